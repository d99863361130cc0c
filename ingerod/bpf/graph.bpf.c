/* CUDA graphs: a capture records a step's kernels and collectives once; each replay
 * (cudaGraphLaunch, which CUDA 13's runtime implements on the driver's cuGraphLaunch) runs
 * them again without calling a launch or NCCL entry point (REAL-GPU.md). So a capture keeps
 * what it saw (struct capture: the collectives NCCL was called for on the capturing stream,
 * the launches of the capturing thread; see collective() and launch_entry()), the graph and
 * then its instance inherit it, and each replay counts the launches and tells each captured
 * collective as entered then, with its communicator's next sequence number: fleetd aligns
 * and judges the replays as it judges eager collectives, and a rank that stops replaying is
 * missing from them.
 */
#ifndef INGERO_COMMON
#include "common.bpf.c"
#endif

struct graph_call {
    u64 out;         /* cudaGraph_t* (end of capture), cudaGraphExec_t* (instantiation) */
    u64 from;        /* the capturing stream, the graph instantiated */
};

/* (tgid, cudaGraph_t) and (tgid, cudaGraphExec_t) → what its capture recorded. LRU: graphs'
 * destruction is not probed. */
BPF_TABLE("lru_hash", struct stream_key, struct capture, graphs, MAX_TARGETS);
BPF_TABLE("lru_hash", struct stream_key, struct capture, graph_execs, MAX_TARGETS);
/* pid_tgid → an end of capture or an instantiation between its entry and its return. */
BPF_HASH(graph_calls, u64, struct graph_call, MAX_INFLIGHT);
/* [0] → a capture with nothing in it (too big for the stack), never written. */
BPF_PERCPU_ARRAY(empty_capture, struct capture, 1);

/* cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode mode) */
int capture_begin(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid(), stream = PT_REGS_PARM1(ctx);
    struct stream_key key = {.tgid = id >> 32, .stream = stream};
    int zero = 0;
    struct capture *empty = empty_capture.lookup(&zero);
    if (!is_target(key.tgid) || !empty)
        return 0;
    captures.update(&key, empty);
    capturing_thread.update(&id, &stream);
    return 0;
}

static __always_inline int graph_call_entry(u64 out, u64 from)
{
    u64 id = bpf_get_current_pid_tgid();
    struct graph_call call = {.out = out, .from = from};
    if (is_target(id >> 32))
        graph_calls.update(&id, &call);
    return 0;
}

/* cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) */
int capture_end(struct pt_regs *ctx)
{
    return graph_call_entry(PT_REGS_PARM2(ctx), PT_REGS_PARM1(ctx));
}

/* The graph written to *pGraph takes what the capture on the stream recorded. */
int capture_end_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid(), graph = 0;
    struct graph_call *call = graph_calls.lookup(&id);
    struct stream_key key = {.tgid = id >> 32};
    struct capture *capture;
    if (!call)
        return 0;
    key.stream = call->from;
    capture = captures.lookup(&key);
    if (capture && PT_REGS_RC(ctx) == 0 &&
        bpf_probe_read_user(&graph, sizeof(graph), (void *)call->out) == 0 && graph) {
        struct stream_key made = {.tgid = key.tgid, .stream = graph};
        graphs.update(&made, capture);
    }
    captures.delete(&key);
    capturing_thread.delete(&id);
    graph_calls.delete(&id);
    return 0;
}

/* cudaGraphInstantiate(cudaGraphExec_t* pGraphExec, cudaGraph_t graph, unsigned long long) */
int graph_instantiate(struct pt_regs *ctx)
{
    return graph_call_entry(PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx));
}

/* The instance written to *pGraphExec takes what its graph's capture recorded. */
int graph_instantiate_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid(), exec = 0;
    struct graph_call *call = graph_calls.lookup(&id);
    struct stream_key key = {.tgid = id >> 32};
    struct capture *graph;
    if (!call)
        return 0;
    key.stream = call->from;
    graph = graphs.lookup(&key);
    if (graph && PT_REGS_RC(ctx) == 0 &&
        bpf_probe_read_user(&exec, sizeof(exec), (void *)call->out) == 0 && exec) {
        struct stream_key made = {.tgid = key.tgid, .stream = exec};
        graph_execs.update(&made, graph);
    }
    graph_calls.delete(&id);
    return 0;
}

/* A replay, counted once whichever entry it went through (see outermost()): its launches
 * counted and each captured collective told as entered now, on the launch stream. */
static __always_inline int graph_launch(struct pt_regs *ctx, int runtime)
{
    u64 id = bpf_get_current_pid_tgid(), stream = PT_REGS_PARM2(ctx);
    struct stream_key key = {.tgid = id >> 32, .stream = PT_REGS_PARM1(ctx)};
    struct capture *graph;
    if (!is_target(key.tgid) || !outermost(ctx, id, runtime))
        return 0;
    graph = graph_execs.lookup(&key);
    if (!graph)
        return 0;
    if (graph->launches)
        count_launches(key.tgid, graph->launches);
#pragma unroll
    for (int i = 0; i < MAX_CAPTURED; i++) {
        if (i >= graph->n)
            break;
        struct captured *c = &graph->colls[i];
        emit_collective(c->op, c->count, c->datatype, c->redop, c->peer, c->handle, stream,
                        EVF_GRAPH);
    }
    return 0;
}

/* cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) */
int runtime_graph_launch(struct pt_regs *ctx)
{
    return graph_launch(ctx, 1);
}

/* cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) */
int driver_graph_launch(struct pt_regs *ctx)
{
    return graph_launch(ctx, 0);
}
