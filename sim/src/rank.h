/*
 * ingero-sim-rank: one rank of a simulated training job. It calls the sim's CUDA and NCCL
 * libraries exactly as a training loop would, injects the straggler behaviour it is told to,
 * and writes the ground truth of what it did (JSON lines) for tests and demos to check against.
 */
#ifndef SIM_RANK_H
#define SIM_RANK_H

#include <stddef.h>
#include <stdint.h>

#include "nccl.h"

#define MAX_DELAY_RULES 8
#define MAX_WORKERS 16
#define MAX_STAGES 16
#define MAX_SUBGROUPS 8
#define MAX_BUCKETS 64
#define WARM_UP_STEPS 2           /* loop pytorch: the caching allocator mallocs only in these */

enum rank_exit {
    EXIT_OK = 0,
    EXIT_INJECTED_DEATH = 1,  /* --die-at: exits without cleanup, like a crashed process */
    EXIT_USAGE = 2,
    EXIT_GPU_ERROR = 3,       /* a CUDA or NCCL call failed, e.g. a peer never arrived */
    EXIT_RESTART = 4,         /* --restart-at: leaves for an elastic restart (its launcher
                               * starts every rank again, from that step) */
};

enum extra_collective {
    EXTRA_ALL_GATHER = 1 << 0,
    EXTRA_REDUCE_SCATTER = 1 << 1,
    EXTRA_BROADCAST = 1 << 2,
    EXTRA_REDUCE = 1 << 3,
    EXTRA_SEND_RECV = 1 << 4,
    EXTRA_ALL_TO_ALL = 1 << 5,    /* ncclAlltoAll, an equal split */
    EXTRA_ALL_TO_ALLV = 1 << 6,   /* an uneven split: grouped ncclSend/ncclRecv with every peer */
};

/* How the world communicator is made (PyTorch's choice by size and settings). */
enum nccl_init {
    INIT_CONFIG = 0,          /* ncclCommInitRankConfig, rank 0's unique id */
    INIT_SCALABLE,            /* ncclCommInitRankScalable, a unique id per node's first rank */
    INIT_NONBLOCKING,         /* ncclCommInitRankConfig non-blocking: ncclInProgress, polled */
};

/* The training loop: the sim's own (one stream, a sync on the rank's own kernels after the
 * forward pass, an allocation each synced step), or PyTorch DDP's (see rank_pytorch.c). */
enum loop { LOOP_SIM = 0, LOOP_PYTORCH };

/* Where a --delay sleeps: before the gradient all-reduce, or before the rank's subgroups'. */
enum delay_place { BEFORE_ALLREDUCE = 0, BEFORE_SUBGROUP, BEFORE_ALLTOALLV };

/* Host-side sleep before the gradient all-reduce on steps from, from+every, … until. */
struct delay_rule {
    int64_t delay_ns;
    int from, every, until;   /* until < 0: to the end */
    enum delay_place before;
};

struct rank_config {
    int rank, world_size, local_rank, local_world_size, node;
    char job_id[64];
    int steps;
    int64_t step_compute_ns;  /* GPU time of forward + backward + optimizer per step */
    int kernels;              /* kernel launches per forward pass; backward launches twice as many */
    size_t allreduce_bytes;
    ncclDataType_t datatype;
    unsigned int extras;      /* enum extra_collective bits */
    int64_t host_work_ns;     /* CPU time of host-side work per step (data loading) */
    struct delay_rule delays[MAX_DELAY_RULES];
    int ndelays;
    int die_at, hang_at;      /* step numbers; -1: never */
    int restart_at;           /* step to leave at, for an elastic restart; -1: never */
    int tp, pp;               /* tensor- and pipeline-parallel sizes (1: none) */
    enum nccl_init nccl_init;
    enum loop loop;
    int buckets;              /* loop pytorch: gradient all-reduces a step */
    int graphs_from;          /* from this step, the step's GPU work is a CUDA graph; -1 never */
    double gemm_share;        /* loop pytorch: share of launches made with cuLaunchKernelEx */
    int subgroups;            /* groups split from the world, each with NOCOLOR non-members */
    unsigned char in_subgroup[MAX_SUBGROUPS];   /* whether this rank is in each */
    int64_t stage_work_ns[MAX_STAGES];   /* GPU compute per step of each stage */
    int stage_works;          /* how many --stage-work gave */
    int first_step;           /* where this run of the rank starts (after a restart) */
    int memcpy_every;         /* a blocking device-to-host copy every N steps; 0: never */
    int loss_every;           /* a sync on the forward pass (loss.item()) every N steps; 0: never */
    int sync_every;           /* the host waits for its GPU every N steps only (1: every step) */
    int64_t jitter_ns;        /* random host time per step, uniform in [0, jitter_ns] */
    int workers;              /* data-loader worker processes per epoch; 0: none */
    int epoch_steps;          /* steps per epoch (workers exit and are forked anew); 0: all */
    const char *input_path;   /* the file the workers read batches from */
    size_t input_bytes;       /* read per batch */
    int64_t worker_cpu_ns;    /* CPU time a worker spends decoding a batch */
    int64_t input_stall_ns;   /* extra time a worker's read takes (a slow store) */
    const char *record_path;
    const char *unique_id_path;
};

/* rank.c: host time, spent or slept */
void burn_cpu(int64_t cpu_ns);
void sleep_for_ns(int64_t ns);

/* rank_input.c: the data loader's worker processes */
struct input_pipeline {
    const struct rank_config *cfg;
    int fds[2];               /* workers write a byte per batch ready; the rank reads */
    int wanted[2];            /* the rank writes a byte per batch it asks for; workers read */
    int batches, asked;       /* this epoch's batches, and how many the rank asked for */
    int workers[MAX_WORKERS]; /* this epoch's worker pids */
    int nworkers;
    void *buffer;             /* O_DIRECT-aligned, allocated before any fork */
    int epoch_end;            /* the first step of the next epoch */
};

int input_open(struct input_pipeline *in, const struct rank_config *cfg);
int input_next(struct input_pipeline *in, int step);
void input_close(struct input_pipeline *in);

/* rank_config.c */
int rank_config_parse(struct rank_config *cfg, int argc, char **argv);
int64_t rank_delay_ns(const struct rank_config *cfg, int step, enum delay_place before);
const char *datatype_name(ncclDataType_t datatype);
size_t datatype_size(ncclDataType_t datatype);

/* rank_record.c: the ground-truth record, one JSON object per line, written unbuffered. */
struct collective_call {
    const char *op;           /* the NCCL function name, e.g. "ncclAllReduce" */
    size_t count;
    ncclDataType_t datatype;
    int root, peer;           /* -1 where the call has none */
    uint64_t seq;             /* per-communicator sequence, from 0 */
    uint64_t comm_hash;       /* the communicator's, as ingerod hashes it */
    uint64_t *counter;        /* what numbered it (call_begin) */
    int step;
    int64_t entry_ns, return_ns;
    ncclResult_t result;
};

struct rank_summary {
    int steps_done;
    uint64_t collectives;
    uint64_t runtime_launches, driver_launches;   /* cudaLaunchKernel, cuLaunchKernelEx */
    const int64_t *step_ns, *sync_wait_ns, *loss_sync_ns, *loss_device_ns;
    const char *status, *error;
    int64_t start_ns, end_ns;
    uint64_t net_ns;          /* inode of the network namespace the rank ran in */
};

int record_open(const char *path);
void record_collective(int fd, const struct rank_config *cfg, uint64_t comm_hash,
                       const struct collective_call *call);
void record_summary(int fd, const struct rank_config *cfg, uint64_t comm_hash,
                    const struct rank_summary *summary);

#endif
