"""Where a selection's collectives are, and how their entries and calls are read.

Speed. The collective tools never scan a job's collectives. The communicators are found by
skip scans of the partial index ``ix_events_collective_seq`` (cluster, job, comm_hash, seq
INCLUDE rank, t; migration 0003), their sequence range in the window by a few probes, and then
at most ``max_entries`` (instance, rank) entries are read by lookups of evenly spaced sequence
numbers: every ``stride``-th collective, all of them when the window holds fewer; answers say
the stride. Entry times come back packed in one bytea and the lag statistics are numpy's
(``entry_lags``); call statistics, which need the heap, read a smaller sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from sqlalchemy import Connection, text

from ingero.analysis import step_intervals

from .selection import Selection, Where, rows, storable, whole


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
AND_THE_NEXT = ("(SELECT generate_series(c.lo, c.hi, CAST(:stride AS bigint)) UNION ALL "
                "SELECT generate_series(c.lo + 1, c.hi + 1, CAST(:stride AS bigint)))")
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


def read_entries(conn: Connection, sel: Selection, comms: list[Communicator], stride: int,
                 and_next: bool = False) -> tuple[np.ndarray, ...]:
    """(communicator index, seq, rank, t in µs) of every entry into every stride-th instance
    (and, with ``and_next``, into the instance after each)."""
    window = Where().within("e.t", sel.window)
    statement = ENTRIES.format(window=window.sql(),
                               seqs=AND_THE_NEXT if and_next else EVERY_STRIDE)
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

CALLS = """
SELECT CAST(c.ix - 1 AS integer), e.op, e.rank, count(*), sum(e.bytes),
       percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP (ORDER BY e.duration_ns),
       sum(e.bytes) FILTER (WHERE e.duration_ns > 0),
       sum(e.duration_ns) FILTER (WHERE e.duration_ns > 0 AND e.bytes IS NOT NULL), max(e.t)
FROM unnest(CAST(:clusters AS text[]), CAST(:jobs AS text[]), CAST(:comms AS text[]),
            CAST(:los AS bigint[]), CAST(:his AS bigint[]))
     WITH ORDINALITY AS c(cluster, job, comm_hash, lo, hi, ix)
CROSS JOIN LATERAL generate_series(c.lo, c.hi, CAST(:stride AS bigint)) AS g(seq)
CROSS JOIN LATERAL (
    SELECT e.op, e.rank, e.bytes, e.duration_ns, e.t FROM events e
    WHERE e.kind = 'collective' AND e.cluster = c.cluster AND e.job = c.job
      AND e.comm_hash = c.comm_hash AND e.seq = g.seq AND e.rank IS NOT NULL AND {where}
    OFFSET 0) e
GROUP BY 1, 2, 3
"""
DEFAULT_CALL_ENTRIES = 100_000          # call statistics read the heap: a smaller sample


@dataclass
class CallStats:
    """Collective calls of one (op, communicator, rank) among those examined."""

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
    stride: int


def sample_calls(conn: Connection, sel: Selection, where: Where, *, comm_hash: str | None = None,
                 max_entries: int = DEFAULT_CALL_ENTRIES, intervals: bool = False) -> CallSurvey:
    """Per (op, communicator, rank): calls, bytes and call-duration percentiles from every
    stride-th collective of the selection's communicators (``where`` filters the calls); with
    ``intervals``, also the median time to the next collective on the communicator."""
    comms = [c for c in communicators(conn, sel) if comm_hash in (None, c.comm_hash)]
    stride = max(1, math.ceil(sum(c.instances * max(c.ranks, 1) for c in comms) / max_entries))
    coverage = {"communicators": len(comms), "instances_total": sum(c.instances for c in comms),
                "instances_examined": sum(-(-c.instances // stride) for c in comms),
                "stride": stride, "entries_examined": 0}
    if not comms:
        return CallSurvey([], coverage, stride)
    nodes = rank_nodes(conn, comms)
    found = []
    for ix, op, rank, calls, nbytes, durations, timed_bytes, timed_ns, last in rows(
            conn, CALLS.format(where=where.sql()),
            {**where.params, **comm_arrays(comms), "stride": stride}):
        c = comms[ix]
        found.append(CallStats(c.cluster, c.job, op, c.comm_hash, rank,
                               nodes.get((c.cluster, c.job, rank)), calls, whole(nbytes),
                               *(durations or (None,) * 3), whole(timed_bytes), whole(timed_ns),
                               last))
    if intervals and found:
        gaps = step_intervals(*read_entries(conn, sel, comms, stride, and_next=stride > 1))
        index = {(c.cluster, c.job, c.comm_hash): i for i, c in enumerate(comms)}
        for call in found:
            call.interval_us = gaps.get((index[(call.cluster, call.job, call.comm_hash)],
                                         call.rank))
    found.sort(key=lambda c: (c.cluster, c.job, c.op or "", c.comm_hash, c.rank))
    coverage["entries_examined"] = sum(c.calls for c in found)
    return CallSurvey(found, coverage, stride)
