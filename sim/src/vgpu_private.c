/*
 * The virtual GPU's private entry points for libcuda and libnccl (see vgpu.h). They reach the
 * model directly, never through a cuda* entry point, so tracing those stays truthful.
 */
#include "simcommon.h"
#include "vgpu_model.h"

SIM_API cudaError_t ingero_sim_enqueue_kernel(cudaStream_t stream, const void *func)
{
    return vgpu_launch(stream, func);
}

SIM_API cudaError_t ingero_sim_enqueue_copy(cudaStream_t stream, size_t bytes,
                                            enum cudaMemcpyKind kind)
{
    return vgpu_work(stream, vgpu_copy_ns(bytes, kind));
}

SIM_API cudaError_t ingero_sim_enqueue_remote(cudaStream_t stream,
                                              const struct ingero_sim_remote_ops *ops,
                                              void *const *parts, int nparts)
{
    struct CUstream_st *s = vgpu_stream(stream);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    if (!ops || !parts || nparts <= 0)
        return cudaErrorInvalidValue;
    return vgpu_enqueue(s, vgpu_item_remote(ops, parts, nparts));
}

SIM_API cudaError_t ingero_sim_copy_blocking(void *dst, const void *src, size_t bytes,
                                             enum cudaMemcpyKind kind)
{
    return vgpu_copy(dst, src, bytes, kind, NULL, 1);
}

SIM_API cudaError_t ingero_sim_stream_synchronize(cudaStream_t stream)
{
    return vgpu_stream_sync(stream);
}

SIM_API cudaError_t ingero_sim_device_synchronize(void)
{
    return vgpu_device_sync(0);
}

SIM_API cudaError_t ingero_sim_device_alloc(void **ptr, size_t bytes)
{
    return vgpu_alloc(ptr, bytes, MEM_DEVICE);
}

SIM_API cudaError_t ingero_sim_device_free(void *ptr)
{
    return vgpu_release(ptr, MEM_DEVICE);
}

SIM_API int64_t ingero_sim_stream_done_ns(cudaStream_t stream)
{
    struct CUstream_st *s = vgpu_stream(stream);
    if (!s)
        return -1;
    vgpu_lock();
    int64_t done = vgpu_known_end(s);   /* its items may not be retired yet */
    if (done < 0)
        done = s->free_at_ns;
    vgpu_unlock();
    return done;
}

SIM_API int ingero_sim_device_count(void)
{
    return vgpu_knobs()->device_count;
}

SIM_API int64_t ingero_sim_timeout_ns(void)
{
    return vgpu_knobs()->timeout_ns;
}

SIM_API void ingero_sim_wake_device(void)
{
    vgpu_init();
    vgpu_lock();
    vgpu_poke();
    vgpu_unlock();
}

SIM_API int ingero_sim_stream_capturing(cudaStream_t stream)
{
    return vgpu_capturing(stream);
}

SIM_API cudaError_t ingero_sim_graph_launch(cudaGraphExec_t exec, cudaStream_t stream)
{
    return vgpu_graph_launch(exec, stream);
}
