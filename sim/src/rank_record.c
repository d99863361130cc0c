/*
 * The ground-truth record: one JSON object per line, written with one write(2) each, so a rank
 * that dies mid-run leaves every line it finished. Field names are a contract with the tests
 * and the tracer (see sim/README.md).
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "rank.h"

int record_open(const char *path)
{
    return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
}

static void write_line(int fd, const char *line, size_t length)
{
    while (length) {
        ssize_t n = write(fd, line, length);
        if (n <= 0)
            return;
        line += n;
        length -= (size_t)n;
    }
}

static size_t put_identity(char *buf, size_t size, const struct rank_config *cfg,
                           uint64_t comm_hash)
{
    int n = snprintf(buf, size,
                     "\"rank\":%d,\"nranks\":%d,\"local_rank\":%d,\"node\":%d,\"job_id\":\"%s\","
                     "\"pid\":%d,\"comm_id_hash\":%" PRIu64,
                     cfg->rank, cfg->world_size, cfg->local_rank, cfg->node, cfg->job_id,
                     (int)getpid(), comm_hash);
    return n < 0 ? 0 : (size_t)n < size ? (size_t)n : size - 1;
}

void record_collective(int fd, const struct rank_config *cfg, uint64_t comm_hash,
                       const struct collective_call *call)
{
    char line[1024];
    size_t n = (size_t)snprintf(line, sizeof line, "{\"type\":\"collective\",\"op\":\"%s\",",
                                call->op);
    n += put_identity(line + n, sizeof line - n, cfg, comm_hash);
    n += (size_t)snprintf(line + n, sizeof line - n,
                          ",\"seq\":%" PRIu64 ",\"step\":%d,\"count\":%zu,\"datatype\":\"%s\","
                          "\"datatype_id\":%d,\"bytes\":%zu,\"root\":%d,\"peer\":%d,"
                          "\"entry_ns\":%" PRId64 ",\"return_ns\":%" PRId64 ",\"result\":%d}\n",
                          call->seq, call->step, call->count, datatype_name(call->datatype),
                          (int)call->datatype, call->count * datatype_size(call->datatype),
                          call->root, call->peer, call->entry_ns, call->return_ns,
                          (int)call->result);
    write_line(fd, line, strlen(line));
}

static size_t put_series(char *buf, size_t size, const char *name, const int64_t *values,
                         int count)
{
    size_t n = (size_t)snprintf(buf, size, ",\"%s\":[", name);
    for (int i = 0; i < count && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%" PRId64, i ? "," : "", values[i]);
    if (n < size)
        n += (size_t)snprintf(buf + n, size - n, "]");
    return n;
}

/* Error text comes from cudaGetErrorString/ncclGetErrorString: keep it JSON-safe. */
static void json_safe(char *out, size_t size, const char *text)
{
    size_t n = 0;
    for (; text && *text && n + 1 < size; text++)
        out[n++] = (*text == '"' || *text == '\\' || (unsigned char)*text < 0x20) ? '\'' : *text;
    out[n] = '\0';
}

void record_summary(int fd, const struct rank_config *cfg, uint64_t comm_hash,
                    const struct rank_summary *s)
{
    size_t size = 256 + (size_t)cfg->steps * 96;
    char line[size], error[256];
    json_safe(error, sizeof error, s->error);
    size_t n = (size_t)snprintf(line, size, "{\"type\":\"summary\",");
    n += put_identity(line + n, size - n, cfg, comm_hash);
    n += (size_t)snprintf(line + n, size - n,
                          ",\"status\":\"%s\",\"error\":\"%s\",\"steps\":%d,\"steps_done\":%d,"
                          "\"collectives\":%" PRIu64 ",\"start_ns\":%" PRId64 ",\"end_ns\":%" PRId64
                          ",\"net_ns\":%" PRIu64 ",\"launches\":{\"cudaLaunchKernel\":%" PRIu64
                          ",\"cuLaunchKernelEx\":%" PRIu64 "}",
                          s->status, error, cfg->steps, s->steps_done, s->collectives,
                          s->start_ns, s->end_ns, s->net_ns, s->runtime_launches,
                          s->driver_launches);
    n += put_series(line + n, size - n, "step_ns", s->step_ns, s->steps_done);
    n += put_series(line + n, size - n, "sync_wait_ns", s->sync_wait_ns, s->steps_done);
    n += put_series(line + n, size - n, "loss_sync_ns", s->loss_sync_ns, s->steps_done);
    n += put_series(line + n, size - n, "loss_device_ns", s->loss_device_ns, s->steps_done);
    if (n + 2 < size) {
        line[n++] = '}';
        line[n++] = '\n';
        write_line(fd, line, n);
    }
}
