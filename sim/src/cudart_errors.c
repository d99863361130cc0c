/* Names and descriptions of the cudaError_t values the sim can return (CUDA 12 wording). */
#include "cuda_runtime_api.h"
#include "vgpu_model.h"

struct error_text {
    cudaError_t code;
    const char *name;
    const char *description;
};

static const struct error_text error_texts[] = {
    { cudaSuccess, "cudaSuccess", "no error" },
    { cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument" },
    { cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory" },
    { cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error" },
    { cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down" },
    { cudaErrorInvalidConfiguration, "cudaErrorInvalidConfiguration",
      "invalid configuration argument" },
    { cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer" },
    { cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection",
      "invalid copy direction for memcpy" },
    { cudaErrorInvalidDeviceFunction, "cudaErrorInvalidDeviceFunction",
      "invalid device function" },
    { cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected" },
    { cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal" },
    { cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle",
      "invalid resource handle" },
    { cudaErrorNotReady, "cudaErrorNotReady", "device not ready" },
    { cudaErrorLaunchTimeout, "cudaErrorLaunchTimeout",
      "the launch timed out and was terminated" },
    { cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure" },
    { cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported" },
    { cudaErrorTimeout, "cudaErrorTimeout", "timeout occurred" },
    { cudaErrorUnknown, "cudaErrorUnknown", "unknown error" },
};

static const struct error_text *find_error(cudaError_t code)
{
    for (size_t i = 0; i < sizeof error_texts / sizeof error_texts[0]; i++)
        if (error_texts[i].code == code)
            return &error_texts[i];
    return NULL;
}

HIDDEN const char *sim_cuda_error_name(cudaError_t code)
{
    const struct error_text *t = find_error(code);
    return t ? t->name : "cudaErrorUnknown";
}

HIDDEN const char *sim_cuda_error_description(cudaError_t code)
{
    const struct error_text *t = find_error(code);
    return t ? t->description : "unrecognized error code";
}
