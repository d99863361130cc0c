/*
 * The rank's data loader, as PyTorch's DataLoader runs one: worker processes forked from the
 * rank at the start of every epoch (so they map libcudart and carry the rank's environment,
 * but never call CUDA), each reading its share of the epoch's batches from the input file
 * (real reads, O_DIRECT where the file system allows it, so they reach the block device) and
 * decoding them on the CPU, then exiting when the epoch's batches are done. As PyTorch's, they
 * prefetch only PREFETCH batches each ahead of the rank: a worker takes a request (a byte the
 * rank writes into one pipe) before it loads a batch, and hands the batch over by writing a
 * byte into another; the rank reads one batch a step, waiting there when its workers fall
 * behind, as a training loop waits in next(iter(loader)), and asks for one more. Once the
 * epoch's batches are all asked for, it closes its end: the workers exit when the requests
 * run out, near the end of the epoch.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rank.h"

#define DIRECT_ALIGN 4096
#define PREFETCH 2               /* batches each worker loads ahead: PyTorch's prefetch_factor */

static size_t aligned(size_t bytes)
{
    size_t blocks = (bytes + DIRECT_ALIGN - 1) / DIRECT_ALIGN;
    return (blocks ? blocks : 1) * DIRECT_ALIGN;
}

int input_open(struct input_pipeline *in, const struct rank_config *cfg)
{
    *in = (struct input_pipeline){ .cfg = cfg, .fds = { -1, -1 }, .wanted = { -1, -1 },
                                   .epoch_end = -1 };
    if (!cfg->workers)
        return 0;
    if (!cfg->input_path || pipe2(in->fds, O_CLOEXEC) != 0)
        return -1;
    return posix_memalign(&in->buffer, DIRECT_ALIGN, aligned(cfg->input_bytes)) ? -1 : 0;
}

static int open_input(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    return fd >= 0 || errno != EINVAL ? fd : open(path, O_RDONLY | O_CLOEXEC);
}

/* One batch: read it, decode it, stall as a slow store would, hand it over. */
static void load_batch(const struct input_pipeline *in, int fd, off_t size, int batch)
{
    const struct rank_config *cfg = in->cfg;
    size_t bytes = aligned(cfg->input_bytes);
    off_t slots = size >= (off_t)bytes ? size / (off_t)bytes : 1;
    if (pread(fd, in->buffer, bytes, (off_t)(batch % slots) * (off_t)bytes) < 0)
        _exit(EXIT_GPU_ERROR);
    burn_cpu(cfg->worker_cpu_ns);
    if (cfg->input_stall_ns > 0)
        sleep_for_ns(cfg->input_stall_ns);
    char ready = 1;
    if (write(in->fds[1], &ready, 1) != 1)
        _exit(EXIT_GPU_ERROR);
}

static void worker(const struct input_pipeline *in, int index, int first)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    prctl(PR_SET_NAME, "pt_data_worker");
    close(in->wanted[1]);           /* else the requests would never run out */
    int fd = open_input(in->cfg->input_path);
    struct stat st;
    char request;
    if (fd < 0 || fstat(fd, &st) != 0)
        _exit(EXIT_GPU_ERROR);
    for (int batch = first + index; read(in->wanted[0], &request, 1) == 1;
         batch += in->cfg->workers)
        load_batch(in, fd, st.st_size, batch);
    _exit(EXIT_OK);
}

/* Ask the workers for another batch; once the epoch's are all asked for, say so. */
static int ask(struct input_pipeline *in)
{
    char request = 1;
    if (in->asked < in->batches && write(in->wanted[1], &request, 1) != 1)
        return -1;
    if (++in->asked >= in->batches && in->wanted[1] >= 0) {
        close(in->wanted[1]);
        in->wanted[1] = -1;
    }
    return 0;
}

/* Wait for the epoch's workers: they exit once their batches are handed over. */
static void reap(struct input_pipeline *in)
{
    for (int i = 0; i < in->nworkers; i++)
        while (waitpid(in->workers[i], NULL, 0) < 0 && errno == EINTR)
            ;
    in->nworkers = 0;
}

static int start_epoch(struct input_pipeline *in, int step)
{
    const struct rank_config *cfg = in->cfg;
    int epoch = cfg->epoch_steps > 0 ? cfg->epoch_steps : cfg->steps;
    reap(in);
    in->epoch_end = step + epoch < cfg->steps ? step + epoch : cfg->steps;
    in->batches = in->epoch_end - step;
    in->asked = 0;
    if (in->wanted[0] >= 0)
        close(in->wanted[0]);
    if (pipe2(in->wanted, O_CLOEXEC) != 0)
        return -1;
    for (int i = 0; i < cfg->workers && i < MAX_WORKERS; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0)
            worker(in, i, step);
        in->workers[in->nworkers++] = pid;
    }
    for (int i = 0; i < PREFETCH * cfg->workers && in->asked < in->batches; i++)
        if (ask(in) != 0)
            return -1;
    return 0;
}

int input_next(struct input_pipeline *in, int step)
{
    if (!in->cfg->workers)
        return 0;
    if (step >= in->epoch_end && start_epoch(in, step) != 0)
        return -1;
    char ready;
    ssize_t n;
    while ((n = read(in->fds[0], &ready, 1)) < 0 && errno == EINTR)
        ;
    return n == 1 ? ask(in) : -1;
}

void input_close(struct input_pipeline *in)
{
    for (int i = 0; i < in->nworkers; i++)
        kill(in->workers[i], SIGKILL);
    reap(in);
    for (int i = 0; i < 2; i++) {
        if (in->fds[i] >= 0)
            close(in->fds[i]);
        if (in->wanted[i] >= 0)
            close(in->wanted[i]);
    }
    free(in->buffer);
}
