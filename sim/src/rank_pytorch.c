/*
 * A training step as PyTorch's DistributedDataParallel runs it on CUDA 13 and NCCL 2.28
 * (REAL-GPU.md): the batch copied in (cudaMemcpyAsync), forward and backward kernels on the
 * compute stream, a share of them GEMMs launched through the driver's cuLaunchKernelEx as
 * cuBLAS does, the rest through cudaLaunchKernel (which enters the driver's cuLaunchKernel).
 * As each gradient bucket is ready its event is recorded on the compute stream
 * (cudaEventRecordWithFlags), the process group's own NCCL stream waits on it
 * (cudaStreamWaitEvent) and its all-reduce is enqueued there; the compute stream then waits
 * on the NCCL stream's event before the optimizer. The host never waits on its own kernels:
 * its only sync is the loss read (loss.item(): a copy and a stream sync) every --sync-every
 * steps, which waits on the optimizer and so on the all-reduces. The caching allocator
 * mallocs only in the first steps.
 */
#include <stdlib.h>

#include "cuda.h"
#include "rank_train.h"

/* ``n`` launches of ``kernel``: every 1/gemm_share-th by cuLaunchKernelEx, as cuBLAS's GEMMs,
 * spread evenly over the job's launches. */
static int launch_mix(struct training *t, const struct ingero_sim_kernel *kernel, int n,
                      cudaStream_t stream)
{
    dim3 grid = { 132, 1, 1 }, block = { 256, 1, 1 };
    CUlaunchConfig config = { 132, 1, 1, 256, 1, 1, 0, (CUstream)stream, NULL, 0 };
    double share = t->cfg->gemm_share;
    for (int i = 0; i < n; i++, t->launched++) {
        int gemm = (uint64_t)((double)(t->launched + 1) * share)
                   > (uint64_t)((double)t->launched * share);
        if (gemm) {
            if (cuLaunchKernelEx(&config, (CUfunction)(void *)kernel, NULL, NULL)
                != CUDA_SUCCESS)
                return cuda_failed(t, "cuLaunchKernelEx", cudaErrorLaunchFailure);
            t->driver_launches++;
        } else {
            if (cuda_failed(t, "cudaLaunchKernel",
                            cudaLaunchKernel(kernel, grid, block, NULL, 0, stream)))
                return 1;
            t->runtime_launches++;
        }
    }
    return 0;
}

int pytorch_set_up(struct training *t)
{
    if (cuda_failed(t, "cudaStreamCreateWithFlags",
                    cudaStreamCreateWithFlags(&t->nccl_stream, cudaStreamNonBlocking))
        || cuda_failed(t, "cudaEventCreateWithFlags",
                       cudaEventCreateWithFlags(&t->all_reduced, cudaEventDisableTiming)))
        return 1;
    for (int b = 0; b < t->cfg->buckets; b++)
        if (cuda_failed(t, "cudaEventCreateWithFlags",
                        cudaEventCreateWithFlags(&t->bucket_ready[b], cudaEventDisableTiming)))
            return 1;
    return 0;
}

/* Bucket ``b``'s backward kernels, then its all-reduce on the NCCL stream once they are done
 * on the GPU; the host does not wait. */
static int bucket(struct training *t, int b, int step)
{
    const struct rank_config *cfg = t->cfg;
    int kernels = 2 * cfg->kernels / cfg->buckets + (b < 2 * cfg->kernels % cfg->buckets);
    size_t share = t->elements / (size_t)cfg->buckets;
    size_t count = share + (b == cfg->buckets - 1 ? t->elements % (size_t)cfg->buckets : 0);
    if (launch_mix(t, &t->backward, kernels, t->stream)
        || cuda_failed(t, "cudaEventRecordWithFlags",
                       cudaEventRecordWithFlags(t->bucket_ready[b], t->stream,
                                                cudaEventRecordDefault))
        || cuda_failed(t, "cudaStreamWaitEvent",
                       cudaStreamWaitEvent(t->nccl_stream, t->bucket_ready[b], 0)))
        return 1;
    if (b == 0) {
        int64_t delay = rank_delay_ns(cfg, step, BEFORE_ALLREDUCE);
        jitter(t);
        if (delay > 0)
            sleep_for_ns(delay);
    }
    struct collective_call c = call_begin(t, "ncclAllReduce", count ? count : 1, -1, -1, step,
                                          &t->seq);
    c.result = ncclAllReduce(t->grads, t->reduced, c.count, cfg->datatype, ncclSum, t->comm,
                             t->nccl_stream);
    return call_end(t, &c);
}

/* loss.item(): the loss copied to the host and the compute stream synced. */
static int read_loss_item(struct training *t, int step)
{
    int64_t begin = now_ns();
    if (cuda_failed(t, "cudaMemcpyAsync", cudaMemcpyAsync(t->loss_host, t->loss_device,
                                                          sizeof(float),
                                                          cudaMemcpyDeviceToHost, t->stream))
        || cuda_failed(t, "cudaStreamSynchronize", cudaStreamSynchronize(t->stream)))
        return 1;
    t->sync_wait_ns[step] = now_ns() - begin;
    return 0;
}

int pytorch_step(struct training *t, int step)
{
    const struct rank_config *cfg = t->cfg;
    int warming = step - cfg->first_step;
    if (warming < WARM_UP_STEPS
        && cuda_failed(t, "cudaMalloc", cudaMalloc(&t->cached[warming],
                                                   cfg->allreduce_bytes + 1)))
        return 1;
    if (cuda_failed(t, "cudaMemcpyAsync",
                    cudaMemcpyAsync(t->p2p_in, t->loss_host, sizeof(float),
                                    cudaMemcpyHostToDevice, t->stream))
        || launch_mix(t, &t->forward, cfg->kernels, t->stream))
        return 1;
    for (int b = 0; b < cfg->buckets; b++)
        if (bucket(t, b, step))
            return 1;
    if (cuda_failed(t, "cudaEventRecordWithFlags",
                    cudaEventRecordWithFlags(t->all_reduced, t->nccl_stream,
                                             cudaEventRecordDefault))
        || cuda_failed(t, "cudaStreamWaitEvent",
                       cudaStreamWaitEvent(t->stream, t->all_reduced, 0))
        || launch_mix(t, &t->optimizer, 1, t->stream))
        return 1;
    return synced_step(cfg, step) ? read_loss_item(t, step) : 0;
}

void pytorch_tear_down(struct training *t)
{
    for (int i = 0; i < WARM_UP_STEPS; i++)
        if (t->cached[i])
            cudaFree(t->cached[i]);
    for (int b = 0; b < t->cfg->buckets; b++)
        if (t->bucket_ready[b])
            cudaEventDestroy(t->bucket_ready[b]);
    if (t->all_reduced)
        cudaEventDestroy(t->all_reduced);
    if (t->nccl_stream)
        cudaStreamDestroy(t->nccl_stream);
}
