/*
 * ingero_sim.h — what a program needs to drive the sim's virtual GPU deliberately.
 *
 * A kernel launched through cudaLaunchKernel or cuLaunchKernel normally runs for the default
 * time (INGERO_SIM_KERNEL_US). A program that wants a kernel of a given length passes, as the
 * kernel function, a pointer to a struct ingero_sim_kernel carrying INGERO_SIM_KERNEL_MAGIC.
 *
 * comm_id_hash names a communicator the same way in the sim, in its ground-truth records and in
 * the tracer: a splitmix64 fold over the 128-byte ncclUniqueId read as 16 little-endian words.
 * The Python twin is sim.comm_id_hash(); both must stay byte-for-byte identical.
 */
#ifndef INGERO_SIM_H
#define INGERO_SIM_H

#include <stddef.h>
#include <stdint.h>

/* "INGEROSK" in ASCII: unlikely to be the first bytes of real machine code. */
#define INGERO_SIM_KERNEL_MAGIC 0x4b534f5245474e49ULL

struct ingero_sim_kernel {
    uint64_t magic;       /* INGERO_SIM_KERNEL_MAGIC */
    uint64_t duration_ns; /* device time before INGERO_SIM_GPU_SLOWDOWN is applied */
};

#define INGERO_SIM_UNIQUE_ID_BYTES 128

static inline uint64_t ingero_sim_splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* The 128-byte unique id folded into one word; byte order fixed so every host agrees. */
static inline uint64_t ingero_sim_comm_id_hash(const void *unique_id)
{
    const unsigned char *bytes = (const unsigned char *)unique_id;
    uint64_t h = 0;
    for (size_t word = 0; word < INGERO_SIM_UNIQUE_ID_BYTES / 8; word++) {
        uint64_t w = 0;
        for (int b = 7; b >= 0; b--)
            w = (w << 8) | bytes[word * 8 + (size_t)b];
        h = ingero_sim_splitmix64(h ^ w);
    }
    return h;
}

#endif
