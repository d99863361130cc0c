/*
 * Inside libnccl: communicators and the operations queued on CUDA streams. An operation becomes
 * one "part" of a remote item on the virtual GPU (several parts when grouped); the device thread
 * publishes the part's arrival and completes it when the rendezvous says every peer arrived.
 */
#ifndef SIM_NCCL_INTERNAL_H
#define SIM_NCCL_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "nccl.h"
#include "rdv.h"

#define COMM_MAGIC 0x434f4d4dU

struct ncclComm {
    uint32_t magic;
    ncclUniqueId id;
    uint64_t id_hash;          /* comm_id_hash: the same on every rank */
    int rank, nranks;
    struct rdv *rdv;
    uint64_t next_collective;  /* rendezvous sequence of the next collective */
    uint64_t *sent, *received; /* per peer: point-to-point transfers so far */
    uint64_t splits;           /* ncclCommSplit calls so far: names child communicators */
    pthread_mutex_t lock;      /* guards pending */
    pthread_cond_t drained;
    int pending;               /* parts queued on streams, not yet finished */
    atomic_int aborted;
    atomic_int async_error;    /* ncclResult_t of a failed operation */
    atomic_int init_state;     /* ncclInProgress while a non-blocking init joins, then its end */
};

enum nccl_op {
    OP_ALL_REDUCE, OP_ALL_GATHER, OP_REDUCE_SCATTER, OP_REDUCE, OP_BROADCAST, OP_SEND, OP_RECV,
    OP_ALL_TO_ALL, OP_GATHER, OP_SCATTER
};

/* nccl_comm.c */
HIDDEN struct ncclComm *comm_checked(ncclComm_t comm);
HIDDEN ncclResult_t comm_new_unique_id(ncclUniqueId *id);
HIDDEN ncclResult_t comm_init_rank(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                                   const ncclConfig_t *config);
HIDDEN ncclResult_t comm_init_all(ncclComm_t *comms, int ndev);
HIDDEN ncclResult_t comm_split(struct ncclComm *parent, int color, int key, ncclComm_t *out);
HIDDEN ncclResult_t comm_shrink(struct ncclComm *parent, const int *excluded, int nexcluded,
                                ncclComm_t *out);
HIDDEN ncclResult_t comm_finish(struct ncclComm *comm, int abort);
HIDDEN void comm_part_added(struct ncclComm *comm);
HIDDEN void comm_part_finished(struct ncclComm *comm, int failed);

/* nccl_ops.c */
HIDDEN size_t datatype_bytes(ncclDataType_t datatype);
HIDDEN ncclResult_t op_submit(enum nccl_op op, struct ncclComm *comm, size_t bytes, int peer,
                              cudaStream_t stream);
HIDDEN ncclResult_t group_start(void);
HIDDEN ncclResult_t group_end(void);

#endif
