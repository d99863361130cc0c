/* Choosing a rendezvous transport, and the blocking exchange built on any of them. */
#include <stdlib.h>
#include <string.h>

#include "ingero_sim.h"
#include "rdv.h"
#include "simcommon.h"

struct rdv *rdv_open(const ncclUniqueId *id, int nranks, int rank, ncclResult_t *err)
{
    uint64_t hash = ingero_sim_comm_id_hash(id->internal);
    const char *address = getenv("INGERO_SIM_RENDEZVOUS");
    if (!address || !*address || strcmp(address, "shm") == 0)
        return rdv_shm_open(hash, nranks, rank, err);
    if (strncmp(address, "tcp://", 6) == 0)
        return rdv_tcp_open(address + 6, hash, nranks, rank, err);
    sim_log("INGERO_SIM_RENDEZVOUS=%s: expected shm or tcp://HOST:PORT", address);
    *err = ncclInvalidArgument;
    return NULL;
}

ncclResult_t rdv_wait_joined(struct rdv *r, int64_t deadline_ns)
{
    return r->backend->wait_joined(r, deadline_ns);
}

int rdv_publish(struct rdv *r, const struct rdv_key *key, int64_t arrival_ns, int64_t payload)
{
    return r->backend->publish(r, key, arrival_ns, payload);
}

int rdv_poll(struct rdv *r, const struct rdv_key *key, int64_t *max_arrival_ns, int64_t *payloads)
{
    return r->backend->poll(r, key, max_arrival_ns, payloads);
}

void rdv_forget(struct rdv *r, const struct rdv_key *key)
{
    r->backend->forget(r, key);
}

void rdv_close(struct rdv *r)
{
    if (r)
        r->backend->close(r);
}

/* Host-side, blocking: publish a payload now and wait for every rank's (ncclCommSplit). */
ncclResult_t rdv_exchange(struct rdv *r, const struct rdv_key *key, int64_t payload,
                          int64_t *payloads, int64_t deadline_ns)
{
    if (rdv_publish(r, key, sim_now_ns(), payload) < 0)
        return ncclSystemError;
    for (;;) {
        uint64_t token = r->backend->progress_token(r);
        int64_t max_arrival = 0;
        int status = rdv_poll(r, key, &max_arrival, payloads);
        if (status == RDV_DONE)
            break;
        if (status == RDV_FAILED)
            return ncclSystemError;
        if (sim_now_ns() >= deadline_ns)
            return ncclRemoteError;
        r->backend->wait_progress(r, token, deadline_ns);
    }
    rdv_forget(r, key);
    return ncclSuccess;
}
