/* Shared by every ingero probe: the event record, the target filter, the maps that tie a
 * collective to the synchronisation that later waits for it.
 *
 * ingerod loads common.bpf.c, nccl.bpf.c, cuda.bpf.c, graph.bpf.c and host.bpf.c as ONE
 * program text, in that order, so that the probes share these maps: bcc rewrites map calls
 * (map.lookup(...)) only in the main source, never in an #included file. Each probe file
 * includes this one when compiled alone (for a syntax check); in the joined text the guard
 * skips it.
 */
#ifndef INGERO_COMMON
#define INGERO_COMMON

#include <uapi/linux/ptrace.h>

#ifndef MAX_TARGETS
#define MAX_TARGETS 4096        /* traced processes at once */
#endif
#ifndef MAX_COMMS
#define MAX_COMMS 16384         /* live NCCL communicators, all targets together */
#endif
#ifndef MAX_INFLIGHT
#define MAX_INFLIGHT 65536      /* calls between entry and return, allocations outstanding */
#endif
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 256       /* 1 MiB of events between two user-space polls */
#endif

enum event_kind {
    EV_COLLECTIVE = 1, EV_COMM_INIT = 2, EV_COMM_DESTROY = 3, EV_SYNC = 4,
    EV_ALLOC = 5, EV_FREE = 6, EV_MEMCPY = 7, EV_PROCESS_EXIT = 8,
};

/* Which function an event came from; user space holds the same table (ingerod/events.py). */
enum probe_op {
    OP_ALL_REDUCE = 1, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_REDUCE, OP_BROADCAST, OP_BCAST,
    OP_SEND, OP_RECV, OP_ALL_TO_ALL, OP_GATHER, OP_SCATTER, OP_EXCHANGE,
    OP_COMM_INIT_RANK = 20, OP_COMM_INIT_RANK_CONFIG, OP_COMM_INIT_ALL, OP_COMM_SPLIT,
    OP_COMM_DESTROY, OP_COMM_ABORT, OP_COMM_INIT_RANK_SCALABLE, OP_COMM_SHRINK,
    OP_COMM_FINALIZE,
    OP_STREAM_SYNC = 40, OP_EVENT_SYNC, OP_DEVICE_SYNC, OP_CTX_SYNC,
    OP_CUDA_MALLOC = 60, OP_CUDA_MALLOC_MANAGED, OP_CU_MEM_ALLOC, OP_CUDA_FREE, OP_CU_MEM_FREE,
    OP_MEMCPY = 80, OP_MEMCPY_ASYNC, OP_MEMCPY_2D, OP_MEMCPY_2D_ASYNC, OP_MEMCPY_PEER,
    OP_MEMCPY_PEER_ASYNC,
};

/* One record in the ring buffer. Fields a kind does not use are zero. */
struct event {
    u64 ts;          /* bpf_ktime_get_ns() at entry (CLOCK_MONOTONIC) */
    u64 duration;    /* entry to return, for the calls probed at both ends */
    u64 comm_hash;   /* splitmix64 fold of the communicator's 128-byte unique id */
    u64 seq;         /* per-communicator collective sequence number */
    u64 count;       /* elements (collectives) */
    u64 bytes;       /* count × datatype size; allocation or copy size */
    u64 stream;      /* cudaStream_t as an address */
    u64 addr;        /* allocation address; communicator handle */
    u64 covered_ts;  /* sync: entry time of the collective it waited for, else 0 */
    u32 pid;         /* thread group id */
    u32 tid;
    u32 kind;        /* enum event_kind */
    u32 op;          /* enum probe_op */
    s32 rank;
    s32 nranks;
    s32 peer;        /* send/recv peer, reduce/broadcast root, else -1 */
    u32 datatype;
    u32 redop;
    s32 result;      /* return code where the return is probed; a process's exit code */
    u32 flags;       /* EVF_* */
    u32 pad;
};

#define EVF_IN_GROUP   1   /* collective issued between ncclGroupStart and ncclGroupEnd */
#define EVF_PEER_WAIT  2   /* sync covered a collective: waiting on peers, not own work */
#define EVF_GRAPH      4   /* collective run by a CUDA graph's replay (captured before) */

/* Two filters. A process that calls a probed function is recorded from its very first call
 * unless user space has excluded it (it belongs to another job); the host tracepoints, which
 * fire for every task on the machine, follow only the processes user space has found.
 * tgid → 1 for each, kept in step with /proc by user space. */
BPF_HASH(excluded, u32, u32, MAX_TARGETS);
BPF_HASH(targets, u32, u32, MAX_TARGETS);

/* Everything user space reads per event. */
BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

/* [0] → events that did not fit in the ring buffer. */
BPF_PERCPU_ARRAY(lost, u64, 1);

/* For the uprobes: a caller of CUDA or NCCL, not excluded. */
static __always_inline int is_target(u32 tgid)
{
    return excluded.lookup(&tgid) == NULL;
}

/* For the host tracepoints: a process user space has found and follows. */
static __always_inline int is_followed(u32 tgid)
{
    return targets.lookup(&tgid) != NULL;
}

static __always_inline u32 current_tgid(void)
{
    return bpf_get_current_pid_tgid() >> 32;
}

static __always_inline void fill_ids(struct event *ev)
{
    u64 id = bpf_get_current_pid_tgid();
    ev->pid = id >> 32;
    ev->tid = (u32)id;
    ev->peer = -1;
}

static __always_inline void submit(struct event *ev)
{
    if (events.ringbuf_output(ev, sizeof(*ev), 0) < 0) {
        int zero = 0;
        u64 *n = lost.lookup(&zero);
        if (n)
            (*n)++;
    }
}

/* The x86-64 SysV stack argument N (7, 8, ...) at function entry: after the return address. */
static __always_inline u64 stack_arg(struct pt_regs *ctx, int n)
{
    u64 value = 0;
    bpf_probe_read_user(&value, sizeof(value), (void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
    return value;
}

/* What a sync may turn out to be waiting for: the latest collective on a stream. */
struct stream_key {
    u32 tgid;
    u32 pad;
    u64 stream;
};

struct pending_collective {
    u64 ts;
    u64 comm_hash;
    u64 seq;
};

/* (tgid, stream) → latest collective enqueued on that stream and not yet waited for. */
BPF_HASH(pending_on_stream, struct stream_key, struct pending_collective, MAX_INFLIGHT);
/* tgid → latest collective on any stream, for device-wide syncs. */
BPF_HASH(pending_on_device, u32, struct pending_collective, MAX_TARGETS);

/* CUDA graphs (graph.bpf.c): what a capture on a stream recorded, its collectives run anew at
 * each replay and its launches counted then. */
#define MAX_CAPTURED 16

struct captured {
    u64 handle;      /* ncclComm_t */
    u64 count;
    u32 op;
    u32 datatype;
    u32 redop;
    s32 peer;
};

struct capture {
    u32 n;           /* collectives captured (the first MAX_CAPTURED kept) */
    u32 launches;    /* kernel launches captured */
    struct captured colls[MAX_CAPTURED];
};

/* (tgid, stream) → the capture under way on that stream. */
BPF_TABLE("lru_hash", struct stream_key, struct capture, captures, MAX_TARGETS);
/* pid_tgid → the stream the thread is capturing on: its launches are captured, not run. */
BPF_TABLE("lru_hash", u64, u64, capturing_thread, MAX_TARGETS);

#endif /* INGERO_COMMON */
