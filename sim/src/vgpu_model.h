/*
 * Inside the virtual GPU (libingero-sim-vgpu.so, and the runtimes that drive it). A stream is
 * a FIFO of items; the device thread runs the item at each stream's head in real time: work
 * (kernels, copies) ends at start + duration, an event record completes at once, an event
 * wait completes when the event does, and a remote item (a collective) completes when every
 * rank has reached it plus the transfer time.
 *
 * Times: "virtual" times are CLOCK_MONOTONIC ns at which the modelled GPU did something; the
 * device thread sleeps until real time catches up with them, so syncs block for real.
 * Locking: one mutex (vgpu_lock) guards all streams, events and items.
 */
#ifndef SIM_VGPU_MODEL_H
#define SIM_VGPU_MODEL_H

#include <pthread.h>
#include <stdint.h>

#include "cuda_runtime_api.h"
#include "vgpu.h"

/* The model lives in libingero-sim-vgpu.so; the runtimes (libcudart.so.12 and .so.13) drive it
 * through these, exported under the private version node only (src/libingero-sim-vgpu.map). */
#define SHARED __attribute__((visibility("default")))
/* Within one library. */
#define HIDDEN __attribute__((visibility("hidden")))

#define STREAM_MAGIC 0x5354524dU
#define EVENT_MAGIC 0x45564e54U

struct vgpu_item;

struct CUstream_st {
    uint32_t magic;
    unsigned int flags;       /* cudaStreamNonBlocking: not ordered with the legacy stream */
    int destroyed;            /* freed by the device thread once its queue drains */
    struct vgpu_item *head, *tail;
    uint64_t enqueued;        /* items ever queued */
    uint64_t completed;       /* items the device has finished (or failed) */
    int64_t free_at_ns;       /* virtual time the last finished item ended */
    cudaError_t error;        /* first failure on this stream; sticky */
    struct vgpu_capture *capturing; /* what a graph capture records; NULL: none */
    struct CUstream_st *next; /* all live streams, the default stream last */
};

struct CUevent_st {
    uint32_t magic;
    unsigned int flags;
    int destroyed;
    int refs;                 /* queued items that still point here */
    uint64_t recorded;        /* cudaEventRecord calls so far */
    uint64_t completed;       /* highest record the device has reached */
    int64_t time_ns;          /* virtual time of that record */
    cudaError_t error;
};

struct vgpu_knobs {
    int64_t kernel_ns;        /* INGERO_SIM_KERNEL_US */
    double slowdown;          /* INGERO_SIM_GPU_SLOWDOWN */
    double pcie_gbps;         /* INGERO_SIM_PCIE_GBPS: GB/s == bytes per ns */
    double hbm_gbps;          /* INGERO_SIM_HBM_GBPS */
    int64_t timeout_ns;       /* INGERO_SIM_TIMEOUT_S */
    int device_count;         /* INGERO_SIM_DEVICE_COUNT */
    uint64_t memory_bytes;    /* INGERO_SIM_GPU_MEM_GB */
};

/* vgpu_device.c: global state, the device thread, host-side waiting. */
SHARED void vgpu_init(void);
SHARED const struct vgpu_knobs *vgpu_knobs(void);
SHARED void vgpu_lock(void);
SHARED void vgpu_unlock(void);
SHARED struct CUstream_st *vgpu_default_stream(void);
SHARED void vgpu_add_stream(struct CUstream_st *s);
SHARED cudaError_t vgpu_sticky_error(void);
SHARED void vgpu_poke(void);
SHARED cudaError_t vgpu_wait(int (*done)(void *arg), void *arg);
SHARED void vgpu_sleep_until(int64_t until);
SHARED void vgpu_catch_up(void);
SHARED int64_t vgpu_known_end(const struct CUstream_st *s);
SHARED cudaError_t vgpu_enqueue(struct CUstream_st *s, struct vgpu_item *item);
SHARED struct vgpu_item *vgpu_item_work(int64_t duration_ns);
SHARED struct vgpu_item *vgpu_item_event(int wait, struct CUevent_st *ev, uint64_t record);
SHARED struct vgpu_item *vgpu_item_remote(const struct ingero_sim_remote_ops *ops,
                                          void *const *parts, int nparts);
SHARED int vgpu_for_each_stream(int (*visit)(struct CUstream_st *s, void *arg), void *arg);
/* A graph capture: the items enqueued on a capturing stream, kept instead of run (kernels and
 * copies as work, collectives as template parts); a replay enqueues them again, each
 * collective's parts renewed. */
struct vgpu_capture;
SHARED struct vgpu_capture *vgpu_capture_new(void);
SHARED void vgpu_capture_free(struct vgpu_capture *c);
SHARED cudaError_t vgpu_capture_replay(const struct vgpu_capture *c, struct CUstream_st *s);

/* vgpu_stream.c: streams, events, durations, synchronisation. */
SHARED struct CUstream_st *vgpu_stream(cudaStream_t handle);
SHARED struct CUevent_st *vgpu_event(cudaEvent_t handle);
SHARED int64_t vgpu_kernel_ns(const void *func);
SHARED int64_t vgpu_copy_ns(size_t bytes, enum cudaMemcpyKind kind);
SHARED cudaError_t vgpu_launch(cudaStream_t stream, const void *func);
SHARED cudaError_t vgpu_work(cudaStream_t stream, int64_t duration_ns);
SHARED cudaError_t vgpu_stream_create(cudaStream_t *out, unsigned int flags);
SHARED cudaError_t vgpu_stream_destroy(cudaStream_t stream);
SHARED cudaError_t vgpu_stream_query(cudaStream_t stream);
SHARED cudaError_t vgpu_stream_sync(cudaStream_t stream);
SHARED cudaError_t vgpu_device_sync(int blocking_streams_only);
SHARED cudaError_t vgpu_stream_wait_event(cudaStream_t stream, cudaEvent_t event);
SHARED int vgpu_capturing(cudaStream_t stream);
SHARED cudaError_t vgpu_event_create(cudaEvent_t *out, unsigned int flags);
SHARED cudaError_t vgpu_event_record(cudaEvent_t event, cudaStream_t stream);
SHARED cudaError_t vgpu_event_query(cudaEvent_t event);
SHARED cudaError_t vgpu_event_sync(cudaEvent_t event);
SHARED cudaError_t vgpu_event_elapsed(float *ms, cudaEvent_t start, cudaEvent_t end);
SHARED cudaError_t vgpu_event_destroy(cudaEvent_t event);
SHARED void vgpu_event_release(struct CUevent_st *ev);

/* vgpu_graph.c: capture, instantiation and replay. */
SHARED cudaError_t vgpu_begin_capture(cudaStream_t stream);
SHARED cudaError_t vgpu_end_capture(cudaStream_t stream, cudaGraph_t *graph);
SHARED cudaError_t vgpu_graph_instantiate(cudaGraphExec_t *exec, cudaGraph_t graph);
SHARED cudaError_t vgpu_graph_launch(cudaGraphExec_t exec, cudaStream_t stream);
SHARED cudaError_t vgpu_graph_exec_destroy(cudaGraphExec_t exec);
SHARED cudaError_t vgpu_graph_destroy(cudaGraph_t graph);

/* vgpu_mem.c: allocations and copies. */
enum vgpu_mem_kind { MEM_HOST_PAGEABLE, MEM_DEVICE, MEM_MANAGED, MEM_HOST_PINNED };
SHARED cudaError_t vgpu_alloc(void **ptr, size_t bytes, enum vgpu_mem_kind kind);
SHARED cudaError_t vgpu_release(void *ptr, enum vgpu_mem_kind kind);
SHARED void vgpu_mem_info(size_t *free_bytes, size_t *total_bytes);
SHARED void vgpu_set_device(int device);
SHARED cudaError_t vgpu_copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                             cudaStream_t stream, int blocking);
SHARED cudaError_t vgpu_memset(void *dst, int value, size_t bytes, cudaStream_t stream);

#endif
