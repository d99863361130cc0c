/* CUDA runtime and driver: how often a rank launches work, how long it waits and for what,
 * how much it copies and allocates. The driver calls (cuLaunchKernel, cuCtxSynchronize,
 * cuMemAlloc_v2, cuMemFree_v2) share the runtime handlers below.
 *
 * Cost discipline (a uprobe trap costs microseconds): kernel launches and asynchronous copies
 * (PyTorch's loop makes ~120 a step) are only counted in kernel maps, never sent per call, and
 * on entry only; syncs, blocking copies and allocations are probed at entry and return for
 * their duration.
 *
 * Waiting is not working: a sync that covers a collective enqueued on its stream (or, for a
 * device-wide sync, on any stream) is flagged EVF_PEER_WAIT — the rank is waiting for its
 * peers; a sync that covers only its own kernels is self-work.
 */
#ifndef INGERO_COMMON
#include "common.bpf.c"
#endif

struct call_start {
    u64 ts;
    u64 stream;      /* syncs: the stream (0 for device-wide); allocations: the out pointer */
    u64 size;
    u32 op;
    u32 kind;        /* memcpy direction */
    u64 waited;      /* how long the thread, runnable, waited for a CPU since it was last
                      * woken in the call (host.bpf.c's sched_switch keeps it) */
    u32 slept;       /* it slept in the call: woken, it was done waiting for its GPU */
    u32 pad;
};

/* tgid → kernel launches counted in the kernel, each once: see launch_entry. */
BPF_HASH(launches, u32, u64, MAX_TARGETS);

struct copy_key {
    u32 tgid;
    u16 op;          /* OP_MEMCPY_ASYNC, OP_MEMCPY_2D_ASYNC, OP_MEMCPY_PEER_ASYNC */
    u16 kind;        /* cudaMemcpyKind */
};

struct copy_count {
    u64 calls;
    u64 bytes;
};

/* (tgid, call, direction) → asynchronous copies enqueued since user space last took them. */
BPF_HASH(async_copies, struct copy_key, struct copy_count, MAX_INFLIGHT);
/* tgid → the executable mappings of the CUDA runtime's and driver's files in the process
 * (user space reads them from /proc/PID/maps when it finds the process). */
#define CUDA_TEXTS 8     /* a process may map several runtimes (torch's, cupy's …) */
struct cuda_text {
    u64 start[CUDA_TEXTS];
    u64 end[CUDA_TEXTS];
};
BPF_HASH(cuda_text, u32, struct cuda_text, MAX_TARGETS);
/* pid_tgid → a runtime launch not yet seen to enter the driver, for a process whose mappings
 * user space has not read yet. */
BPF_TABLE("lru_hash", u64, u32, launching, MAX_TARGETS);
/* pid_tgid → a call between its entry and its return. */
BPF_HASH(calls, u64, struct call_start, MAX_INFLIGHT);
/* (tgid, cudaEvent_t) → the stream the event was last recorded on. LRU: events are pooled
 * and reused, and their destruction is not probed. */
BPF_TABLE("lru_hash", struct stream_key, u64, event_streams, MAX_INFLIGHT);
/* (tgid, cudaEvent_t) → the collective the event's stream had pending when it was recorded:
 * a stream made to wait on the event then waits on that collective too. */
BPF_TABLE("lru_hash", struct stream_key, struct pending_collective, event_pending, MAX_INFLIGHT);
/* (tgid, device address) → bytes, for the allocations still outstanding. */
BPF_HASH(allocations, struct stream_key, u64, MAX_INFLIGHT);

/* Where the function probed will return to: its caller. */
static __always_inline u64 return_address(struct pt_regs *ctx)
{
    u64 back = 0;
#if defined(bpf_target_x86)
    bpf_probe_read_user(&back, sizeof(back), (void *)PT_REGS_SP(ctx));   /* pushed by call */
#else
    back = PT_REGS_RET(ctx);                                              /* the link register */
#endif
    return back;
}

/* A launch is counted once, at its outermost call. CUDA 13's runtime enters the driver's
 * exported cuLaunchKernel for every cudaLaunchKernel (REAL-GPU.md: 792 = 792 a step), while
 * cuBLAS and Triton call the driver themselves: a launch entry called from CUDA's own code
 * (the runtime's or the driver's files) is inside a launch counted already. Telling which
 * takes the caller's address against those files' mappings, not a return probe (a second trap
 * a launch). Until user space has read the mappings (a process's first seconds), a mark the
 * thread's runtime launch leaves stands in: exact where the runtime enters the driver; where
 * it does not, one direct driver launch after it may go uncounted. */
static __always_inline int outermost(struct pt_regs *ctx, u64 id, int runtime)
{
    u64 back;
    u32 tgid = id >> 32, mark = 1;
    struct cuda_text *text = cuda_text.lookup(&tgid);
    int nested = 0;
    if (text) {
        back = return_address(ctx);
#pragma unroll
        for (int i = 0; i < CUDA_TEXTS; i++)
            nested |= back >= text->start[i] && back < text->end[i];
    } else if (runtime) {
        launching.update(&id, &mark);
    } else {
        nested = launching.lookup(&id) != NULL;
        launching.delete(&id);
    }
    return !nested;
}

static __always_inline void count_launches(u32 tgid, u64 count)
{
    u64 *n = launches.lookup(&tgid);
    if (n)
        __sync_fetch_and_add(n, count);
    else
        launches.update(&tgid, &count);
}

/* A launch on a thread capturing a CUDA graph is recorded in the capture, not run: it is
 * counted at each replay (graph.bpf.c). */
static __always_inline int launch_entry(struct pt_regs *ctx, int runtime)
{
    u64 id = bpf_get_current_pid_tgid(), *on;
    u32 tgid = id >> 32;
    if (!is_target(tgid) || !outermost(ctx, id, runtime))
        return 0;
    on = capturing_thread.lookup(&id);
    if (on) {
        struct stream_key key = {.tgid = tgid, .stream = *on};
        struct capture *capture = captures.lookup(&key);
        if (capture) {
            capture->launches++;
            return 0;
        }
    }
    count_launches(tgid, 1);
    return 0;
}

/* cudaLaunchKernel(func, gridDim, blockDim, args, sharedMem, stream),
 * cudaLaunchKernelExC(config, func, args) */
int runtime_launch(struct pt_regs *ctx)
{
    return launch_entry(ctx, 1);
}

/* cuLaunchKernel(f, grid…, block…, sharedMemBytes, hStream, kernelParams, extra),
 * cuLaunchKernelEx(config, f, kernelParams, extra) */
int driver_launch(struct pt_regs *ctx)
{
    return launch_entry(ctx, 0);
}

/* The runtime implements its calls on the driver's (cudaDeviceSynchronize on
 * cuCtxSynchronize, cudaMalloc on cuMemAlloc): the outermost call of a thread is the one
 * recorded, and a return only closes the call of its own op. */
static __always_inline int enter(u32 op, u64 stream, u64 size, u32 kind)
{
    u64 id = bpf_get_current_pid_tgid();
    struct call_start start = {.ts = bpf_ktime_get_ns(), .stream = stream, .size = size,
                               .op = op, .kind = kind};
    if (!is_target(id >> 32))
        return 0;
    calls.insert(&id, &start);
    return 0;
}

static __always_inline struct call_start *returning(u64 id, u32 first_op, u32 last_op)
{
    struct call_start *start = calls.lookup(&id);
    if (!start || start->op < first_op || start->op > last_op)
        return NULL;
    return start;
}

/* What every return event takes from its call's entry; the call is then closed. */
static __always_inline void returned(struct event *ev, struct call_start *start, u32 kind,
                                     struct pt_regs *ctx)
{
    fill_ids(ev);
    ev->ts = start->ts;
    ev->duration = bpf_ktime_get_ns() - start->ts;
    ev->kind = kind;
    ev->op = start->op;
    ev->result = (s32)PT_REGS_RC(ctx);
}

/* cudaStreamSynchronize(cudaStream_t stream) */
int stream_sync_enter(struct pt_regs *ctx)
{
    return enter(OP_STREAM_SYNC, PT_REGS_PARM1(ctx), 0, 0);
}

/* cudaEventRecord(cudaEvent_t event, cudaStream_t stream), and
 * cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags): which
 * stream the event marks, and the collective pending on it then, if any. PyTorch runs NCCL
 * on the process group's own stream: it records an event there after each collective, and
 * the compute stream waits on it (cudaStreamWaitEvent) before the optimizer. */
int event_record(struct pt_regs *ctx)
{
    struct stream_key key = {.tgid = current_tgid(), .stream = PT_REGS_PARM1(ctx)};
    struct stream_key on = {.tgid = key.tgid, .stream = PT_REGS_PARM2(ctx)};
    struct pending_collective *pending;
    if (!is_target(key.tgid))
        return 0;
    event_streams.update(&key, &on.stream);
    pending = pending_on_stream.lookup(&on);
    if (pending)
        event_pending.update(&key, pending);
    else
        event_pending.delete(&key);
    return 0;
}

/* cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags): the
 * stream's later work waits for what the event marks; where that is a collective, a sync on
 * the stream waits on the collective's peers (the .item() of a PyTorch step). */
int stream_wait_event(struct pt_regs *ctx)
{
    struct stream_key event = {.tgid = current_tgid(), .stream = PT_REGS_PARM2(ctx)};
    struct stream_key waiting = {.tgid = event.tgid, .stream = PT_REGS_PARM1(ctx)};
    struct pending_collective *pending, *mine;
    if (!is_target(event.tgid))
        return 0;
    pending = event_pending.lookup(&event);
    if (!pending)
        return 0;
    mine = pending_on_stream.lookup(&waiting);
    if (!mine || mine->ts < pending->ts)
        pending_on_stream.update(&waiting, pending);
    return 0;
}

/* cudaEventSynchronize(cudaEvent_t event): waits for the stream the event was recorded on. */
int event_sync_enter(struct pt_regs *ctx)
{
    struct stream_key key = {.tgid = current_tgid(), .stream = PT_REGS_PARM1(ctx)};
    u64 *stream = event_streams.lookup(&key);
    return enter(OP_EVENT_SYNC, stream ? *stream : ~0ULL, 0, 0);
}

/* cudaDeviceSynchronize(void) */
int device_sync_enter(struct pt_regs *ctx)
{
    return enter(OP_DEVICE_SYNC, 0, 0, 0);
}

/* cuCtxSynchronize(void) */
int ctx_sync_enter(struct pt_regs *ctx)
{
    return enter(OP_CTX_SYNC, 0, 0, 0);
}

/* A sync's return: how long it waited, and whether a collective was behind the wait. The
 * wait is the device's: until the thread was last woken in the call, without its waits for a
 * CPU after that (or, where it never slept, without its last preemption). A busy host wakes a
 * rank late from many syncs (with two nice -10 loops on its CPU, a third of them by 1.4 ms
 * to 24 ms, against 6 ms of kernels): counted in, that lateness makes its kernels look slow.
 * Where the thread spins on its GPU rather than sleeps, a preemption that ended before the
 * GPU was done is taken out too: the wait is then a lower bound. */
static __always_inline int sync_return(struct pt_regs *ctx, u32 first_op, u32 last_op)
{
    u64 id = bpf_get_current_pid_tgid();
    struct call_start *start = returning(id, first_op, last_op);
    struct pending_collective *pending = NULL;
    struct stream_key skey = {.tgid = id >> 32};
    struct event ev = {};
    if (!start)
        return 0;
    returned(&ev, start, EV_SYNC, ctx);
    if (start->waited < ev.duration)
        ev.duration -= start->waited;
    ev.stream = start->stream;
    if (start->op == OP_DEVICE_SYNC || start->op == OP_CTX_SYNC) {
        pending = pending_on_device.lookup(&skey.tgid);
    } else {
        skey.stream = start->stream;
        pending = pending_on_stream.lookup(&skey);
    }
    if (pending && pending->ts <= start->ts) {
        ev.flags |= EVF_PEER_WAIT;
        ev.comm_hash = pending->comm_hash;
        ev.seq = pending->seq;
        ev.covered_ts = pending->ts;
        if (start->op == OP_DEVICE_SYNC || start->op == OP_CTX_SYNC)
            pending_on_device.delete(&skey.tgid);
        else
            pending_on_stream.delete(&skey);
    }
    calls.delete(&id);
    submit(&ev);
    return 0;
}

/* cudaMalloc(void** devPtr, size_t size), cudaMallocManaged(void**, size_t, unsigned),
 * cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize): the address is known at return. */
int cuda_malloc_enter(struct pt_regs *ctx)
{
    return enter(OP_CUDA_MALLOC, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);
}

int cuda_malloc_managed_enter(struct pt_regs *ctx)
{
    return enter(OP_CUDA_MALLOC_MANAGED, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);
}

int cu_mem_alloc_enter(struct pt_regs *ctx)
{
    return enter(OP_CU_MEM_ALLOC, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);
}

int runtime_sync_return(struct pt_regs *ctx)
{
    return sync_return(ctx, OP_STREAM_SYNC, OP_DEVICE_SYNC);
}

int driver_sync_return(struct pt_regs *ctx)
{
    return sync_return(ctx, OP_CTX_SYNC, OP_CTX_SYNC);
}

static __always_inline int alloc_return(struct pt_regs *ctx, u32 first_op, u32 last_op)
{
    u64 id = bpf_get_current_pid_tgid();
    struct call_start *start = returning(id, first_op, last_op);
    struct event ev = {};
    u64 address = 0;
    if (!start)
        return 0;
    returned(&ev, start, EV_ALLOC, ctx);
    ev.bytes = start->size;
    if (ev.result == 0 &&
        bpf_probe_read_user(&address, sizeof(address), (void *)start->stream) == 0) {
        struct stream_key key = {.tgid = id >> 32, .stream = address};
        ev.addr = address;
        allocations.update(&key, &ev.bytes);
    }
    calls.delete(&id);
    submit(&ev);
    return 0;
}

int runtime_alloc_return(struct pt_regs *ctx)
{
    return alloc_return(ctx, OP_CUDA_MALLOC, OP_CUDA_MALLOC_MANAGED);
}

int driver_alloc_return(struct pt_regs *ctx)
{
    return alloc_return(ctx, OP_CU_MEM_ALLOC, OP_CU_MEM_ALLOC);
}

/* cudaFree(void* devPtr), cuMemFree_v2(CUdeviceptr dptr) */
static __always_inline int free_enter(struct pt_regs *ctx, u32 op)
{
    struct stream_key key = {.tgid = current_tgid(), .stream = PT_REGS_PARM1(ctx)};
    u64 *size = allocations.lookup(&key);
    int ret = enter(op, key.stream, size ? *size : 0, 0);
    if (size)
        allocations.delete(&key);
    return ret;
}

int cuda_free_enter(struct pt_regs *ctx)
{
    return free_enter(ctx, OP_CUDA_FREE);
}

int cu_mem_free_enter(struct pt_regs *ctx)
{
    return free_enter(ctx, OP_CU_MEM_FREE);
}

static __always_inline int free_return(struct pt_regs *ctx, u32 op)
{
    u64 id = bpf_get_current_pid_tgid();
    struct call_start *start = returning(id, op, op);
    struct event ev = {};
    if (!start)
        return 0;
    returned(&ev, start, EV_FREE, ctx);
    ev.addr = start->stream;
    ev.bytes = start->size;
    calls.delete(&id);
    submit(&ev);
    return 0;
}

int runtime_free_return(struct pt_regs *ctx)
{
    return free_return(ctx, OP_CUDA_FREE);
}

int driver_free_return(struct pt_regs *ctx)
{
    return free_return(ctx, OP_CU_MEM_FREE);
}

static __always_inline int memcpy_async(u32 op, u64 bytes, u32 kind)
{
    struct copy_key key = {.tgid = current_tgid(), .op = op, .kind = kind < 5 ? kind : 4};
    struct copy_count zero = {}, *n;
    if (!is_target(key.tgid))
        return 0;
    n = async_copies.lookup_or_try_init(&key, &zero);
    if (n) {
        __sync_fetch_and_add(&n->calls, 1);
        __sync_fetch_and_add(&n->bytes, bytes);
    }
    return 0;
}

/* cudaMemcpy(dst, src, count, kind): blocking, so its duration is the copy. */
int memcpy_enter(struct pt_regs *ctx)
{
    return enter(OP_MEMCPY, 0, PT_REGS_PARM3(ctx), (u32)PT_REGS_PARM4(ctx));
}

/* cudaMemcpy2D(dst, dpitch, src, spitch, width, height, kind) */
int memcpy_2d_enter(struct pt_regs *ctx)
{
    return enter(OP_MEMCPY_2D, 0, PT_REGS_PARM5(ctx) * PT_REGS_PARM6(ctx),
                 (u32)stack_arg(ctx, 7));
}

/* cudaMemcpyPeer(dst, dstDevice, src, srcDevice, count) */
int memcpy_peer_enter(struct pt_regs *ctx)
{
    return enter(OP_MEMCPY_PEER, 0, PT_REGS_PARM5(ctx), 3);
}

int memcpy_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct call_start *start = returning(id, OP_MEMCPY, OP_MEMCPY_PEER);
    struct event ev = {};
    if (!start)
        return 0;
    returned(&ev, start, EV_MEMCPY, ctx);
    ev.bytes = start->size;
    ev.datatype = start->kind;
    calls.delete(&id);
    submit(&ev);
    return 0;
}

/* cudaMemcpyAsync(dst, src, count, kind, stream) */
int memcpy_async_enter(struct pt_regs *ctx)
{
    return memcpy_async(OP_MEMCPY_ASYNC, PT_REGS_PARM3(ctx), (u32)PT_REGS_PARM4(ctx));
}

/* cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream) */
int memcpy_2d_async_enter(struct pt_regs *ctx)
{
    return memcpy_async(OP_MEMCPY_2D_ASYNC, PT_REGS_PARM5(ctx) * PT_REGS_PARM6(ctx),
                        (u32)stack_arg(ctx, 7));
}

/* cudaMemcpyPeerAsync(dst, dstDevice, src, srcDevice, count, stream) */
int memcpy_peer_async_enter(struct pt_regs *ctx)
{
    return memcpy_async(OP_MEMCPY_PEER_ASYNC, PT_REGS_PARM5(ctx), 3);
}
