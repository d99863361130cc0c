"""The tools over traced calls: collective_stats (NCCL), memcpy_bandwidth (cudaMemcpy*) and
memory_hotspots (GPU allocations)."""

from __future__ import annotations

from ingero.vocabulary import COPY_DIRECTIONS

from ..registry import ToolContext, obj, tool
from .collectives import DEFAULT_CALL_ENTRIES, sample_calls
from .lag import COVERAGE_OUT
from .schema import (BOOL, CLUSTER_ARG, INT, INT_OR_NULL, JOB_ARG, LIMIT, MAX_ENTRIES, NAME,
                     NODE_ARG, NUM_OR_NULL, RANK_ARG, SINCE_ARG, STR, STR_OR_NULL, UNTIL_ARG,
                     WINDOW_OUT, array, closed, described)
from .selection import num, pinned, reading, rows, select, whole

SMALL_ALLOCATION = 2**20


# -- collective_stats --------------------------------------------------------------------------

@tool("collective_stats", summary="Per op, communicator and rank: calls, bytes, call durations, "
      "enqueue bandwidth and the step interval",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG,
                        "op": described(NAME, "Only this collective (e.g. ncclAllReduce)."),
                        "comm_hash": described(NAME, "Only this communicator (16 hex digits)."),
                        "rank": RANK_ARG, "since": SINCE_ARG, "until": UNTIL_ARG,
                        "limit": LIMIT,
                        "max_entries": {**MAX_ENTRIES, "default": DEFAULT_CALL_ENTRIES}}),
      output_schema=closed({
          "collectives": array(closed({
              "cluster": STR, "job": STR, "op": STR_OR_NULL, "comm_hash": STR, "rank": INT,
              "node": STR_OR_NULL, "calls": INT, "bytes": INT,
              "call_p50_us": NUM_OR_NULL, "call_p95_us": NUM_OR_NULL,
              "enqueue_bandwidth_gbps": NUM_OR_NULL, "interval_median_ms": NUM_OR_NULL})),
          "truncated": BOOL, "coverage": COVERAGE_OUT, "window": WINDOW_OUT}))
def collective_stats(ctx: ToolContext, args: dict) -> dict:
    """NCCL collectives per (op, communicator, rank): calls, bytes, call duration p50/p95 (µs),
    enqueue_bandwidth_gbps = bytes / call duration over the calls with a duration (GB/s) and
    interval_median_ms = the median time from one collective on the communicator to the next at
    this rank (any op), which tracks the training step time. Read the durations honestly: NCCL
    calls are asynchronous, the traced duration is the enqueue call and not the transfer on the
    GPU, so enqueue bandwidth is no bus bandwidth; it falls when the host is slow to enqueue.
    Past 'max_entries' (collective, rank) entries only every k-th collective is read
    (coverage.stride = k) and calls and bytes are scaled by k. Collectives without a job,
    communicator or sequence number are not counted. At most 'limit' rows (default 100). The
    window defaults to the whole job when 'job' is given, else the last hour."""
    sel = select(ctx, args, rank=True)
    limit = args.get("limit", 100)
    with reading(ctx) as conn:
        where = sel.where("e", node=False).equal("e.op", "op", args.get("op"))
        found = sample_calls(conn, sel, where, comm_hash=args.get("comm_hash"),
                             max_entries=args.get("max_entries", DEFAULT_CALL_ENTRIES),
                             intervals=True)
    k = found.stride
    out = [{"cluster": c.cluster, "job": c.job, "op": c.op, "comm_hash": c.comm_hash,
            "rank": c.rank, "node": c.node, "calls": c.calls * k, "bytes": whole(c.bytes) * k,
            "call_p50_us": None if c.p50_ns is None else num(c.p50_ns / 1e3, 3),
            "call_p95_us": None if c.p95_ns is None else num(c.p95_ns / 1e3, 3),
            "enqueue_bandwidth_gbps": num(c.timed_bytes / c.timed_ns, 3) if c.timed_ns else None,
            "interval_median_ms": None if c.interval_us is None else num(c.interval_us / 1e3, 3)}
           for c in found.calls[:limit]]
    return {"collectives": out, "truncated": len(found.calls) > limit,
            "coverage": found.coverage, "window": sel.window.to_json()}


# -- memcpy_bandwidth --------------------------------------------------------------------------

COPIES = """
SELECT e.cluster, e.node, e.rank, e.attrs ->> 'direction' AS direction, count(*), sum(e.bytes),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY e.bytes::float8 / e.duration_ns)
           FILTER (WHERE e.duration_ns > 0 AND e.bytes IS NOT NULL),
       sum(e.bytes) FILTER (WHERE e.duration_ns > 0),
       sum(e.duration_ns) FILTER (WHERE e.duration_ns > 0 AND e.bytes IS NOT NULL)
FROM events e WHERE e.kind = 'memcpy' AND {where}
GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
"""


@tool("memcpy_bandwidth", summary="Per node, rank and direction: copies, bytes and the GB/s "
      "they reached",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "node": NODE_ARG,
                        "direction": {"type": "string", "enum": list(COPY_DIRECTIONS),
                                      "description": "Only copies in this direction."},
                        "since": SINCE_ARG, "until": UNTIL_ARG}),
      output_schema=closed({
          "copies": array(closed({
              "cluster": STR, "node": STR, "rank": INT_OR_NULL, "direction": STR_OR_NULL,
              "copies": INT, "bytes": INT, "gbps_median": NUM_OR_NULL,
              "gbps_aggregate": NUM_OR_NULL})),
          "window": WINDOW_OUT}))
def memcpy_bandwidth(ctx: ToolContext, args: dict) -> dict:
    """cudaMemcpy* copies per (node, rank, direction): how many, bytes, the median per-copy rate
    (bytes / traced duration, GB/s) and the aggregate (all bytes / all durations). A host-to-
    device rate far under its peers' points at PCIe, NUMA placement or pageable (unpinned)
    host memory. For the *Async calls the traced duration is the enqueue, so their rate is an
    upper bound of little meaning. The window defaults to the whole job when 'job' is given,
    else the last hour."""
    sel = select(ctx, args, node=True)
    with reading(ctx) as conn:
        where = pinned(conn, sel).where("e", rank=False)
        where.equal("e.attrs ->> 'direction'", "direction", args.get("direction"))
        found = rows(conn, COPIES.format(where=where.sql()), where.params)
    return {"copies": [{"cluster": cluster, "node": node, "rank": rank, "direction": direction,
                        "copies": copies, "bytes": whole(nbytes), "gbps_median": num(median, 3),
                        "gbps_aggregate": num(timed_bytes / timed_ns, 3) if timed_ns else None}
                       for cluster, node, rank, direction, copies, nbytes, median, timed_bytes,
                       timed_ns in found],
            "window": sel.window.to_json()}


# -- memory_hotspots ---------------------------------------------------------------------------

OK_CALL = "coalesce(e.attrs -> 'result', '0'::jsonb) = '0'::jsonb"
ALLOCATIONS = f"""
SELECT * FROM (
SELECT e.cluster, e.node, e.rank,
       count(*) FILTER (WHERE e.kind = 'alloc' AND {OK_CALL}) AS allocations,
       count(*) FILTER (WHERE e.kind = 'free' AND {OK_CALL}) AS frees,
       coalesce(sum(e.bytes) FILTER (WHERE e.kind = 'alloc' AND {OK_CALL}), 0) AS allocated,
       coalesce(sum(e.bytes) FILTER (WHERE e.kind = 'free' AND {OK_CALL}), 0) AS freed,
       max(e.bytes) FILTER (WHERE e.kind = 'alloc' AND {OK_CALL}) AS largest,
       count(*) FILTER (WHERE e.kind = 'alloc' AND NOT {OK_CALL}) AS failed,
       count(*) FILTER (WHERE e.kind = 'alloc' AND {OK_CALL} AND e.bytes < :small) AS small
FROM events e WHERE e.kind IN ('alloc', 'free') AND {{where}}
GROUP BY 1, 2, 3
) a
ORDER BY a.allocated - a.freed DESC, a.cluster, a.node, a.rank LIMIT :limit
"""


@tool("memory_hotspots", summary="Per node and rank: GPU allocations, bytes outstanding, failed "
      "and small allocations, most outstanding first",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "node": NODE_ARG,
                        "since": SINCE_ARG, "until": UNTIL_ARG, "limit": LIMIT}),
      output_schema=closed({
          "ranks": array(closed({
              "cluster": STR, "node": STR, "rank": INT_OR_NULL, "allocations": INT,
              "frees": INT, "bytes_allocated": INT, "bytes_freed": INT,
              "bytes_outstanding": INT, "largest_allocation": INT_OR_NULL,
              "failed_allocations": INT, "small_allocation_share": NUM_OR_NULL})),
          "truncated": BOOL, "window": WINDOW_OUT}))
def memory_hotspots(ctx: ToolContext, args: dict) -> dict:
    """GPU memory per (node, rank) from the traced cudaMalloc/cuMemAlloc and cudaFree calls in
    the window, most outstanding bytes first (at most 'limit', default 100): successful
    allocations and frees, bytes allocated and freed, bytes_outstanding = allocated − freed
    (negative when the window frees what was allocated before it), the largest allocation,
    failed allocations (result ≠ 0: out of memory or fragmentation), and the share of
    allocations under 1 MiB (a high share hints at fragmentation; PyTorch's caching allocator
    normally hides small tensors). The window defaults to the whole job when 'job' is given,
    else the last hour."""
    sel = select(ctx, args, node=True)
    limit = args.get("limit", 100)
    with reading(ctx) as conn:
        where = pinned(conn, sel).where("e", rank=False)
        found = rows(conn, ALLOCATIONS.format(where=where.sql()),
                     {**where.params, "small": SMALL_ALLOCATION, "limit": limit + 1})
    out = [{"cluster": cluster, "node": node, "rank": rank, "allocations": allocations,
            "frees": frees, "bytes_allocated": whole(allocated), "bytes_freed": whole(freed),
            "bytes_outstanding": whole(allocated) - whole(freed),
            "largest_allocation": None if largest is None else whole(largest),
            "failed_allocations": failed,
            "small_allocation_share": num(small / allocations, 4) if allocations else None}
           for cluster, node, rank, allocations, frees, allocated, freed, largest, failed, small
           in found[:limit]]
    return {"ranks": out, "truncated": len(found) > limit, "window": sel.window.to_json()}
