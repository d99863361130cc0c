/*
 * Communicators: unique ids, joining (blocks until every rank joined, like NCCL), splitting,
 * and tearing down once the operations already queued on streams have finished.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "ingero_sim.h"
#include "nccl_internal.h"
#include "simcommon.h"
#include "vgpu.h"

#define CONFIG_MAGIC 0xcafebeefU
#define TEARDOWN_GRACE_NS (5 * NS_PER_S)

struct ncclComm *comm_checked(ncclComm_t comm)
{
    return comm && comm->magic == COMM_MAGIC ? comm : NULL;
}

ncclResult_t comm_new_unique_id(ncclUniqueId *id)
{
    size_t filled = 0;
    while (filled < sizeof id->internal) {
        ssize_t n = getrandom(id->internal + filled, sizeof id->internal - filled, 0);
        if (n < 0)
            return ncclSystemError;
        filled += (size_t)n;
    }
    return ncclSuccess;
}

static void free_comm(struct ncclComm *comm)
{
    comm->magic = 0;
    free(comm->sent);
    free(comm->received);
    pthread_mutex_destroy(&comm->lock);
    pthread_cond_destroy(&comm->drained);
    free(comm);
}

static struct ncclComm *new_comm(const ncclUniqueId *id, int nranks, int rank)
{
    struct ncclComm *comm = calloc(1, sizeof *comm);
    if (!comm)
        return NULL;
    comm->magic = COMM_MAGIC;
    comm->id = *id;
    comm->id_hash = ingero_sim_comm_id_hash(id->internal);
    comm->rank = rank;
    comm->nranks = nranks;
    comm->sent = calloc((size_t)nranks, sizeof *comm->sent);
    comm->received = calloc((size_t)nranks, sizeof *comm->received);
    pthread_mutex_init(&comm->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&comm->drained, &attr);
    pthread_condattr_destroy(&attr);
    if (!comm->sent || !comm->received) {
        free_comm(comm);
        return NULL;
    }
    return comm;
}

/* Register with the rendezvous without waiting; the caller waits for everyone to join. */
static ncclResult_t comm_open(const ncclUniqueId *id, int nranks, int rank, struct ncclComm **out)
{
    *out = NULL;
    if (nranks < 1 || nranks > SIM_MAX_RANKS || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    struct ncclComm *comm = new_comm(id, nranks, rank);
    if (!comm)
        return ncclSystemError;
    ncclResult_t result = ncclSuccess;
    comm->rdv = rdv_open(id, nranks, rank, &result);
    if (!comm->rdv) {
        free_comm(comm);
        return result;
    }
    *out = comm;
    return ncclSuccess;
}

static void comm_discard(struct ncclComm *comm)
{
    rdv_close(comm->rdv);
    free_comm(comm);
}

static int64_t join_deadline(void)
{
    return sim_now_ns() + ingero_sim_timeout_ns();
}

/* A non-blocking init's joining, on a thread of its own, as NCCL's: the communicator says
 * ncclInProgress (ncclCommGetAsyncError) until every rank joined, then how it ended. */
static void *join_in_background(void *arg)
{
    struct ncclComm *comm = arg;
    atomic_store(&comm->init_state, rdv_wait_joined(comm->rdv, join_deadline()));
    return NULL;
}

static ncclResult_t init_nonblocking(struct ncclComm *comm)
{
    pthread_t thread;
    atomic_store(&comm->init_state, ncclInProgress);
    if (sim_start_thread(join_in_background, comm, &thread))
        return ncclSystemError;
    pthread_detach(thread);
    return ncclInProgress;
}

ncclResult_t comm_init_rank(ncclComm_t *out, int nranks, const ncclUniqueId *id, int rank,
                            const ncclConfig_t *config)
{
    if (!out)
        return ncclInvalidArgument;
    *out = NULL;
    if (config && config->magic != CONFIG_MAGIC)
        return ncclInvalidArgument;
    struct ncclComm *comm = NULL;
    ncclResult_t result = comm_open(id, nranks, rank, &comm);
    if (result == ncclSuccess && config && config->blocking == 0) {
        result = init_nonblocking(comm);
        if (result == ncclInProgress)
            *out = comm;
        else
            comm_discard(comm);
        return result;
    }
    if (result == ncclSuccess)
        result = rdv_wait_joined(comm->rdv, join_deadline());
    if (result != ncclSuccess) {
        if (comm)
            comm_discard(comm);
        return result;
    }
    SIM_DEBUG("joined communicator %016" PRIx64 " as rank %d of %d", comm->id_hash, rank, nranks);
    *out = comm;
    return ncclSuccess;
}

/* One process drives ndev ranks: register them all first, then wait, or they would deadlock. */
ncclResult_t comm_init_all(ncclComm_t *comms, int ndev)
{
    ncclUniqueId id;
    ncclResult_t result = comm_new_unique_id(&id);
    int opened = 0;
    while (result == ncclSuccess && opened < ndev) {
        result = comm_open(&id, ndev, opened, &comms[opened]);
        opened += result == ncclSuccess;
    }
    int64_t deadline = join_deadline();
    for (int i = 0; result == ncclSuccess && i < ndev; i++)
        result = rdv_wait_joined(comms[i]->rdv, deadline);
    if (result != ncclSuccess)
        for (int i = 0; i < opened; i++) {
            comm_discard(comms[i]);
            comms[i] = NULL;
        }
    return result;
}

void comm_part_added(struct ncclComm *comm)
{
    pthread_mutex_lock(&comm->lock);
    comm->pending++;
    pthread_mutex_unlock(&comm->lock);
}

void comm_part_finished(struct ncclComm *comm, int failed)
{
    if (failed)
        atomic_store(&comm->async_error, ncclRemoteError);
    pthread_mutex_lock(&comm->lock);
    if (--comm->pending == 0)
        pthread_cond_broadcast(&comm->drained);
    pthread_mutex_unlock(&comm->lock);
}

/* Wait until the device has finished (or failed) every queued operation of the communicator. */
static int wait_drained(struct ncclComm *comm, int64_t deadline_ns)
{
    struct timespec ts = sim_timespec(deadline_ns);
    pthread_mutex_lock(&comm->lock);
    while (comm->pending > 0 && sim_now_ns() < deadline_ns)
        pthread_cond_timedwait(&comm->drained, &comm->lock, &ts);
    int drained = comm->pending == 0;
    pthread_mutex_unlock(&comm->lock);
    return drained;
}

/*
 * Destroy flushes queued work first, as NCCL does; abort fails it at once. A communicator whose
 * work never drains is left allocated (the device may still touch it) and reported.
 */
ncclResult_t comm_finish(struct ncclComm *comm, int abort)
{
    if (abort) {
        atomic_store(&comm->aborted, 1);
        ingero_sim_wake_device();
    }
    int64_t deadline = sim_now_ns() + ingero_sim_timeout_ns() + TEARDOWN_GRACE_NS;
    if (!wait_drained(comm, deadline)) {
        sim_log("communicator %016" PRIx64 ": operations still queued at teardown", comm->id_hash);
        return ncclRemoteError;
    }
    comm_discard(comm);
    return ncclSuccess;
}

/* Every member derives the same child id from the parent id, the split count and the color. */
static void child_unique_id(const struct ncclComm *parent, int color, ncclUniqueId *child)
{
    uint64_t seed = ingero_sim_splitmix64(parent->id_hash ^ ingero_sim_splitmix64(parent->splits));
    seed = ingero_sim_splitmix64(seed ^ (uint64_t)(uint32_t)color);
    for (size_t word = 0; word < sizeof child->internal / 8; word++) {
        seed = ingero_sim_splitmix64(seed);
        memcpy(child->internal + word * 8, &seed, 8);
    }
}

/* New rank = position among the ranks of the same color, ordered by (key, old rank). */
static int child_rank(const int64_t *payloads, int nranks, int me, int *child_nranks)
{
    int32_t color = (int32_t)(payloads[me] >> 32), key = (int32_t)payloads[me];
    int rank = 0, count = 0;
    for (int r = 0; r < nranks; r++) {
        int32_t c = (int32_t)(payloads[r] >> 32), k = (int32_t)payloads[r];
        if (c != color)
            continue;
        count++;
        if (k < key || (k == key && r < me))
            rank++;
    }
    *child_nranks = count;
    return rank;
}

ncclResult_t comm_split(struct ncclComm *parent, int color, int key, ncclComm_t *out)
{
    *out = NULL;
    int64_t deadline = join_deadline();
    if (!wait_drained(parent, deadline))
        return ncclRemoteError;
    int64_t payloads[SIM_MAX_RANKS] = { 0 };
    struct rdv_key exchange = { .kind = RDV_COLLECTIVE, .seq = parent->next_collective++ };
    int64_t mine = (int64_t)(((uint64_t)(uint32_t)color << 32) | (uint32_t)key);
    ncclResult_t result = rdv_exchange(parent->rdv, &exchange, mine, payloads, deadline);
    ncclUniqueId child;
    child_unique_id(parent, color, &child);
    parent->splits++;
    if (result != ncclSuccess || color == NCCL_SPLIT_NOCOLOR)
        return result;
    int child_nranks = 0;
    int rank = child_rank(payloads, parent->nranks, parent->rank, &child_nranks);
    return comm_init_rank(out, child_nranks, &child, rank, NULL);
}

/* The ranks left once the excluded ones are dropped (only they call it, as with NCCL), in the
 * parent's order; their child id is the parent's next split's, of a colour no split uses. */
ncclResult_t comm_shrink(struct ncclComm *parent, const int *excluded, int nexcluded,
                         ncclComm_t *out)
{
    *out = NULL;
    int rank = parent->rank;
    for (int i = 0; i < nexcluded; i++) {
        if (excluded[i] < 0 || excluded[i] >= parent->nranks || excluded[i] == parent->rank)
            return ncclInvalidArgument;
        rank -= excluded[i] < parent->rank;
    }
    if (nexcluded >= parent->nranks)
        return ncclInvalidArgument;
    ncclUniqueId child;
    child_unique_id(parent, INT32_MIN, &child);
    parent->splits++;
    return comm_init_rank(out, parent->nranks - nexcluded, &child, rank, NULL);
}
