/* A hand-written stand-in for NVIDIA's libnvidia-ml.so.1, as far as ingerod asks it: how many
 * GPUs this node has and how much device memory each holds. INGERO_SIM_GPUS (default 8) and
 * INGERO_SIM_GPU_MEMORY_MIB (default 81920, an 80 GiB H100) say what it answers; the real
 * library's return codes and structure layout (nvml.h: nvmlMemory_t). */
#include <stdint.h>
#include <stdlib.h>

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

SIM_API int nvmlDeviceGetMemoryInfo(void *device, nvmlMemory_t *memory)
{
    if (!device || !memory)
        return NVML_ERROR_INVALID_ARGUMENT;
    memory->total = env_number("INGERO_SIM_GPU_MEMORY_MIB", 81920) << 20;
    memory->used = 0;
    memory->free = memory->total;
    return NVML_SUCCESS;
}
