/* Reading INGERO_SIM_* settings from the environment, shared by the three libraries. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <unistd.h>

#include "simcommon.h"

double sim_knob(const char *name, double fallback, double minimum)
{
    const char *text = getenv(name);
    if (!text || !*text)
        return fallback;
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (errno || end == text || *end || value < minimum) {
        sim_log("ignoring %s=%s: expected a number >= %g; using %g", name, text, minimum,
                fallback);
        return fallback;
    }
    return value;
}

int sim_debug_enabled(void)
{
    static int cached = -1;
    if (cached < 0) {
        const char *flag = getenv("INGERO_SIM_DEBUG");
        cached = flag && *flag && *flag != '0';
    }
    return cached;
}

void sim_log(const char *fmt, ...)
{
    char line[512];
    va_list args;
    va_start(args, fmt);
    int n = snprintf(line, sizeof line, "ingero-sim[%d]: ", (int)getpid());
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, args);
    va_end(args);
    fprintf(stderr, "%s\n", line);
}

int sim_start_thread(void *(*body)(void *), void *arg, pthread_t *thread)
{
    sigset_t all, previous;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &previous);
    int failed = pthread_create(thread, NULL, body, arg);
    pthread_sigmask(SIG_SETMASK, &previous, NULL);
    return failed;
}

unsigned long long sim_process_start(int pid)
{
    char path[64], line[1024];
    unsigned long long start = 0;
    if (pid > 0)
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
    else
        snprintf(path, sizeof path, "/proc/self/stat");
    FILE *f = fopen(path, "r");
    char *after = f && fgets(line, sizeof line, f) ? strrchr(line, ')') : NULL;
    if (after && sscanf(after + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d "
                                   "%*d %*d %*d %*d %llu", &start) != 1)
        start = 0;
    if (f)
        fclose(f);
    return start;
}
