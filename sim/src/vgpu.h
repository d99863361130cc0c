/*
 * The virtual GPU's private interface. libcudart owns the model (streams, events, the device
 * thread, memory); libcuda and libnccl reach it only through these ingero_sim_* entry points,
 * exported under the INGERO_SIM_PRIVATE version node so they never pose as CUDA symbols.
 *
 * Calls here never go through an exported cuda* function, so a uprobe on cudaStreamSynchronize
 * fires only when the application itself calls it.
 */
#ifndef SIM_VGPU_H
#define SIM_VGPU_H

#include <stddef.h>
#include <stdint.h>

#include "cuda_runtime_api.h"

/* What a remote (collective or point-to-point) rendezvous part reports to the device. */
enum ingero_sim_remote_status {
    INGERO_SIM_FAILED = -1,
    INGERO_SIM_PENDING = 0,
    INGERO_SIM_DONE = 1,
};

/*
 * How the device thread drives one part of a queued collective, under the device lock:
 * publish() once when the stream reaches the part (arrival = the virtual time it got there),
 * poll() until it is done (end = when the transfer finishes), finish() exactly once. A part
 * enqueued on a capturing stream is a template kept by the graph: each replay asks renew()
 * for a fresh part like it (NULL: none could be made), and discard() frees it with the graph.
 */
struct ingero_sim_remote_ops {
    int (*publish)(void *part, int64_t arrival_ns);
    int (*poll)(void *part, int64_t *end_ns);
    void (*finish)(void *part, int failed);
    void *(*renew)(void *part);
    void (*discard)(void *part);
};

cudaError_t ingero_sim_enqueue_kernel(cudaStream_t stream, const void *func);
cudaError_t ingero_sim_enqueue_copy(cudaStream_t stream, size_t bytes, enum cudaMemcpyKind kind);
cudaError_t ingero_sim_enqueue_remote(cudaStream_t stream, const struct ingero_sim_remote_ops *ops,
                                      void *const *parts, int nparts);
cudaError_t ingero_sim_copy_blocking(void *dst, const void *src, size_t bytes,
                                     enum cudaMemcpyKind kind);
cudaError_t ingero_sim_stream_synchronize(cudaStream_t stream);
cudaError_t ingero_sim_device_synchronize(void);
cudaError_t ingero_sim_device_alloc(void **ptr, size_t bytes);
cudaError_t ingero_sim_device_free(void *ptr);
/* When the stream's queued work ends (virtual time, CLOCK_MONOTONIC ns; with a collective
 * queued, when its last finished item ended); -1: no such stream. After a sync on it, when
 * the device was done with what the sync waited for. */
int64_t ingero_sim_stream_done_ns(cudaStream_t stream);
int ingero_sim_device_count(void);
/* Whether the stream is capturing a graph: what is enqueued on it is recorded, not run. */
int ingero_sim_stream_capturing(cudaStream_t stream);
cudaError_t ingero_sim_graph_launch(cudaGraphExec_t exec, cudaStream_t stream);
int64_t ingero_sim_timeout_ns(void);
/* Wake the device thread: a remote event (a peer's arrival) may have completed a part. */
void ingero_sim_wake_device(void);

#endif
