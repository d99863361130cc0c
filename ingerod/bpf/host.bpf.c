/* The host side of a rank: who took its CPU, how much block I/O it issued, and when and how
 * it exited.
 *
 * sched_switch fires on every context switch on the machine, so the filter comes first: only
 * a target thread switching out, or a thread we saw switch out switching back in, goes on.
 * A target thread switched out while still runnable (prev_state without any TASK_REPORT bit,
 * i.e. preempted or yielding) was pushed off its CPU: the time until it runs again is charged
 * as preempted time, and to the task that took the CPU. A thread that slept and was woken but
 * then waited at least RUNQ_CHARGE_NS for its CPU was kept off it just the same (a rank that
 * mostly sleeps in syncs is rarely preempted, but it waits behind whoever holds the CPU): that
 * wait is charged too, to the task it finally took the CPU from. The process's own off-CPU
 * totals (its node's cpu signal) count such waits from RUNQ_CHARGE_NS; the task that held the
 * CPU is charged from RUNQ_BLAME_NS: a rank sharing its CPU with busy processes of higher
 * priority waits behind them at nearly every wake-up, mostly for less than a millisecond,
 * and those waits added up are most of what it loses (with three nice -10 hogs, 1 ms
 * charged about 40% of its time against the 60% its lag says). A thread in a CUDA call
 * (cuda.bpf.c's calls, compiled before this part) learns such waits since it was last woken
 * in it: a sync leaves them out of how long its GPU kept it.
 */
#ifndef INGERO_COMMON
#include "common.bpf.c"
#include "cuda.bpf.c"       /* its calls in flight */
#endif

#ifndef MAX_THREADS
#define MAX_THREADS 65536       /* target threads off CPU at once */
#endif
#ifndef MAX_PREEMPTORS
#define MAX_PREEMPTORS 16384    /* (target, preempting task) pairs between two reads */
#endif

#ifndef RUNQ_CHARGE_NS
#define RUNQ_CHARGE_NS 1000000  /* a woken thread's wait for its CPU worth charging */
#endif
#ifndef RUNQ_BLAME_NS
#define RUNQ_BLAME_NS 100000    /* ... and worth charging to whoever held the CPU */
#endif

#define TASK_REPORT_BITS 0x7f  /* interruptible, uninterruptible, stopped, traced, dead... */

struct offcpu_start {
    u64 ts;
    u64 woken;         /* when a sleeping thread was woken; 0 until then */
    u32 tgid;
    u32 preempted;
    u32 by;            /* the task that preempted it */
    u32 pad;
};

struct offcpu_total {
    u64 offcpu_ns;     /* all time off CPU */
    u64 preempted_ns;  /* off CPU while runnable */
    u64 switches;
    u64 preemptions;
};

struct preemptor_key {
    u32 tgid;          /* the target process that lost its CPU */
    u32 pid;           /* the task that took it */
};

struct preemptor_value {
    u64 count;
    u64 ns;            /* how long the target was kept off its CPU by it */
    char comm[16];
};

struct blockio_total {
    u64 requests;
    u64 bytes;
};

/* tid → when a target thread left its CPU. */
BPF_HASH(offcpu_since, u32, struct offcpu_start, MAX_THREADS);
/* tgid → off-CPU totals since user space last read them. */
BPF_HASH(offcpu, u32, struct offcpu_total, MAX_TARGETS);
/* (target tgid, preempting pid) → how often, for how long, and the preempting task's name. */
BPF_HASH(preemptors, struct preemptor_key, struct preemptor_value, MAX_PREEMPTORS);
/* tgid → block I/O requests issued by the target. */
BPF_HASH(blockio, u32, struct blockio_total, MAX_TARGETS);

/* Charge one preemption of a target process to the task that held (or took) its CPU. */
static __always_inline void charge_preemptor(u32 tgid, u32 pid, const char *comm, u64 ns)
{
    struct preemptor_key key = {.tgid = tgid, .pid = pid};
    struct preemptor_value fresh = {}, *value;
    value = preemptors.lookup_or_try_init(&key, &fresh);
    if (value) {
        value->count++;
        value->ns += ns;
        bpf_probe_read_kernel_str(value->comm, sizeof(value->comm), comm);
    }
}

/* Add the time a preemption lasted to the task that caused it (counted when it happened; if
 * user space read the pair in between, this time is not charged to anyone). */
static __always_inline void charge_time(u32 tgid, u32 pid, u64 ns)
{
    struct preemptor_key key = {.tgid = tgid, .pid = pid};
    struct preemptor_value *value = preemptors.lookup(&key);
    if (value)
        value->ns += ns;
}

/* A target thread off its CPU is woken: from now on it waits for a CPU, not for its event. */
TRACEPOINT_PROBE(sched, sched_wakeup)
{
    u32 tid = args->pid;
    struct offcpu_start *since = offcpu_since.lookup(&tid);
    if (since && !since->preempted && !since->woken)
        since->woken = bpf_ktime_get_ns();
    return 0;
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    u32 prev_tgid = current_tgid();
    u32 next_tid = args->next_pid;
    struct offcpu_start *since = offcpu_since.lookup(&next_tid);

    if (since) {
        struct offcpu_total zero = {}, *total;
        u64 delta = now - since->ts;
        u32 tgid = since->tgid;
        u64 waited = since->woken ? now - since->woken : 0;
        total = offcpu.lookup_or_try_init(&tgid, &zero);
        if (total) {
            total->offcpu_ns += delta;
            total->switches++;
            if (since->preempted) {
                total->preempted_ns += delta;
                total->preemptions++;
            } else if (waited >= RUNQ_CHARGE_NS) {
                total->preempted_ns += waited;
                total->preemptions++;
            }
        }
        /* a call in flight (a sync) learns how long its thread waited for a CPU since it was
         * last woken; one that never slept in it (it spins), its last preemption */
        u64 call_id = (u64)tgid << 32 | next_tid;
        struct call_start *call = calls.lookup(&call_id);
        if (call && !since->preempted) {
            call->waited = waited;
            call->slept = 1;
        } else if (call) {
            call->waited = call->slept ? call->waited + delta : delta;
        }
        if (since->preempted && since->by != 0)
            charge_time(tgid, since->by, delta);
        if (waited >= RUNQ_BLAME_NS && args->prev_pid != 0)
            charge_preemptor(tgid, args->prev_pid, args->prev_comm, waited);
        offcpu_since.delete(&next_tid);
    }

    if (args->prev_pid != 0 && is_followed(prev_tgid)) {
        u32 tid = args->prev_pid;
        struct offcpu_start start = {.ts = now, .tgid = prev_tgid};
        start.preempted = (args->prev_state & TASK_REPORT_BITS) == 0;
        if (start.preempted && next_tid != 0) {
            start.by = next_tid;
            charge_preemptor(prev_tgid, next_tid, args->next_comm, 0);
        }
        offcpu_since.update(&tid, &start);
    }
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_issue)
{
    u32 tgid = current_tgid();
    struct blockio_total zero = {}, *total;
    if (!is_followed(tgid))
        return 0;
    total = blockio.lookup_or_try_init(&tgid, &zero);
    if (total) {
        total->requests++;
        total->bytes += args->bytes;
    }
    return 0;
}

/* How a followed process is ending, as a wait(2) status: exit_group(code) says code << 8; a
 * signal whose default action ends the process says its number (a handled signal is followed
 * by the handler's own exit_group, which takes its place). Read from tracepoints: the
 * task_struct's exit_code is not, because these machines' kernel headers are not the running
 * kernel's own. */
#define NO_STATUS (-1)
#define FATAL_SIGNALS 0xEF00FFFEu  /* bit n: signal n ends the process by default */

/* tgid → its ending status, between the call or signal and the exit. */
BPF_HASH(ending, u32, s32, MAX_TARGETS);

TRACEPOINT_PROBE(syscalls, sys_enter_exit_group)
{
    u32 tgid = current_tgid();
    s32 status = (s32)((args->error_code & 0xff) << 8);
    if (is_followed(tgid))
        ending.update(&tgid, &status);
    return 0;
}

TRACEPOINT_PROBE(signal, signal_generate)
{
    u64 id = bpf_get_current_pid_tgid();
    /* a signal a thread raises on itself (a crash) is its process's; another's is aimed at
     * the process by its pid */
    u32 tgid = (u32)args->pid == (u32)id ? id >> 32 : (u32)args->pid;
    s32 status = args->sig;
    if (status > 0 && status < 32 && (FATAL_SIGNALS >> status) & 1 && is_followed(tgid))
        ending.update(&tgid, &status);
    return 0;
}

/* A followed process ends (its main thread exits): reported at once, with how it ended, where
 * a rescan of /proc would tell only later, and not how. A rank that crashed while its peers
 * wait in a collective is dead then, not seconds later. */
TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    struct event ev = {};
    s32 *status;
    if ((u32)id != tgid || !is_followed(tgid))
        return 0;
    fill_ids(&ev);
    ev.ts = bpf_ktime_get_ns();
    ev.kind = EV_PROCESS_EXIT;
    status = ending.lookup(&tgid);
    ev.result = status ? *status : NO_STATUS;
    ending.delete(&tgid);
    submit(&ev);
    return 0;
}
