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

from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np
from sqlalchemy import Connection, text

from ingero.vocabulary import OWN_SEQUENCE

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
    step: str | None = None     # the Slurm step its ranks ran in (a step's are its own)

    @property
    def instances(self) -> int:
        return self.hi - self.lo + 1

    @property
    def key(self) -> tuple[str, str, str]:
        return self.cluster, self.job, self.comm_hash


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
                (SELECT count(*) FROM events e WHERE {same} AND e.seq = r.hi)) AS ranks,
       (SELECT e.attrs ->> 'step' FROM events e WHERE {same} AND e.seq = r.lo LIMIT 1) AS step
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
      {calls}
    OFFSET 0) e
"""
NO_POINT_TO_POINT = "AND e.op <> ALL (CAST(:p2p AS text[]))"
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
SELECT DISTINCT ON (c.cluster, c.job, c.step, e.rank) c.cluster, c.job, c.step, e.rank, e.node
FROM unnest(CAST(:clusters AS text[]), CAST(:jobs AS text[]), CAST(:comms AS text[]),
            CAST(:seqs AS bigint[]), CAST(:steps AS text[]))
     AS c(cluster, job, comm_hash, seq, step)
CROSS JOIN LATERAL (
    SELECT e.rank, e.node, e.t FROM events e
    WHERE e.kind = 'collective' AND e.cluster = c.cluster AND e.job = c.job
      AND e.comm_hash = c.comm_hash AND e.seq = c.seq AND e.rank IS NOT NULL
    OFFSET 0) e
ORDER BY c.cluster, c.job, c.step, e.rank, e.t DESC
"""


def entries_statement(window: Where, collectives_only: bool = False) -> str:
    """The statement that reads the entries of every stride-th instance of the communicators
    it is given (``comm_arrays``, ``stride``); with ``collectives_only``, not their sends and
    receives (which then costs a heap visit an entry: the op is not in the index)."""
    return ENTRIES.format(window=window.sql(), seqs=EVERY_STRIDE,
                          calls=NO_POINT_TO_POINT if collectives_only else "")


def read_entries(conn: Connection, sel: Selection, comms: list[Communicator], stride: int,
                 mixed: frozenset = frozenset()) -> tuple[np.ndarray, ...]:
    """(communicator index, seq, rank, t in µs) of every entry into every stride-th instance;
    on the communicators in ``mixed`` (their keys), their collectives' only, not the sends
    and receives between them."""
    window = Where().within("e.t", sel.window)
    read = []
    for collectives_only in (False, True):
        part = [i for i, c in enumerate(comms) if (c.key in mixed) == collectives_only]
        if not part:
            continue
        packed = conn.execute(text(entries_statement(window, collectives_only)), {
            **window.params, **comm_arrays([comms[i] for i in part]), "stride": stride,
            "p2p": list(OWN_SEQUENCE)}).scalar()
        entries = np.frombuffer(packed or b"", ENTRY)
        read.append((np.asarray(part, np.int64)[entries["comm"].astype(np.int64)],
                     *(entries[name].astype(np.int64) for name in ENTRY.names[1:])))
    if not read:
        return tuple(np.zeros(0, np.int64) for _ in ENTRY.names)
    return tuple(np.concatenate(column) for column in zip(*read))


# Per communicator with sends or receives: how many ranks made collectives on it (0: none).
POINT_TO_POINT_COMMS = """
SELECT s.cluster, s.job, s.comm_hash,
       count(DISTINCT s.rank) FILTER (WHERE s.op IS NULL OR s.op <> ALL (CAST(:p2p AS text[])))
FROM call_stats s
JOIN unnest(CAST(:clusters AS text[]), CAST(:jobs AS text[]), CAST(:comms AS text[]))
     AS c(cluster, job, comm_hash)
  ON s.cluster = c.cluster AND s.job = c.job AND s.comm_hash = c.comm_hash
WHERE s.kind = 'collective'
GROUP BY 1, 2, 3 HAVING bool_or(s.op = ANY (CAST(:p2p AS text[])))
"""


def without_point_to_point(conn: Connection, comms: list[Communicator]
                           ) -> tuple[list[Communicator], frozenset]:
    """The communicators as collectives see them, from the call summaries: one that made only
    sends and receives (a pipeline's) left out; one that made collectives too (a group that
    also exchanges with its neighbours) with the ranks of its collectives (a communicator's
    ranks are counted from its first and last instance, which its sends and receives share:
    they number their own calls) and its key in the set returned, to be read without them."""
    if not comms:
        return comms, frozenset()
    arrays = comm_arrays(comms)
    mixed = {(cluster, job, comm): ranks for cluster, job, comm, ranks in rows(
        conn, POINT_TO_POINT_COMMS, {"clusters": arrays["clusters"], "jobs": arrays["jobs"],
                                     "comms": arrays["comms"], "p2p": list(OWN_SEQUENCE)})}
    kept = [replace(c, ranks=mixed[c.key]) if c.key in mixed else c
            for c in comms if mixed.get(c.key, 1)]
    return kept, frozenset(mixed)


def comm_arrays(comms: list[Communicator]) -> dict[str, list]:
    """The communicators as the parallel arrays the sampling statements unnest."""
    return {"clusters": [c.cluster for c in comms], "jobs": [c.job for c in comms],
            "comms": [c.comm_hash for c in comms], "los": [c.lo for c in comms],
            "his": [c.hi for c in comms]}


def rank_nodes(conn: Connection, comms: list[Communicator]) -> dict[tuple, str]:
    """Each rank's node in each step, (cluster, job, step, rank) → node, from the first and
    last instance of every communicator."""
    ends = [(c, seq) for c in comms for seq in (c.lo, c.hi)]
    params = {"clusters": [c.cluster for c, _ in ends], "jobs": [c.job for c, _ in ends],
              "comms": [c.comm_hash for c, _ in ends], "seqs": [seq for _, seq in ends],
              "steps": [c.step for c, _ in ends]}
    return {(cluster, job, step, rank): node
            for cluster, job, step, rank, node in rows(conn, RANK_NODES, params)}


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
