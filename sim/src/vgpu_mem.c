/*
 * Memory of the virtual GPU. Device memory is address space only (PROT_NONE, never backed):
 * the sim models when bytes move, not what they are, so a rank can "hold" gigabytes of
 * gradients on a small VM. Managed and pinned host memory are real, readable memory.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "simcommon.h"
#include "vgpu_model.h"

#define PAGE_BYTES 4096UL

struct allocation {
    struct allocation *next;
    char *base;
    size_t bytes;
    enum vgpu_mem_kind kind;
};

static struct {
    pthread_mutex_t lock;
    struct allocation *live;  /* few and large in training jobs, so a list is enough */
    uint64_t device_bytes;    /* device memory in use, against INGERO_SIM_GPU_MEM_GB */
    int device;               /* the device the process set last (cudaSetDevice) */
} mem = { .lock = PTHREAD_MUTEX_INITIALIZER };

/* What the node's GPUs hold, as NVML tells it (the sim's libnvidia-ml.so.1 sums these): this
 * process's device memory in use and its start, in
 * /dev/shm/ingero-sim-gpumem/<host label>/<device>.<pid>. A caching allocator's reserve
 * counts, as on a real GPU. Best effort: no file, no word. */
static void publish_usage(void)
{
    const char *label = getenv("INGERO_SIM_NODE");
    char dir[256], path[320], text[64];
    snprintf(dir, sizeof dir, "/dev/shm/ingero-sim-gpumem/%s", label && *label ? label : "0");
    snprintf(path, sizeof path, "%s/%d.%d", dir, mem.device, (int)getpid());
    mkdir("/dev/shm/ingero-sim-gpumem", 01777);
    mkdir(dir, 01777);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    int n = snprintf(text, sizeof text, "%llu %llu\n", (unsigned long long)mem.device_bytes,
                     sim_process_start(0));
    if (write(fd, text, (size_t)n) != n)
        SIM_DEBUG("could not publish device memory in use to %s", path);
    close(fd);
}

void vgpu_set_device(int device)
{
    pthread_mutex_lock(&mem.lock);
    mem.device = device;
    pthread_mutex_unlock(&mem.lock);
}

static size_t mapping_bytes(size_t bytes)
{
    return (bytes + PAGE_BYTES - 1) / PAGE_BYTES * PAGE_BYTES;
}

static void *map_memory(size_t bytes, enum vgpu_mem_kind kind)
{
    int prot = kind == MEM_DEVICE ? PROT_NONE : PROT_READ | PROT_WRITE;
    void *p = mmap(NULL, mapping_bytes(bytes), prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

static int over_capacity(size_t bytes, enum vgpu_mem_kind kind)
{
    if (kind != MEM_DEVICE && kind != MEM_MANAGED)
        return 0;
    return mem.device_bytes + bytes > vgpu_knobs()->memory_bytes;
}

cudaError_t vgpu_alloc(void **ptr, size_t bytes, enum vgpu_mem_kind kind)
{
    if (!ptr)
        return cudaErrorInvalidValue;
    *ptr = NULL;
    if (bytes == 0)
        return cudaSuccess;
    struct allocation *a = calloc(1, sizeof *a);
    pthread_mutex_lock(&mem.lock);
    void *base = a && !over_capacity(bytes, kind) ? map_memory(bytes, kind) : NULL;
    if (base) {
        *a = (struct allocation){ mem.live, base, bytes, kind };
        mem.live = a;
        if (kind == MEM_DEVICE || kind == MEM_MANAGED) {
            mem.device_bytes += bytes;
            publish_usage();
        }
        *ptr = base;
    }
    pthread_mutex_unlock(&mem.lock);
    if (!base)
        free(a);
    return base ? cudaSuccess : cudaErrorMemoryAllocation;
}

static struct allocation *unlink_allocation(void *ptr, enum vgpu_mem_kind kind)
{
    for (struct allocation **link = &mem.live; *link; link = &(*link)->next) {
        struct allocation *a = *link;
        int same_family = kind == MEM_HOST_PINNED ? a->kind == MEM_HOST_PINNED
                                                  : a->kind != MEM_HOST_PINNED;
        if (a->base == ptr && same_family) {
            *link = a->next;
            return a;
        }
    }
    return NULL;
}

cudaError_t vgpu_release(void *ptr, enum vgpu_mem_kind kind)
{
    if (!ptr)
        return cudaSuccess;
    pthread_mutex_lock(&mem.lock);
    struct allocation *a = unlink_allocation(ptr, kind);
    if (a && (a->kind == MEM_DEVICE || a->kind == MEM_MANAGED)) {
        mem.device_bytes -= a->bytes;
        publish_usage();
    }
    pthread_mutex_unlock(&mem.lock);
    if (!a)
        return cudaErrorInvalidValue;
    munmap(a->base, mapping_bytes(a->bytes));
    free(a);
    return cudaSuccess;
}

void vgpu_mem_info(size_t *free_bytes, size_t *total_bytes)
{
    uint64_t total = vgpu_knobs()->memory_bytes;
    pthread_mutex_lock(&mem.lock);
    uint64_t used = mem.device_bytes;
    pthread_mutex_unlock(&mem.lock);
    if (free_bytes)
        *free_bytes = total > used ? total - used : 0;
    if (total_bytes)
        *total_bytes = total;
}

/* Which kind of memory holds ptr; anything the sim did not allocate is pageable host memory. */
static enum vgpu_mem_kind classify(const void *ptr)
{
    const char *p = ptr;
    enum vgpu_mem_kind kind = MEM_HOST_PAGEABLE;
    pthread_mutex_lock(&mem.lock);
    for (struct allocation *a = mem.live; a; a = a->next)
        if (p >= a->base && p < a->base + a->bytes) {
            kind = a->kind;
            break;
        }
    pthread_mutex_unlock(&mem.lock);
    return kind;
}

static int host_readable(enum vgpu_mem_kind kind) { return kind != MEM_DEVICE; }

/* cudaMemcpyDefault infers the direction from where the pointers live (unified addressing). */
static enum cudaMemcpyKind resolve_kind(void *dst, const void *src, enum cudaMemcpyKind kind)
{
    if (kind != cudaMemcpyDefault)
        return kind;
    int dst_device = classify(dst) == MEM_DEVICE, src_device = classify(src) == MEM_DEVICE;
    if (dst_device && src_device)
        return cudaMemcpyDeviceToDevice;
    if (dst_device)
        return cudaMemcpyHostToDevice;
    return src_device ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost;
}

/*
 * A copy takes bytes / bandwidth on the stream. Bytes really move only between host-readable
 * memory; a blocking copy first waits for the blocking streams, as the legacy stream does.
 */
cudaError_t vgpu_copy(void *dst, const void *src, size_t bytes, enum cudaMemcpyKind kind,
                      cudaStream_t stream, int blocking)
{
    if ((unsigned int)kind > cudaMemcpyDefault)
        return cudaErrorInvalidMemcpyDirection;
    if (bytes && (!dst || !src))
        return cudaErrorInvalidValue;
    kind = resolve_kind(dst, src, kind);
    if (bytes && host_readable(classify(dst)) && host_readable(classify(src)))
        memmove(dst, src, bytes);
    if (kind == cudaMemcpyHostToHost)
        return cudaSuccess;
    if (!blocking)
        return vgpu_work(stream, vgpu_copy_ns(bytes, kind));
    cudaError_t result = vgpu_device_sync(1);
    if (!result)
        result = vgpu_work(NULL, vgpu_copy_ns(bytes, kind));
    return result ? result : vgpu_stream_sync(NULL);
}

cudaError_t vgpu_memset(void *dst, int value, size_t bytes, cudaStream_t stream)
{
    if (bytes && !dst)
        return cudaErrorInvalidValue;
    if (bytes && host_readable(classify(dst)))
        memset(dst, value, bytes);
    return vgpu_work(stream, vgpu_copy_ns(bytes, cudaMemcpyDeviceToDevice));
}
