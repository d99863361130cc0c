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
    *asyncError = (ncclResult_t)atomic_load(&c->async_error);
    return ncclSuccess;
}

SIM_API const char *ncclGetErrorString(ncclResult_t result)
{
    if ((unsigned int)result < ncclNumResults && result_texts[result])
        return result_texts[result];
    return "unknown result code";
}

SIM_API ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                   cudaStream_t stream)
{
    struct ncclComm *c = comm_checked(comm);
    ncclResult_t r = check_collective(c, count, sendbuff, recvbuff, datatype);
    if (r == ncclSuccess)
        r = check_reduction(op);
    if (r != ncclSuccess)
        return r;
    return op_submit(OP_ALL_REDUCE, c, count * datatype_bytes(datatype), 0, stream);
}

SIM_API ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                                   ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    struct ncclComm *c = comm_checked(comm);
    ncclResult_t r = check_collective(c, sendcount, sendbuff, recvbuff, datatype);
    if (r != ncclSuccess)
        return r;
    return op_submit(OP_ALL_GATHER, c, sendcount * datatype_bytes(datatype), 0, stream);
}

SIM_API ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                       ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                       cudaStream_t stream)
{
    struct ncclComm *c = comm_checked(comm);
    ncclResult_t r = check_collective(c, recvcount, sendbuff, recvbuff, datatype);
    if (r == ncclSuccess)
        r = check_reduction(op);
    if (r != ncclSuccess)
        return r;
    return op_submit(OP_REDUCE_SCATTER, c, recvcount * datatype_bytes(datatype), 0, stream);
}

SIM_API ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                                ncclDataType_t datatype, ncclRedOp_t op, int root,
                                ncclComm_t comm, cudaStream_t stream)
{
    struct ncclComm *c = comm_checked(comm);
    ncclResult_t r = check_collective(c, count, sendbuff, sendbuff, datatype);
    if (r == ncclSuccess)
        r = check_reduction(op);
    if (r == ncclSuccess)
        r = check_rank(c, root);
    if (r == ncclSuccess && c->rank == root && count && !recvbuff)
        r = ncclInvalidArgument;
    if (r != ncclSuccess)
        return r;
    return op_submit(OP_REDUCE, c, count * datatype_bytes(datatype), root, stream);
}

SIM_API ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                                   ncclDataType_t datatype, int root, ncclComm_t comm,
                                   cudaStream_t stream)
{
    struct ncclComm *c = comm_checked(comm);
    ncclResult_t r = check_collective(c, count, recvbuff, recvbuff, datatype);
    if (r == ncclSuccess)
        r = check_rank(c, root);
    if (r == ncclSuccess && c->rank == root && count && !sendbuff)
        r = ncclInvalidArgument;
    if (r != ncclSuccess)
        return r;
    return op_submit(OP_BROADCAST, c, count * datatype_bytes(datatype), root, stream);
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

SIM_API ncclResult_t ncclGroupStart(void)
{
    return group_start();
}

SIM_API ncclResult_t ncclGroupEnd(void)
{
    return group_end();
}
