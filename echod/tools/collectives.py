"""Where a selection's collectives are, and how their entries and calls are read.

Speed. The collective tools never scan a job's collectives. The communicators are found by
skip scans of the partial index ``ix_events_collective_seq`` (cluster, job, comm_hash, seq
INCLUDE rank, t; migration 0003), their sequence range in the window by a few probes, and then
at most ``max_entries`` (instance, rank) entries are read by lookups of evenly spaced sequence
numbers: every ``stride``-th collective, all of them when the window holds fewer; answers say
the stride. Entry times come back packed in one bytea and the lag statistics are numpy's
(``entry_lags``). Call statistics (counts, bytes, durations) come from the per-minute
summaries instead: every call, none of the heap.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
from sqlalchemy import Connection, text

from .calltotals import call_totals
from .selection import Selection, Where, rows, storable


# -- where the collectives are -----------------------------------------------------------------

@dataclass(frozen=True)
class Communicator:
    """One communicator of a job and the sequence numbers it used in the window."""

    cluster: str
    job: str
    comm_hash: str
    lo: int
    hi: int
    ranks: int

    @property
    def instances(self) -> int:
        return self.hi - self.lo + 1


JOBS_OF_CLUSTERS = """
    jobs AS (
        SELECT c.cluster, first.job FROM clusters c
        CROSS JOIN LATERAL (SELECT min(e.job) AS job FROM events e
                            WHERE e.kind = 'collective' AND e.cluster = c.cluster) first
        WHERE first.job IS NOT NULL
        UNION ALL
        SELECT p.cluster, next.job FROM jobs p
        CROSS JOIN LATERAL (SELECT min(e.job) AS job FROM events e
                            WHERE e.kind = 'collective' AND e.cluster = p.cluster
                              AND e.job > p.job) next
        WHERE next.job IS NOT NULL
    )"""
NAMED_JOB = """
    jobs AS (SELECT c.cluster, CAST(:job AS text) AS job FROM clusters c)"""
COMMUNICATORS = """
WITH RECURSIVE
    clusters AS (SELECT DISTINCT n.cluster FROM nodes n WHERE {clusters}),
    {jobs},
    active AS (
        SELECT j.cluster, j.job FROM jobs j
        CROSS JOIN LATERAL (SELECT 1 FROM events e
                            WHERE e.cluster = j.cluster AND e.job = j.job AND {active}
                            LIMIT 1) hit
    ),
    comms AS (
        SELECT a.cluster, a.job, first.comm_hash FROM active a
        CROSS JOIN LATERAL (SELECT min(e.comm_hash) AS comm_hash FROM events e
                            WHERE e.kind = 'collective' AND e.cluster = a.cluster
                              AND e.job = a.job) first
        WHERE first.comm_hash IS NOT NULL
        UNION ALL
        SELECT p.cluster, p.job, next.comm_hash FROM comms p
        CROSS JOIN LATERAL (SELECT min(e.comm_hash) AS comm_hash FROM events e
                            WHERE e.kind = 'collective' AND e.cluster = p.cluster
                              AND e.job = p.job AND e.comm_hash > p.comm_hash) next
        WHERE next.comm_hash IS NOT NULL
    ),
    ranged AS (
        SELECT c.cluster, c.job, c.comm_hash, {lo} AS lo, {hi} AS hi FROM comms c
    )
SELECT r.cluster, r.job, r.comm_hash, r.lo, r.hi,
       greatest((SELECT count(*) FROM events e WHERE {same} AND e.seq = r.lo),
                (SELECT count(*) FROM events e WHERE {same} AND e.seq = r.hi)) AS ranks
FROM ranged r WHERE r.lo IS NOT NULL AND r.hi IS NOT NULL AND r.lo <= r.hi
ORDER BY r.cluster, r.job, r.comm_hash
"""
SAME_COMM = ("e.kind = 'collective' AND e.cluster = {a}.cluster AND e.job = {a}.job "
             "AND e.comm_hash = {a}.comm_hash")
WHOLE_RANGE = "(SELECT {agg}(e.seq) FROM events e WHERE " + SAME_COMM.format(a="c") + ")"
WINDOW_END = ("(SELECT e.seq FROM events e WHERE " + SAME_COMM.format(a="c")
              + " AND e.seq IS NOT NULL AND {window} ORDER BY e.t {order} LIMIT 1)")


def communicators(conn: Connection, sel: Selection) -> list[Communicator]:
    """The communicators with collectives in the selection, each with its sequence range."""
    clusters = Where().equal("n.cluster", "cluster", sel.cluster)
    window = Where().within("e.t", sel.window)
    params = {**clusters.params, **window.params}
    if sel.job is not None:
        if not storable(sel.job):
            return []
        params["job"] = sel.job
    if window.clauses:
        lo = WINDOW_END.format(window=window.sql(), order="ASC")
        hi = WINDOW_END.format(window=window.sql(), order="DESC")
    else:
        lo, hi = WHOLE_RANGE.format(agg="min"), WHOLE_RANGE.format(agg="max")
    sql = COMMUNICATORS.format(clusters=clusters.sql(),
                               jobs=NAMED_JOB if sel.job is not None else JOBS_OF_CLUSTERS,
                               active=window.sql(), lo=lo, hi=hi, same=SAME_COMM.format(a="r"))
    return [Communicator(*row) for row in rows(conn, sql, params)]


# -- the entries -------------------------------------------------------------------------------

ENTRIES = """
SELECT string_agg(int4send(CAST(c.ix - 1 AS integer)) || int8send(e.seq) || int4send(e.rank)
                  || timestamptz_send(e.t), ''::bytea)
FROM unnest(CAST(:clusters AS text[]), CAST(:jobs AS text[]), CAST(:comms AS text[]),
            CAST(:los AS bigint[]), CAST(:his AS bigint[]))
     WITH ORDINALITY AS c(cluster, job, comm_hash, lo, hi, ix)
CROSS JOIN LATERAL {seqs} AS g(seq)
CROSS JOIN LATERAL (
    SELECT e.seq, e.rank, e.t FROM events e
    WHERE e.kind = 'collective' AND e.cluster = c.cluster AND e.job = c.job
      AND e.comm_hash = c.comm_hash AND e.seq = g.seq AND e.rank IS NOT NULL AND {window}
    OFFSET 0) e
"""
EVERY_STRIDE = "generate_series(c.lo, c.hi, CAST(:stride AS bigint))"
# OFFSET 0 keeps each lateral subquery a probe of one instance by the index: flattened into a
# join, PostgreSQL may rather merge-join the whole index (it cannot tell how many rows
# generate_series makes). The sequence numbers come from generate_series itself, not from an
# expression over it, so that they are index conditions.
# One entry as ENTRIES packs it: the communicator's index, seq, rank and t (µs since
# 2000-01-01, as timestamptz_send writes it), big-endian: one bytea for all, no per-row work in
# Python.
ENTRY = np.dtype([("comm", ">i4"), ("seq", ">i8"), ("rank", ">i4"), ("t", ">i8")])
RANK_NODES = """
SELECT DISTINCT ON (c.cluster, c.job, e.rank) c.cluster, c.job, e.rank, e.node
FROM unnest(CAST(:clusters AS text[]), CAST(:jobs AS text[]), CAST(:comms AS text[]),
            CAST(:seqs AS bigint[])) AS c(cluster, job, comm_hash, seq)
CROSS JOIN LATERAL (
    SELECT e.rank, e.node, e.t FROM events e
    WHERE e.kind = 'collective' AND e.cluster = c.cluster AND e.job = c.job
      AND e.comm_hash = c.comm_hash AND e.seq = c.seq AND e.rank IS NOT NULL
    OFFSET 0) e
ORDER BY c.cluster, c.job, e.rank, e.t DESC
"""


def read_entries(conn: Connection, sel: Selection, comms: list[Communicator], stride: int
                 ) -> tuple[np.ndarray, ...]:
    """(communicator index, seq, rank, t in µs) of every entry into every stride-th instance."""
    window = Where().within("e.t", sel.window)
    statement = ENTRIES.format(window=window.sql(), seqs=EVERY_STRIDE)
    packed = conn.execute(text(statement), {**window.params, **comm_arrays(comms),
                                            "stride": stride}).scalar()
    entries = np.frombuffer(packed or b"", ENTRY)
    return tuple(entries[name].astype(np.int64) for name in ENTRY.names)


def comm_arrays(comms: list[Communicator]) -> dict[str, list]:
    """The communicators as the parallel arrays the sampling statements unnest."""
    return {"clusters": [c.cluster for c in comms], "jobs": [c.job for c in comms],
            "comms": [c.comm_hash for c in comms], "los": [c.lo for c in comms],
            "his": [c.hi for c in comms]}


def rank_nodes(conn: Connection, comms: list[Communicator]) -> dict[tuple, str]:
    """Each rank's node, from the first and last instance of every communicator."""
    ends = [(c, seq) for c in comms for seq in (c.lo, c.hi)]
    params = {"clusters": [c.cluster for c, _ in ends], "jobs": [c.job for c, _ in ends],
              "comms": [c.comm_hash for c, _ in ends], "seqs": [seq for _, seq in ends]}
    return {(cluster, job, rank): node
            for cluster, job, rank, node in rows(conn, RANK_NODES, params)}


# -- call statistics ---------------------------------------------------------------------------

# Per minute, communicator and rank: its collectives' first and last times and count.
MINUTES = """
SELECT s.cluster, s.job, s.comm_hash, s.rank, s.t, min(s.first_t), max(s.last_t), sum(s.calls)
FROM call_stats s WHERE s.kind = 'collective' AND s.comm_hash IS NOT NULL AND {where}
GROUP BY 1, 2, 3, 4, 5
"""


@dataclass
class CallStats:
    """Collective calls of one (op, communicator, rank)."""

    cluster: str
    job: str
    op: str | None
    comm_hash: str
    rank: int
    node: str | None
    calls: int
    bytes: int
    p50_ns: float | None
    p95_ns: float | None
    p99_ns: float | None
    timed_bytes: int
    timed_ns: int
    last: datetime
    interval_us: float | None = None


@dataclass
class CallSurvey:
    calls: list[CallStats]
    coverage: dict


def summed_calls(conn: Connection, sel: Selection, *, op: str | None = None,
                 comm_hash: str | None = None, intervals: bool = False) -> CallSurvey:
    """Per (op, communicator, rank) of a job: calls, bytes and call-duration percentiles from
    the per-minute summaries (``call_totals``: every call, quantiles within a bucket); with
    ``intervals``, also the time between its collectives on the communicator: per minute the
    mean (from the minute's first to its last, over the calls less one), the median of those
    over the minutes."""
    totals = call_totals(conn, sel, ("collective",),
                         ("cluster", "job", "op", "comm_hash", "rank", "node"),
                         node=False, only={"op": op, "comm_hash": comm_hash})
    found = [CallStats(cluster, job, op_, comm, rank, node, t.calls, t.bytes,
                       *(t.durations.quantile(q) for q in (0.5, 0.95, 0.99)), t.timed_bytes,
                       t.duration_ns, t.last)
             for (cluster, job, op_, comm, rank, node), t in totals.items()
             if job is not None and comm is not None and rank is not None]
    if intervals and found:
        gaps = minute_intervals(conn, sel, comm_hash)
        for call in found:
            call.interval_us = gaps.get((call.cluster, call.job, call.comm_hash, call.rank))
    found.sort(key=lambda c: (c.cluster, c.job, c.op or "", c.comm_hash, c.rank))
    per_comm: dict[tuple, dict[int, int]] = {}
    for c in found:
        ranks = per_comm.setdefault((c.cluster, c.job, c.comm_hash), {})
        ranks[c.rank] = ranks.get(c.rank, 0) + c.calls
    instances = sum(max(ranks.values()) for ranks in per_comm.values())
    return CallSurvey(found, {"communicators": len(per_comm), "instances_total": instances,
                              "instances_examined": instances, "stride": 1,
                              "entries_examined": sum(c.calls for c in found),
                              "source": "summaries"})


def minute_intervals(conn: Connection, sel: Selection, comm_hash: str | None
                     ) -> dict[tuple, float]:
    """(cluster, job, communicator, rank) → µs between its collectives (see summed_calls)."""
    where = sel.where("s", node=False).equal("s.comm_hash", "comm_hash", comm_hash)
    means: dict[tuple, list[float]] = {}
    for cluster, job, comm, rank, _minute, first, last, calls in rows(
            conn, MINUTES.format(where=where.sql()), where.params):
        if calls >= 2 and first is not None:
            means.setdefault((cluster, job, comm, rank), []).append(
                (last - first).total_seconds() * 1e6 / (int(calls) - 1))
    return {key: float(np.median(values)) for key, values in means.items()}
