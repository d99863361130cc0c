/*
 * The rank's data loader, as PyTorch's DataLoader runs one: worker processes forked from the
 * rank at the start of every epoch (so they map libcudart and carry the rank's environment,
 * but never call CUDA), each reading its share of the epoch's batches from the input file
 * (real reads, O_DIRECT where the file system allows it, so they reach the block device) and
 * decoding them on the CPU, then exiting when the epoch's batches are done. A worker hands a
 * batch over by writing one byte into a pipe; the rank reads one per step and waits there when
 * its workers fall behind, as a training loop waits in next(iter(loader)).
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

static size_t aligned(size_t bytes)
{
    size_t blocks = (bytes + DIRECT_ALIGN - 1) / DIRECT_ALIGN;
    return (blocks ? blocks : 1) * DIRECT_ALIGN;
}

int input_open(struct input_pipeline *in, const struct rank_config *cfg)
{
    *in = (struct input_pipeline){ .cfg = cfg, .fds = { -1, -1 }, .epoch_end = -1 };
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

static void worker(const struct input_pipeline *in, int index, int first, int end)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    prctl(PR_SET_NAME, "pt_data_worker");
    int fd = open_input(in->cfg->input_path);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0)
        _exit(EXIT_GPU_ERROR);
    for (int batch = first + index; batch < end; batch += in->cfg->workers)
        load_batch(in, fd, st.st_size, batch);
    _exit(EXIT_OK);
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
    for (int i = 0; i < cfg->workers && i < MAX_WORKERS; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return -1;
        if (pid == 0)
            worker(in, i, step, in->epoch_end);
        in->workers[in->nworkers++] = pid;
    }
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
    return n == 1 ? 0 : -1;
}

void input_close(struct input_pipeline *in)
{
    for (int i = 0; i < in->nworkers; i++)
        kill(in->workers[i], SIGKILL);
    reap(in);
    if (in->fds[0] >= 0)
        close(in->fds[0]);
    if (in->fds[1] >= 0)
        close(in->fds[1]);
    free(in->buffer);
}
