/*
 * libnccl.so.2: NCCL's entry points with the real prototypes (x86-64 SysV: the 128-byte
 * ncclUniqueId travels by value on the stack). Each checks its arguments and hands over to
 * nccl_comm.c or nccl_ops.c; none calls another entry point, so every uprobe hit is the
 * application's own call.
 */

#include "nccl_internal.h"
#include "simcommon.h"

static const char *const result_texts[] = {
    [ncclSuccess] = "no error",
    [ncclUnhandledCudaError] = "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    [ncclSystemError] = "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    [ncclInternalError] = "internal error - please report this issue to the NCCL developers",
    [ncclInvalidArgument] = "invalid argument (run with NCCL_DEBUG=WARN for details)",
    [ncclInvalidUsage] = "invalid usage (run with NCCL_DEBUG=WARN for details)",
    [ncclRemoteError] = "remote process exited or there was a network error",
    [ncclInProgress] = "NCCL operation in progress",
};

static ncclResult_t check_collective(struct ncclComm *comm, size_t count, const void *send,
                                     const void *recv, ncclDataType_t datatype)
{
    if (!comm)
        return ncclInvalidArgument;
    if (atomic_load(&comm->init_state) != ncclSuccess)   /* a non-blocking init not done */
        return ncclInvalidUsage;
    if (!datatype_bytes(datatype))
        return ncclInvalidArgument;
    if (count && (!send || !recv))
        return ncclInvalidArgument;
    return ncclSuccess;
}

static ncclResult_t check_reduction(ncclRedOp_t op)
{
    return (unsigned int)op < ncclNumOps ? ncclSuccess : ncclInvalidArgument;
}

static ncclResult_t check_rank(const struct ncclComm *comm, int rank)
{
    return rank >= 0 && rank < comm->nranks ? ncclSuccess : ncclInvalidArgument;
}

/* A call with one buffer addressed to one rank (broadcast root, send or receive peer). */
static ncclResult_t to_one_rank(enum nccl_op op, ncclComm_t comm, const void *buff, size_t count,
                                ncclDataType_t datatype, int rank, cudaStream_t stream)
{
    struct ncclComm *c = comm_checked(comm);
    ncclResult_t r = check_collective(c, count, buff, buff, datatype);
    if (r == ncclSuccess)
        r = check_rank(c, rank);
    if (r != ncclSuccess)
        return r;
    return op_submit(op, c, count * datatype_bytes(datatype), rank, stream);
}

SIM_API ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

SIM_API ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId)
{
    if (!uniqueId)
        return ncclInvalidArgument;
    return comm_new_unique_id(uniqueId);
}

SIM_API ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    return comm_init_rank(comm, nranks, &commId, rank, NULL);
}

SIM_API ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId,
                                            int rank, ncclConfig_t *config)
{
    return comm_init_rank(comm, nranks, &commId, rank, config);
}

/* Several roots' unique ids (every rank passes the same list, as PyTorch's store hands it
 * round): the first names the communicator's rendezvous. */
SIM_API ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank,
                                              int nId, ncclUniqueId *commIds,
                                              ncclConfig_t *config)
{
    if (nId < 1 || nId > nranks || !commIds)
        return ncclInvalidArgument;
    return comm_init_rank(newcomm, nranks, &commIds[0], myrank, config);
}

SIM_API ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist)
{
    (void)devlist;
    if (!comm || ndev < 1 || ndev > SIM_MAX_RANKS)
        return ncclInvalidArgument;
    return comm_init_all(comm, ndev);
}

SIM_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                                   ncclConfig_t *config)
{
    struct ncclComm *parent = comm_checked(comm);
    if (!parent || !newcomm || (color < 0 && color != NCCL_SPLIT_NOCOLOR))
        return ncclInvalidArgument;
    if (config && config->magic != 0xcafebeefU)
        return ncclInvalidArgument;
    return comm_split(parent, color, key, newcomm);
}

SIM_API ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList,
                                    int excludeRanksCount, ncclComm_t *newcomm,
                                    ncclConfig_t *config, int shrinkFlags)
{
    (void)shrinkFlags;
    struct ncclComm *parent = comm_checked(comm);
    if (!parent || !newcomm || excludeRanksCount < 0
        || (excludeRanksCount && !excludeRanksList))
        return ncclInvalidArgument;
    if (config && config->magic != 0xcafebeefU)
        return ncclInvalidArgument;
    return comm_shrink(parent, excludeRanksList, excludeRanksCount, newcomm);
}

/* Flushes the communicator's queued work; PyTorch calls it before ncclCommDestroy. */
SIM_API ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    struct ncclComm *c = comm_checked(comm);
    return c ? ncclSuccess : ncclInvalidArgument;
}

SIM_API ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    struct ncclComm *c = comm_checked(comm);
    return c ? comm_finish(c, 0) : ncclInvalidArgument;
}

SIM_API ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclSuccess;
    struct ncclComm *c = comm_checked(comm);
    return c ? comm_finish(c, 1) : ncclInvalidArgument;
}

SIM_API ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    struct ncclComm *c = comm_checked(comm);
    if (!c || !count)
        return ncclInvalidArgument;
    *count = c->nranks;
    return ncclSuccess;
}

SIM_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    struct ncclComm *c = comm_checked(comm);
    if (!c || !rank)
        return ncclInvalidArgument;
    *rank = c->rank;
    return ncclSuccess;
}

SIM_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    struct ncclComm *c = comm_checked(comm);
    if (!c || !asyncError)
        return ncclInvalidArgument;
    ncclResult_t init = (ncclResult_t)atomic_load(&c->init_state);
    *asyncError = init != ncclSuccess ? init : (ncclResult_t)atomic_load(&c->async_error);
    return ncclSuccess;
}

SIM_API const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "";
}

SIM_API const char *ncclGetErrorString(ncclResult_t result)
{
    if ((unsigned int)result < ncclNumResults && result_texts[result])
        return result_texts[result];
    return "unknown result code";
}

/* A call every rank makes alike; ``reduction`` is checked where the call reduces (else -1). */
static ncclResult_t unrooted(enum nccl_op op, const void *sendbuff, void *recvbuff, size_t count,
                             ncclDataType_t datatype, int reduction, ncclComm_t comm,
                             cudaStream_t stream)
{
    struct ncclComm *c = comm_checked(comm);
    ncclResult_t r = check_collective(c, count, sendbuff, recvbuff, datatype);
    if (r == ncclSuccess && reduction >= 0)
        r = check_reduction((ncclRedOp_t)reduction);
    if (r != ncclSuccess)
        return r;
    return op_submit(op, c, count * datatype_bytes(datatype), 0, stream);
}

SIM_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream)
{
    return unrooted(OP_ALL_REDUCE, sendbuff, recvbuff, count, datatype, (int)op, comm, stream);
}

SIM_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return unrooted(OP_ALL_GATHER, sendbuff, recvbuff, sendcount, datatype, -1, comm, stream);
}

SIM_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream)
{
    return unrooted(OP_REDUCE_SCATTER, sendbuff, recvbuff, recvcount, datatype, (int)op, comm,
                    stream);
}

/* A rooted call: every rank's buffer (``each``), and the root's other one (``at_root``). */
static ncclResult_t rooted(enum nccl_op op, const void *each, const void *at_root, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream)
{
    struct ncclComm *c = comm_checked(comm);
    ncclResult_t r = check_collective(c, count, each, each, datatype);
    if (r == ncclSuccess)
        r = check_rank(c, root);
    if (r == ncclSuccess && c->rank == root && count && !at_root)
        r = ncclInvalidArgument;
    if (r != ncclSuccess)
        return r;
    return op_submit(op, c, count * datatype_bytes(datatype), root, stream);
}

SIM_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, ncclRedOp_t op, int root,
                                ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r = check_reduction(op);
    return r != ncclSuccess ? r : rooted(OP_REDUCE, sendbuff, recvbuff, count, datatype, root,
                                         comm, stream);
}

SIM_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream)
{
    return rooted(OP_BROADCAST, recvbuff, sendbuff, count, datatype, root, comm, stream);
}

SIM_API ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                               ncclComm_t comm, cudaStream_t stream)
{
    return to_one_rank(OP_BROADCAST, comm, buff, count, datatype, root, stream);
}

SIM_API ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype,
                              int peer, ncclComm_t comm, cudaStream_t stream)
{
    return to_one_rank(OP_SEND, comm, sendbuff, count, datatype, peer, stream);
}

SIM_API ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream)
{
    return to_one_rank(OP_RECV, comm, recvbuff, count, datatype, peer, stream);
}

/* count elements to (and from) each peer */
SIM_API ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                                  ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return unrooted(OP_ALL_TO_ALL, sendbuff, recvbuff, count, datatype, -1, comm, stream);
}

SIM_API ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, int root, ncclComm_t comm,
                                cudaStream_t stream)
{
    return rooted(OP_GATHER, sendbuff, recvbuff, count, datatype, root, comm, stream);
}

SIM_API ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                                 ncclDataType_t datatype, int root, ncclComm_t comm,
                                 cudaStream_t stream)
{
    return rooted(OP_SCATTER, recvbuff, sendbuff, count, datatype, root, comm, stream);
}

SIM_API ncclResult_t ncclGroupStart(void)
{
    return group_start();
}

SIM_API ncclResult_t ncclGroupEnd(void)
{
    return group_end();
}
