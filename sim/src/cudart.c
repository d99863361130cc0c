/*
 * libcudart.so.12: NVIDIA's CUDA runtime entry points with their real prototypes, each a thin
 * shell over the virtual GPU. Every entry point is its own function (see SIM_API) and none calls
 * another, so a uprobe on one fires exactly when the application calls it, with one exception
 * that CUDA 13 makes too: a kernel launch enters the driver's exported launch (REAL-GPU.md:
 * 792 cudaLaunchKernel and 792 cuLaunchKernel a step), here the libcuda.so.1 beside this file.
 */
#define _GNU_SOURCE     /* dladdr */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "cuda.h"
#include "simcommon.h"
#include "vgpu_model.h"

HIDDEN const char *sim_cuda_error_name(cudaError_t code);
HIDDEN const char *sim_cuda_error_description(cudaError_t code);

/* Per host thread, as in CUDA: the last error and the current device. */
static __thread cudaError_t last_error;
static __thread int current_device;

/* Remember failures for cudaGetLastError; "not ready" is an answer, not an error. */
static cudaError_t note(cudaError_t result)
{
    if (result != cudaSuccess && result != cudaErrorNotReady)
        last_error = result;
    return result;
}

SIM_API cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return note(cudaErrorInvalidValue);
    *count = vgpu_knobs()->device_count;
    return cudaSuccess;
}

SIM_API cudaError_t cudaSetDevice(int device)
{
    if (device < 0 || device >= vgpu_knobs()->device_count)
        return note(cudaErrorInvalidDevice);
    current_device = device;
    vgpu_set_device(device);
    return cudaSuccess;
}

SIM_API cudaError_t cudaGetDevice(int *device)
{
    if (!device)
        return note(cudaErrorInvalidValue);
    *device = current_device;
    return cudaSuccess;
}

SIM_API cudaError_t cudaDeviceSynchronize(void)
{
    return note(vgpu_device_sync(0));
}

/* Returns and clears this thread's last error; a sticky device error is never cleared. */
SIM_API cudaError_t cudaGetLastError(void)
{
    cudaError_t result = last_error;
    last_error = cudaSuccess;
    vgpu_init();
    return result ? result : vgpu_sticky_error();
}

SIM_API cudaError_t cudaPeekAtLastError(void)
{
    vgpu_init();
    return last_error ? last_error : vgpu_sticky_error();
}

SIM_API const char *cudaGetErrorString(cudaError_t error)
{
    return sim_cuda_error_description(error);
}

SIM_API const char *cudaGetErrorName(cudaError_t error)
{
    return sim_cuda_error_name(error);
}

SIM_API cudaError_t cudaMalloc(void **devPtr, size_t size)
{
    return note(vgpu_alloc(devPtr, size, MEM_DEVICE));
}

/* Like CUDA, freeing device memory waits for the device to go idle first. */
SIM_API cudaError_t cudaFree(void *devPtr)
{
    if (!devPtr)
        return cudaSuccess;
    cudaError_t result = vgpu_device_sync(0);
    return note(result ? result : vgpu_release(devPtr, MEM_DEVICE));
}

SIM_API cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned int flags)
{
    if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost)
        return note(cudaErrorInvalidValue);
    return note(vgpu_alloc(devPtr, size, MEM_MANAGED));
}

SIM_API cudaError_t cudaMallocHost(void **ptr, size_t size)
{
    return note(vgpu_alloc(ptr, size, MEM_HOST_PINNED));
}

SIM_API cudaError_t cudaFreeHost(void *ptr)
{
    return note(vgpu_release(ptr, MEM_HOST_PINNED));
}

SIM_API cudaError_t cudaMemGetInfo(size_t *free, size_t *total)
{
    if (!free || !total)
        return note(cudaErrorInvalidValue);
    vgpu_mem_info(free, total);
    return cudaSuccess;
}

SIM_API cudaError_t cudaMemset(void *devPtr, int value, size_t count)
{
    return note(vgpu_memset(devPtr, value, count, NULL));
}

SIM_API cudaError_t cudaMemsetAsync(void *devPtr, int value, size_t count, cudaStream_t stream)
{
    return note(vgpu_memset(devPtr, value, count, stream));
}

SIM_API cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    return note(vgpu_copy(dst, src, count, kind, NULL, 1));
}

SIM_API cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count,
                                    enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return note(vgpu_copy(dst, src, count, kind, stream, 0));
}

/* A 2D copy moves width × height bytes; the pitches only say where rows start. */
static cudaError_t copy_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                           size_t height, enum cudaMemcpyKind kind, cudaStream_t stream,
                           int blocking)
{
    if (width > dpitch || width > spitch)
        return cudaErrorInvalidValue;
    cudaError_t result = cudaSuccess;
    if (height && kind == cudaMemcpyHostToHost) {
        for (size_t row = 0; row < height && !result; row++)
            result = vgpu_copy((char *)dst + row * dpitch, (const char *)src + row * spitch,
                               width, kind, stream, blocking);
        return result;
    }
    return vgpu_copy(dst, src, width * height, kind, stream, blocking);
}

SIM_API cudaError_t cudaMemcpy2D(void *dst, size_t dpitch, const void *src, size_t spitch,
                                 size_t width, size_t height, enum cudaMemcpyKind kind)
{
    return note(copy_2d(dst, dpitch, src, spitch, width, height, kind, NULL, 1));
}

SIM_API cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch,
                                      size_t width, size_t height, enum cudaMemcpyKind kind,
                                      cudaStream_t stream)
{
    return note(copy_2d(dst, dpitch, src, spitch, width, height, kind, stream, 0));
}

static cudaError_t check_devices(int a, int b)
{
    int count = vgpu_knobs()->device_count;
    return a < 0 || b < 0 || a >= count || b >= count ? cudaErrorInvalidDevice : cudaSuccess;
}

SIM_API cudaError_t cudaMemcpyPeer(void *dst, int dstDevice, const void *src, int srcDevice,
                                   size_t count)
{
    cudaError_t result = check_devices(dstDevice, srcDevice);
    return note(result ? result : vgpu_copy(dst, src, count, cudaMemcpyHostToDevice, NULL, 1));
}

SIM_API cudaError_t cudaMemcpyPeerAsync(void *dst, int dstDevice, const void *src, int srcDevice,
                                        size_t count, cudaStream_t stream)
{
    cudaError_t result = check_devices(dstDevice, srcDevice);
    return note(result ? result
                       : vgpu_copy(dst, src, count, cudaMemcpyHostToDevice, stream, 0));
}

/* The driver's launches, found once in the libcuda.so.1 beside this library and initialised
 * (as the real runtime initialises the driver it loads). Where there is none (a program that
 * loaded this library alone), or INGERO_SIM_RUNTIME_VIA_DRIVER=0, the runtime launches on the
 * virtual GPU itself. */
static struct {
    CUresult (*launch)(CUfunction, unsigned int, unsigned int, unsigned int, unsigned int,
                       unsigned int, unsigned int, unsigned int, CUstream, void **, void **);
    CUresult (*launch_ex)(const CUlaunchConfig *, CUfunction, void **, void **);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
} driver;
static pthread_once_t driver_found = PTHREAD_ONCE_INIT;

static void find_driver(void)
{
    Dl_info self;
    char path[4096];
    if (!sim_knob("INGERO_SIM_RUNTIME_VIA_DRIVER", 1, 0))
        return;     /* a runtime that launches on its own, as older ones may */
    if (!dladdr((void *)find_driver, &self) || !self.dli_fname)
        return;
    const char *slash = strrchr(self.dli_fname, '/');
    int dir = slash ? (int)(slash - self.dli_fname + 1) : 0;
    if (snprintf(path, sizeof path, "%.*slibcuda.so.1", dir, self.dli_fname) >= (int)sizeof path)
        return;
    void *library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    CUresult (*init)(unsigned int) = library ? (CUresult (*)(unsigned int))dlsym(library, "cuInit")
                                             : NULL;
    if (!init || init(0) != CUDA_SUCCESS)
        return;
    driver.launch = (__typeof__(driver.launch))dlsym(library, "cuLaunchKernel");
    driver.launch_ex = (__typeof__(driver.launch_ex))dlsym(library, "cuLaunchKernelEx");
    driver.graph_launch = (__typeof__(driver.graph_launch))dlsym(library, "cuGraphLaunch");
}

/* What the runtime says for the driver's answer to a launch whose function it checked
 * already: a bad handle is the stream's; an error the device raised meanwhile is its own. */
static cudaError_t launch_result(CUresult result)
{
    cudaError_t sticky = vgpu_sticky_error();
    switch (result) {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_LAUNCH_TIMEOUT: return cudaErrorLaunchTimeout;
    default: return sticky ? sticky : cudaErrorLaunchFailure;
    }
}

static int bad_shape(dim3 grid, dim3 block)
{
    return !grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z;
}

/* A kernel the runtime checked, launched through the driver's cuLaunchKernel or cuLaunchKernelEx
 * (``config`` given); the sticky error and a missing function answer before the driver. */
static cudaError_t runtime_launch(const void *func, dim3 grid, dim3 block, size_t shared,
                                  cudaStream_t stream, const cudaLaunchConfig_t *config)
{
    cudaError_t sticky = vgpu_sticky_error();
    if (sticky || !func)
        return sticky ? sticky : cudaErrorInvalidDeviceFunction;
    pthread_once(&driver_found, find_driver);
    if (config && driver.launch_ex) {
        CUlaunchConfig driver_config = {
            .gridDimX = grid.x, .gridDimY = grid.y, .gridDimZ = grid.z,
            .blockDimX = block.x, .blockDimY = block.y, .blockDimZ = block.z,
            .sharedMemBytes = (unsigned int)shared, .hStream = (CUstream)stream,
        };
        return launch_result(driver.launch_ex(&driver_config, (CUfunction)func, NULL, NULL));
    }
    if (!config && driver.launch)
        return launch_result(driver.launch((CUfunction)func, grid.x, grid.y, grid.z, block.x,
                                           block.y, block.z, (unsigned int)shared,
                                           (CUstream)stream, NULL, NULL));
    return vgpu_launch(stream, func);
}

SIM_API cudaError_t cudaLaunchKernel(const void *func, dim3 gridDim, dim3 blockDim, void **args,
                                     size_t sharedMem, cudaStream_t stream)
{
    (void)args;
    if (bad_shape(gridDim, blockDim))
        return note(cudaErrorInvalidConfiguration);
    return note(runtime_launch(func, gridDim, blockDim, sharedMem, stream, NULL));
}

/* cudaLaunchKernelExC(config, func, args): the launch with attributes (cluster dimensions,
 * programmatic serialisation …), which the sim accepts and does not model. */
SIM_API cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func,
                                        void **args)
{
    (void)args;
    if (!config)
        return note(cudaErrorInvalidValue);
    if (bad_shape(config->gridDim, config->blockDim))
        return note(cudaErrorInvalidConfiguration);
    return note(runtime_launch(func, config->gridDim, config->blockDim,
                               config->dynamicSmemBytes, config->stream, config));
}

SIM_API cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return note(vgpu_stream_create(pStream, cudaStreamDefault));
}

SIM_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    return note(vgpu_stream_create(pStream, flags));
}

SIM_API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    return note(vgpu_stream_destroy(stream));
}

SIM_API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    return note(vgpu_stream_sync(stream));
}

SIM_API cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    return note(vgpu_stream_query(stream));
}

SIM_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event,
                                        unsigned int flags)
{
    (void)flags;
    return note(vgpu_stream_wait_event(stream, event));
}

SIM_API cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return note(vgpu_event_create(event, cudaEventDefault));
}

SIM_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    return note(vgpu_event_create(event, flags));
}

SIM_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    return note(vgpu_event_record(event, stream));
}

SIM_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode)
{
    if ((unsigned int)mode > cudaStreamCaptureModeRelaxed)
        return note(cudaErrorInvalidValue);
    return note(vgpu_begin_capture(stream));
}

SIM_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph)
{
    return note(vgpu_end_capture(stream, pGraph));
}

SIM_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream,
                                          enum cudaStreamCaptureStatus *pStatus)
{
    if (!pStatus)
        return note(cudaErrorInvalidValue);
    *pStatus = vgpu_capturing(stream) ? cudaStreamCaptureStatusActive
                                      : cudaStreamCaptureStatusNone;
    return cudaSuccess;
}

SIM_API cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                         unsigned long long flags)
{
    (void)flags;
    return note(vgpu_graph_instantiate(pGraphExec, graph));
}

/* A replay: through the driver's cuGraphLaunch, as CUDA 13's runtime does (REAL-GPU.md). */
SIM_API cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream)
{
    cudaError_t sticky = vgpu_sticky_error();
    if (sticky)
        return note(sticky);
    pthread_once(&driver_found, find_driver);
    if (driver.graph_launch)
        return note(launch_result(driver.graph_launch(graphExec, (CUstream)stream)));
    return note(vgpu_graph_launch(graphExec, stream));
}

SIM_API cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec)
{
    return note(vgpu_graph_exec_destroy(graphExec));
}

SIM_API cudaError_t cudaGraphDestroy(cudaGraph_t graph)
{
    return note(vgpu_graph_destroy(graph));
}

/* flags: cudaEventRecordDefault or cudaEventRecordExternal (graph capture only) */
SIM_API cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream,
                                             unsigned int flags)
{
    if (flags & ~cudaEventRecordExternal)
        return note(cudaErrorInvalidValue);
    return note(vgpu_event_record(event, stream));
}

SIM_API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    return note(vgpu_event_sync(event));
}

SIM_API cudaError_t cudaEventQuery(cudaEvent_t event)
{
    return note(vgpu_event_query(event));
}

SIM_API cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    return note(vgpu_event_elapsed(ms, start, end));
}

SIM_API cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    return note(vgpu_event_destroy(event));
}
