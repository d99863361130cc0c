/*
 * Shared-memory rendezvous for the ranks of one host. The segment /ingero-sim-<comm_id_hash>
 * holds one cell per (collective slot, rank) and per (sender, receiver, slot, side); each rank
 * writes only its own cells, so no locks are needed. A cell's tag is seq + 1 once written.
 * Ranks stay within one collective of each other (a rank cannot finish collective s before all
 * reached it), so a small ring of slots is never lapped. The rank whose arrival completes a key
 * bumps `epoch` and wakes every futex waiter: the per-communicator watcher threads, which wake
 * their device thread.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "rdv.h"
#include "simcommon.h"
#include "vgpu.h"

#define COLL_SLOTS 64
#define P2P_SLOTS 8
#define WATCH_CHUNK_NS (1 * NS_PER_S)
#define JOIN_CHUNK_NS (100 * NS_PER_MS)

struct shm_cell {
    _Atomic uint64_t tag;   /* seq + 1 once arrival and payload are written */
    int64_t arrival_ns;
    int64_t payload;
};

struct shm_segment {
    _Atomic uint32_t nranks;   /* set by the first rank to arrive */
    _Atomic uint32_t joined;   /* futex: ranks that registered */
    _Atomic uint32_t attached; /* ranks still using the segment; the last one unlinks it */
    _Atomic uint32_t epoch;    /* futex: bumped whenever a key completes */
    _Atomic int32_t pids[SIM_MAX_RANKS];
    struct shm_cell collective[COLL_SLOTS][SIM_MAX_RANKS];
    struct shm_cell p2p[SIM_MAX_RANKS][SIM_MAX_RANKS][P2P_SLOTS][2];
};

struct shm_rdv {
    struct rdv base;
    struct shm_segment *seg;
    char name[48];
    pthread_t watcher;
    int watching;
    uint32_t epoch_seen;      /* the epoch when the watcher was started */
    _Atomic int stopping;
};

static void futex_wait(_Atomic uint32_t *word, uint32_t expected, int64_t timeout_ns)
{
    struct timespec ts = sim_timespec(sim_max(timeout_ns, 0));
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static struct shm_cell *own_cell(struct shm_rdv *s, const struct rdv_key *key)
{
    if (key->kind == RDV_COLLECTIVE)
        return &s->seg->collective[key->seq % COLL_SLOTS][s->base.rank];
    return &s->seg->p2p[key->src][key->dst][key->seq % P2P_SLOTS][key->side];
}

/* RDV_DONE with the cell read, RDV_PENDING if not written yet, RDV_FAILED if lapped. */
static int read_cell(struct shm_cell *cell, uint64_t seq, int64_t *max_arrival, int64_t *payload)
{
    uint64_t tag = atomic_load(&cell->tag);
    if (tag != seq + 1)
        return tag > seq + 1 ? RDV_FAILED : RDV_PENDING;
    *max_arrival = sim_max(*max_arrival, cell->arrival_ns);
    if (payload)
        *payload = cell->payload;
    return RDV_DONE;
}

static int shm_poll(struct rdv *r, const struct rdv_key *key, int64_t *max_arrival,
                    int64_t *payloads)
{
    struct shm_rdv *s = (struct shm_rdv *)r;
    int64_t latest = 0;
    if (key->kind == RDV_P2P) {
        for (int side = 0; side < 2; side++) {
            struct shm_cell *cell = &s->seg->p2p[key->src][key->dst][key->seq % P2P_SLOTS][side];
            int status = read_cell(cell, key->seq, &latest, NULL);
            if (status != RDV_DONE)
                return status;
        }
    } else {
        for (int rank = 0; rank < r->nranks; rank++) {
            struct shm_cell *cell = &s->seg->collective[key->seq % COLL_SLOTS][rank];
            int status = read_cell(cell, key->seq, &latest, payloads ? &payloads[rank] : NULL);
            if (status != RDV_DONE)
                return status;
        }
    }
    *max_arrival = latest;
    return RDV_DONE;
}

static int shm_publish(struct rdv *r, const struct rdv_key *key, int64_t arrival_ns,
                       int64_t payload)
{
    struct shm_rdv *s = (struct shm_rdv *)r;
    struct shm_cell *cell = own_cell(s, key);
    cell->arrival_ns = arrival_ns;
    cell->payload = payload;
    atomic_store(&cell->tag, key->seq + 1);
    int64_t ignored = 0;
    if (shm_poll(r, key, &ignored, NULL) == RDV_DONE) {
        atomic_fetch_add(&s->seg->epoch, 1);
        futex_wake_all(&s->seg->epoch);
    }
    return 0;
}

static void shm_forget(struct rdv *r, const struct rdv_key *key)
{
    (void)r;
    (void)key;
}

static uint64_t shm_progress_token(struct rdv *r)
{
    return atomic_load(&((struct shm_rdv *)r)->seg->epoch);
}

static void shm_wait_progress(struct rdv *r, uint64_t token, int64_t deadline_ns)
{
    struct shm_rdv *s = (struct shm_rdv *)r;
    futex_wait(&s->seg->epoch, (uint32_t)token, sim_min(deadline_ns - sim_now_ns(), JOIN_CHUNK_NS));
}

/*
 * Turns a peer's completing arrival (a futex wake in shared memory) into a device wake-up.
 * `seen` starts at the epoch read before this rank could publish anything and only ever moves
 * to a value already acted on, so no bump between two waits goes unnoticed.
 */
static void *watch_epoch(void *arg)
{
    struct shm_rdv *s = arg;
    uint32_t seen = s->epoch_seen;
    while (!atomic_load(&s->stopping)) {
        futex_wait(&s->seg->epoch, seen, WATCH_CHUNK_NS);
        uint32_t now = atomic_load(&s->seg->epoch);
        if (now != seen) {
            seen = now;
            ingero_sim_wake_device();
        }
    }
    return NULL;
}

static ncclResult_t shm_wait_joined(struct rdv *r, int64_t deadline_ns)
{
    struct shm_rdv *s = (struct shm_rdv *)r;
    for (;;) {
        uint32_t joined = atomic_load(&s->seg->joined);
        if ((int)joined >= r->nranks)
            return ncclSuccess;
        int64_t left = deadline_ns - sim_now_ns();
        if (left <= 0) {
            sim_log("ncclCommInitRank: %u of %d ranks joined communicator %016" PRIx64
                    " before the timeout", joined, r->nranks, r->comm_hash);
            return ncclRemoteError;
        }
        futex_wait(&s->seg->joined, joined, sim_min(left, JOIN_CHUNK_NS));
    }
}

static void shm_close(struct rdv *r)
{
    struct shm_rdv *s = (struct shm_rdv *)r;
    if (s->watching) {
        atomic_store(&s->stopping, 1);
        futex_wake_all(&s->seg->epoch);
        pthread_join(s->watcher, NULL);
    }
    if (atomic_fetch_sub(&s->seg->attached, 1) == 1)
        shm_unlink(s->name);
    munmap(s->seg, sizeof *s->seg);
    free(s);
}

static const struct rdv_backend shm_backend = {
    .wait_joined = shm_wait_joined,
    .publish = shm_publish,
    .poll = shm_poll,
    .forget = shm_forget,
    .progress_token = shm_progress_token,
    .wait_progress = shm_wait_progress,
    .close = shm_close,
};

static struct shm_segment *map_segment(const char *name)
{
    int fd = shm_open(name, O_CREAT | O_RDWR, 0600);
    if (fd < 0)
        return NULL;
    void *p = MAP_FAILED;
    if (ftruncate(fd, sizeof(struct shm_segment)) == 0)
        p = mmap(NULL, sizeof(struct shm_segment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* Claim nranks (first comer) and this rank's slot; a mismatch is the application's error. */
static ncclResult_t register_rank(struct shm_rdv *s)
{
    uint32_t expected = 0;
    uint32_t nranks = (uint32_t)s->base.nranks;
    if (!atomic_compare_exchange_strong(&s->seg->nranks, &expected, nranks) && expected != nranks) {
        sim_log("communicator %s: this rank says %u ranks, another said %u", s->name, nranks,
                expected);
        return ncclInvalidUsage;
    }
    int32_t free_slot = 0;
    if (!atomic_compare_exchange_strong(&s->seg->pids[s->base.rank], &free_slot, getpid())) {
        sim_log("communicator %s: rank %d joined twice", s->name, s->base.rank);
        return ncclInvalidUsage;
    }
    atomic_fetch_add(&s->seg->attached, 1);
    atomic_fetch_add(&s->seg->joined, 1);
    futex_wake_all(&s->seg->joined);
    return ncclSuccess;
}

struct rdv *rdv_shm_open(uint64_t comm_hash, int nranks, int rank, ncclResult_t *err)
{
    struct shm_rdv *s = calloc(1, sizeof *s);
    if (!s) {
        *err = ncclSystemError;
        return NULL;
    }
    s->base = (struct rdv){ &shm_backend, nranks, rank, comm_hash };
    snprintf(s->name, sizeof s->name, "/ingero-sim-%016" PRIx64, comm_hash);
    s->seg = map_segment(s->name);
    *err = s->seg ? register_rank(s) : ncclSystemError;
    if (*err == ncclSuccess) {
        s->epoch_seen = atomic_load(&s->seg->epoch);
        s->watching = sim_start_thread(watch_epoch, s, &s->watcher) == 0;
    }
    if (*err != ncclSuccess || !s->watching) {
        if (s->seg)
            munmap(s->seg, sizeof *s->seg);
        free(s);
        if (*err == ncclSuccess)
            *err = ncclSystemError;
        return NULL;
    }
    return &s->base;
}
