/*
 * A tensor-, pipeline- and data-parallel training step, laid out as Megatron-LM lays ranks
 * out: tensor-parallel groups of --tp consecutive ranks (within a node), data-parallel groups
 * across them, --pp pipeline stages of world / pp consecutive ranks each. Every group is a
 * communicator split from the world with ncclCommSplit, as PyTorch's new_group does; the
 * world itself carries no collective. A step: the stage's forward pass (activations received
 * from the stage before, sent to the stage after), a sync on its own kernels (a step timer's,
 * or the loss read where it comes before any collective: self-work, where a slow GPU shows),
 * its tensor-parallel all-reduce, the backward pass the other way, a second tensor-parallel
 * all-reduce, the gradients' data-parallel all-reduce, the optimizer. Stages do unequal work
 * by design (--stage-work).
 */
#include "rank_train.h"

static void plan_stage(struct training *t)
{
    struct parallel *p = &t->parallel;
    uint64_t work = (uint64_t)t->cfg->stage_work_ns[p->stage];
    uint64_t k = (uint64_t)t->cfg->kernels;
    p->forward = (struct ingero_sim_kernel){ INGERO_SIM_KERNEL_MAGIC, work * 3 / 10 / k };
    p->backward = (struct ingero_sim_kernel){ INGERO_SIM_KERNEL_MAGIC, work * 6 / 10 / (2 * k) };
}

int parallel_join(struct training *t)
{
    const struct rank_config *cfg = t->cfg;
    struct parallel *p = &t->parallel;
    int tp = cfg->tp, dp = cfg->world_size / (cfg->tp * cfg->pp);
    int tp_index = cfg->rank % tp, dp_index = cfg->rank / tp % dp;
    p->stages = cfg->pp;
    p->stage = cfg->rank / (tp * dp);
    plan_stage(t);
    return group_split(t, &p->tp, p->stage * dp + dp_index, 0)
        || group_split(t, &p->dp, p->stage * tp + tp_index, 1)
        || group_split(t, &p->pp, dp_index * tp + tp_index, 2);
}

/* Activations (forward) or gradients (backward) to or from the stage ``side`` (0: before,
 * 1: after), on the pipeline group, where the group's rank is the stage. */
static int exchange(struct training *t, int side, int sending, int step)
{
    struct parallel *p = &t->parallel;
    int peer = p->stage + (side ? 1 : -1);
    size_t count = t->elements / 4 ? t->elements / 4 : 1;
    uint64_t *counter = sending ? &p->sent[side] : &p->received[side];
    struct collective_call c = call_begin(t, sending ? "ncclSend" : "ncclRecv", count, -1, peer,
                                          step, counter);
    c.comm_hash = p->pp.hash;
    c.result = sending
        ? ncclSend(t->p2p_out, count, t->cfg->datatype, peer, p->pp.comm, t->stream)
        : ncclRecv(t->p2p_in, count, t->cfg->datatype, peer, p->pp.comm, t->stream);
    return call_end(t, &c);
}

static int forward(struct training *t, int step)
{
    struct parallel *p = &t->parallel;
    int64_t delay = rank_delay_ns(t->cfg, step, BEFORE_ALLREDUCE);
    size_t tp_count = t->elements / 4 ? t->elements / 4 : 1;
    if ((p->stage > 0 && exchange(t, 0, 0, step)) || launch(t, &p->forward, t->cfg->kernels)
        || read_loss(t, step))
        return 1;
    jitter(t);
    if (delay > 0)
        sleep_for_ns(delay);
    return group_all_reduce(t, &p->tp, tp_count, step)
        || (p->stage < p->stages - 1 && exchange(t, 1, 1, step));
}

static int backward(struct training *t, int step)
{
    struct parallel *p = &t->parallel;
    size_t tp_count = t->elements / 4 ? t->elements / 4 : 1;
    return (p->stage < p->stages - 1 && exchange(t, 1, 0, step))
        || launch(t, &p->backward, 2 * t->cfg->kernels)
        || group_all_reduce(t, &p->tp, tp_count, step)
        || (p->stage > 0 && exchange(t, 0, 1, step));
}

int parallel_compute(struct training *t, int step)
{
    return forward(t, step) || backward(t, step)
        || group_all_reduce(t, &t->parallel.dp, t->elements, step)
        || launch(t, &t->optimizer, 1);
}
