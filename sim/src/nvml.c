/* A hand-written stand-in for NVIDIA's libnvidia-ml.so.1, as far as ingerod asks it: how many
 * GPUs this node has, how much device memory each holds and how much of it is in use.
 * INGERO_SIM_GPUS (default 8) and INGERO_SIM_GPU_MEMORY_MIB (default 81920, an 80 GiB H100)
 * say what it answers; in use is what the sim's processes on this host label
 * (INGERO_SIM_NODE, default 0) hold on the device, as each publishes it in
 * /dev/shm/ingero-sim-gpumem/<label>/<device>.<pid> (vgpu_mem.c) with its start time: live
 * processes only (a file whose start is not its pid's process's is a former process's). The
 * real library's return codes and structure layout (nvml.h: nvmlMemory_t). */
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "simcommon.h"

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

enum { NVML_SUCCESS = 0, NVML_ERROR_INVALID_ARGUMENT = 2 };

static unsigned long long env_number(const char *name, unsigned long long fallback)
{
    const char *text = getenv(name);
    char *end;
    unsigned long long value;

    if (!text || !*text)
        return fallback;
    value = strtoull(text, &end, 10);
    return *end ? fallback : value;
}

SIM_API int nvmlInit_v2(void) { return NVML_SUCCESS; }

SIM_API int nvmlShutdown(void) { return NVML_SUCCESS; }

SIM_API int nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)env_number("INGERO_SIM_GPUS", 8);
    return NVML_SUCCESS;
}

SIM_API int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void **device)
{
    if (!device || index >= env_number("INGERO_SIM_GPUS", 8))
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = (void *)(uintptr_t)(index + 1);
    return NVML_SUCCESS;
}

/* What the live sim processes of this host label hold on device ``index``. */
static unsigned long long in_use(unsigned int index)
{
    const char *label = getenv("INGERO_SIM_NODE");
    char path[320];
    unsigned long long total = 0;
    snprintf(path, sizeof path, "/dev/shm/ingero-sim-gpumem/%s", label && *label ? label : "0");
    DIR *dir = opendir(path);
    for (struct dirent *entry; dir && (entry = readdir(dir));) {
        unsigned int device;
        int pid;
        unsigned long long bytes;
        char file[640];
        if (sscanf(entry->d_name, "%u.%d", &device, &pid) != 2 || device != index)
            continue;
        snprintf(file, sizeof file, "%s/%s", path, entry->d_name);
        FILE *f = fopen(file, "r");
        unsigned long long start;
        if (f && fscanf(f, "%llu %llu", &bytes, &start) == 2 && start && start == sim_process_start(pid))
            total += bytes;
        if (f)
            fclose(f);
    }
    if (dir)
        closedir(dir);
    return total;
}

SIM_API int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory)
{
    if (!device || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = env_number("INGERO_SIM_GPU_MEMORY_MIB", 81920) << 20;
    memory->used = in_use((unsigned int)((uintptr_t)device - 1));
    if (memory->used > memory->total)
        memory->used = memory->total;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}
