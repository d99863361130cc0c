/*
 * CUDA graphs on the virtual GPU: a stream in capture mode records what is enqueued on it
 * (kernels and copies as work of their duration, collectives as templates of their parts)
 * instead of running it; the graph is instantiated, and each launch of the instance enqueues
 * the recorded work again on the launch stream, each collective as fresh parts (the remote
 * ops' renew: a new rendezvous sequence each replay, as NCCL's captured collectives run anew
 * at every replay). As with CUDA, a replay calls no launch or NCCL entry point: only
 * cudaGraphLaunch (and, inside it, the driver's cuGraphLaunch).
 *
 * Events cannot be recorded or waited on in a capture here (cudaErrorStreamCaptureUnsupported);
 * a sync on a capturing stream is refused the same way.
 */
#include <stdlib.h>

#include "simcommon.h"
#include "vgpu_model.h"

#define GRAPH_MAGIC 0x47525048U
#define EXEC_MAGIC 0x47455845U

struct CUgraph_st {
    uint32_t magic;
    int refs;                /* the graph's own, and one per instance */
    int destroyed;
    struct vgpu_capture *captured;
};

struct CUgraphExec_st {
    uint32_t magic;
    struct CUgraph_st *graph;
};

static struct CUgraph_st *graph_checked(cudaGraph_t graph)
{
    return graph && graph->magic == GRAPH_MAGIC && !graph->destroyed ? graph : NULL;
}

static struct CUgraphExec_st *exec_checked(cudaGraphExec_t exec)
{
    return exec && exec->magic == EXEC_MAGIC ? exec : NULL;
}

/* Caller holds the lock. */
static void graph_release(struct CUgraph_st *g)
{
    if (--g->refs > 0)
        return;
    vgpu_capture_free(g->captured);
    g->magic = 0;
    free(g);
}

cudaError_t vgpu_begin_capture(cudaStream_t stream)
{
    struct CUstream_st *s = vgpu_stream(stream);
    if (!s || s == vgpu_default_stream())
        return s ? cudaErrorStreamCaptureUnsupported : cudaErrorInvalidResourceHandle;
    struct vgpu_capture *c = vgpu_capture_new();
    if (!c)
        return cudaErrorMemoryAllocation;
    vgpu_lock();
    cudaError_t err = s->capturing ? cudaErrorIllegalState : cudaSuccess;
    if (err == cudaSuccess)
        s->capturing = c;
    vgpu_unlock();
    if (err != cudaSuccess)
        vgpu_capture_free(c);
    return err;
}

cudaError_t vgpu_end_capture(cudaStream_t stream, cudaGraph_t *graph)
{
    struct CUstream_st *s = vgpu_stream(stream);
    if (!s || !graph)
        return s ? cudaErrorInvalidValue : cudaErrorInvalidResourceHandle;
    struct CUgraph_st *g = calloc(1, sizeof *g);
    vgpu_lock();
    struct vgpu_capture *c = s->capturing;
    if (c && g)
        s->capturing = NULL;
    vgpu_unlock();
    if (!c || !g) {
        free(g);
        return c ? cudaErrorMemoryAllocation : cudaErrorIllegalState;
    }
    *g = (struct CUgraph_st){ .magic = GRAPH_MAGIC, .refs = 1, .captured = c };
    *graph = g;
    return cudaSuccess;
}

cudaError_t vgpu_graph_instantiate(cudaGraphExec_t *exec, cudaGraph_t graph)
{
    struct CUgraphExec_st *e = exec ? calloc(1, sizeof *e) : NULL;
    if (!e)
        return exec ? cudaErrorMemoryAllocation : cudaErrorInvalidValue;
    vgpu_lock();
    struct CUgraph_st *g = graph_checked(graph);
    if (g)
        g->refs++;
    vgpu_unlock();
    if (!g) {
        free(e);
        return cudaErrorInvalidValue;
    }
    e->magic = EXEC_MAGIC;
    e->graph = g;
    *exec = e;
    return cudaSuccess;
}

/* The instance's work enqueued again on ``stream``, its collectives as fresh parts. */
cudaError_t vgpu_graph_launch(cudaGraphExec_t exec, cudaStream_t stream)
{
    struct CUgraphExec_st *e = exec_checked(exec);
    struct CUstream_st *s = vgpu_stream(stream);
    if (!e || !s)
        return e ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue;
    return vgpu_capture_replay(e->graph->captured, s);
}

cudaError_t vgpu_graph_exec_destroy(cudaGraphExec_t exec)
{
    struct CUgraphExec_st *e = exec_checked(exec);
    if (!e)
        return cudaErrorInvalidValue;
    vgpu_lock();
    e->magic = 0;
    graph_release(e->graph);
    vgpu_unlock();
    free(e);
    return cudaSuccess;
}

cudaError_t vgpu_graph_destroy(cudaGraph_t graph)
{
    vgpu_lock();
    struct CUgraph_st *g = graph_checked(graph);
    if (g) {
        g->destroyed = 1;
        graph_release(g);
    }
    vgpu_unlock();
    return g ? cudaSuccess : cudaErrorInvalidValue;
}
