/*
 * ingero-sim-rank: a training loop over the sim libraries. Per step: host-side work (data
 * loading, CPU time), forward and backward kernels, an optional injected host delay, the
 * gradient all-reduce and any extra collectives, the optimizer kernel, then a host sync that
 * waits for it all; a temporary allocation and an occasional blocking copy, as real steps have.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cuda.h"
#include "cuda_runtime_api.h"
#include "ingero_sim.h"
#include "nccl.h"
#include "rank.h"
#include "rank_train.h"

#define UNIQUE_ID_POLL_NS 10000000LL


static double timeout_s(void)
{
    const char *text = getenv("INGERO_SIM_TIMEOUT_S");
    double value = text ? strtod(text, NULL) : 0;
    return value > 0 ? value : 60;
}

static int read_unique_id(const char *path, ncclUniqueId *id)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, id->internal, sizeof id->internal);
    close(fd);
    return n == (ssize_t)sizeof id->internal ? 0 : -1;
}

/* Rank 0 creates the id (atomically: write then rename), as a real job's rank 0 does. */
static int write_unique_id(const char *path, ncclUniqueId *id)
{
    if (ncclGetUniqueId(id) != ncclSuccess)
        return -1;
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.%d.tmp", path, (int)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    int ok = write(fd, id->internal, sizeof id->internal) == (ssize_t)sizeof id->internal;
    close(fd);
    return ok && rename(tmp, path) == 0 ? 0 : -1;
}

/* The id at ``path``: made by this rank where it is the id's root, else waited for. */
static int load_unique_id(struct training *t, const char *path, int root, ncclUniqueId *id)
{
    if (read_unique_id(path, id) == 0)
        return 0;
    if (root)
        return write_unique_id(path, id) == 0 ? 0 : cuda_failed(t, path, cudaErrorUnknown);
    int64_t deadline = now_ns() + (int64_t)(timeout_s() * 1e9);
    while (read_unique_id(path, id) != 0) {
        if (now_ns() > deadline) {
            snprintf(t->error, sizeof t->error, "no unique id appeared in %s", path);
            return 1;
        }
        sleep_for_ns(UNIQUE_ID_POLL_NS);
    }
    return 0;
}

static void plan_kernels(struct training *t)
{
    uint64_t step = (uint64_t)t->cfg->step_compute_ns;
    uint64_t k = (uint64_t)t->cfg->kernels;
    t->forward = (struct ingero_sim_kernel){ INGERO_SIM_KERNEL_MAGIC, step * 3 / 10 / k };
    t->backward = (struct ingero_sim_kernel){ INGERO_SIM_KERNEL_MAGIC, step * 6 / 10 / (2 * k) };
    t->optimizer = (struct ingero_sim_kernel){ INGERO_SIM_KERNEL_MAGIC, step / 10 };
}

/* The device, as a framework sets it up: driver init, device by local rank, a stream, buffers. */
static int set_up_device(struct training *t)
{
    const struct rank_config *cfg = t->cfg;
    CUdevice device;
    int count = 0;
    size_t bytes = cfg->allreduce_bytes ? cfg->allreduce_bytes : 1;
    if (cuInit(0) != CUDA_SUCCESS || cudaGetDeviceCount(&count) != cudaSuccess || count < 1)
        return cuda_failed(t, "cuInit/cudaGetDeviceCount", cudaErrorNoDevice);
    if (cuDeviceGet(&device, cfg->local_rank % count) != CUDA_SUCCESS)
        return cuda_failed(t, "cuDeviceGet", cudaErrorInvalidDevice);
    t->elements = cfg->allreduce_bytes / datatype_size(cfg->datatype);
    return cuda_failed(t, "cudaSetDevice", cudaSetDevice(device))
        || cuda_failed(t, "cudaStreamCreateWithFlags",
                       cudaStreamCreateWithFlags(&t->stream, cudaStreamNonBlocking))
        || cuda_failed(t, "cudaMalloc", cudaMalloc(&t->grads, bytes))
        || cuda_failed(t, "cudaMalloc", cudaMalloc(&t->reduced, bytes))
        || cuda_failed(t, "cudaMalloc", cudaMalloc(&t->gathered, bytes))
        || cuda_failed(t, "cudaMalloc", cudaMalloc(&t->p2p_out, bytes))
        || cuda_failed(t, "cudaMalloc", cudaMalloc(&t->p2p_in, bytes))
        || cuda_failed(t, "cudaMalloc", cudaMalloc(&t->loss_device, sizeof(float)))
        || cuda_failed(t, "cudaMallocHost", cudaMallocHost((void **)&t->loss_host, sizeof(float)));
}

/* ncclCommInitRankScalable, as PyTorch makes a group over TORCH_NCCL_RANKS_PER_ROOT ranks:
 * the first rank of each node makes a unique id, every rank reads them all. */
static int join_scalable(struct training *t, ncclConfig_t *config)
{
    const struct rank_config *cfg = t->cfg;
    int per_root = cfg->local_world_size > 0 ? cfg->local_world_size : 1;
    int roots = (cfg->world_size + per_root - 1) / per_root;
    ncclUniqueId *ids = calloc((size_t)roots, sizeof *ids);
    char path[4096];
    int failed = !ids;
    for (int i = 0; !failed && i < roots; i++) {
        snprintf(path, sizeof path, "%s.root%d", cfg->unique_id_path, i);
        failed = load_unique_id(t, path, cfg->rank == i * per_root, &ids[i]);
    }
    if (!failed) {
        t->comm_hash = ingero_sim_comm_id_hash(ids[0].internal);
        failed = nccl_failed(t, "ncclCommInitRankScalable",
                             ncclCommInitRankScalable(&t->comm, cfg->world_size, cfg->rank, roots,
                                                      ids, config));
    }
    free(ids);
    return failed;
}

/* A non-blocking init returns ncclInProgress; the rank polls until it is done. */
static int init_finished(struct training *t, ncclResult_t result)
{
    ncclResult_t state = result;
    while (state == ncclInProgress) {
        sleep_for_ns(UNIQUE_ID_POLL_NS / 10);
        if (nccl_failed(t, "ncclCommGetAsyncError", ncclCommGetAsyncError(t->comm, &state)))
            return 1;
    }
    return nccl_failed(t, "ncclCommInitRankConfig", state);
}

static int join_communicator(struct training *t)
{
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    ncclUniqueId id;
    if (t->cfg->nccl_init == INIT_SCALABLE)
        return join_scalable(t, &config);
    if (load_unique_id(t, t->cfg->unique_id_path, t->cfg->rank == 0, &id))
        return 1;
    t->comm_hash = ingero_sim_comm_id_hash(id.internal);
    config.blocking = t->cfg->nccl_init != INIT_NONBLOCKING;
    return init_finished(t, ncclCommInitRankConfig(&t->comm, t->cfg->world_size, id,
                                                   t->cfg->rank, &config));
}

/* One split of the world per --subgroup, in order, as PyTorch's new_group makes them: its
 * members pass the group's colour, everyone else NCCL_SPLIT_NOCOLOR. */
static int join_subgroups(struct training *t)
{
    for (int i = 0; i < t->cfg->subgroups; i++)
        if (group_split(t, &t->subgroups[i], t->cfg->in_subgroup[i] ? i : NCCL_SPLIT_NOCOLOR,
                        (uint32_t)i))
            return 1;
    return 0;
}

static int all_reduce(struct training *t, int step)
{
    struct collective_call c = call_begin(t, "ncclAllReduce", t->elements, -1, -1, step, &t->seq);
    c.result = ncclAllReduce(t->grads, t->reduced, t->elements, t->cfg->datatype, ncclSum, t->comm,
                             t->stream);
    return call_end(t, &c);
}

static size_t per_rank_elements(const struct training *t)
{
    size_t share = t->elements / (size_t)t->cfg->world_size;
    return share ? share : 1;
}

static int all_gather(struct training *t, int step)
{
    size_t count = per_rank_elements(t);
    struct collective_call c = call_begin(t, "ncclAllGather", count, -1, -1, step, &t->seq);
    c.result = ncclAllGather(t->grads, t->gathered, count, t->cfg->datatype, t->comm, t->stream);
    return call_end(t, &c);
}

static int reduce_scatter(struct training *t, int step)
{
    size_t count = per_rank_elements(t);
    struct collective_call c = call_begin(t, "ncclReduceScatter", count, -1, -1, step, &t->seq);
    c.result = ncclReduceScatter(t->grads, t->reduced, count, t->cfg->datatype, ncclSum, t->comm,
                                 t->stream);
    return call_end(t, &c);
}

static int broadcast(struct training *t, int step)
{
    int root = step % t->cfg->world_size;
    struct collective_call c = call_begin(t, "ncclBroadcast", t->elements, root, -1, step,
                                          &t->seq);
    c.result = ncclBroadcast(t->grads, t->reduced, t->elements, t->cfg->datatype, root, t->comm,
                             t->stream);
    return call_end(t, &c);
}

static int reduce(struct training *t, int step)
{
    int root = step % t->cfg->world_size;
    struct collective_call c = call_begin(t, "ncclReduce", t->elements, root, -1, step,
                                          &t->seq);
    c.result = ncclReduce(t->grads, t->reduced, t->elements, t->cfg->datatype, ncclSum, root,
                          t->comm, t->stream);
    return call_end(t, &c);
}

/* A ring exchange (pipeline-parallel style): send to the next rank, receive from the previous,
 * grouped so the two proceed together. */
static int send_recv(struct training *t, int step)
{
    int n = t->cfg->world_size, me = t->cfg->rank;
    size_t count = per_rank_elements(t);
    if (nccl_failed(t, "ncclGroupStart", ncclGroupStart()))
        return 1;
    struct collective_call send = call_begin(t, "ncclSend", count, -1, (me + 1) % n, step,
                                             &t->sent);
    send.result = ncclSend(t->p2p_out, count, t->cfg->datatype, send.peer, t->comm, t->stream);
    int failed = call_end(t, &send);
    struct collective_call recv = call_begin(t, "ncclRecv", count, -1, (me + n - 1) % n, step,
                                             &t->received);
    recv.result = ncclRecv(t->p2p_in, count, t->cfg->datatype, recv.peer, t->comm, t->stream);
    failed |= call_end(t, &recv);
    return nccl_failed(t, "ncclGroupEnd", ncclGroupEnd()) || failed;
}

/* A mixture-of-experts layer's two ncclAlltoAll, each an equal share to and from every rank:
 * tokens dispatched to their experts, and the experts' output combined back. */
static int all_to_all(struct training *t, int step)
{
    size_t count = per_rank_elements(t);
    for (int round = 0; round < 2; round++) {
        struct collective_call c = call_begin(t, "ncclAlltoAll", count, -1, -1, step, &t->seq);
        c.result = ncclAlltoAll(t->grads, t->gathered, count, t->cfg->datatype, t->comm,
                                t->stream);
        if (call_end(t, &c))
            return 1;
    }
    return 0;
}

/* all_to_all_single with uneven splits, as PyTorch does it: in one group, a send to and a
 * receive from every rank, itself included, of a share that differs by rank. */
static int all_to_all_v(struct training *t, int step)
{
    int n = t->cfg->world_size, me = t->cfg->rank, failed = 0;
    size_t share = per_rank_elements(t);
    int64_t delay = rank_delay_ns(t->cfg, step, BEFORE_ALLTOALLV);
    if (delay > 0)
        sleep_for_ns(delay);
    if (!t->a2a_sent && !(t->a2a_sent = calloc((size_t)n, sizeof *t->a2a_sent)))
        return nccl_failed(t, "alltoallv", ncclSystemError);
    if (!t->a2a_received && !(t->a2a_received = calloc((size_t)n, sizeof *t->a2a_received)))
        return nccl_failed(t, "alltoallv", ncclSystemError);
    if (nccl_failed(t, "ncclGroupStart", ncclGroupStart()))
        return 1;
    for (int peer = 0; peer < n; peer++) {
        size_t out = share / 2 + share * (size_t)((me + peer) % n) / (size_t)n + 1;
        size_t in = share / 2 + share * (size_t)((peer + me) % n) / (size_t)n + 1;
        struct collective_call send = call_begin(t, "ncclSend", out, -1, peer, step,
                                                 &t->a2a_sent[peer]);
        send.result = ncclSend(t->p2p_out, out, t->cfg->datatype, peer, t->comm, t->stream);
        failed |= call_end(t, &send);
        struct collective_call recv = call_begin(t, "ncclRecv", in, -1, peer, step,
                                                 &t->a2a_received[peer]);
        recv.result = ncclRecv(t->p2p_in, in, t->cfg->datatype, peer, t->comm, t->stream);
        failed |= call_end(t, &recv);
    }
    return nccl_failed(t, "ncclGroupEnd", ncclGroupEnd()) || failed;
}

/* Each subgroup the rank is in all-reduces its gradients' share among its members. */
static int subgroups(struct training *t, int step)
{
    int64_t delay = rank_delay_ns(t->cfg, step, BEFORE_SUBGROUP);
    if (delay > 0)
        sleep_for_ns(delay);
    for (int i = 0; i < t->cfg->subgroups; i++)
        if (t->subgroups[i].comm && group_all_reduce(t, &t->subgroups[i], per_rank_elements(t),
                                                     step))
            return 1;
    return 0;
}

static int communicate(struct training *t, int step)
{
    unsigned int extras = t->cfg->extras;
    return all_reduce(t, step) || subgroups(t, step)
        || ((extras & EXTRA_ALL_GATHER) && all_gather(t, step))
        || ((extras & EXTRA_REDUCE_SCATTER) && reduce_scatter(t, step))
        || ((extras & EXTRA_BROADCAST) && broadcast(t, step))
        || ((extras & EXTRA_REDUCE) && reduce(t, step))
        || ((extras & EXTRA_SEND_RECV) && send_recv(t, step))
        || ((extras & EXTRA_ALL_TO_ALL) && all_to_all(t, step))
        || ((extras & EXTRA_ALL_TO_ALLV) && all_to_all_v(t, step));
}

static int compute_and_communicate(struct training *t, int step)
{
    int64_t delay = rank_delay_ns(t->cfg, step, BEFORE_ALLREDUCE);
    if (launch(t, &t->forward, t->cfg->kernels) || read_loss(t, step)
        || launch(t, &t->backward, 2 * t->cfg->kernels))
        return 1;
    jitter(t);
    if (delay > 0)
        sleep_for_ns(delay);
    return communicate(t, step) || launch(t, &t->optimizer, 1);
}

/* The step's GPU work captured once as a CUDA graph (kernels and collectives; the loss read,
 * a sync, cannot be captured), then instantiated. */
static int capture_step(struct training *t, int step)
{
    cudaGraph_t graph = NULL;
    if (cuda_failed(t, "cudaStreamBeginCapture",
                    cudaStreamBeginCapture(t->stream, cudaStreamCaptureModeGlobal)))
        return 1;
    t->capturing = 1;
    int failed = launch(t, &t->forward, t->cfg->kernels)
        || launch(t, &t->backward, 2 * t->cfg->kernels) || communicate(t, step)
        || launch(t, &t->optimizer, 1);
    t->capturing = 0;
    failed |= cuda_failed(t, "cudaStreamEndCapture", cudaStreamEndCapture(t->stream, &graph));
    if (!failed)
        failed = cuda_failed(t, "cudaGraphInstantiate",
                             cudaGraphInstantiate(&t->graph, graph, 0));
    if (graph)
        cudaGraphDestroy(graph);
    return failed;
}

/* A graphed step: the host's delay, then one cudaGraphLaunch, which calls no launch and no
 * NCCL entry point, yet runs the step's kernels and collectives again. */
static int replay_step(struct training *t, int step)
{
    int64_t delay = rank_delay_ns(t->cfg, step, BEFORE_ALLREDUCE);
    if (!t->graph && capture_step(t, step))
        return 1;
    jitter(t);
    if (delay > 0)
        sleep_for_ns(delay);
    int64_t entry = now_ns();
    if (cuda_failed(t, "cudaGraphLaunch", cudaGraphLaunch(t->graph, t->stream)))
        return 1;
    t->runtime_launches += (uint64_t)(3 * t->cfg->kernels + 1);
    replayed(t, step, entry);
    return 0;
}

static int graphed(const struct rank_config *cfg, int step)
{
    return cfg->graphs_from >= 0 && step >= cfg->graphs_from;
}

static int run_step(struct training *t, int step)
{
    const struct rank_config *cfg = t->cfg;
    int64_t begin = now_ns();
    void *activations = NULL;
    int synced = synced_step(cfg, step);
    burn_cpu(cfg->host_work_ns);
    if (input_next(&t->input, step) != 0)
        return cuda_failed(t, "the data loader", cudaErrorUnknown);
    if (cfg->loop == LOOP_PYTORCH) {
        if (pytorch_step(t, step))
            return 1;
        t->step_ns[step] = now_ns() - begin;
        return 0;
    }
    if ((synced && cuda_failed(t, "cudaMalloc",
                               cudaMalloc(&activations, cfg->allreduce_bytes + 1)))
        || (graphed(cfg, step) ? replay_step(t, step)
            : cfg->tp * cfg->pp > 1 ? parallel_compute(t, step)
            : compute_and_communicate(t, step)))
        return 1;
    if (synced) {
        int64_t sync_begin = now_ns();
        if (cuda_failed(t, "cudaStreamSynchronize", cudaStreamSynchronize(t->stream)))
            return 1;
        t->sync_wait_ns[step] = now_ns() - sync_begin;
        if (cuda_failed(t, "cudaFree", cudaFree(activations)))
            return 1;
    }
    if (synced && cfg->memcpy_every && step % cfg->memcpy_every == cfg->memcpy_every - 1
        && cuda_failed(t, "cudaMemcpy", cudaMemcpy(t->loss_host, t->loss_device, sizeof(float),
                                                   cudaMemcpyDeviceToHost)))
        return 1;
    t->step_ns[step] = now_ns() - begin;
    return 0;
}

/* Injected faults act at the start of a step: a crash exits at once, a hang just stops; an
 * elastic restart leaves too (the launcher kills its workers), to be started again. */
static void inject_fault(const struct rank_config *cfg, int step)
{
    if (step == cfg->die_at)
        _exit(EXIT_INJECTED_DEATH);
    if (step == cfg->restart_at)
        _exit(EXIT_RESTART);
    if (step == cfg->hang_at)
        for (;;)
            pause();
}

static int train(struct training *t)
{
    for (int step = t->cfg->first_step; step < t->cfg->steps; step++) {
        inject_fault(t->cfg, step);
        if (run_step(t, step))
            return 1;
        t->steps_done = step + 1;
    }
    return 0;
}

static uint64_t network_namespace(void)
{
    struct stat st;
    return stat("/proc/self/ns/net", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static int finish(struct training *t, int failed, int64_t start_ns)
{
    struct rank_summary summary = {
        .steps_done = t->steps_done, .collectives = t->seq, .step_ns = t->step_ns,
        .sync_wait_ns = t->sync_wait_ns, .loss_sync_ns = t->loss_sync_ns,
        .loss_device_ns = t->loss_device_ns, .status = failed ? "error" : "ok", .error = t->error,
        .start_ns = start_ns, .end_ns = now_ns(), .net_ns = network_namespace(),
        .runtime_launches = t->runtime_launches, .driver_launches = t->driver_launches,
    };
    record_summary(t->record_fd, t->cfg, t->comm_hash, &summary);
    if (failed) {
        fprintf(stderr, "ingero-sim-rank %d: %s\n", t->cfg->rank, t->error);
        if (t->comm)
            ncclCommAbort(t->comm);
        return EXIT_GPU_ERROR;
    }
    if (t->cfg->loop == LOOP_PYTORCH)
        pytorch_tear_down(t);
    if (t->graph)
        cudaGraphExecDestroy(t->graph);
    ncclCommDestroy(t->comm);
    cudaStreamDestroy(t->stream);
    cudaFreeHost(t->loss_host);
    return EXIT_OK;
}

int main(int argc, char **argv)
{
    struct rank_config cfg;
    int status = rank_config_parse(&cfg, argc, argv);
    if (status)
        return status;
    struct training t = { .cfg = &cfg, .seed = (unsigned int)(getpid() ^ (cfg.rank * 7919)) };
    t.record_fd = record_open(cfg.record_path);
    t.step_ns = calloc((size_t)cfg.steps, sizeof *t.step_ns);
    t.sync_wait_ns = calloc((size_t)cfg.steps, sizeof *t.sync_wait_ns);
    t.loss_sync_ns = calloc((size_t)cfg.steps, sizeof *t.loss_sync_ns);
    t.loss_device_ns = calloc((size_t)cfg.steps, sizeof *t.loss_device_ns);
    if (t.record_fd < 0 || !t.step_ns || !t.sync_wait_ns || !t.loss_sync_ns
        || !t.loss_device_ns) {
        perror(cfg.record_path);
        return EXIT_USAGE;
    }
    int64_t start_ns = now_ns();
    plan_kernels(&t);
    if (input_open(&t.input, &cfg) != 0) {
        perror(cfg.input_path ? cfg.input_path : "--workers needs --input");
        return EXIT_USAGE;
    }
    int failed = set_up_device(&t) || join_communicator(&t) || join_subgroups(&t)
        || (cfg.loop == LOOP_PYTORCH && pytorch_set_up(&t))
        || (cfg.tp * cfg.pp > 1 && parallel_join(&t)) || train(&t);
    input_close(&t.input);
    return finish(&t, failed, start_ns);
}
