/*
 * Rendezvous: how the ranks of one communicator learn when the others reached the same
 * collective. Every rank publishes (key, arrival time, payload); a key is complete when every
 * participant has published, and its result is the latest arrival (plus, for a collective, each
 * rank's payload, which ncclCommSplit uses to exchange colors). Two transports:
 *   shm — a shared-memory segment named after comm_id_hash, for ranks on one host;
 *   tcp — a coordinator process at INGERO_SIM_RENDEZVOUS=tcp://HOST:PORT, for ranks in
 *         different network namespaces.
 * Completion wakes the device thread (ingero_sim_wake_device) from a per-communicator thread.
 */
#ifndef SIM_RDV_H
#define SIM_RDV_H

#include <stdint.h>

#include "nccl.h"

#define HIDDEN __attribute__((visibility("hidden")))

/* A communicator's ranks at most (sim/scenario.py MAX_WORLD): a 64-node job of 8 GPUs. The shm
 * rendezvous' tables are sized by it; only the cells of pairs that exchange are ever touched. */
#define SIM_MAX_RANKS 512

enum rdv_status { RDV_FAILED = -1, RDV_PENDING = 0, RDV_DONE = 1 };

enum rdv_kind { RDV_COLLECTIVE, RDV_P2P };
enum rdv_side { RDV_SENDER, RDV_RECEIVER };

/* A collective is named by its sequence on the communicator; a point-to-point transfer by
 * (sender, receiver, how many transfers that pair made before it). */
struct rdv_key {
    enum rdv_kind kind;
    enum rdv_side side;   /* RDV_P2P: which end this rank publishes */
    int src, dst;         /* RDV_P2P */
    uint64_t seq;
};

struct rdv;

struct rdv_backend {
    ncclResult_t (*wait_joined)(struct rdv *r, int64_t deadline_ns);
    int (*publish)(struct rdv *r, const struct rdv_key *key, int64_t arrival_ns, int64_t payload);
    int (*poll)(struct rdv *r, const struct rdv_key *key, int64_t *max_arrival_ns,
                int64_t *payloads);
    void (*forget)(struct rdv *r, const struct rdv_key *key);
    uint64_t (*progress_token)(struct rdv *r);
    void (*wait_progress)(struct rdv *r, uint64_t token, int64_t deadline_ns);
    void (*close)(struct rdv *r);
};

/* Every transport's state starts with this. */
struct rdv {
    const struct rdv_backend *backend;
    int nranks, rank;
    uint64_t comm_hash;
};

/* Register this rank (non-blocking); rdv_wait_joined then blocks until all nranks did. */
HIDDEN struct rdv *rdv_open(const ncclUniqueId *id, int nranks, int rank, ncclResult_t *err);
HIDDEN struct rdv *rdv_shm_open(uint64_t comm_hash, int nranks, int rank, ncclResult_t *err);
HIDDEN struct rdv *rdv_tcp_open(const char *address, uint64_t comm_hash, int nranks, int rank,
                                ncclResult_t *err);

HIDDEN ncclResult_t rdv_wait_joined(struct rdv *r, int64_t deadline_ns);
HIDDEN int rdv_publish(struct rdv *r, const struct rdv_key *key, int64_t arrival_ns,
                       int64_t payload);
HIDDEN int rdv_poll(struct rdv *r, const struct rdv_key *key, int64_t *max_arrival_ns,
                    int64_t *payloads);
HIDDEN void rdv_forget(struct rdv *r, const struct rdv_key *key);
HIDDEN ncclResult_t rdv_exchange(struct rdv *r, const struct rdv_key *key, int64_t payload,
                                 int64_t *payloads, int64_t deadline_ns);
HIDDEN void rdv_close(struct rdv *r);

#endif
