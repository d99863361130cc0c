"""The anomalies tool: what stands out in the stored events and thresholds, newest first."""

from __future__ import annotations

import json
from datetime import datetime

from sqlalchemy import Connection

from ingero.analysis.causes import HEAVY_BLOCKIO_BYTES, HEAVY_BLOCKIO_REQUESTS, PREEMPTION_BURST

from ..store.models import FAILED_CALL
from ..registry import ToolContext, obj, tool
from .calltotals import call_totals
from .evidence import BY_ANOTHER_PROCESS
from .schema import (BOOL, CLUSTER_ARG, INT_OR_NULL, JOB_ARG, LIMIT, NODE_ARG, SCALAR,
                     SINCE_ARG, STR, STR_OR_NULL, TIME, UNTIL_ARG, WINDOW_OUT, array, closed)
from .selection import (EVENT_ROWS, Selection, Where, iso, jnum, num, pinned, reading, rows,
                        scalar, select, whole)

SLOW_CALL_RATIO = 3.0                  # p99/p50 of an op's call duration
SLOW_CALL_MIN_CALLS = 10

ANOMALY_TYPES = ("straggler", "resolved", "panic", "quorum_lost", "slow_calls",
                 "preemption_burst", "heavy_blockio", "failed_call")
EDGES = f"""
SELECT e.t, e.kind, e.cluster, e.node, e.job, e.rank, {jnum('score')}, {jnum('threshold')},
       e.attrs ->> 'mode'
FROM events e WHERE e.kind IN ('straggler', 'resolved') AND {{where}}
ORDER BY e.t DESC, e.id LIMIT :limit
"""
THRESHOLD_ALERTS = """
SELECT th.t, th.cluster, th.cohort, th.panic, th.quorum_met, th.active, th.median, th.threshold
FROM thresholds th WHERE {where} AND (th.panic OR NOT th.quorum_met)
ORDER BY th.t DESC, th.cluster, th.cohort LIMIT :limit
"""
TIMED_CALLS = ("collective", "comm_init", "comm_destroy", "sync", "alloc", "free", "memcpy")
PREEMPTION_BURSTS = f"""
SELECT e.t, e.cluster, e.node, e.job, e.rank, {jnum('count')} AS preemptions,
       e.attrs ->> 'preemptor_comm', {jnum('preemptor_pid')}
FROM events e WHERE e.kind = 'preempted' AND {{where}} AND {jnum('count')} >= :burst
  AND {BY_ANOTHER_PROCESS}
ORDER BY e.t DESC, e.id LIMIT :limit
"""
HEAVY_BLOCKIO = f"""
SELECT e.t, e.cluster, e.node, e.job, e.rank, {jnum('requests')}, e.bytes
FROM events e WHERE e.kind = 'blockio' AND {{where}}
  AND (coalesce(e.bytes, 0) >= :heavy_bytes OR coalesce({jnum('requests')}, 0) >= :heavy_requests)
ORDER BY e.t DESC, e.id LIMIT :limit
"""
FAILED_CALLS = f"""
SELECT e.t, e.cluster, e.node, e.job, e.rank, e.kind, e.op, (e.attrs ->> 'result')::numeric
FROM {EVENT_ROWS} e WHERE {FAILED_CALL} AND {{where}}
ORDER BY e.t DESC, e.id LIMIT :limit
"""
ANOMALY_OUT = closed({
    "type": {"type": "string", "enum": list(ANOMALY_TYPES)}, "t": TIME, "cluster": STR,
    "node": STR_OR_NULL, "job": STR_OR_NULL, "rank": INT_OR_NULL, "summary": STR,
    "detail": {"type": "object", "additionalProperties": SCALAR}})


def anomaly(kind: str, t: datetime, cluster: str, node: str | None, job: str | None,
            rank: int | None, summary: str, /, **detail) -> dict:
    return {"type": kind, "t": iso(t), "cluster": cluster, "node": node, "job": job, "rank": rank,
            "summary": summary, "detail": {k: scalar(v) for k, v in detail.items()}}


def where_rank(rank: int | None) -> str:
    return "" if rank is None else f" rank {rank}"


@tool("anomalies", summary="Notable things, newest first: straggler edges, threshold alarms, "
      "erratic call durations, preemption bursts, heavy block I/O, failed calls",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "node": NODE_ARG,
                        "since": SINCE_ARG, "until": UNTIL_ARG, "limit": LIMIT}),
      output_schema=closed({"anomalies": array(ANOMALY_OUT), "truncated": BOOL,
                            "window": WINDOW_OUT}))
def anomalies(ctx: ToolContext, args: dict) -> dict:
    """What stands out, newest first (at most 'limit', default 100). Types: straggler / resolved
    (a node agent's own verdict edges: its score crossed the bar), panic / quorum_lost (a
    cohort's threshold could not be trusted: too many nodes under it, or too few nodes), slow_calls
    (an op on one rank whose p99 call duration is at least 3× its p50 over at least 10 calls,
    from the per-minute summaries; t is its last call; an NCCL call's duration is the
    enqueue), preemption_burst (the
    process was pushed off its CPU at least 5 times in one sample; detail names the preemptor),
    heavy_blockio (at least 64 MiB or 1000 requests of block I/O in one sample), failed_call
    (a sync, allocation or free whose result ≠ 0, e.g. a failed cudaMalloc). The window
    defaults to the whole job when 'job' is given, else the last hour."""
    sel = select(ctx, args, node=True)
    limit = args.get("limit", 100)
    found: list[dict] = []
    with reading(ctx) as conn:
        sel = pinned(conn, sel)
        where = sel.where("e", rank=False)
        params = {**where.params, "limit": limit + 1}
        found += edges(conn, where, params)
        if sel.node is None:
            found += threshold_alerts(conn, sel, limit + 1)
        found += slow_calls(conn, sel, params)
        found += host_anomalies(conn, where, params)
        found += failed_calls(conn, where, params)
    newest_first(found)
    return {"anomalies": found[:limit], "truncated": len(found) > limit,
            "window": sel.window.to_json()}


def newest_first(found: list[dict]) -> None:
    """Sorts anomalies newest first, and those of one time by what they say: a sample
    reports every rank of a node, and each process that preempted one, at once; their order
    is the answer's, not the order the store's rows came in."""
    found.sort(key=lambda a: (a["type"], a["cluster"], a["node"] or "",
                              -1 if a["rank"] is None else a["rank"],
                              json.dumps(a["detail"], sort_keys=True), a["summary"]))
    found.sort(key=lambda a: a["t"], reverse=True)


EDGE_WORDS = {"straggler": "became a straggler", "resolved": "recovered"}


def edges(conn: Connection, where: Where, params: dict) -> list[dict]:
    return [anomaly(kind, t, cluster, node, job, rank,
                    f"{node}{where_rank(rank)}: {EDGE_WORDS[kind]} (score {num(score, 3)}, "
                    f"bar {num(bar, 3)}, {mode or 'unknown'} mode)",
                    score=num(score), threshold=num(bar), mode=mode)
            for t, kind, cluster, node, job, rank, score, bar, mode in
            rows(conn, EDGES.format(where=where.sql()), params)]


def threshold_alerts(conn: Connection, sel: Selection, limit: int) -> list[dict]:
    where = sel.where("th", node=False, rank=False)
    if sel.job is not None:
        where = Where().equal("th.cluster", "cluster", sel.cluster).within("th.t", sel.window)
        where.add("th.cohort = :cohort", cohort=f"job:{sel.job}")
    out = []
    for t, cluster, cohort, panic, quorum, active, median, bar in rows(
            conn, THRESHOLD_ALERTS.format(where=where.sql()), {**where.params, "limit": limit}):
        kind = "panic" if panic else "quorum_lost"
        what = ("too many nodes under the bar: fleetd stopped flagging" if panic
                else f"only {active} nodes active: no quorum")
        job = cohort.removeprefix("job:") if cohort.startswith("job:") else None
        out.append(anomaly(kind, t, cluster, None, job, None, f"{cohort}: {what}",
                           cohort=cohort, active=active, quorum_met=quorum, median=num(median),
                           threshold=num(bar)))
    return out


def slow_calls(conn: Connection, sel: Selection, params: dict) -> list[dict]:
    """Ops whose p99 call duration is at least 3× their p50, from the per-minute summaries
    (quantiles within a histogram bucket, 2.2%)."""
    found = [(cluster, node, job, rank, op or kind, calls.timed, calls.durations.quantile(0.5),
              calls.durations.quantile(0.99), calls.last)
             for (cluster, node, job, rank, kind, op), calls in call_totals(
                 conn, sel, TIMED_CALLS, ("cluster", "node", "job", "rank", "kind", "op"),
                 rank=False).items()
             if calls.timed >= SLOW_CALL_MIN_CALLS]
    out = []
    for cluster, node, job, rank, name, calls, p50, p99, last in found:
        ratio = p99 / max(p50, 1.0)
        if ratio >= SLOW_CALL_RATIO:
            out.append(anomaly("slow_calls", last, cluster, node, job, rank,
                               f"{node}{where_rank(rank)}: {name} p99 {num(p99 / 1e3, 1)} µs is "
                               f"{num(ratio, 1)}× its p50 over {calls} calls",
                               op=name, calls=calls, p50_us=num(p50 / 1e3, 3),
                               p99_us=num(p99 / 1e3, 3), ratio=num(ratio, 2)))
    newest_first(out)
    return out[:params["limit"]]


def host_anomalies(conn: Connection, where: Where, params: dict) -> list[dict]:
    out = []
    for t, cluster, node, job, rank, count, comm, pid in rows(
            conn, PREEMPTION_BURSTS.format(where=where.sql()),
            {**params, "burst": PREEMPTION_BURST}):
        out.append(anomaly("preemption_burst", t, cluster, node, job, rank,
                           f"{node}{where_rank(rank)}: preempted {whole(count)} times in one "
                           f"sample by {comm or 'an unknown process'}",
                           preemptions=whole(count), preemptor_comm=comm,
                           preemptor_pid=None if pid is None else whole(pid)))
    for t, cluster, node, job, rank, requests, nbytes in rows(
            conn, HEAVY_BLOCKIO.format(where=where.sql()),
            {**params, "heavy_bytes": HEAVY_BLOCKIO_BYTES,
             "heavy_requests": HEAVY_BLOCKIO_REQUESTS}):
        out.append(anomaly("heavy_blockio", t, cluster, node, job, rank,
                           f"{node}{where_rank(rank)}: {whole(requests)} block I/O requests, "
                           f"{whole(nbytes) / 2**20:.1f} MiB in one sample",
                           requests=whole(requests), bytes=whole(nbytes)))
    return out


def failed_calls(conn: Connection, where: Where, params: dict) -> list[dict]:
    return [anomaly("failed_call", t, cluster, node, job, rank,
                    f"{node}{where_rank(rank)}: {op or kind} failed (result {whole(result)})",
                    kind=kind, op=op, result=whole(result))
            for t, cluster, node, job, rank, kind, op, result in
            rows(conn, FAILED_CALLS.format(where=where.sql()), params)]
