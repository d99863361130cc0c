/*
 * Collectives and point-to-point transfers: their cost model, grouping, and the callbacks the
 * device thread uses to publish a part's arrival and learn when its peers arrived.
 *
 * Transfer time after the last rank arrives (B bytes, n ranks, bw = INGERO_SIM_NET_GBPS,
 * α = INGERO_SIM_NET_LATENCY_US per ring step), as for NCCL's ring algorithms:
 *   AllReduce           2(n−1)/n · B/bw + 2(n−1)α      (reduce-scatter then all-gather)
 *   AllGather, ReduceScatter, AlltoAll, Gather, Scatter
 *                       (n−1) · b/bw + (n−1)α          (b = the per-rank chunk)
 *   Broadcast, Reduce   B/bw + (n−1)α                  (pipelined ring)
 *   Send/Recv           B/bw + α
 */
#include <pthread.h>
#include <stdlib.h>

#include "nccl_internal.h"
#include "simcommon.h"
#include "vgpu.h"

struct nccl_part {
    struct ncclComm *comm;
    struct rdv_key key;
    int64_t transfer_ns;
    enum nccl_op op;          /* what it does, to make it anew at each graph replay */
    size_t bytes;
    int peer;
    int template;             /* captured in a graph: never run, only renewed */
};

struct grouped_part {
    cudaStream_t stream;
    struct nccl_part *part;
};

/* ncclGroupStart/End nest per host thread; grouped parts are queued together at the end. */
static __thread int group_depth;
static __thread struct grouped_part *grouped;
static __thread int grouped_count, grouped_capacity;

size_t datatype_bytes(ncclDataType_t datatype)
{
    switch (datatype) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static struct {
    double bytes_per_ns;      /* INGERO_SIM_NET_GBPS: GB/s is bytes per ns */
    double step_latency_ns;   /* INGERO_SIM_NET_LATENCY_US */
} net;

static pthread_once_t net_once = PTHREAD_ONCE_INIT;

static void read_net_knobs(void)
{
    net.bytes_per_ns = sim_knob("INGERO_SIM_NET_GBPS", 10, 0.001);
    net.step_latency_ns = sim_knob("INGERO_SIM_NET_LATENCY_US", 5, 0) * NS_PER_US;
}

static int64_t transfer_ns(enum nccl_op op, size_t bytes, int nranks)
{
    pthread_once(&net_once, read_net_knobs);
    double n = nranks, b = (double)bytes, bw = net.bytes_per_ns, alpha = net.step_latency_ns;
    if (nranks == 1 && op != OP_SEND && op != OP_RECV)
        return 0;
    switch (op) {
    case OP_ALL_REDUCE: return (int64_t)(2 * (n - 1) / n * b / bw + 2 * (n - 1) * alpha);
    case OP_ALL_GATHER:
    case OP_REDUCE_SCATTER:
    case OP_ALL_TO_ALL:
    case OP_GATHER:
    case OP_SCATTER: return (int64_t)((n - 1) * b / bw + (n - 1) * alpha);
    case OP_REDUCE:
    case OP_BROADCAST: return (int64_t)(b / bw + (n - 1) * alpha);
    case OP_SEND:
    case OP_RECV: return (int64_t)(b / bw + alpha);
    }
    return 0;
}

static int part_publish(void *arg, int64_t arrival_ns)
{
    struct nccl_part *part = arg;
    return rdv_publish(part->comm->rdv, &part->key, arrival_ns, 0);
}

static int part_poll(void *arg, int64_t *end_ns)
{
    struct nccl_part *part = arg;
    if (atomic_load(&part->comm->aborted))
        return INGERO_SIM_FAILED;
    int64_t last_arrival = 0;
    int status = rdv_poll(part->comm->rdv, &part->key, &last_arrival, NULL);
    if (status == RDV_DONE)
        *end_ns = last_arrival + part->transfer_ns;
    return status == RDV_DONE ? INGERO_SIM_DONE
           : status == RDV_FAILED ? INGERO_SIM_FAILED : INGERO_SIM_PENDING;
}

static void part_discard(void *arg)
{
    free(arg);
}

static void part_finish(void *arg, int failed)
{
    struct nccl_part *part = arg;
    if (part->template) {
        part_discard(part);
        return;
    }
    rdv_forget(part->comm->rdv, &part->key);
    comm_part_finished(part->comm, failed);
    free(part);
}

static void *part_renew(void *arg);

static const struct ingero_sim_remote_ops part_ops = {
    .publish = part_publish,
    .poll = part_poll,
    .finish = part_finish,
    .renew = part_renew,
    .discard = part_discard,
};

/* Name the operation in the rendezvous: collectives by sequence, transfers per peer pair. */
static struct rdv_key key_for(enum nccl_op op, struct ncclComm *comm, int peer)
{
    struct rdv_key key = { .kind = RDV_COLLECTIVE };
    if (op == OP_SEND) {
        key = (struct rdv_key){ RDV_P2P, RDV_SENDER, comm->rank, peer, comm->sent[peer]++ };
    } else if (op == OP_RECV) {
        key = (struct rdv_key){ RDV_P2P, RDV_RECEIVER, peer, comm->rank, comm->received[peer]++ };
    } else {
        key.seq = comm->next_collective++;
    }
    return key;
}

static ncclResult_t enqueue_parts(cudaStream_t stream, struct nccl_part **parts, int nparts)
{
    cudaError_t err = ingero_sim_enqueue_remote(stream, &part_ops, (void *const *)parts, nparts);
    if (err == cudaSuccess)
        return ncclSuccess;
    for (int i = 0; i < nparts; i++)
        part_finish(parts[i], 0);
    return err == cudaErrorInvalidResourceHandle ? ncclInvalidArgument : ncclUnhandledCudaError;
}

static ncclResult_t remember_grouped(cudaStream_t stream, struct nccl_part *part)
{
    if (grouped_count == grouped_capacity) {
        int capacity = grouped_capacity ? 2 * grouped_capacity : 16;
        struct grouped_part *bigger = realloc(grouped, (size_t)capacity * sizeof *bigger);
        if (!bigger)
            return ncclSystemError;
        grouped = bigger;
        grouped_capacity = capacity;
    }
    grouped[grouped_count++] = (struct grouped_part){ stream, part };
    return ncclSuccess;
}

/* A part to run (its rendezvous key the communicator's next), or, on a capturing stream, a
 * template the graph keeps and renews at each replay (no key: it never runs itself). */
static struct nccl_part *new_part(enum nccl_op op, struct ncclComm *comm, size_t bytes,
                                  int peer, int template)
{
    struct nccl_part *part = calloc(1, sizeof *part);
    if (!part)
        return NULL;
    *part = (struct nccl_part){ .comm = comm, .op = op, .bytes = bytes, .peer = peer,
                                .template = template };
    if (!template) {
        part->key = key_for(op, comm, peer);
        part->transfer_ns = transfer_ns(op, bytes, comm->nranks);
        comm_part_added(comm);
    }
    return part;
}

/* A graph replay's part, like its captured template: as NCCL runs a captured collective
 * anew at each replay, with the communicator's next sequence. */
static void *part_renew(void *arg)
{
    const struct nccl_part *template = arg;
    return new_part(template->op, template->comm, template->bytes, template->peer, 0);
}

ncclResult_t op_submit(enum nccl_op op, struct ncclComm *comm, size_t bytes, int peer,
                       cudaStream_t stream)
{
    struct nccl_part *part = new_part(op, comm, bytes, peer,
                                      ingero_sim_stream_capturing(stream));
    if (!part)
        return ncclSystemError;
    ncclResult_t result = group_depth ? remember_grouped(stream, part)
                                      : enqueue_parts(stream, &part, 1);
    if (group_depth && result != ncclSuccess)
        part_finish(part, 0);
    return result;
}

ncclResult_t group_start(void)
{
    group_depth++;
    return ncclSuccess;
}

/* Take the grouped parts queued on `stream` out of the group, in call order. */
static int take_stream_parts(cudaStream_t stream, struct nccl_part **parts)
{
    int nparts = 0;
    for (int i = 0; i < grouped_count; i++)
        if (grouped[i].part && grouped[i].stream == stream) {
            parts[nparts++] = grouped[i].part;
            grouped[i].part = NULL;
        }
    return nparts;
}

/* The grouped parts of each stream become one item, so a send and a receive between the same
 * two ranks proceed together instead of waiting on each other. */
static ncclResult_t flush_group(void)
{
    ncclResult_t result = ncclSuccess;
    struct nccl_part **parts = calloc((size_t)grouped_count + 1, sizeof *parts);
    for (int i = 0; i < grouped_count; i++) {
        if (!grouped[i].part)
            continue;
        if (!parts) {
            part_finish(grouped[i].part, 0);
            result = ncclSystemError;
            continue;
        }
        int nparts = take_stream_parts(grouped[i].stream, parts);
        ncclResult_t r = enqueue_parts(grouped[i].stream, parts, nparts);
        if (result == ncclSuccess)
            result = r;
    }
    free(parts);
    grouped_count = 0;
    return result;
}

ncclResult_t group_end(void)
{
    if (group_depth == 0)
        return ncclInvalidUsage;
    if (--group_depth > 0)
        return ncclSuccess;
    return flush_group();
}
