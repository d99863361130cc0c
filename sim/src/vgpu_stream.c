/*
 * Streams and events of the virtual GPU, how long work takes on it, and the synchronisation
 * calls that make the host sleep in real time until the device has caught up.
 */
#include <stdlib.h>
#include <string.h>

#include "ingero_sim.h"
#include "simcommon.h"
#include "vgpu_model.h"

/* NULL, cudaStreamLegacy and cudaStreamPerThread all name the one default stream here. */
struct CUstream_st *vgpu_stream(cudaStream_t handle)
{
    vgpu_init();
    if (handle == NULL || handle == cudaStreamLegacy || handle == cudaStreamPerThread)
        return vgpu_default_stream();
    if (handle->magic != STREAM_MAGIC || handle->destroyed)
        return NULL;
    return handle;
}

struct CUevent_st *vgpu_event(cudaEvent_t handle)
{
    vgpu_init();
    if (!handle || handle->magic != EVENT_MAGIC || handle->destroyed)
        return NULL;
    return handle;
}

/* A kernel's own length when func names a struct ingero_sim_kernel, else the default. */
int64_t vgpu_kernel_ns(const void *func)
{
    const struct vgpu_knobs *k = vgpu_knobs();
    struct ingero_sim_kernel kernel;
    memcpy(&kernel.magic, func, sizeof kernel.magic);
    int64_t base = k->kernel_ns;
    if (kernel.magic == INGERO_SIM_KERNEL_MAGIC) {
        memcpy(&kernel, func, sizeof kernel);
        base = (int64_t)kernel.duration_ns;
    }
    return (int64_t)((double)base * k->slowdown);
}

/* GB/s is bytes per ns: host copies cross PCIe, device-to-device copies stay in HBM. */
int64_t vgpu_copy_ns(size_t bytes, enum cudaMemcpyKind kind)
{
    const struct vgpu_knobs *k = vgpu_knobs();
    if (kind == cudaMemcpyHostToHost)
        return 0;
    double gbps = kind == cudaMemcpyDeviceToDevice ? k->hbm_gbps : k->pcie_gbps;
    return (int64_t)((double)bytes / gbps);
}

cudaError_t vgpu_work(cudaStream_t stream, int64_t duration_ns)
{
    struct CUstream_st *s = vgpu_stream(stream);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    return vgpu_enqueue(s, vgpu_item_work(duration_ns));
}

cudaError_t vgpu_launch(cudaStream_t stream, const void *func)
{
    if (!func)
        return cudaErrorInvalidDeviceFunction;
    cudaError_t sticky = vgpu_sticky_error();
    if (sticky)
        return sticky;
    return vgpu_work(stream, vgpu_kernel_ns(func));
}

cudaError_t vgpu_stream_create(cudaStream_t *out, unsigned int flags)
{
    if (!out || (flags & ~(unsigned int)cudaStreamNonBlocking))
        return cudaErrorInvalidValue;
    vgpu_init();
    struct CUstream_st *s = calloc(1, sizeof *s);
    if (!s)
        return cudaErrorMemoryAllocation;
    s->magic = STREAM_MAGIC;
    s->flags = flags;
    vgpu_lock();
    vgpu_add_stream(s);
    vgpu_unlock();
    *out = s;
    return cudaSuccess;
}

/* Like CUDA: returns at once; the device frees the stream when its queued work is done. */
cudaError_t vgpu_stream_destroy(cudaStream_t stream)
{
    struct CUstream_st *s = vgpu_stream(stream);
    if (!s || s == vgpu_default_stream())
        return cudaErrorInvalidResourceHandle;
    vgpu_lock();
    s->destroyed = 1;
    vgpu_poke();
    vgpu_unlock();
    return cudaSuccess;
}

cudaError_t vgpu_stream_query(cudaStream_t stream)
{
    struct CUstream_st *s = vgpu_stream(stream);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    vgpu_lock();
    vgpu_catch_up();
    cudaError_t result = s->error ? s->error
                         : s->completed < s->enqueued ? cudaErrorNotReady : cudaSuccess;
    vgpu_unlock();
    return result;
}

struct stream_target {
    struct CUstream_st *stream;
    uint64_t target;
};

static int stream_reached(void *arg)
{
    struct stream_target *t = arg;
    return t->stream->completed >= t->target;
}

/* Whether a graph capture is under way on the stream. */
int vgpu_capturing(cudaStream_t stream)
{
    struct CUstream_st *s = vgpu_stream(stream);
    vgpu_lock();
    int capturing = s && s->capturing;
    vgpu_unlock();
    return capturing;
}

cudaError_t vgpu_stream_sync(cudaStream_t stream)
{
    struct CUstream_st *s = vgpu_stream(stream);
    if (!s)
        return cudaErrorInvalidResourceHandle;
    if (vgpu_capturing(stream))
        return cudaErrorStreamCaptureUnsupported;
    vgpu_lock();
    struct stream_target t = { s, s->enqueued };
    int64_t until = vgpu_known_end(s);
    if (until >= 0 && !s->error) {  /* only kernels and copies, which do not fail */
        vgpu_sleep_until(until);
        return cudaSuccess;
    }
    cudaError_t result = vgpu_wait(stream_reached, &t);
    if (!result)
        result = s->error;
    vgpu_unlock();
    return result;
}

/* Device-wide sync: every stream (or every blocking stream) up to what was queued at the call. */
struct device_target {
    struct stream_target *targets;
    int count, capacity;
    int blocking_only;
    cudaError_t error;
};

static int note_target(struct CUstream_st *s, void *arg)
{
    struct device_target *d = arg;
    if (d->blocking_only && (s->flags & cudaStreamNonBlocking))
        return 1;
    if (d->count == d->capacity)
        return 0;
    d->targets[d->count++] = (struct stream_target){ s, s->enqueued };
    return 1;
}

static int count_stream(struct CUstream_st *s, void *arg)
{
    (void)s;
    (*(int *)arg)++;
    return 1;
}

static int device_reached(void *arg)
{
    struct device_target *d = arg;
    for (int i = 0; i < d->count; i++) {
        if (!stream_reached(&d->targets[i]))
            return 0;
        if (d->targets[i].stream->error && !d->error)
            d->error = d->targets[i].stream->error;
    }
    return 1;
}

cudaError_t vgpu_device_sync(int blocking_streams_only)
{
    vgpu_init();
    vgpu_lock();
    struct device_target d = { .blocking_only = blocking_streams_only };
    vgpu_for_each_stream(count_stream, &d.capacity);
    d.targets = calloc((size_t)d.capacity, sizeof *d.targets);
    if (!d.targets) {
        vgpu_unlock();
        return cudaErrorMemoryAllocation;
    }
    vgpu_for_each_stream(note_target, &d);
    cudaError_t result = vgpu_wait(device_reached, &d);
    vgpu_unlock();
    free(d.targets);
    return result ? result : d.error;
}

cudaError_t vgpu_event_create(cudaEvent_t *out, unsigned int flags)
{
    unsigned int known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (!out || (flags & ~known))
        return cudaErrorInvalidValue;
    vgpu_init();
    struct CUevent_st *ev = calloc(1, sizeof *ev);
    if (!ev)
        return cudaErrorMemoryAllocation;
    ev->magic = EVENT_MAGIC;
    ev->flags = flags;
    *out = ev;
    return cudaSuccess;
}

cudaError_t vgpu_event_record(cudaEvent_t event, cudaStream_t stream)
{
    struct CUevent_st *ev = vgpu_event(event);
    struct CUstream_st *s = vgpu_stream(stream);
    if (!ev || !s)
        return cudaErrorInvalidResourceHandle;
    vgpu_lock();
    uint64_t record = ++ev->recorded;
    struct vgpu_item *item = vgpu_item_event(0, ev, record);
    vgpu_unlock();
    return vgpu_enqueue(s, item);
}

cudaError_t vgpu_stream_wait_event(cudaStream_t stream, cudaEvent_t event)
{
    struct CUevent_st *ev = vgpu_event(event);
    struct CUstream_st *s = vgpu_stream(stream);
    if (!ev || !s)
        return cudaErrorInvalidResourceHandle;
    vgpu_lock();
    struct vgpu_item *item = ev->recorded ? vgpu_item_event(1, ev, ev->recorded) : NULL;
    int nothing_to_wait_for = ev->recorded == 0;
    vgpu_unlock();
    return nothing_to_wait_for ? cudaSuccess : vgpu_enqueue(s, item);
}

cudaError_t vgpu_event_query(cudaEvent_t event)
{
    struct CUevent_st *ev = vgpu_event(event);
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    vgpu_lock();
    vgpu_catch_up();
    cudaError_t result = ev->completed < ev->recorded ? cudaErrorNotReady : ev->error;
    vgpu_unlock();
    return result;
}

struct event_target {
    struct CUevent_st *event;
    uint64_t record;
};

static int event_reached(void *arg)
{
    struct event_target *t = arg;
    return t->event->completed >= t->record;
}

cudaError_t vgpu_event_sync(cudaEvent_t event)
{
    struct CUevent_st *ev = vgpu_event(event);
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    vgpu_lock();
    ev->refs++;
    struct event_target t = { ev, ev->recorded };
    cudaError_t result = vgpu_wait(event_reached, &t);
    if (!result)
        result = ev->error;
    vgpu_event_release(ev);
    vgpu_unlock();
    return result;
}

/* Virtual times, so the elapsed time between two records is exact, not jittered by wake-ups. */
cudaError_t vgpu_event_elapsed(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    struct CUevent_st *a = vgpu_event(start), *b = vgpu_event(end);
    if (!ms)
        return cudaErrorInvalidValue;
    if (!a || !b || ((a->flags | b->flags) & cudaEventDisableTiming))
        return cudaErrorInvalidResourceHandle;
    vgpu_lock();
    vgpu_catch_up();
    cudaError_t result = cudaSuccess;
    if (!a->recorded || !b->recorded)
        result = cudaErrorInvalidResourceHandle;
    else if (a->completed < a->recorded || b->completed < b->recorded)
        result = cudaErrorNotReady;
    else
        *ms = (float)((double)(b->time_ns - a->time_ns) / NS_PER_MS);
    vgpu_unlock();
    return result;
}

/* Caller holds the lock. Frees a destroyed event once no queued item points at it. */
cudaError_t vgpu_event_destroy(cudaEvent_t event)
{
    struct CUevent_st *ev = vgpu_event(event);
    if (!ev)
        return cudaErrorInvalidResourceHandle;
    vgpu_lock();
    ev->destroyed = 1;
    ev->magic = 0;
    if (ev->refs == 0)
        free(ev);
    vgpu_unlock();
    return cudaSuccess;
}
