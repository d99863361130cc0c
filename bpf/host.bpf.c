/* The host side of a rank: who took its CPU, and how much block I/O it issued.
 *
 * sched_switch fires on every context switch on the machine, so the filter comes first: only
 * a target thread switching out, or a thread we saw switch out switching back in, goes on.
 * A target thread switched out while still runnable (prev_state without any TASK_REPORT bit,
 * i.e. preempted or yielding) was pushed off its CPU: the time until it runs again is charged
 * as preempted time, and to the task that took the CPU.
 */
#ifndef INGERO_COMMON
#include "common.bpf.c"
#endif

#ifndef MAX_THREADS
#define MAX_THREADS 65536       /* target threads off CPU at once */
#endif
#ifndef MAX_PREEMPTORS
#define MAX_PREEMPTORS 16384    /* (target, preempting task) pairs between two reads */
#endif

#define TASK_REPORT_BITS 0x7f  /* interruptible, uninterruptible, stopped, traced, dead... */

struct offcpu_start {
    u64 ts;
    u32 tgid;
    u32 preempted;
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
/* (target tgid, preempting pid) → how often, and the preempting task's name. */
BPF_HASH(preemptors, struct preemptor_key, struct preemptor_value, MAX_PREEMPTORS);
/* tgid → block I/O requests issued by the target. */
BPF_HASH(blockio, u32, struct blockio_total, MAX_TARGETS);

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
        total = offcpu.lookup_or_try_init(&tgid, &zero);
        if (total) {
            total->offcpu_ns += delta;
            total->switches++;
            if (since->preempted) {
                total->preempted_ns += delta;
                total->preemptions++;
            }
        }
        offcpu_since.delete(&next_tid);
    }

    if (args->prev_pid != 0 && is_followed(prev_tgid)) {
        u32 tid = args->prev_pid;
        struct offcpu_start start = {.ts = now, .tgid = prev_tgid};
        start.preempted = (args->prev_state & TASK_REPORT_BITS) == 0;
        offcpu_since.update(&tid, &start);
        if (start.preempted && next_tid != 0) {
            struct preemptor_key key = {.tgid = prev_tgid, .pid = next_tid};
            struct preemptor_value fresh = {}, *value;
            value = preemptors.lookup_or_try_init(&key, &fresh);
            if (value) {
                value->count++;
                bpf_probe_read_kernel_str(value->comm, sizeof(value->comm), args->next_comm);
            }
        }
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
