/* NCCL: every collective a rank enters, on which communicator, with which sequence number.
 *
 * NCCL calls are asynchronous: they enqueue work on a CUDA stream and return. So only the
 * entry is probed (one trap per call); the wait shows up later in the sync that covers the
 * collective (see cudart.bpf.c), which is why each collective is remembered per stream.
 *
 * Communicators: ncclCommInitRank passes the 128-byte ncclUniqueId by value, so it lies on the
 * stack just above the return address, and `rank` is the third integer register argument.
 * The whole id is folded with splitmix64 into comm_hash, identical on every rank of the
 * communicator; the ncclComm_t written to *comm is read at return and mapped to it.
 */
#ifndef INGERO_COMMON
#include "common.bpf.c"
#endif

#define UNIQUE_ID_BYTES 128
#define NCCL_IN_PROGRESS 7
#define NCCL_SPLIT_NOCOLOR -1
#define UNIQUE_ID_WORDS (UNIQUE_ID_BYTES / 8)

struct comm_key {
    u32 tgid;
    u32 pad;
    u64 handle;      /* ncclComm_t, an address in the rank's process */
};

struct comm_info {
    u64 hash;
    u64 seq;         /* collectives issued so far on this communicator (not Send/Recv) */
    s32 rank;
    s32 nranks;
    u32 splits;      /* ncclCommSplit calls made on it so far */
    u32 exchanges;   /* groups of Send/Recv on it so far (see group_end) */
};

struct init_args {
    u64 ts;
    u64 comm_out;    /* ncclComm_t* the call fills in */
    u64 hash;
    u64 parent;      /* ncclCommSplit: the parent communicator's hash */
    s32 rank;
    s32 nranks;
    u32 op;
    s32 color;
    s32 key;         /* ncclCommSplit: orders the ranks of one colour */
    s32 parent_rank; /* ncclCommSplit: this rank in the parent, and the parent's size */
    s32 parent_nranks;
    u32 split;       /* ncclCommSplit: how many splits of the parent came before */
};

struct p2p_key {
    u32 tgid;
    u32 peer_dir;    /* the peer rank << 1, | 1 for a receive */
    u64 handle;      /* ncclComm_t */
};

/* (tgid, ncclComm_t) → what the communicator is. */
BPF_HASH(comms, struct comm_key, struct comm_info, MAX_COMMS);
/* (tgid, ncclComm_t, peer, direction) → Send or Recv calls so far with that peer. Send/Recv
 * match per peer pair, in order, and pipeline stages make different numbers of them, so they
 * keep their own sequence and never shift the collectives'. LRU: a destroyed communicator's
 * counters are not deleted one by one (BPF cannot list them), they age out. */
BPF_TABLE("lru_hash", struct p2p_key, u64, p2p_seqs, MAX_COMMS);
/* pid_tgid → arguments of an init call, between entry and return. */
BPF_HASH(inits, u64, struct init_args, MAX_INFLIGHT);
/* An ncclGroupStart … ncclGroupEnd of one thread: how deep, and its Send/Recv. */
struct group {
    u64 ts;          /* its first Send or Recv's entry */
    u64 handle;      /* the communicator of its Send/Recv */
    u64 count;       /* elements sent and received */
    u64 bytes;
    u64 stream;
    u32 depth;       /* ncclGroupStart nesting */
    u32 sends;
    u32 recvs;
    u32 mixed;       /* Send/Recv on more than one communicator */
    u32 datatype;    /* its first Send or Recv's */
    u32 pad;
};

/* pid_tgid → the group it is in. LRU: a thread that starts a group and never ends it (a
 * user's process may) leaves no entry that others' groups could not take the place of. */
BPF_TABLE("lru_hash", u64, struct group, groups, MAX_INFLIGHT);
struct unique_id {
    u64 words[UNIQUE_ID_WORDS];
};

/* [0] → scratch for the unique id (too big for the 512-byte BPF stack next to an event). */
BPF_PERCPU_ARRAY(id_scratch, struct unique_id, 1);

static __always_inline u64 splitmix64(u64 x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static __always_inline u64 hash_unique_id(u64 address)
{
    int zero = 0;
    struct unique_id *id = id_scratch.lookup(&zero);
    u64 hash = 0;
    if (!id)
        return 0;
    if (bpf_probe_read_user(id->words, UNIQUE_ID_BYTES, (void *)address) < 0)
        return 0;
#pragma unroll
    for (int i = 0; i < UNIQUE_ID_WORDS; i++)
        hash = splitmix64(hash ^ id->words[i]);
    return hash;
}

static __always_inline int remember(struct init_args *args)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_target(id >> 32))
        return 0;
    args->ts = bpf_ktime_get_ns();
    inits.update(&id, args);
    return 0;
}

static __always_inline int remember_init(u32 op, u64 comm_out, u64 hash, s32 rank, s32 nranks)
{
    struct init_args args = {.comm_out = comm_out, .hash = hash, .rank = rank,
                             .nranks = nranks, .op = op};
    return remember(&args);
}

/* ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) */
int nccl_comm_init_rank(struct pt_regs *ctx)
{
    u64 hash = hash_unique_id(PT_REGS_SP(ctx) + 8);
    return remember_init(OP_COMM_INIT_RANK, PT_REGS_PARM1(ctx), hash, (s32)PT_REGS_PARM3(ctx),
                         (s32)PT_REGS_PARM2(ctx));
}

/* ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
 *                        ncclConfig_t* config) */
int nccl_comm_init_rank_config(struct pt_regs *ctx)
{
    u64 hash = hash_unique_id(PT_REGS_SP(ctx) + 8);
    return remember_init(OP_COMM_INIT_RANK_CONFIG, PT_REGS_PARM1(ctx), hash,
                         (s32)PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM2(ctx));
}

/* ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
 *                          ncclUniqueId* commIds, ncclConfig_t* config): several roots' ids,
 * the same list on every rank (PyTorch over TORCH_NCCL_RANKS_PER_ROOT ranks); the first names
 * the communicator. */
int nccl_comm_init_rank_scalable(struct pt_regs *ctx)
{
    u64 hash = hash_unique_id(PT_REGS_PARM5(ctx));
    return remember_init(OP_COMM_INIT_RANK_SCALABLE, PT_REGS_PARM1(ctx), hash,
                         (s32)PT_REGS_PARM3(ctx), (s32)PT_REGS_PARM2(ctx));
}

/* ncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist): one process, ndev ranks.
 * The unique id stays inside NCCL; the first handle, with the process, names the group. */
int nccl_comm_init_all(struct pt_regs *ctx)
{
    return remember_init(OP_COMM_INIT_ALL, PT_REGS_PARM1(ctx), 0, 0, (s32)PT_REGS_PARM2(ctx));
}

/* ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config)
 * Ranks that pass the same color share the new communicator: hash the parent, the color and
 * how many splits the parent has made (every rank splits it in the same order), so that each
 * split, and each color of it, is a communicator of its own. The new communicator's rank and
 * size are NCCL's to decide (by key, then parent rank, among those of the colour): the event
 * carries what decides them, and fleetd, which hears every rank of the parent, works them out. */
static __always_inline int split_of(struct pt_regs *ctx, u32 op, s32 color, s32 key,
                                    u64 comm_out, s32 excluded)
{
    u64 id = bpf_get_current_pid_tgid();
    struct comm_key parent = {.tgid = id >> 32, .handle = PT_REGS_PARM1(ctx)};
    struct comm_info *info = comms.lookup(&parent);
    struct init_args args = {.comm_out = comm_out, .rank = -1, .nranks = -1, .op = op,
                             .color = color, .key = key, .parent_rank = -1,
                             .parent_nranks = -1};
    u64 colour = (u64)(s64)color;
    if (info) {
        args.hash = splitmix64(info->hash ^ colour ^ ((u64)info->splits << 32));
        args.parent = info->hash;
        args.parent_rank = info->rank;
        args.parent_nranks = info->nranks - excluded;
        args.split = info->splits++;
    } else {
        args.hash = splitmix64(parent.handle ^ colour);
    }
    return remember(&args);
}

int nccl_comm_split(struct pt_regs *ctx)
{
    return split_of(ctx, OP_COMM_SPLIT, (s32)PT_REGS_PARM2(ctx), (s32)PT_REGS_PARM3(ctx),
                    PT_REGS_PARM4(ctx), 0);
}

/* ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
 *                ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags): only the ranks
 * that stay call it, and NCCL numbers them in the parent's order: a split of one colour
 * among the parent's ranks less the excluded, which fleetd resolves as it resolves splits. */
int nccl_comm_shrink(struct pt_regs *ctx)
{
    s32 excluded = (s32)PT_REGS_PARM3(ctx);
    return split_of(ctx, OP_COMM_SHRINK, 0, 0, PT_REGS_PARM4(ctx), excluded > 0 ? excluded : 0);
}

static __always_inline void register_comm(struct init_args *args, u64 handle, s32 rank,
                                          s32 nranks, u64 hash)
{
    struct comm_key key = {.tgid = current_tgid(), .handle = handle};
    struct comm_info info = {.hash = hash, .rank = rank, .nranks = nranks};
    struct event ev = {};
    if (handle)                       /* NCCL_SPLIT_NOCOLOR: told, with no communicator */
        comms.update(&key, &info);
    fill_ids(&ev);
    ev.ts = args->ts;
    ev.duration = bpf_ktime_get_ns() - args->ts;
    ev.kind = EV_COMM_INIT;
    ev.op = args->op;
    ev.comm_hash = hash;
    ev.addr = handle;
    ev.rank = rank;
    ev.nranks = nranks;
    if (args->op == OP_COMM_SPLIT || args->op == OP_COMM_SHRINK) {  /* what decides the new
                                                                     * rank and size */
        ev.covered_ts = args->parent;
        ev.peer = args->color;
        ev.count = (u64)(s64)args->key;
        ev.redop = (u32)args->parent_rank;
        ev.result = args->parent_nranks;
        ev.datatype = args->split;
    }
    submit(&ev);
}

/* Return of any init call: read the handle(s) NCCL wrote and map them. A non-blocking init
 * returns ncclInProgress with the handle already written: its collectives come only once it
 * is done. A rank that split as NCCL_SPLIT_NOCOLOR gets no communicator, but its split is
 * still told, so that fleetd hears every rank of the parent and resolves the others'. */
int nccl_comm_init_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct init_args *args = inits.lookup(&id);
    u64 handle = 0;
    s64 rc = (s64)(s32)PT_REGS_RC(ctx);
    if (!args)
        return 0;
    if ((rc == 0 || rc == NCCL_IN_PROGRESS) && args->op == OP_COMM_SPLIT &&
        args->color == NCCL_SPLIT_NOCOLOR && args->parent_nranks > 0) {
        register_comm(args, 0, -1, -1, args->hash);
    } else if ((rc == 0 || rc == NCCL_IN_PROGRESS) &&
        bpf_probe_read_user(&handle, sizeof(handle), (void *)args->comm_out) == 0 && handle) {
        if (args->op == OP_COMM_INIT_ALL) {
            u64 hash = splitmix64(((u64)current_tgid() << 32) ^ handle);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                u64 h = 0;
                if (i >= args->nranks)
                    break;
                bpf_probe_read_user(&h, sizeof(h), (void *)(args->comm_out + 8 * i));
                if (h)
                    register_comm(args, h, i, args->nranks, hash);
            }
        } else {
            register_comm(args, handle, args->rank, args->nranks, args->hash);
        }
    }
    inits.delete(&id);
    return 0;
}

/* ncclCommDestroy(ncclComm_t comm), and ncclCommAbort(ncclComm_t comm): what a rank calls
 * when NCCL failed (an error, a timeout); rare, so probing it costs nothing in the step. */
static __always_inline int comm_gone(struct pt_regs *ctx, u32 op, int forget)
{
    struct comm_key key = {.tgid = current_tgid(), .handle = PT_REGS_PARM1(ctx)};
    struct comm_info *info = comms.lookup(&key);
    struct event ev = {};
    if (!info)
        return 0;
    fill_ids(&ev);
    ev.ts = bpf_ktime_get_ns();
    ev.kind = EV_COMM_DESTROY;
    ev.op = op;
    ev.comm_hash = info->hash;
    ev.seq = info->seq;
    ev.addr = key.handle;
    ev.rank = info->rank;
    ev.nranks = info->nranks;
    submit(&ev);
    if (forget)
        comms.delete(&key);
    return 0;
}

int nccl_comm_destroy(struct pt_regs *ctx)
{
    return comm_gone(ctx, OP_COMM_DESTROY, 1);
}

int nccl_comm_abort(struct pt_regs *ctx)
{
    return comm_gone(ctx, OP_COMM_ABORT, 1);
}

/* ncclCommFinalize(ncclComm_t comm): the job is done with the communicator (PyTorch's
 * destroy_process_group finalizes each, then destroys it); the mapping stays for the destroy. */
int nccl_comm_finalize(struct pt_regs *ctx)
{
    return comm_gone(ctx, OP_COMM_FINALIZE, 0);
}

int nccl_group_start(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct group *group, first = {.depth = 1};
    if (!is_target(id >> 32))
        return 0;
    group = groups.lookup(&id);
    if (group)
        group->depth++;
    else
        groups.update(&id, &first);
    return 0;
}

/* A Send or Recv (``ev``) issued inside ``group``. */
static __always_inline void join_group(struct group *group, struct event *ev)
{
    if (!group->handle) {
        group->handle = ev->addr;
        group->ts = ev->ts;
        group->stream = ev->stream;
        group->datatype = ev->datatype;
    } else if (group->handle != ev->addr) {
        group->mixed = 1;
    }
    if (ev->op == OP_SEND)
        group->sends++;
    else
        group->recvs++;
    group->count += ev->count;
    group->bytes += ev->bytes;
}

/* A finished group of Send/Recv on one communicator. Every such group counts in the
 * communicator's own sequence of them; one that sent to and received from every peer (each
 * but one at least: PyTorch skips a zero-size split, and counts the rank itself) is an
 * all-to-all with uneven splits, all_to_all_single as PyTorch makes it, and is told as one
 * entry at that number, every rank waiting on every other like a collective. A pipeline's
 * groups (a send to the next stage, a receive from the previous) are not, and a 2-rank
 * communicator's are never told: its pair windows judge it. A rank skipping more peers
 * than that in one exchange is absent from it, its later ones still in step. */
static __always_inline void exchange(u64 id, struct group *group)
{
    struct comm_key key = {.tgid = id >> 32, .handle = group->handle};
    struct comm_info *info = comms.lookup(&key);
    u64 seq;
    if (!info || info->nranks < 3)
        return;
    seq = info->exchanges++;
    if (group->sends + 1 < (u32)info->nranks || group->recvs + 1 < (u32)info->nranks)
        return;
    struct event ev = {.flags = EVF_IN_GROUP};
    fill_ids(&ev);
    ev.ts = group->ts;
    ev.kind = EV_COLLECTIVE;
    ev.op = OP_EXCHANGE;
    ev.count = group->count;
    ev.datatype = group->datatype;
    ev.bytes = group->bytes;
    ev.peer = -1;
    ev.stream = group->stream;
    ev.addr = group->handle;
    ev.comm_hash = info->hash;
    ev.seq = seq;
    ev.rank = info->rank;
    ev.nranks = info->nranks;
    submit(&ev);
}

int nccl_group_end(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct group *group = groups.lookup(&id), done;
    if (!group)
        return 0;
    if (group->depth > 1) {
        group->depth--;
        return 0;
    }
    done = *group;
    groups.delete(&id);
    if (done.handle && !done.mixed)
        exchange(id, &done);
    return 0;
}

static __always_inline u32 datatype_size(u32 datatype)
{
    switch (datatype) {
    case 0: case 1: case 10: case 11: return 1;   /* int8, uint8, fp8 e4m3, fp8 e5m2 */
    case 6: case 9: return 2;                     /* float16, bfloat16 */
    case 2: case 3: case 7: return 4;             /* int32, uint32, float32 */
    case 4: case 5: case 8: return 8;             /* int64, uint64, float64 */
    default: return 0;
    }
}

/* The next sequence number of Send/Recv calls between this rank and ``peer``. */
static __always_inline u64 p2p_next(u32 tgid, u64 handle, s32 peer, u32 op)
{
    struct p2p_key key = {.tgid = tgid, .handle = handle,
                          .peer_dir = ((u32)peer << 1) | (op == OP_RECV)};
    u64 zero = 0, *n = p2p_seqs.lookup_or_try_init(&key, &zero);
    return n ? __sync_fetch_and_add(n, 1) : 0;
}

/* A collective entered (or, ``flags`` EVF_GRAPH, run by a graph's replay): its communicator's
 * next sequence number, and the stream it is pending on. */
static __always_inline void emit_collective(u32 op, u64 count, u32 datatype, u32 redop,
                                            s32 peer, u64 handle, u64 stream, u32 flags)
{
    u64 id = bpf_get_current_pid_tgid();
    struct comm_key key = {.tgid = id >> 32, .handle = handle};
    struct comm_info *info;
    struct event ev = {.flags = flags};
    fill_ids(&ev);
    ev.ts = bpf_ktime_get_ns();
    ev.kind = EV_COLLECTIVE;
    ev.op = op;
    ev.count = count;
    ev.datatype = datatype;
    ev.bytes = count * datatype_size(datatype);
    ev.redop = redop;
    ev.peer = peer;
    ev.stream = stream;
    ev.addr = handle;
    ev.rank = -1;
    ev.nranks = -1;
    info = comms.lookup(&key);
    if (info) {
        ev.comm_hash = info->hash;
        ev.seq = (op == OP_SEND || op == OP_RECV) ? p2p_next(key.tgid, handle, peer, op)
                                                   : info->seq++;
        ev.rank = info->rank;
        ev.nranks = info->nranks;
    }
    struct group *group = groups.lookup(&id);
    if (group) {
        ev.flags |= EVF_IN_GROUP;
        if (op == OP_SEND || op == OP_RECV)
            join_group(group, &ev);
    }
    struct pending_collective pending = {.ts = ev.ts, .comm_hash = ev.comm_hash, .seq = ev.seq};
    struct stream_key skey = {.tgid = key.tgid, .stream = stream};
    pending_on_stream.update(&skey, &pending);
    pending_on_device.update(&key.tgid, &pending);
    submit(&ev);
}

/* The common part of every collective's entry. On a stream capturing a CUDA graph NCCL only
 * records the collective: it runs (and is numbered) at each replay (graph.bpf.c). */
static __always_inline int collective(struct pt_regs *ctx, u32 op, u64 count, u32 datatype,
                                      u32 redop, s32 peer, u64 handle, u64 stream)
{
    struct stream_key skey = {.tgid = current_tgid(), .stream = stream};
    struct capture *capture;
    u32 at;
    if (!is_target(skey.tgid))
        return 0;
    capture = captures.lookup(&skey);
    if (!capture) {
        emit_collective(op, count, datatype, redop, peer, handle, stream, 0);
        return 0;
    }
    at = capture->n;
    if (at < MAX_CAPTURED) {
        struct captured *c = &capture->colls[at];
        c->handle = handle;
        c->count = count;
        c->op = op;
        c->datatype = datatype;
        c->redop = redop;
        c->peer = peer;
    }
    capture->n = at + 1;
    return 0;
}

/* ncclAllReduce(send, recv, count, datatype, op, comm, stream) — stream is the 7th argument */
int nccl_all_reduce(struct pt_regs *ctx)
{
    return collective(ctx, OP_ALL_REDUCE, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx),
                      PT_REGS_PARM5(ctx), -1, PT_REGS_PARM6(ctx), stack_arg(ctx, 7));
}

/* ncclReduceScatter(send, recv, recvcount, datatype, op, comm, stream) */
int nccl_reduce_scatter(struct pt_regs *ctx)
{
    return collective(ctx, OP_REDUCE_SCATTER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx),
                      PT_REGS_PARM5(ctx), -1, PT_REGS_PARM6(ctx), stack_arg(ctx, 7));
}

/* ncclAllGather(send, recv, sendcount, datatype, comm, stream) */
int nccl_all_gather(struct pt_regs *ctx)
{
    return collective(ctx, OP_ALL_GATHER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, -1,
                      PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

/* ncclReduce(send, recv, count, datatype, op, root, comm, stream) — comm and stream on stack */
int nccl_reduce(struct pt_regs *ctx)
{
    return collective(ctx, OP_REDUCE, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx),
                      PT_REGS_PARM5(ctx), (s32)PT_REGS_PARM6(ctx), stack_arg(ctx, 7),
                      stack_arg(ctx, 8));
}

/* ncclBroadcast(send, recv, count, datatype, root, comm, stream) */
int nccl_broadcast(struct pt_regs *ctx)
{
    return collective(ctx, OP_BROADCAST, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0,
                      (s32)PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), stack_arg(ctx, 7));
}

/* ncclBcast(buff, count, datatype, root, comm, stream) */
int nccl_bcast(struct pt_regs *ctx)
{
    return collective(ctx, OP_BCAST, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), 0,
                      (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

/* ncclSend(send, count, datatype, peer, comm, stream) */
int nccl_send(struct pt_regs *ctx)
{
    return collective(ctx, OP_SEND, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), 0,
                      (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

/* ncclRecv(recv, count, datatype, peer, comm, stream) */
int nccl_recv(struct pt_regs *ctx)
{
    return collective(ctx, OP_RECV, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), 0,
                      (s32)PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

/* ncclAlltoAll(send, recv, count, datatype, comm, stream): count to and from each peer */
int nccl_all_to_all(struct pt_regs *ctx)
{
    return collective(ctx, OP_ALL_TO_ALL, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, -1,
                      PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx));
}

/* ncclGather(send, recv, count, datatype, root, comm, stream) */
int nccl_gather(struct pt_regs *ctx)
{
    return collective(ctx, OP_GATHER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0,
                      (s32)PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), stack_arg(ctx, 7));
}

/* ncclScatter(send, recv, count, datatype, root, comm, stream) */
int nccl_scatter(struct pt_regs *ctx)
{
    return collective(ctx, OP_SCATTER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0,
                      (s32)PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), stack_arg(ctx, 7));
}
