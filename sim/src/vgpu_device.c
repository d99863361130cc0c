/*
 * The device thread: the part of the virtual GPU that runs independently of the host. It walks
 * every stream's queue, completes items whose virtual end time real time has reached, publishes
 * collective arrivals, and sleeps on a condition variable until the next end time, a new item
 * at a stream head, or a peer's arrival (rung by libnccl's transport threads). Hosts waiting in a
 * sync sleep on a second condition variable that the device broadcasts after each completion,
 * or, where the sync's end is known, alone until then (and leave the items to the device).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simcommon.h"
#include "vgpu_model.h"

#define IDLE_WAKE_NS (1 * NS_PER_S)

enum item_kind { ITEM_WORK, ITEM_EVENT_RECORD, ITEM_EVENT_WAIT, ITEM_REMOTE };
enum item_status { ITEM_PENDING, ITEM_DONE, ITEM_FAILED };

struct vgpu_remote {
    const struct ingero_sim_remote_ops *ops;
    void **parts;
    int64_t *part_end;        /* -1 while that part still waits for its peers */
    int nparts;
    int published;
    int64_t published_at_ns;  /* real time of publishing, for the timeout */
};

struct vgpu_item {
    struct vgpu_item *next;
    enum item_kind kind;
    int64_t enqueued_ns;      /* real time the host queued it */
    int64_t duration_ns;      /* ITEM_WORK */
    int64_t start_ns;         /* virtual start; -1 until it reaches the stream head */
    struct CUevent_st *event; /* ITEM_EVENT_RECORD, ITEM_EVENT_WAIT */
    uint64_t event_record;    /* which record of the event this item is or waits for */
    struct vgpu_remote remote;
};

static struct {
    pthread_mutex_t lock;
    pthread_cond_t work;      /* the device thread sleeps here */
    pthread_cond_t progress;  /* hosts in a sync sleep here */
    uint64_t completions;     /* items finished so far; lets waiters see progress */
    struct CUstream_st default_stream;
    struct CUstream_st *streams;
    cudaError_t sticky_error; /* a failed item poisons the context, as on a real GPU */
    struct vgpu_knobs knobs;
} dev = { .lock = PTHREAD_MUTEX_INITIALIZER };

static pthread_once_t dev_once = PTHREAD_ONCE_INIT;

static void read_knobs(struct vgpu_knobs *k)
{
    k->kernel_ns = (int64_t)(sim_knob("INGERO_SIM_KERNEL_US", 50, 0) * NS_PER_US);
    k->slowdown = sim_knob("INGERO_SIM_GPU_SLOWDOWN", 1.0, 0.001);
    k->pcie_gbps = sim_knob("INGERO_SIM_PCIE_GBPS", 25, 0.001);
    k->hbm_gbps = sim_knob("INGERO_SIM_HBM_GBPS", 1500, 0.001);
    k->timeout_ns = (int64_t)(sim_knob("INGERO_SIM_TIMEOUT_S", 60, 0.001) * NS_PER_S);
    k->device_count = (int)sim_knob("INGERO_SIM_DEVICE_COUNT", 8, 1);
    k->memory_bytes = (uint64_t)(sim_knob("INGERO_SIM_GPU_MEM_GB", 80, 0.001) * 1e9);
}

static void init_condvar(pthread_cond_t *cv)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(cv, &attr);
    pthread_condattr_destroy(&attr);
}

static void *device_main(void *unused);

static void start_device_thread(void)
{
    pthread_t thread;
    if (sim_start_thread(device_main, NULL, &thread) != 0) {
        sim_log("cannot start the device thread; the virtual GPU is dead");
        abort();
    }
    pthread_detach(thread);
}

static void init_once(void)
{
    read_knobs(&dev.knobs);
    init_condvar(&dev.work);
    init_condvar(&dev.progress);
    dev.default_stream.magic = STREAM_MAGIC;
    dev.streams = &dev.default_stream;
    start_device_thread();
}

void vgpu_init(void) { pthread_once(&dev_once, init_once); }
const struct vgpu_knobs *vgpu_knobs(void) { vgpu_init(); return &dev.knobs; }
void vgpu_lock(void) { pthread_mutex_lock(&dev.lock); }
void vgpu_unlock(void) { pthread_mutex_unlock(&dev.lock); }
struct CUstream_st *vgpu_default_stream(void) { return &dev.default_stream; }
cudaError_t vgpu_sticky_error(void) { return dev.sticky_error; }
void vgpu_poke(void) { pthread_cond_signal(&dev.work); }

/* Caller holds the lock. New streams go first so the default stream stays last. */
void vgpu_add_stream(struct CUstream_st *s)
{
    s->next = dev.streams;
    dev.streams = s;
}

int vgpu_for_each_stream(int (*visit)(struct CUstream_st *s, void *arg), void *arg)
{
    for (struct CUstream_st *s = dev.streams; s; s = s->next)
        if (!visit(s, arg))
            return 0;
    return 1;
}

static struct vgpu_item *new_item(enum item_kind kind)
{
    struct vgpu_item *item = calloc(1, sizeof *item);
    if (item)
        item->kind = kind;
    return item;
}

struct vgpu_item *vgpu_item_work(int64_t duration_ns)
{
    struct vgpu_item *item = new_item(ITEM_WORK);
    if (item)
        item->duration_ns = duration_ns;
    return item;
}

/* Caller holds the lock: the event's reference count changes here. */
struct vgpu_item *vgpu_item_event(int wait, struct CUevent_st *ev, uint64_t record)
{
    struct vgpu_item *item = new_item(wait ? ITEM_EVENT_WAIT : ITEM_EVENT_RECORD);
    if (item) {
        item->event = ev;
        item->event_record = record;
        ev->refs++;
    }
    return item;
}

struct vgpu_item *vgpu_item_remote(const struct ingero_sim_remote_ops *ops, void *const *parts,
                                   int nparts)
{
    struct vgpu_item *item = new_item(ITEM_REMOTE);
    if (!item)
        return NULL;
    struct vgpu_remote *r = &item->remote;
    r->parts = calloc((size_t)nparts, sizeof *r->parts);
    r->part_end = calloc((size_t)nparts, sizeof *r->part_end);
    if (!r->parts || !r->part_end) {
        free(r->parts);
        free(r->part_end);
        free(item);
        return NULL;
    }
    r->ops = ops;
    r->nparts = nparts;
    for (int i = 0; i < nparts; i++) {
        r->parts[i] = parts[i];
        r->part_end[i] = -1;
    }
    return item;
}

/* Queue an item; the device is woken only when the item is the stream's new head. */
struct vgpu_capture {
    struct vgpu_item *head, *tail;
};

struct vgpu_capture *vgpu_capture_new(void)
{
    return calloc(1, sizeof(struct vgpu_capture));
}

void vgpu_capture_free(struct vgpu_capture *c)
{
    while (c && c->head) {
        struct vgpu_item *item = c->head;
        c->head = item->next;
        for (int i = 0; item->kind == ITEM_REMOTE && i < item->remote.nparts; i++)
            item->remote.ops->discard(item->remote.parts[i]);
        free(item->remote.parts);
        free(item->remote.part_end);
        free(item);
    }
    free(c);
}

/* Caller holds the lock: an item enqueued on a capturing stream is kept by the capture
 * (a collective's parts as templates); events cannot be captured here. */
static cudaError_t capture(struct vgpu_capture *c, struct vgpu_item *item)
{
    int kept = item->kind == ITEM_WORK
        || (item->kind == ITEM_REMOTE && item->remote.ops->renew && item->remote.ops->discard);
    if (!kept) {
        if (item->event)
            vgpu_event_release(item->event);
        free(item->remote.parts);
        free(item->remote.part_end);
        free(item);
        return cudaErrorStreamCaptureUnsupported;
    }
    item->next = NULL;
    if (c->tail)
        c->tail->next = item;
    else
        c->head = item;
    c->tail = item;
    return cudaSuccess;
}

/* A replay: the captured work enqueued again on ``s``, each collective's parts renewed. */
cudaError_t vgpu_capture_replay(const struct vgpu_capture *c, struct CUstream_st *s)
{
    cudaError_t err = cudaSuccess;
    for (const struct vgpu_item *item = c->head; item && err == cudaSuccess; item = item->next) {
        if (item->kind == ITEM_WORK) {
            err = vgpu_enqueue(s, vgpu_item_work(item->duration_ns));
            continue;
        }
        const struct vgpu_remote *r = &item->remote;
        void *parts[r->nparts];
        int made = 0;
        while (made < r->nparts && (parts[made] = r->ops->renew(r->parts[made])))
            made++;
        struct vgpu_item *fresh = made == r->nparts ? vgpu_item_remote(r->ops, parts, made)
                                                    : NULL;
        if (!fresh)
            for (int i = 0; i < made; i++)
                r->ops->finish(parts[i], 0);
        err = vgpu_enqueue(s, fresh);
    }
    return err;
}

cudaError_t vgpu_enqueue(struct CUstream_st *s, struct vgpu_item *item)
{
    if (!item)
        return cudaErrorMemoryAllocation;
    vgpu_lock();
    if (s->capturing) {
        cudaError_t err = capture(s->capturing, item);
        vgpu_unlock();
        return err;
    }
    item->enqueued_ns = sim_now_ns();
    item->start_ns = -1;
    if (s->tail)
        s->tail->next = item;
    else
        s->head = item;
    s->tail = item;
    s->enqueued++;
    if (s->head == item)
        vgpu_poke();
    vgpu_unlock();
    return cudaSuccess;
}

/* An event's reference, dropped by the item that held it (done on the device, or a query
 * that found it): the last one frees a destroyed event. Called with the lock held. */
void vgpu_event_release(struct CUevent_st *ev)
{
    if (--ev->refs == 0 && ev->destroyed)
        free(ev);
}

static enum item_status run_work(struct vgpu_item *item, int64_t now, int64_t *end,
                                 int64_t *wake_at)
{
    *end = item->start_ns + item->duration_ns;
    if (*end <= now)
        return ITEM_DONE;
    *wake_at = sim_min(*wake_at, *end);
    return ITEM_PENDING;
}

static enum item_status run_event_wait(struct vgpu_item *item, int64_t *end)
{
    struct CUevent_st *ev = item->event;
    if (ev->completed < item->event_record)
        return ITEM_PENDING;
    *end = sim_max(item->start_ns, ev->time_ns);
    return ITEM_DONE;
}

/* Publish every part once, then collect each part's end; all must be done for the item. */
static enum item_status collect_parts(struct vgpu_remote *r, int64_t *end, cudaError_t *err)
{
    enum item_status status = ITEM_DONE;
    for (int i = 0; i < r->nparts; i++) {
        if (r->part_end[i] >= 0) {
            *end = sim_max(*end, r->part_end[i]);
            continue;
        }
        int64_t part_end = 0;
        int polled = r->ops->poll(r->parts[i], &part_end);
        if (polled == INGERO_SIM_FAILED) {
            *err = cudaErrorLaunchFailure;
            return ITEM_FAILED;
        }
        if (polled == INGERO_SIM_PENDING) {
            status = ITEM_PENDING;
            continue;
        }
        r->part_end[i] = part_end;
        *end = sim_max(*end, part_end);
    }
    return status;
}

static enum item_status run_remote(struct vgpu_item *item, int64_t now, int64_t *end,
                                   int64_t *wake_at, cudaError_t *err)
{
    struct vgpu_remote *r = &item->remote;
    if (!r->published) {
        r->published = 1;
        r->published_at_ns = now;
        for (int i = 0; i < r->nparts; i++)
            if (r->ops->publish(r->parts[i], item->start_ns) < 0) {
                *err = cudaErrorLaunchFailure;
                return ITEM_FAILED;
            }
    }
    *end = item->start_ns;
    enum item_status status = collect_parts(r, end, err);
    if (status == ITEM_FAILED)
        return status;
    if (status == ITEM_PENDING) {
        int64_t deadline = r->published_at_ns + dev.knobs.timeout_ns;
        if (now >= deadline) {
            sim_log("collective waited %.1f s for its peers; failing it (INGERO_SIM_TIMEOUT_S)",
                    (double)(now - r->published_at_ns) / NS_PER_S);
            *err = cudaErrorLaunchTimeout;
            return ITEM_FAILED;
        }
        *wake_at = sim_min(*wake_at, deadline);
        return ITEM_PENDING;
    }
    if (*end > now) {
        *wake_at = sim_min(*wake_at, *end);
        return ITEM_PENDING;
    }
    return ITEM_DONE;
}

static enum item_status run_item(struct vgpu_item *item, int64_t now, int64_t *end,
                                 int64_t *wake_at, cudaError_t *err)
{
    switch (item->kind) {
    case ITEM_WORK:
        return run_work(item, now, end, wake_at);
    case ITEM_EVENT_RECORD:
        *end = item->start_ns;
        return ITEM_DONE;
    case ITEM_EVENT_WAIT:
        return run_event_wait(item, end);
    case ITEM_REMOTE:
        return run_remote(item, now, end, wake_at, err);
    }
    return ITEM_DONE;
}

static void free_item(struct vgpu_item *item, int failed)
{
    struct vgpu_remote *r = &item->remote;
    if (item->kind == ITEM_REMOTE) {
        for (int i = 0; i < r->nparts; i++)
            r->ops->finish(r->parts[i], failed);
        free(r->parts);
        free(r->part_end);
    }
    if (item->event)
        vgpu_event_release(item->event);
    free(item);
}

/* Pop the head: a finished item moves the stream's clock, a failed one poisons the stream. */
static void retire_item(struct CUstream_st *s, struct vgpu_item *item, int64_t end,
                        cudaError_t err)
{
    s->head = item->next;
    if (!s->head)
        s->tail = NULL;
    s->completed++;
    dev.completions++;
    if (err) {
        if (!s->error)
            s->error = err;
        if (!dev.sticky_error)
            dev.sticky_error = err;
    } else {
        s->free_at_ns = end;
    }
    if (item->kind == ITEM_EVENT_RECORD && item->event_record > item->event->completed) {
        item->event->completed = item->event_record;
        item->event->time_ns = end;
        item->event->error = err;
    }
    free_item(item, err != cudaSuccess);
}

static int advance_stream(struct CUstream_st *s, int64_t now, int64_t *wake_at)
{
    int finished = 0;
    struct vgpu_item *item;
    while ((item = s->head)) {
        if (item->start_ns < 0)
            item->start_ns = sim_max(s->free_at_ns, item->enqueued_ns);
        int64_t end = item->start_ns;
        cudaError_t err = s->error;
        enum item_status status = err ? ITEM_FAILED : run_item(item, now, &end, wake_at, &err);
        if (status == ITEM_PENDING)
            break;
        retire_item(s, item, end, status == ITEM_FAILED ? err : cudaSuccess);
        finished++;
    }
    return finished;
}

static void reap_destroyed_streams(void)
{
    struct CUstream_st **link = &dev.streams;
    while (*link) {
        struct CUstream_st *s = *link;
        if (s->destroyed && !s->head) {
            *link = s->next;
            free(s);
        } else {
            link = &s->next;
        }
    }
}

/* Run every stream until nothing more can finish now (an event wait may free another stream). */
static int advance_all(int64_t now, int64_t *wake_at)
{
    int total = 0, round;
    do {
        round = 0;
        for (struct CUstream_st *s = dev.streams; s; s = s->next)
            round += advance_stream(s, now, wake_at);
        total += round;
    } while (round);
    reap_destroyed_streams();
    return total;
}

static void *device_main(void *unused)
{
    (void)unused;
    vgpu_lock();
    for (;;) {
        int64_t now = sim_now_ns();
        int64_t wake_at = now + IDLE_WAKE_NS;
        if (advance_all(now, &wake_at))
            pthread_cond_broadcast(&dev.progress);
        struct timespec deadline = sim_timespec(wake_at);
        pthread_cond_timedwait(&dev.work, &dev.lock, &deadline);
    }
    return NULL;
}

/* Caller holds the lock. When the stream will be done with all its queued work, where that
 * is known now: kernels, copies and event records only, whose virtual times follow from their
 * lengths; -1 where a collective or an event wait is queued (it ends when peers or another
 * stream say). */
int64_t vgpu_known_end(const struct CUstream_st *s)
{
    int64_t end = s->free_at_ns;
    for (const struct vgpu_item *item = s->head; item; item = item->next) {
        if (item->kind != ITEM_WORK && item->kind != ITEM_EVENT_RECORD)
            return -1;
        int64_t start = item->start_ns >= 0 ? item->start_ns : sim_max(end, item->enqueued_ns);
        end = start + (item->kind == ITEM_WORK ? item->duration_ns : 0);
    }
    return end;
}

/* Caller holds the lock, and gives it up: sleep until virtual time ``until`` (from
 * vgpu_known_end), when the device will be done with what the caller waits for. A real GPU's
 * driver wakes a thread blocked in a sync once, when its GPU is done, whoever else runs on
 * the CPU; waiting on the device thread instead (its broadcast at every item, then the lock it
 * holds), a host on a busy CPU was late twice over, and spent in line for its CPU times that
 * its GPU was still working. The device thread retires the items on its own time. */
void vgpu_sleep_until(int64_t until)
{
    struct timespec at = sim_timespec(until);
    vgpu_unlock();
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, NULL) == EINTR)
        continue;
}

/* Caller holds the lock. Retire what real time has reached, before the host reads any
 * completion: a sync that slept until its stream's end left its items to the device thread,
 * which may not have run yet, and CUDA promises a stream idle and its events complete once a
 * sync on it returned. */
void vgpu_catch_up(void)
{
    int64_t ignored = INT64_MAX;
    if (advance_all(sim_now_ns(), &ignored)) {
        pthread_cond_broadcast(&dev.progress);
        vgpu_poke();    /* the device thread's next wake-up may have changed */
    }
}

/*
 * Host side: sleep (lock held) until done(arg). The device thread fails collectives after the
 * timeout, so this returns by then; the backstop only guards against a device that stopped
 * making progress at all, and is re-armed whenever anything completes.
 */
cudaError_t vgpu_wait(int (*done)(void *arg), void *arg)
{
    int64_t patience = 2 * dev.knobs.timeout_ns + NS_PER_S;
    vgpu_catch_up();
    int64_t backstop = sim_now_ns() + patience;
    uint64_t seen = dev.completions;
    while (!done(arg)) {
        int64_t now = sim_now_ns();
        if (dev.completions != seen) {
            seen = dev.completions;
            backstop = now + patience;
        }
        if (now >= backstop)
            return cudaErrorLaunchTimeout;
        struct timespec deadline = sim_timespec(backstop);
        pthread_cond_timedwait(&dev.progress, &dev.lock, &deadline);
    }
    return cudaSuccess;
}
