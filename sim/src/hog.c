/*
 * ingero-hog: a busy loop that competes for one CPU with a rank, so the rank's host work is
 * really preempted and sched_switch names the culprit by this process name. It exits when the
 * rank it watches (--watch-pid) is gone, or after --seconds, so it never outlives its scenario.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>

#define CHECK_EVERY_NS 50000000LL

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int alive(pid_t pid)
{
    return pid <= 0 || kill(pid, 0) == 0 || errno == EPERM;
}

int main(int argc, char **argv)
{
    pid_t watched = 0;
    double seconds = 3600;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--watch-pid") == 0)
            watched = (pid_t)atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seconds") == 0)
            seconds = atof(argv[i + 1]);
        else {
            fprintf(stderr, "usage: ingero-hog [--watch-pid PID] [--seconds S]\n");
            return 2;
        }
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    long long end = now_ns() + (long long)(seconds * 1e9), next_check = 0;
    volatile unsigned long long spin = 0;
    for (;;) {
        for (int i = 0; i < 100000; i++)
            spin += (unsigned long long)i;
        long long now = now_ns();
        if (now < next_check)
            continue;
        next_check = now + CHECK_EVERY_NS;
        if (now > end || !alive(watched))
            return 0;
    }
}
