/*
 * The rank's training state, shared by the training loop (rank.c) and its tensor-, pipeline-
 * and data-parallel variant (rank_parallel.c), and the calls both make (rank_train.c), which
 * calls neither. Private to the rank driver.
 */
#ifndef SIM_RANK_TRAIN_H
#define SIM_RANK_TRAIN_H

#include <stdint.h>

#include "cuda_runtime_api.h"
#include "ingero_sim.h"
#include "nccl.h"
#include "rank.h"

#define MAX_CAPTURED 32

/* One group of ranks on a communicator split from the world. */
struct group {
    ncclComm_t comm;
    uint64_t hash;              /* as ingerod hashes a split: parent, colour, split count */
    uint64_t seq;               /* its collectives so far */
    int rank, size;             /* in the group */
};

struct parallel {
    int stage, stages;          /* pipeline stage; tensor and data groups lie within one */
    struct group tp, dp, pp;
    uint64_t sent[2], received[2];   /* Send/Recv with the stage before [0] and after [1] */
    struct ingero_sim_kernel forward, backward;   /* this stage's share of the work */
};

struct training {
    const struct rank_config *cfg;
    int record_fd;
    cudaStream_t stream;
    ncclComm_t comm;
    uint64_t comm_hash;
    uint64_t seq;               /* collectives made on the communicator so far */
    uint64_t sent, received;    /* Send/Recv calls so far with the one peer of each (a ring) */
    uint64_t *a2a_sent, *a2a_received;   /* alltoallv: Send/Recv calls so far, per peer */
    size_t elements;            /* gradient elements all-reduced per step */
    void *grads, *reduced, *gathered, *p2p_out, *p2p_in, *loss_device;
    float *loss_host;
    struct ingero_sim_kernel forward, backward, optimizer;
    int64_t *step_ns, *sync_wait_ns;
    int64_t *loss_sync_ns, *loss_device_ns;   /* the loss read's sync, and the device's part */
    int steps_done;
    unsigned int seed;          /* for the per-step jitter */
    struct input_pipeline input;
    struct parallel parallel;   /* tensor/pipeline/data-parallel groups, when --tp/--pp */
    struct group subgroups[MAX_SUBGROUPS];   /* --subgroup: comm NULL where not a member */
    /* loop pytorch: the process group's own stream, an event per gradient bucket (recorded on
     * the compute stream, waited on by the NCCL stream) and one the compute stream waits on */
    cudaStream_t nccl_stream;
    cudaEvent_t bucket_ready[MAX_BUCKETS], all_reduced;
    void *cached[WARM_UP_STEPS];             /* the caching allocator's blocks */
    uint64_t launched, runtime_launches, driver_launches;
    /* --graphs-from: the step's graph, and the collectives captured in it (run anew, and
     * recorded, at each replay) */
    cudaGraphExec_t graph;
    int capturing;
    struct collective_call captured[MAX_CAPTURED];
    int ncaptured;
    char error[256];
};

int64_t now_ns(void);
int cuda_failed(struct training *t, const char *call, cudaError_t err);
int nccl_failed(struct training *t, const char *call, ncclResult_t result);
struct collective_call call_begin(struct training *t, const char *op, size_t count, int root,
                                  int peer, int step, uint64_t *counter);
int call_end(struct training *t, struct collective_call *call);
void replayed(struct training *t, int step, int64_t entry);
int launch(struct training *t, const struct ingero_sim_kernel *kernel, int times);
int read_loss(struct training *t, int step);
void jitter(struct training *t);
int synced_step(const struct rank_config *cfg, int step);

int group_split(struct training *t, struct group *g, int color, uint32_t split);
int group_all_reduce(struct training *t, struct group *g, size_t count, int step);

/* rank_pytorch.c */
int pytorch_set_up(struct training *t);
int pytorch_step(struct training *t, int step);
void pytorch_tear_down(struct training *t);

/* rank_parallel.c */
int parallel_join(struct training *t);
int parallel_compute(struct training *t, int step);

#endif
