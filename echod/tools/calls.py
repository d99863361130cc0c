"""The tools over traced calls: collective_stats (NCCL), memcpy_bandwidth (cudaMemcpy*) and
memory_hotspots (GPU allocations), all three from the per-minute call summaries (every call
counted, whatever retention kept of the raw events)."""

from __future__ import annotations

from ingero.vocabulary import COPY_DIRECTIONS

from ..registry import ToolContext, obj, tool
from .calltotals import call_totals
from .collectives import summed_calls
from .lag import COVERAGE_OUT
from .schema import (BOOL, CLUSTER_ARG, INT, INT_OR_NULL, JOB_ARG, LIMIT, MAX_ENTRIES, NAME,
                     NODE_ARG, NUM_OR_NULL, RANK_ARG, SINCE_ARG, STR, STR_OR_NULL, UNTIL_ARG,
                     WINDOW_OUT, array, closed, described)
from .selection import num, pinned, reading, select


# -- collective_stats --------------------------------------------------------------------------

@tool("collective_stats", summary="Per op, communicator and rank: calls, bytes, call durations, "
      "enqueue bandwidth and the step interval",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG,
                        "op": described(NAME, "Only this collective (e.g. ncclAllReduce)."),
                        "comm_hash": described(NAME, "Only this communicator (16 hex digits)."),
                        "rank": RANK_ARG, "since": SINCE_ARG, "until": UNTIL_ARG,
                        "limit": LIMIT,
                        "max_entries": described(MAX_ENTRIES, "Accepted and ignored: every "
                                                 "call is counted, from the summaries.")}),
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
    Every call is counted, from the per-minute summaries (coverage.source = 'summaries'):
    the percentiles are within 2.2% (a histogram bucket), and the interval is per minute the
    mean time between the rank's collectives on the communicator, the median over the
    minutes. Collectives without a job or communicator are not counted. At most 'limit' rows
    (default 100). The window defaults to the whole job when 'job' is given, else the last
    hour."""
    sel = select(ctx, args, rank=True)
    limit = args.get("limit", 100)
    with reading(ctx) as conn:
        found = summed_calls(conn, pinned(conn, sel), op=args.get("op"),
                             comm_hash=args.get("comm_hash"), intervals=True)
    out = [{"cluster": c.cluster, "job": c.job, "op": c.op, "comm_hash": c.comm_hash,
            "rank": c.rank, "node": c.node, "calls": c.calls, "bytes": c.bytes,
            "call_p50_us": None if c.p50_ns is None else num(c.p50_ns / 1e3, 3),
            "call_p95_us": None if c.p95_ns is None else num(c.p95_ns / 1e3, 3),
            "enqueue_bandwidth_gbps": num(c.timed_bytes / c.timed_ns, 3) if c.timed_ns else None,
            "interval_median_ms": None if c.interval_us is None else num(c.interval_us / 1e3, 3)}
           for c in found.calls[:limit]]
    return {"collectives": out, "truncated": len(found.calls) > limit,
            "coverage": found.coverage, "window": sel.window.to_json()}


# -- memcpy_bandwidth --------------------------------------------------------------------------

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
    """cudaMemcpy* copies per (node, rank, direction): how many, bytes, the rate of a median
    copy (its mean size over the median traced duration, GB/s) and the aggregate (all bytes
    / all durations of the copies with a duration). A host-to-device rate far under its
    peers' points at PCIe, NUMA placement or pageable (unpinned) host memory. For the *Async
    calls the traced duration is the enqueue, so their rate is an upper bound of little
    meaning. From the per-minute summaries: every copy, the median duration within 2.2%. The
    window defaults to the whole job when 'job' is given, else the last hour."""
    sel = select(ctx, args, node=True)
    with reading(ctx) as conn:
        found = call_totals(conn, pinned(conn, sel), ("memcpy",),
                            ("cluster", "node", "rank", "detail"), rank=False,
                            only={"detail": args.get("direction")})
    copies = []
    for (cluster, node, rank, direction), t in sorted(found.items(), key=ordered):
        median = t.durations.quantile(0.5)
        size = t.timed_bytes / t.timed if t.timed else None
        copies.append({"cluster": cluster, "node": node, "rank": rank, "direction": direction,
                       "copies": t.calls, "bytes": t.bytes,
                       "gbps_median": num(size / median, 3) if size is not None and median
                       else None,
                       "gbps_aggregate": num(t.timed_bytes / t.duration_ns, 3)
                       if t.duration_ns else None})
    return {"copies": copies, "window": sel.window.to_json()}


def ordered(item: tuple[tuple, object]) -> tuple:
    """Groups in order, None last where a value may be missing."""
    return tuple((value is None, value if value is not None else 0) for value in item[0])


# -- memory_hotspots ---------------------------------------------------------------------------

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
        found = call_totals(conn, pinned(conn, sel), ("alloc", "free"),
                            ("cluster", "node", "rank", "kind", "failed"), rank=False)
    ranks: dict[tuple, dict] = {}
    for (cluster, node, rank, kind, failed), t in found.items():
        row = ranks.setdefault((cluster, node, rank), {
            "cluster": cluster, "node": node, "rank": rank, "allocations": 0, "frees": 0,
            "bytes_allocated": 0, "bytes_freed": 0, "largest_allocation": None,
            "failed_allocations": 0, "small": 0})
        if failed:
            row["failed_allocations"] += t.calls if kind == "alloc" else 0
        elif kind == "alloc":
            row["allocations"] += t.calls
            row["bytes_allocated"] += t.bytes
            row["small"] += t.small
            if t.max_bytes is not None:
                row["largest_allocation"] = max(t.max_bytes, row["largest_allocation"] or 0)
        else:
            row["frees"] += t.calls
            row["bytes_freed"] += t.bytes
    out = sorted(ranks.values(), key=lambda r: (
        -(r["bytes_allocated"] - r["bytes_freed"]), r["cluster"], r["node"],
        (r["rank"] is None, r["rank"] or 0)))
    for row in out:
        row["bytes_outstanding"] = row["bytes_allocated"] - row["bytes_freed"]
        small = row.pop("small")
        row["small_allocation_share"] = num(small / row["allocations"], 4) \
            if row["allocations"] else None
    return {"ranks": out[:limit], "truncated": len(out) > limit, "window": sel.window.to_json()}
