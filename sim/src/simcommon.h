/*
 * Helpers every sim library compiles in: the export attribute, the monotonic clock that all
 * arrival times use, and reading the INGERO_SIM_* knobs from the environment.
 */
#ifndef SIM_COMMON_H
#define SIM_COMMON_H

#include <pthread.h>
#include <stdint.h>
#include <time.h>

/* Exported entry points must stay real, uninlined functions so uprobes have an address to hit. */
#define SIM_API __attribute__((visibility("default"), noinline, used))

#define NS_PER_US 1000LL
#define NS_PER_MS 1000000LL
#define NS_PER_S 1000000000LL

/* CLOCK_MONOTONIC: one clock for every network namespace of a machine, like bpf_ktime_get_ns. */
static inline int64_t sim_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * NS_PER_S + ts.tv_nsec;
}

static inline struct timespec sim_timespec(int64_t ns)
{
    struct timespec ts = { .tv_sec = ns / NS_PER_S, .tv_nsec = ns % NS_PER_S };
    return ts;
}

static inline int64_t sim_min(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t sim_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* A knob from the environment; a missing or malformed value (reported once) gives the default. */
__attribute__((visibility("hidden"))) double sim_knob(const char *name, double fallback,
                                                      double minimum);
__attribute__((visibility("hidden"))) int sim_debug_enabled(void);
__attribute__((visibility("hidden"))) void sim_log(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/* A helper thread with every signal blocked, so signals keep reaching the application. */
__attribute__((visibility("hidden"))) int sim_start_thread(void *(*body)(void *), void *arg,
                                                           pthread_t *thread);

/* When process ``pid`` (0: this one) started: /proc/PID/stat's 22nd field, clock ticks since
 * boot; 0 where it cannot be read. Tells a process from a former one of the same pid. */
__attribute__((visibility("hidden"))) unsigned long long sim_process_start(int pid);

#define SIM_DEBUG(...) do { if (sim_debug_enabled()) sim_log(__VA_ARGS__); } while (0)

#endif
