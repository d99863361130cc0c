/*
 * libcuda.so.1: the driver-API subset, with the real prototypes (cuLaunchKernel's eleven
 * arguments, the _v2 names). It drives the same virtual GPU as libcudart through the private
 * ingero_sim_* entry points, so runtime and driver calls share one device timeline.
 */
#include <stdint.h>

#include "cuda.h"
#include "simcommon.h"
#include "vgpu.h"

static int initialized;

/* Context handles are opaque to callers; one static context per device is all the sim needs. */
static char contexts[64];

static CUresult driver_result(cudaError_t error)
{
    switch (error) {
    case cudaSuccess: return CUDA_SUCCESS;
    case cudaErrorInvalidValue: return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case cudaErrorInvalidDevice: return CUDA_ERROR_INVALID_DEVICE;
    case cudaErrorInvalidResourceHandle: return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorInvalidDeviceFunction: return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorNotReady: return CUDA_ERROR_NOT_READY;
    case cudaErrorLaunchTimeout: return CUDA_ERROR_LAUNCH_TIMEOUT;
    case cudaErrorLaunchFailure: return CUDA_ERROR_LAUNCH_FAILED;
    default: return CUDA_ERROR_UNKNOWN;
    }
}

SIM_API CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    initialized = 1;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= ingero_sim_device_count())
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    (void)flags;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= ingero_sim_device_count() || dev >= (int)sizeof contexts)
        return CUDA_ERROR_INVALID_DEVICE;
    *pctx = (CUcontext)&contexts[dev];
    return CUDA_SUCCESS;
}

SIM_API CUresult cuCtxSynchronize(void)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return driver_result(ingero_sim_device_synchronize());
}

SIM_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int sharedMemBytes, CUstream hStream,
                                void **kernelParams, void **extra)
{
    (void)sharedMemBytes;
    (void)kernelParams;
    (void)extra;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!gridDimX || !gridDimY || !gridDimZ || !blockDimX || !blockDimY || !blockDimZ)
        return CUDA_ERROR_INVALID_VALUE;
    return driver_result(ingero_sim_enqueue_kernel(hStream, (const void *)f));
}

/* cuLaunchKernelEx(config, f, kernelParams, extra): how cuBLAS and cuBLASLt launch their GEMMs
 * (REAL-GPU.md: 131 a step, the heaviest kernels); the attributes are accepted, not modelled. */
SIM_API CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                  void **kernelParams, void **extra)
{
    (void)kernelParams;
    (void)extra;
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!config || !config->gridDimX || !config->gridDimY || !config->gridDimZ ||
        !config->blockDimX || !config->blockDimY || !config->blockDimZ)
        return CUDA_ERROR_INVALID_VALUE;
    return driver_result(ingero_sim_enqueue_kernel(config->hStream, (const void *)f));
}

/* cuGraphLaunch(hGraphExec, hStream): a graph's replay, which cudaGraphLaunch enters. */
SIM_API CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return driver_result(ingero_sim_graph_launch((cudaGraphExec_t)hGraphExec, hStream));
}

SIM_API CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (!dptr || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *ptr = NULL;
    CUresult result = driver_result(ingero_sim_device_alloc(&ptr, bytesize));
    *dptr = (CUdeviceptr)(uintptr_t)ptr;
    return result;
}

SIM_API CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return driver_result(ingero_sim_device_free((void *)(uintptr_t)dptr));
}

SIM_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return driver_result(ingero_sim_copy_blocking((void *)(uintptr_t)dstDevice, srcHost,
                                                  ByteCount, cudaMemcpyHostToDevice));
}

SIM_API CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return driver_result(ingero_sim_copy_blocking(dstHost, (const void *)(uintptr_t)srcDevice,
                                                  ByteCount, cudaMemcpyDeviceToHost));
}

/* Unified addressing: the direction is inferred; the time charged is a PCIe transfer. */
SIM_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount,
                               CUstream hStream)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ByteCount && (!dst || !src))
        return CUDA_ERROR_INVALID_VALUE;
    return driver_result(ingero_sim_enqueue_copy(hStream, ByteCount, cudaMemcpyDefault));
}

SIM_API CUresult cuStreamSynchronize(CUstream hStream)
{
    if (!initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return driver_result(ingero_sim_stream_synchronize(hStream));
}
