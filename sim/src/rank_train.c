/*
 * The calls a rank's training makes, shared by its training loop (rank.c), its tensor-,
 * pipeline- and data-parallel variant (rank_parallel.c) and its input pipeline
 * (rank_input.c): clocks and host work, CUDA and NCCL error reporting, the record of each
 * collective, kernel launches, the loss read and the synced steps. It calls none of them.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cuda_runtime_api.h"
#include "ingero_sim.h"
#include "nccl.h"
#include "rank.h"
#include "rank_train.h"

int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

void sleep_for_ns(int64_t ns)
{
    struct timespec left = { .tv_sec = ns / 1000000000LL, .tv_nsec = ns % 1000000000LL };
    while (nanosleep(&left, &left) != 0 && errno == EINTR)
        ;
}

static int64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* Burn CPU time, not wall time: a contended CPU stretches this step's host work. */
void burn_cpu(int64_t cpu_ns)
{
    volatile uint64_t sink = 0;
    int64_t until = thread_cpu_ns() + cpu_ns;
    while (thread_cpu_ns() < until)
        for (int i = 0; i < 1000; i++)
            sink += (uint64_t)i;
}

int cuda_failed(struct training *t, const char *call, cudaError_t err)
{
    if (err == cudaSuccess)
        return 0;
    snprintf(t->error, sizeof t->error, "%s: %s", call, cudaGetErrorString(err));
    return 1;
}

int nccl_failed(struct training *t, const char *call, ncclResult_t result)
{
    if (result == ncclSuccess)
        return 0;
    snprintf(t->error, sizeof t->error, "%s: %s", call, ncclGetErrorString(result));
    return 1;
}

/* A call about to be made; ``counter`` numbers it: the communicator's collectives, or the
 * Send/Recv calls with one peer (they match per peer pair, and keep their own order). */
struct collective_call call_begin(struct training *t, const char *op, size_t count,
                                         int root, int peer, int step, uint64_t *counter)
{
    return (struct collective_call){
        .op = op, .count = count, .datatype = t->cfg->datatype, .root = root, .peer = peer,
        .seq = (*counter)++, .counter = counter, .step = step, .entry_ns = now_ns(),
        .comm_hash = t->comm_hash,
    };
}

/* A call made: recorded; or, captured in a graph, kept to be numbered and recorded at each
 * replay (a captured collective runs only then). */
int call_end(struct training *t, struct collective_call *call)
{
    call->return_ns = now_ns();
    if (t->capturing && call->result == ncclSuccess) {
        (*call->counter)--;
        if (t->ncaptured == MAX_CAPTURED)
            return nccl_failed(t, "graph capture (more than 32 collectives)", ncclInvalidUsage);
        t->captured[t->ncaptured++] = *call;
        return 0;
    }
    record_collective(t->record_fd, t->cfg, call->comm_hash, call);
    return nccl_failed(t, call->op, call->result);
}

/* The collectives of a graph replayed at ``entry``: each numbered anew, and recorded. */
void replayed(struct training *t, int step, int64_t entry)
{
    int64_t back = now_ns();
    for (int i = 0; i < t->ncaptured; i++) {
        struct collective_call call = t->captured[i];
        call.seq = (*call.counter)++;
        call.step = step;
        call.entry_ns = entry;
        call.return_ns = back;
        record_collective(t->record_fd, t->cfg, call.comm_hash, &call);
    }
}

int launch(struct training *t, const struct ingero_sim_kernel *kernel, int times)
{
    dim3 grid = { 132, 1, 1 }, block = { 256, 1, 1 };
    for (int i = 0; i < times; i++)
        if (cuda_failed(t, "cudaLaunchKernel",
                        cudaLaunchKernel(kernel, grid, block, NULL, 0, t->stream)))
            return 1;
    if (!t->capturing)               /* captured: they run, and count, at each replay */
        t->runtime_launches += (uint64_t)times;
    return 0;
}

/* The sim's own word for when the device finishes a stream's work (looked up, not linked:
 * the rank runs on NVIDIA's libcudart too, which has no such thing). */
static int64_t stream_done_ns(cudaStream_t stream)
{
    static int64_t (*done)(cudaStream_t);
    static int looked;
    if (!looked) {
        done = (int64_t (*)(cudaStream_t))dlsym(RTLD_DEFAULT, "ingero_sim_stream_done_ns");
        looked = 1;
    }
    return done ? done(stream) : -1;
}

/* The loss read after the forward pass, as loss.item() does: a sync that covers only the rank's
 * own kernels (self-work), so a slow GPU shows in it. */
int read_loss(struct training *t, int step)
{
    int every = t->cfg->loss_every;
    if (!every || step % every || !synced_step(t->cfg, step))
        return 0;
    int64_t entry = now_ns();
    if (cuda_failed(t, "cudaStreamSynchronize", cudaStreamSynchronize(t->stream)))
        return 1;
    int64_t back = now_ns(), done = stream_done_ns(t->stream);
    t->loss_sync_ns[step] = back - entry;
    t->loss_device_ns[step] = done < 0 ? -1 : done > entry ? done - entry : 0;
    return 0;
}

/* Host time that varies from step to step (Python, the data loader): uniform in [0, jitter]. */
void jitter(struct training *t)
{
    if (t->cfg->jitter_ns > 0)
        sleep_for_ns((int64_t)((double)rand_r(&t->seed) / RAND_MAX * (double)t->cfg->jitter_ns));
}

/* Whether the host waits for its GPU at the end of this step: every step, or only every
 * --sync-every steps (PyTorch syncs only on .item(), a blocking copy or the allocator: between
 * those the host enqueues steps ahead of its GPU). The allocation, the loss read and the
 * blocking copy of a step are syncs too, so they come only with it. */
int synced_step(const struct rank_config *cfg, int step)
{
    return cfg->sync_every <= 1 || step % cfg->sync_every == cfg->sync_every - 1
        || step == cfg->steps - 1;
}

/* How ingerod hashes a split (nccl.bpf.c): the parent's hash, the colour, the split count. */
static uint64_t split_hash(uint64_t parent, int color, uint32_t split)
{
    return ingero_sim_splitmix64(parent ^ (uint64_t)(int64_t)color ^ ((uint64_t)split << 32));
}

/* The world's ``split``-th split, as ``color`` (NCCL_SPLIT_NOCOLOR: no communicator for this
 * rank, as for ranks outside a PyTorch new_group), keyed by world rank. */
int group_split(struct training *t, struct group *g, int color, uint32_t split)
{
    g->hash = split_hash(t->comm_hash, color, split);
    if (nccl_failed(t, "ncclCommSplit",
                    ncclCommSplit(t->comm, color, t->cfg->rank, &g->comm, NULL)))
        return 1;
    if (color == NCCL_SPLIT_NOCOLOR)
        return g->comm ? nccl_failed(t, "ncclCommSplit (NOCOLOR)", ncclInternalError) : 0;
    return nccl_failed(t, "ncclCommUserRank", ncclCommUserRank(g->comm, &g->rank))
        || nccl_failed(t, "ncclCommCount", ncclCommCount(g->comm, &g->size));
}

int group_all_reduce(struct training *t, struct group *g, size_t count, int step)
{
    struct collective_call c = call_begin(t, "ncclAllReduce", count, -1, -1, step, &g->seq);
    c.comm_hash = g->hash;
    c.result = ncclAllReduce(t->grads, t->reduced, count, t->cfg->datatype, ncclSum, g->comm,
                             t->stream);
    return call_end(t, &c);
}
