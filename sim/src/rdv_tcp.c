/*
 * TCP rendezvous through the coordinator (sim/rendezvous.py), for ranks that live in different
 * network namespaces. One connection per communicator; the protocol is text lines:
 *   rank → coordinator   JOIN <comm_hash hex> <nranks> <rank> <pid>
 *                        ARRIVE <key> <arrival_ns> <payload>
 *   coordinator → rank   READY                        all ranks joined
 *                        DONE <key> <max_arrival_ns> [<payload of rank 0> …]   (collectives)
 *                        ERROR <reason>
 * Keys: c<seq> for a collective, p<src>.<dst>.<seq> for a point-to-point transfer. A reader
 * thread stores DONE results until the device consumes them, and wakes the device thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rdv.h"
#include "simcommon.h"
#include "vgpu.h"

#define KEY_TEXT 48
#define LINE_MAX_BYTES (64 + SIM_MAX_RANKS * 24)
#define CONNECT_RETRY_NS (50 * NS_PER_MS)

struct tcp_result {
    struct tcp_result *next;
    char key[KEY_TEXT];
    int64_t max_arrival_ns;
    int npayloads;
    int64_t payloads[];
};

struct tcp_rdv {
    struct rdv base;
    int fd;
    pthread_mutex_t lock;      /* guards everything below */
    pthread_cond_t changed;    /* a message arrived or the connection failed */
    uint64_t messages;         /* progress token */
    int ready, failed;
    struct tcp_result *results;
    pthread_mutex_t send_lock;
    pthread_t reader;
    int reading;
};

static void key_text(const struct rdv_key *key, char out[KEY_TEXT])
{
    if (key->kind == RDV_COLLECTIVE)
        snprintf(out, KEY_TEXT, "c%" PRIu64, key->seq);
    else
        snprintf(out, KEY_TEXT, "p%d.%d.%" PRIu64, key->src, key->dst, key->seq);
}

static int send_line(struct tcp_rdv *t, const char *line)
{
    size_t left = strlen(line);
    pthread_mutex_lock(&t->send_lock);
    while (left) {
        ssize_t n = send(t->fd, line, left, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        line += n;
        left -= (size_t)n;
    }
    pthread_mutex_unlock(&t->send_lock);
    return left ? -1 : 0;
}

static struct tcp_result *parse_done(char *args)
{
    char *save = NULL;
    char *key = strtok_r(args, " ", &save);
    char *arrival = strtok_r(NULL, " ", &save);
    if (!key || !arrival || strlen(key) >= KEY_TEXT)
        return NULL;
    struct tcp_result *res = calloc(1, sizeof *res + SIM_MAX_RANKS * sizeof(int64_t));
    if (!res)
        return NULL;
    snprintf(res->key, KEY_TEXT, "%s", key);
    res->max_arrival_ns = strtoll(arrival, NULL, 10);
    char *word;
    while ((word = strtok_r(NULL, " ", &save)) && res->npayloads < SIM_MAX_RANKS)
        res->payloads[res->npayloads++] = strtoll(word, NULL, 10);
    return res;
}

/* Apply one coordinator line to the shared state; the caller holds t->lock. */
static void handle_line(struct tcp_rdv *t, char *line)
{
    if (strcmp(line, "READY") == 0) {
        t->ready = 1;
    } else if (strncmp(line, "DONE ", 5) == 0) {
        struct tcp_result *res = parse_done(line + 5);
        if (res) {
            res->next = t->results;
            t->results = res;
        }
    } else if (strncmp(line, "ERROR", 5) == 0) {
        sim_log("rendezvous coordinator: %s", line);
        t->failed = 1;
    }
    t->messages++;
}

/* Split buffered bytes into lines and apply them; returns the bytes left over. */
static size_t handle_lines(struct tcp_rdv *t, char *buf, size_t used)
{
    char *start = buf, *newline;
    pthread_mutex_lock(&t->lock);
    while ((newline = memchr(start, '\n', used - (size_t)(start - buf)))) {
        *newline = '\0';
        handle_line(t, start);
        start = newline + 1;
    }
    pthread_cond_broadcast(&t->changed);
    pthread_mutex_unlock(&t->lock);
    size_t rest = used - (size_t)(start - buf);
    memmove(buf, start, rest);
    return rest;
}

static void *read_coordinator(void *arg)
{
    struct tcp_rdv *t = arg;
    char buf[LINE_MAX_BYTES * 4];
    size_t used = 0;
    for (;;) {
        ssize_t n = recv(t->fd, buf + used, sizeof buf - used, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0 || (used += (size_t)n) == sizeof buf)
            break;
        used = handle_lines(t, buf, used);
        ingero_sim_wake_device();
    }
    pthread_mutex_lock(&t->lock);
    t->failed = 1;
    pthread_cond_broadcast(&t->changed);
    pthread_mutex_unlock(&t->lock);
    ingero_sim_wake_device();
    return NULL;
}

static void wait_changed(struct tcp_rdv *t, int64_t deadline_ns)
{
    struct timespec ts = sim_timespec(deadline_ns);
    pthread_cond_timedwait(&t->changed, &t->lock, &ts);
}

static ncclResult_t tcp_wait_joined(struct rdv *r, int64_t deadline_ns)
{
    struct tcp_rdv *t = (struct tcp_rdv *)r;
    pthread_mutex_lock(&t->lock);
    while (!t->ready && !t->failed && sim_now_ns() < deadline_ns)
        wait_changed(t, deadline_ns);
    ncclResult_t result = t->ready ? ncclSuccess : t->failed ? ncclSystemError : ncclRemoteError;
    pthread_mutex_unlock(&t->lock);
    if (result == ncclRemoteError)
        sim_log("ncclCommInitRank: not every rank joined communicator %016" PRIx64
                " before the timeout", r->comm_hash);
    return result;
}

static int tcp_publish(struct rdv *r, const struct rdv_key *key, int64_t arrival_ns,
                       int64_t payload)
{
    char key_buf[KEY_TEXT], line[128];
    key_text(key, key_buf);
    snprintf(line, sizeof line, "ARRIVE %s %" PRId64 " %" PRId64 "\n", key_buf, arrival_ns,
             payload);
    return send_line((struct tcp_rdv *)r, line);
}

static struct tcp_result **find_result(struct tcp_rdv *t, const char *key)
{
    struct tcp_result **link = &t->results;
    while (*link && strcmp((*link)->key, key) != 0)
        link = &(*link)->next;
    return link;
}

static int tcp_poll(struct rdv *r, const struct rdv_key *key, int64_t *max_arrival,
                    int64_t *payloads)
{
    struct tcp_rdv *t = (struct tcp_rdv *)r;
    char key_buf[KEY_TEXT];
    key_text(key, key_buf);
    pthread_mutex_lock(&t->lock);
    struct tcp_result *res = *find_result(t, key_buf);
    int status = res ? RDV_DONE : t->failed ? RDV_FAILED : RDV_PENDING;
    if (res) {
        *max_arrival = res->max_arrival_ns;
        for (int i = 0; payloads && i < res->npayloads && i < r->nranks; i++)
            payloads[i] = res->payloads[i];
    }
    pthread_mutex_unlock(&t->lock);
    return status;
}

static void tcp_forget(struct rdv *r, const struct rdv_key *key)
{
    struct tcp_rdv *t = (struct tcp_rdv *)r;
    char key_buf[KEY_TEXT];
    key_text(key, key_buf);
    pthread_mutex_lock(&t->lock);
    struct tcp_result **link = find_result(t, key_buf);
    struct tcp_result *res = *link;
    if (res)
        *link = res->next;
    pthread_mutex_unlock(&t->lock);
    free(res);
}

static uint64_t tcp_progress_token(struct rdv *r)
{
    struct tcp_rdv *t = (struct tcp_rdv *)r;
    pthread_mutex_lock(&t->lock);
    uint64_t token = t->messages;
    pthread_mutex_unlock(&t->lock);
    return token;
}

static void tcp_wait_progress(struct rdv *r, uint64_t token, int64_t deadline_ns)
{
    struct tcp_rdv *t = (struct tcp_rdv *)r;
    pthread_mutex_lock(&t->lock);
    while (t->messages == token && !t->failed && sim_now_ns() < deadline_ns)
        wait_changed(t, deadline_ns);
    pthread_mutex_unlock(&t->lock);
}

static void tcp_close(struct rdv *r)
{
    struct tcp_rdv *t = (struct tcp_rdv *)r;
    shutdown(t->fd, SHUT_RDWR);
    if (t->reading)
        pthread_join(t->reader, NULL);
    close(t->fd);
    while (t->results) {
        struct tcp_result *next = t->results->next;
        free(t->results);
        t->results = next;
    }
    free(t);
}

static const struct rdv_backend tcp_backend = {
    .wait_joined = tcp_wait_joined,
    .publish = tcp_publish,
    .poll = tcp_poll,
    .forget = tcp_forget,
    .progress_token = tcp_progress_token,
    .wait_progress = tcp_wait_progress,
    .close = tcp_close,
};

static int connect_once(const char *host, const char *port)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *found = NULL;
    if (getaddrinfo(host, port, &hints, &found) != 0)
        return -1;
    int fd = -1;
    for (struct addrinfo *a = found; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(found);
    return fd;
}

/* "HOST:PORT" (or "[v6]:PORT"); the coordinator may still be starting, so retry a while. */
static int connect_coordinator(const char *address)
{
    char host[256];
    const char *colon = strrchr(address, ':');
    if (!colon || (size_t)(colon - address) >= sizeof host)
        return -1;
    const char *h = address;
    size_t len = (size_t)(colon - address);
    if (len >= 2 && h[0] == '[' && h[len - 1] == ']') {
        h++;
        len -= 2;
    }
    snprintf(host, sizeof host, "%.*s", (int)len, h);
    int64_t deadline = sim_now_ns() + ingero_sim_timeout_ns();
    int fd;
    while ((fd = connect_once(host, colon + 1)) < 0 && sim_now_ns() < deadline) {
        struct timespec pause = sim_timespec(CONNECT_RETRY_NS);
        nanosleep(&pause, NULL);
    }
    if (fd >= 0) {
        int on = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    }
    return fd;
}

static void init_tcp_state(struct tcp_rdv *t)
{
    pthread_mutex_init(&t->lock, NULL);
    pthread_mutex_init(&t->send_lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&t->changed, &attr);
    pthread_condattr_destroy(&attr);
}

struct rdv *rdv_tcp_open(const char *address, uint64_t comm_hash, int nranks, int rank,
                         ncclResult_t *err)
{
    struct tcp_rdv *t = calloc(1, sizeof *t);
    *err = ncclSystemError;
    if (!t)
        return NULL;
    t->base = (struct rdv){ &tcp_backend, nranks, rank, comm_hash };
    init_tcp_state(t);
    t->fd = connect_coordinator(address);
    if (t->fd < 0) {
        sim_log("cannot reach the rendezvous coordinator at tcp://%s", address);
        free(t);
        return NULL;
    }
    char join[128];
    snprintf(join, sizeof join, "JOIN %016" PRIx64 " %d %d %d\n", comm_hash, nranks, rank,
             (int)getpid());
    t->reading = send_line(t, join) == 0 && sim_start_thread(read_coordinator, t, &t->reader) == 0;
    if (!t->reading) {
        close(t->fd);
        free(t);
        return NULL;
    }
    *err = ncclSuccess;
    return &t->base;
}
