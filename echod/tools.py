"""echod's tools: the questions the HTTP API and MCP answer, each declared once with its schemas.

Every tool reads through ``ctx.read()``, a read-only transaction as the sandbox role in which
row-level security already hides the clusters the caller may not see; a ``cluster`` argument
only narrows further. SQL is fixed text with the caller's values bound as parameters. Times go
out as ISO 8601 UTC strings, floats as finite numbers or null.

Entry lag. Ranks call a communicator's collectives in the same order, so (communicator,
sequence number) names one collective instance across ranks without trusting clocks. A rank's
entry lag at an instance is its entry time minus the instance's earliest entry. The earliest
needs one min per instance, a late rank cannot move it, and a reference that is off (an early
rank, a skewed clock) shifts every rank alike, which the robust bar across ranks ignores. The
same per-instance aggregates give the idle time the cost tools report: every rank that arrived
before the last one waits t_last − t_rank. Hosts' clocks are not corrected yet (fleetd will
estimate offsets), so a lag includes the clock offset between the nodes involved.

Speed. The collective tools never scan a job's collectives. The communicators are found by
skip scans of the partial index ``ix_events_collective_seq`` (cluster, job, comm_hash, seq
INCLUDE rank, t; migration 0003), their sequence range in the window by a few probes, and then
at most ``max_entries`` (instance, rank) entries are read by lookups of evenly spaced sequence
numbers: every ``stride``-th collective, all of them when the window holds fewer; answers say
the stride. Entry times come back packed in one bytea and the lag statistics are numpy's
(``entry_lags``); call statistics, which need the heap, read a smaller sample.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import numpy as np
from sqlalchemy import Connection, text

from ingero.analysis import Bar, LagStats, entry_lags, lower_bar, step_intervals, upper_bar

from .registry import ToolContext, ToolError, obj, tool
from .sqlcheck import MAX_SQL_CHARS, SqlError

HOUR = timedelta(hours=1)
REPORTING_S = 300                      # a node that sent nothing for this long is not reporting
RECENT_S = 3600                        # what cluster_summary calls recent
LAG_K = 2.0                            # bar = median + k·1.4826·max(MAD, floor)
LAG_MAD_FLOOR_S = 0.0005               # so ranks a hair apart flag nothing
LAG_MIN_SAMPLES = 3
SCORE_K = 2.0
SCORE_MAD_FLOOR = 0.01                 # fleetd's mad_floor for scores
DEFAULT_MAX_ENTRIES = 250_000
PREEMPTION_BURST = 5                   # preemptions in one sample that count as a burst
HEAVY_BLOCKIO_BYTES = 64 * 2**20       # block I/O in one sample that counts as heavy
HEAVY_BLOCKIO_REQUESTS = 1000
SLOW_CALL_RATIO = 3.0                  # p99/p50 of an op's call duration
SLOW_CALL_MIN_CALLS = 10
SMALL_ALLOCATION = 2**20
LOW_SIGNAL = {"cpu": 0.75, "compute": 0.6, "memory": 0.5}
SIGNALS = ("throughput", "compute", "memory", "cpu")
KINDS = ("collective", "comm_init", "comm_destroy", "sync", "alloc", "free", "memcpy",
         "preempted", "blockio", "straggler", "resolved")
DIRECTIONS = ("host_to_host", "host_to_device", "device_to_host", "device_to_device", "default")
CAUSES = ("host_preemption", "io", "slow_gpu", "memory_pressure", "network_or_peer", "none",
          "unknown")
# Published on-demand prices per GPU-hour (REFERENCE.md, from Ingero's cost table; for EC2 and
# GCP the 8-GPU instance's hourly price divided by 8). List prices, not anyone's bill.
GPU_RATES = {("H100-80GB", "ec2"): 12.29, ("H100-80GB", "gcp"): 11.06,
             ("H100-80GB", "lambda"): 2.49, ("H100-80GB", "coreweave"): 4.25,
             ("A100-80GB", "ec2"): 4.10, ("A100-80GB", "lambda"): 1.29}
GPUS = sorted({gpu for gpu, _ in GPU_RATES})
PROVIDERS = sorted({provider for _, provider in GPU_RATES})
WORK_MEM = "64MB"                      # the lag aggregates sort in memory

# -- schemas -----------------------------------------------------------------------------------

NAME = {"type": "string", "minLength": 1, "maxLength": 256}
TIME_ARG = {"type": "string", "format": "date-time", "minLength": 1, "maxLength": 64}
RANK = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
LIMIT = {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 100}
MAX_ENTRIES = {"type": "integer", "minimum": 1000, "maximum": 10_000_000,
               "default": DEFAULT_MAX_ENTRIES,
               "description": "Most (collective, rank) entries read; past it, every k-th "
                              "collective is read (the answer's coverage.stride is k)."}


def described(schema: dict, description: str) -> dict:
    return {**schema, "description": description}


CLUSTER_ARG = described(NAME, "Only this cluster (else every cluster the caller may see).")
JOB_ARG = described(NAME, "Only this job (Slurm job id).")
NODE_ARG = described(NAME, "Only this node.")
RANK_ARG = described(RANK, "Only this rank (the process's global rank).")
SINCE_ARG = described(TIME_ARG, "Window start, ISO 8601 (RFC 3339) date-time, inclusive; "
                                "no offset means UTC.")
UNTIL_ARG = described(TIME_ARG, "Window end, ISO 8601 (RFC 3339) date-time, exclusive.")

INT = {"type": "integer"}
NUM = {"type": "number"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
TIME = {"type": "string", "format": "date-time"}
INT_OR_NULL = {"type": ["integer", "null"]}
NUM_OR_NULL = {"type": ["number", "null"]}
STR_OR_NULL = {"type": ["string", "null"]}
TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
SCALAR = {"type": ["string", "number", "boolean", "null"]}


def array(items: dict) -> dict:
    return {"type": "array", "items": items}


def closed(properties: dict) -> dict:
    """An output object: every property always present."""
    return obj(properties, tuple(properties))


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


WINDOW_OUT = closed({"since": TIME_OR_NULL, "until": TIME_OR_NULL})


# -- arguments ---------------------------------------------------------------------------------

DATE_TIME = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})?",
    re.ASCII)
EARLIEST = datetime.min.replace(tzinfo=UTC)
LATEST = datetime.max.replace(tzinfo=UTC)


def parse_time(name: str, value: Any) -> datetime:
    """An RFC 3339 date-time as an aware UTC datetime. A leap second (:60) counts as the last
    microsecond of its minute; years Python cannot hold clamp to its first or last instant."""
    match = DATE_TIME.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise ToolError(f"{name}: {value!r} is not an ISO 8601 date-time "
                        "(e.g. 2026-11-21T22:00:00Z)")
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    micro = int((match.group(7) or ".0")[1:7].ljust(6, "0"))
    if second == 60:
        second, micro = 59, 999_999
    try:
        zone = offset_of(match.group(8))
        if year == 0:
            return EARLIEST
        return datetime(year, month, day, hour, minute, second, micro, zone).astimezone(UTC)
    except OverflowError:
        return EARLIEST if year < 5000 else LATEST
    except ValueError as exc:
        raise ToolError(f"{name}: {value!r} is not a valid date-time ({exc})") from None


def offset_of(zone: str | None) -> timezone:
    if zone is None or zone in "Zz":
        return UTC
    hours, minutes = int(zone[1:3]), int(zone[4:6])
    if hours > 23 or minutes > 59:
        raise ValueError(f"offset {zone} out of range")
    sign = -1 if zone[0] == "-" else 1
    return timezone(sign * timedelta(hours=hours, minutes=minutes))


@dataclass(frozen=True)
class Window:
    """[since, until): either end may be open."""

    since: datetime | None = None
    until: datetime | None = None

    def to_json(self) -> dict:
        return {"since": iso(self.since), "until": iso(self.until)}


def window_of(ctx: ToolContext, args: dict, *, whole_job: bool) -> Window:
    """The window the arguments name. Without ``since`` it starts an hour before ``until`` (or
    now), unless ``whole_job``: then it stays open and the job's own data bounds it."""
    since = parse_time("since", args["since"]) if "since" in args else None
    until = parse_time("until", args["until"]) if "until" in args else None
    if since is not None and until is not None and since > until:
        raise ToolError(f"since ({iso(since)}) is after until ({iso(until)})")
    if since is None and not whole_job:
        since = (until or datetime.fromtimestamp(ctx.now, UTC)) - HOUR
    return Window(since, until)


@dataclass(frozen=True)
class Selection:
    """What a tool's arguments select: cluster, job, node, rank (each optional), a window."""

    cluster: str | None = None
    job: str | None = None
    node: str | None = None
    rank: int | None = None
    window: Window = Window()
    job_clusters: tuple[str, ...] | None = None     # see pinned()

    def where(self, alias: str, *, time: str | None = "t", node: bool = True,
              rank: bool = True) -> Where:
        where = Where()
        where.equal(f"{alias}.cluster", "cluster", self.cluster)
        if self.cluster is None and self.job_clusters is not None:
            where.add(f"{alias}.cluster = ANY (CAST(:job_clusters AS text[]))",
                      job_clusters=list(self.job_clusters))
        where.equal(f"{alias}.job", "job", self.job)
        if node:
            where.equal(f"{alias}.node", "node", self.node)
        if rank:
            where.equal(f"{alias}.rank", "rank", self.rank)
        if time:
            where.within(f"{alias}.{time}", self.window)
        return where


def select(ctx: ToolContext, args: dict, *, node: bool = False, rank: bool = False) -> Selection:
    """The selection of the common arguments; the window defaults to the whole job when a job
    is named, else to the last hour."""
    return Selection(args.get("cluster"), args.get("job"), args.get("node") if node else None,
                     args.get("rank") if rank else None,
                     window_of(ctx, args, whole_job="job" in args))


# -- SQL ---------------------------------------------------------------------------------------

def storable(value: str) -> bool:
    """Whether PostgreSQL text can hold it (no NUL, no lone surrogate)."""
    if "\x00" in value:
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


class Where:
    """AND-ed conditions: fixed SQL text, the caller's values bound as parameters. A value that
    PostgreSQL text cannot hold was never stored, so it matches nothing instead of failing."""

    def __init__(self):
        self.clauses: list[str] = []
        self.params: dict[str, Any] = {}

    def add(self, clause: str, **params) -> Where:
        if any(isinstance(v, str) and not storable(v) for v in params.values()):
            self.clauses.append("FALSE")
            return self
        self.clauses.append(clause)
        self.params.update(params)
        return self

    def equal(self, column: str, name: str, value: Any) -> Where:
        return self if value is None else self.add(f"{column} = :{name}", **{name: value})

    def within(self, column: str, window: Window) -> Where:
        if window.since is not None:
            self.add(f"{column} >= :since", since=window.since)
        if window.until is not None:
            self.add(f"{column} < :until", until=window.until)
        return self

    def sql(self) -> str:
        return " AND ".join(self.clauses) or "TRUE"


def rows(conn: Connection, sql: str, params: dict) -> list:
    return conn.execute(text(sql), params).all()


@contextlib.contextmanager
def reading(ctx: ToolContext) -> Iterator[Connection]:
    """The caller's read-only transaction, set to sort in memory and to skip JIT compilation
    (which costs these queries more than it saves)."""
    with ctx.read() as conn:
        conn.execute(text(f"SET LOCAL work_mem = '{WORK_MEM}'"))
        conn.execute(text("SET LOCAL jit = off"))
        yield conn


def jnum(key: str, alias: str = "e") -> str:
    """SQL for a numeric attribute, NULL when the attribute is missing or not a number."""
    return (f"CASE WHEN jsonb_typeof({alias}.attrs -> '{key}') = 'number' "
            f"THEN ({alias}.attrs ->> '{key}')::numeric END")


# -- JSON values -------------------------------------------------------------------------------

def iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def num(value: Any, digits: int = 6) -> float | None:
    """A finite float (rounded), or None."""
    if value is None:
        return None
    value = float(value)
    return round(value, digits) if math.isfinite(value) else None


def whole(value: Any) -> int:
    """An integer from a count or numeric sum (None counts as 0)."""
    if value is None:
        return 0
    if isinstance(value, Decimal) and not value.is_finite():
        return 0
    return int(value)


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else num(seconds * 1000.0, 3)


# -- health signals -------------------------------------------------------------------------

def lowest_signal(signals: dict[str, float | None]) -> tuple[str | None, float | None]:
    """The signal with the smallest value, ignoring those not reported."""
    known = {name: value for name, value in signals.items() if value is not None}
    if not known:
        return None, None
    name = min(known, key=known.get)
    return name, known[name]


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


# -- entry lag per rank ------------------------------------------------------------------------

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


@dataclass
class RankLag:
    """One rank's entry lag over the collective instances examined (seconds)."""

    cluster: str
    job: str
    rank: int
    node: str | None
    samples: int
    lag_median: float
    lag_p95: float
    lag_max: float
    last_arrivals: int
    idle_caused: float          # GPU-seconds its peers waited at instances it entered last
    waited: float               # GPU-seconds it waited itself
    straggler: bool = False


@dataclass
class Survey:
    """The entry lags of the ranks in a selection and what was read to get them."""

    ranks: list[RankLag]
    bars: dict[tuple[str, str], Bar]
    communicators: int
    instances_total: int
    instances_examined: int
    stride: int
    entries_examined: int

    @property
    def idle_total(self) -> float:
        """GPU-seconds waited at the instances examined."""
        return sum(r.waited for r in self.ranks)

    @property
    def scale(self) -> float:
        """From the instances examined to all of them."""
        return float(self.stride)

    def coverage(self) -> dict:
        return {"communicators": self.communicators, "instances_total": self.instances_total,
                "instances_examined": self.instances_examined, "stride": self.stride,
                "entries_examined": self.entries_examined}

    def rank(self, cluster: str, job: str, rank: int) -> RankLag | None:
        return next((r for r in self.ranks if (r.cluster, r.job, r.rank) == (cluster, job, rank)),
                    None)


COVERAGE_OUT = closed({"communicators": INT, "instances_total": INT, "instances_examined": INT,
                       "stride": INT, "entries_examined": INT})


def survey(conn: Connection, sel: Selection, max_entries: int = DEFAULT_MAX_ENTRIES) -> Survey:
    """Every rank's entry lag in the selection, from at most ``max_entries`` entries."""
    comms = communicators(conn, sel)
    entries = sum(c.instances * max(c.ranks, 1) for c in comms)
    stride = max(1, math.ceil(entries / max_entries))
    jobs = {key: i for i, key in enumerate(dict.fromkeys((c.cluster, c.job) for c in comms))}
    job_of = np.array([jobs[(c.cluster, c.job)] for c in comms], np.int64)
    stats = entry_lags(*read_entries(conn, sel, comms, stride), job_of) if comms else None
    ranks = rank_lag_rows(stats, comms, rank_nodes(conn, comms)) if stats else []
    bars = job_bars(ranks)
    for r in ranks:
        bar = bars[(r.cluster, r.job)]
        r.straggler = bool(r.samples >= LAG_MIN_SAMPLES and r.lag_median > bar.bar)
    return Survey(ranks, bars, len(comms), sum(c.instances for c in comms),
                  stats.instances if stats else 0, stride,
                  int(stats.samples.sum()) if stats else 0)


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


def rank_lag_rows(stats: LagStats, comms: list[Communicator],
                  nodes: dict[tuple, str]) -> list[RankLag]:
    found = []
    for i, (comm, rank) in enumerate(zip(stats.comm, stats.rank)):
        c = comms[comm]
        found.append(RankLag(c.cluster, c.job, int(rank), nodes.get((c.cluster, c.job, int(rank))),
                             int(stats.samples[i]), float(stats.lag_p50[i]) / 1e6,
                             float(stats.lag_p95[i]) / 1e6, float(stats.lag_max[i]) / 1e6,
                             int(stats.last_arrivals[i]), float(stats.idle_caused[i]) / 1e6,
                             float(stats.waited[i]) / 1e6))
    return found


def rank_nodes(conn: Connection, comms: list[Communicator]) -> dict[tuple, str]:
    """Each rank's node, from the first and last instance of every communicator."""
    ends = [(c, seq) for c in comms for seq in (c.lo, c.hi)]
    params = {"clusters": [c.cluster for c, _ in ends], "jobs": [c.job for c, _ in ends],
              "comms": [c.comm_hash for c, _ in ends], "seqs": [seq for _, seq in ends]}
    return {(cluster, job, rank): node
            for cluster, job, rank, node in rows(conn, RANK_NODES, params)}


def job_bars(ranks: list[RankLag]) -> dict[tuple[str, str], Bar]:
    """Per job, the robust bar over its ranks' median lags."""
    medians: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in ranks:
        medians[(r.cluster, r.job)].append(r.lag_median)
    return {key: upper_bar(np.array(values), LAG_K, LAG_MAD_FLOOR_S)
            for key, values in medians.items()}


def ordered(ranks: list[RankLag]) -> list[RankLag]:
    """Stragglers first, then by median lag, largest first."""
    return sorted(ranks, key=lambda r: (not r.straggler, -r.lag_median, r.cluster, r.job, r.rank))


# -- host and health evidence ------------------------------------------------------------------

HOST_EVIDENCE = f"""
SELECT e.cluster, e.node, e.rank, e.kind, e.attrs ->> 'preemptor_comm' AS comm,
       sum({jnum('count')}) AS preemptions, sum({jnum('requests')}) AS requests,
       sum(e.bytes) AS bytes, max({jnum('requests')}) AS peak_requests,
       max(e.bytes) AS peak_bytes
FROM events e
JOIN unnest(CAST(:ev_clusters AS text[]), CAST(:ev_nodes AS text[])) AS n(cluster, node)
  ON e.cluster = n.cluster AND e.node = n.node
WHERE e.kind IN ('preempted', 'blockio') AND {{where}}
GROUP BY 1, 2, 3, 4, 5
"""
SCORE_EVIDENCE = """
SELECT s.cluster, s.node, count(*), min(s.score), avg(s.score), avg(s.throughput),
       avg(s.compute), avg(s.memory), avg(s.cpu)
FROM health_scores s
JOIN unnest(CAST(:ev_clusters AS text[]), CAST(:ev_nodes AS text[])) AS n(cluster, node)
  ON s.cluster = n.cluster AND s.node = n.node
WHERE {where}
GROUP BY 1, 2
"""
LISTINGS = """
SELECT n.cluster, n.node, count(*)
FROM thresholds th
JOIN unnest(CAST(:ev_clusters AS text[]), CAST(:ev_nodes AS text[])) AS n(cluster, node)
  ON th.cluster = n.cluster AND n.node = ANY (th.stragglers)
WHERE {where}
GROUP BY 1, 2
"""
JOB_SPANS = """
SELECT min(s.first), max(s.last)
FROM unnest(CAST(:span_clusters AS text[]), CAST(:span_jobs AS text[])) AS j(cluster, job)
CROSS JOIN LATERAL (SELECT min(e.t) AS first, max(e.t) AS last FROM events e
                    WHERE e.cluster = j.cluster AND e.job = j.job) s
"""


@dataclass
class NodeHealth:
    samples: int = 0
    score_min: float | None = None
    score_avg: float | None = None
    signals: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(SIGNALS))
    listings: int = 0


@dataclass
class HostEvidence:
    """What a rank's host did in the window: preemptions by whom, block I/O (heavy: a sample
    with at least 64 MiB or 1000 requests)."""

    preemptions: int = 0
    preemptors: dict[str, int] = field(default_factory=dict)
    blockio_requests: int = 0
    blockio_bytes: int = 0
    heavy_blockio: bool = False

    @property
    def top_preemptor(self) -> str | None:
        return max(self.preemptors, key=self.preemptors.get) if self.preemptors else None


@dataclass
class Evidence:
    health: dict[tuple[str, str], NodeHealth]
    host: dict[tuple[str, str, int], HostEvidence]


def evidence_window(conn: Connection, sel: Selection, ranks: list[RankLag]) -> Selection:
    """The selection with the window closed: a whole job's is its first to last event."""
    if sel.window.since is not None and sel.window.until is not None:
        return sel
    jobs = sorted({(r.cluster, r.job) for r in ranks})
    first, last = conn.execute(text(JOB_SPANS), {"span_clusters": [c for c, _ in jobs],
                                                 "span_jobs": [j for _, j in jobs]}).one()
    since = sel.window.since or first
    until = sel.window.until or (last + timedelta(microseconds=1) if last else None)
    return replace(sel, window=Window(since, until))


def gather_evidence(conn: Connection, sel: Selection, ranks: list[RankLag]) -> Evidence:
    """Health, threshold listings, preemptions and block I/O of the ranks' nodes."""
    located = [r for r in ranks if r.node is not None]
    if not located:
        return Evidence({}, {})
    sel = evidence_window(conn, sel, located)
    nodes = sorted({(r.cluster, r.node) for r in located})
    params = {"ev_clusters": [c for c, _ in nodes], "ev_nodes": [n for _, n in nodes]}
    return Evidence(node_health(conn, sel, params), host_evidence(conn, sel, params, located))


def node_health(conn: Connection, sel: Selection, params: dict) -> dict:
    health: dict[tuple[str, str], NodeHealth] = defaultdict(NodeHealth)
    where = sel.where("s", node=False, rank=False)
    for cluster, node, samples, low, avg, *signals in rows(
            conn, SCORE_EVIDENCE.format(where=where.sql()), {**params, **where.params}):
        health[(cluster, node)] = NodeHealth(samples, num(low), num(avg),
                                             {s: num(v) for s, v in zip(SIGNALS, signals)})
    listing = Where().within("th.t", sel.window)
    if sel.job is not None:
        listing.add("th.cohort = :cohort", cohort=f"job:{sel.job}")
    for cluster, node, count in rows(conn, LISTINGS.format(where=listing.sql()),
                                     {**params, **listing.params}):
        health[(cluster, node)].listings = count
    return health


def host_evidence(conn: Connection, sel: Selection, params: dict,
                  ranks: list[RankLag]) -> dict[tuple[str, str, int], HostEvidence]:
    """Per rank: its own process's host events plus its node's that name no rank."""
    where = sel.where("e", node=False, rank=False)
    on_node = defaultdict(list)
    for row in rows(conn, HOST_EVIDENCE.format(where=where.sql()), {**params, **where.params}):
        on_node[(row[0], row[1])].append(row[2:])
    host = {}
    for r in ranks:
        evidence = HostEvidence()
        for rank, kind, comm, preemptions, requests, nbytes, peak_requests, peak_bytes in \
                on_node[(r.cluster, r.node)]:
            if rank not in (None, r.rank):
                continue
            if kind == "preempted":
                evidence.preemptions += whole(preemptions)
                name = comm or "unknown"
                evidence.preemptors[name] = evidence.preemptors.get(name, 0) + whole(preemptions)
            else:
                evidence.blockio_requests += whole(requests)
                evidence.blockio_bytes += whole(nbytes)
                evidence.heavy_blockio |= (whole(peak_bytes) >= HEAVY_BLOCKIO_BYTES
                                           or whole(peak_requests) >= HEAVY_BLOCKIO_REQUESTS)
        host[(r.cluster, r.node, r.rank)] = evidence
    return host


RANK_EVIDENCE_OUT = closed({
    "score_min": NUM_OR_NULL, "score_avg": NUM_OR_NULL,
    "lowest_signal": {"type": ["string", "null"], "enum": [*SIGNALS, None]},
    "lowest_signal_value": NUM_OR_NULL, "threshold_listings": INT, "preemptions": INT,
    "top_preemptor": STR_OR_NULL, "blockio_requests": INT, "blockio_bytes": INT})


def rank_evidence_json(evidence: Evidence, r: RankLag) -> dict:
    health = evidence.health.get((r.cluster, r.node)) or NodeHealth()
    host = evidence.host.get((r.cluster, r.node, r.rank)) or HostEvidence()
    signal, value = lowest_signal(health.signals)
    return {"score_min": health.score_min, "score_avg": health.score_avg,
            "lowest_signal": signal, "lowest_signal_value": value,
            "threshold_listings": health.listings, "preemptions": host.preemptions,
            "top_preemptor": host.top_preemptor, "blockio_requests": host.blockio_requests,
            "blockio_bytes": host.blockio_bytes}


# -- jobs --------------------------------------------------------------------------------------

JOB_CLUSTERS = """
SELECT c.cluster FROM (SELECT DISTINCT n.cluster FROM nodes n WHERE {where}) c
CROSS JOIN LATERAL (
    SELECT (SELECT 1 FROM events e WHERE e.cluster = c.cluster AND e.job = :job LIMIT 1) AS ran,
           (SELECT 1 FROM jobs j WHERE j.cluster = c.cluster AND j.id = :job) AS listed) found
WHERE found.ran IS NOT NULL OR found.listed IS NOT NULL
ORDER BY 1
"""


def clusters_of_job(conn: Connection, job: str, cluster: str | None = None) -> list[str]:
    """The visible clusters that ran ``job`` (or list it in the jobs table)."""
    if not storable(job):
        return []
    where = Where().equal("n.cluster", "cluster", cluster)
    return [c for (c,) in rows(conn, JOB_CLUSTERS.format(where=where.sql()),
                               {**where.params, "job": job})]


def pinned(conn: Connection, sel: Selection) -> Selection:
    """A selection of a job in no named cluster, pinned to the clusters that ran it, so that
    the (cluster, job, t) index serves the job's rows."""
    if sel.job is None or sel.cluster is not None:
        return sel
    return replace(sel, job_clusters=tuple(clusters_of_job(conn, sel.job)))


def job_cluster(conn: Connection, job: str, cluster: str | None) -> str:
    """The one visible cluster that ran ``job``: 404 when none does, 400 when several do."""
    found = clusters_of_job(conn, job, cluster)
    if not found:
        raise ToolError(f"no job {job!r} in the clusters you may see", "not_found", 404)
    if len(found) > 1:
        raise ToolError(f"job {job!r} ran in several clusters ({', '.join(found)}): name one "
                        "with 'cluster'", "ambiguous", 400)
    return found[0]


# -- cost --------------------------------------------------------------------------------------

VERDICT_COST = "SELECT sum(v.cost_gpu_seconds) FROM straggler_verdicts v WHERE {where}"


def gpu_rate(args: dict) -> tuple[float | None, str | None]:
    """(USD per GPU-hour, where it came from): the explicit rate, else the table's."""
    if "usd_per_gpu_hour" in args:
        return float(args["usd_per_gpu_hour"]), "explicit"
    rate = GPU_RATES.get((args.get("gpu"), args.get("provider")))
    return (rate, f"table:{args['gpu']}/{args['provider']}") if rate is not None else (None, None)


def usd(gpu_seconds: float, rate: float | None) -> float | None:
    return None if rate is None else num(gpu_seconds / 3600.0 * rate, 2)


def cost_summary(conn: Connection, sel: Selection, found: Survey, rate: float | None,
                 source: str | None, limit: int = 100) -> dict:
    """GPU time idle at collectives because of late ranks, attributed to the rank that arrived
    last, scaled from the instances examined to all of them when a stride was used."""
    total = found.idle_total * found.scale
    culprits = sorted((r for r in found.ranks if r.idle_caused > 0),
                      key=lambda r: -r.idle_caused)[:limit]
    attributed = sum(r.idle_caused for r in found.ranks) or 1.0
    verdicts = sel.where("v", time="t", node=False, rank=False)
    verdict_seconds = conn.execute(text(VERDICT_COST.format(where=verdicts.sql())),
                                   verdicts.params).scalar()
    return {
        "gpu_seconds_idle": num(total, 3), "gpu_hours_idle": num(total / 3600.0, 6),
        "usd_per_gpu_hour": rate, "rate_source": source, "usd": usd(total, rate),
        "estimated": found.stride > 1,
        "verdicts_gpu_seconds": num(verdict_seconds, 3),
        "by_rank": [{"cluster": r.cluster, "job": r.job, "rank": r.rank, "node": r.node,
                     "last_arrivals": r.last_arrivals,
                     "gpu_seconds": num(r.idle_caused * found.scale, 3),
                     "share": num(r.idle_caused / attributed, 4),
                     "usd": usd(r.idle_caused * found.scale, rate)} for r in culprits],
    }


COST_OUT = closed({
    "gpu_seconds_idle": NUM_OR_NULL, "gpu_hours_idle": NUM_OR_NULL,
    "usd_per_gpu_hour": NUM_OR_NULL, "rate_source": STR_OR_NULL, "usd": NUM_OR_NULL,
    "estimated": BOOL, "verdicts_gpu_seconds": NUM_OR_NULL,
    "by_rank": array(closed({"cluster": STR, "job": STR, "rank": INT, "node": STR_OR_NULL,
                             "last_arrivals": INT, "gpu_seconds": NUM_OR_NULL,
                             "share": NUM_OR_NULL, "usd": NUM_OR_NULL}))})


# == the tools ==================================================================================

# -- cluster_summary ---------------------------------------------------------------------------

NODE_COUNTS = """
SELECT n.cluster, count(*), count(*) FILTER (WHERE n.last_seen >= :reporting), max(n.last_seen)
FROM nodes n WHERE {where} GROUP BY 1 ORDER BY 1
"""
RECENT_JOBS = """
SELECT DISTINCT n.cluster, s.job FROM nodes n
CROSS JOIN LATERAL (SELECT DISTINCT h.job FROM health_scores h
                    WHERE h.cluster = n.cluster AND h.node = n.name AND h.t >= :recent
                      AND h.job IS NOT NULL) s
WHERE {where} AND n.last_seen >= :recent
UNION
SELECT j.cluster, j.id FROM jobs j
WHERE {jobs} AND (j."end" IS NULL OR j."end" >= :recent) AND j.start <= :now
"""
LATEST_THRESHOLDS = """
SELECT DISTINCT ON (th.cluster, th.cohort) th.cluster, th.cohort, th.t, th.threshold, th.median,
       th.mad, th.active, th.quorum_met, th.panic, th.stragglers
FROM thresholds th WHERE {where} AND th.t >= :recent
ORDER BY th.cluster, th.cohort, th.t DESC
"""
LATEST_SCORES = """
SELECT n.cluster, n.name, h.job, h.score, h.t FROM nodes n
CROSS JOIN LATERAL (SELECT h.job, h.score, h.t FROM health_scores h
                    WHERE h.cluster = n.cluster AND h.node = n.name AND h.t >= :recent
                    ORDER BY h.t DESC LIMIT 1) h
WHERE {where}
"""
COHORT_OUT = closed({"cohort": STR, "t": TIME, "threshold": NUM_OR_NULL, "median": NUM_OR_NULL,
                     "mad": NUM_OR_NULL, "active": INT, "quorum_met": BOOL, "panic": BOOL,
                     "stragglers": array(STR)})
UNDER_BAR_OUT = closed({"node": STR, "job": STR_OR_NULL, "score": NUM_OR_NULL, "t": TIME,
                        "cohort": STR, "threshold": NUM_OR_NULL})


@tool("cluster_summary", summary="Per cluster: nodes reporting, recent jobs, each cohort's "
      "straggler bar and the nodes under it now",
      input_schema=obj({"cluster": CLUSTER_ARG}),
      output_schema=closed({
          "clusters": array(closed({
              "cluster": STR, "nodes_known": INT, "nodes_reporting": INT,
              "last_seen": TIME_OR_NULL, "jobs_recent": array(STR),
              "cohorts": array(COHORT_OUT), "under_bar": array(UNDER_BAR_OUT)})),
          "reporting_window_s": INT, "recent_window_s": INT}))
def cluster_summary(ctx: ToolContext, args: dict) -> dict:
    """What each cluster looks like now. Per cluster: nodes known and nodes reporting (anything
    received in the last 5 minutes), jobs recent (a node pushed a health score for it in the last
    hour, or the jobs table has it running), the latest straggler threshold of every cohort
    recomputed in the last hour (cohort 'job:<id>' or 'cluster:<name>'; threshold = median −
    2·1.4826·MAD of the cohort's health scores; quorum_met false means too few nodes to judge;
    panic means so many nodes are under the bar that fleetd stopped flagging), and the nodes whose
    latest score (last hour) is under their cohort's latest threshold now. Scores and signals are
    in [0, 1], higher is healthier."""
    now = datetime.fromtimestamp(ctx.now, UTC)
    nodes = Where().equal("n.cluster", "cluster", args.get("cluster"))
    jobs = Where().equal("j.cluster", "cluster", args.get("cluster"))
    thresholds = Where().equal("th.cluster", "cluster", args.get("cluster"))
    recent = now - timedelta(seconds=RECENT_S)
    params = {**nodes.params, "reporting": now - timedelta(seconds=REPORTING_S),
              "recent": recent, "now": now}
    with reading(ctx) as conn:
        counts = rows(conn, NODE_COUNTS.format(where=nodes.sql()), params)
        recent_jobs = rows(conn, RECENT_JOBS.format(where=nodes.sql(), jobs=jobs.sql()), params)
        cohorts = rows(conn, LATEST_THRESHOLDS.format(where=thresholds.sql()), params)
        scores = rows(conn, LATEST_SCORES.format(where=nodes.sql()), params)
    clusters = {c: summary_of(c) for c in sorted({r[0] for r in counts} | {r[0] for r in cohorts})}
    for cluster, known, reporting, last_seen in counts:
        clusters[cluster].update(nodes_known=known, nodes_reporting=reporting,
                                 last_seen=iso(last_seen))
    for cluster, job in sorted(recent_jobs):
        clusters[cluster]["jobs_recent"].append(job)
    bars = {}
    for cluster, cohort, t, threshold, median, mad, active, quorum, panic, stragglers in cohorts:
        bars[(cluster, cohort)] = threshold
        clusters[cluster]["cohorts"].append({
            "cohort": cohort, "t": iso(t), "threshold": num(threshold), "median": num(median),
            "mad": num(mad), "active": active, "quorum_met": quorum, "panic": panic,
            "stragglers": list(stragglers)})
    for cluster, node, job, score, t in sorted(scores):
        cohort = f"job:{job}" if job else f"cluster:{cluster}"
        bar = bars.get((cluster, cohort))
        if bar is not None and score < bar and cluster in clusters:
            clusters[cluster]["under_bar"].append({"node": node, "job": job, "score": num(score),
                                                   "t": iso(t), "cohort": cohort,
                                                   "threshold": num(bar)})
    return {"clusters": list(clusters.values()), "reporting_window_s": REPORTING_S,
            "recent_window_s": RECENT_S}


def summary_of(cluster: str) -> dict:
    return {"cluster": cluster, "nodes_known": 0, "nodes_reporting": 0, "last_seen": None,
            "jobs_recent": [], "cohorts": [], "under_bar": []}


# -- event_history -----------------------------------------------------------------------------

EVENTS = """
SELECT e.t, e.id, e.cluster, e.node, e.job, e.rank, e.kind, e.op, e.comm_hash, e.seq, e.bytes,
       e.duration_ns, e.attrs
FROM events e WHERE {where}
ORDER BY e.t DESC, e.id DESC LIMIT :limit
"""
EVENT_OUT = closed({
    "t": TIME, "id": STR, "cluster": STR, "node": STR, "job": STR_OR_NULL, "rank": INT_OR_NULL,
    "kind": STR, "op": STR_OR_NULL, "comm_hash": STR_OR_NULL, "seq": INT_OR_NULL,
    "bytes": INT_OR_NULL, "duration_ns": INT_OR_NULL,
    "attrs": {"type": "object", "additionalProperties": SCALAR}})


def scalar(value: Any) -> Any:
    """An attribute value as JSON carries it (non-finite floats as null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


@tool("event_history", summary="Stored events, newest first, filtered by cluster, job, node, "
      "rank, kind, op and time",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "node": NODE_ARG,
                        "rank": RANK_ARG,
                        "kind": {"type": "string", "enum": list(KINDS),
                                 "description": "Only events of this kind."},
                        "op": described(NAME, "Only this operation (e.g. ncclAllReduce, "
                                              "cudaStreamSynchronize, cudaMalloc)."),
                        "since": SINCE_ARG, "until": UNTIL_ARG, "limit": LIMIT}),
      output_schema=closed({"events": array(EVENT_OUT), "truncated": BOOL,
                            "window": WINDOW_OUT}))
def event_history(ctx: ToolContext, args: dict) -> dict:
    """The raw events, newest first (at most 'limit', default 100; 'truncated' says more
    matched). The window defaults to the whole job when 'job' is given, else the last hour.
    Kinds: collective (op, comm_hash, seq = the communicator's sequence number, bytes; attrs
    comm_rank, nranks, count, datatype, stream…; duration_ns is the enqueue call, not the
    transfer), comm_init/comm_destroy, sync (duration_ns; attrs peer_wait: the sync covered a
    collective), alloc/free (bytes; attrs addr, result ≠ 0 = failed), memcpy (bytes, duration_ns,
    attrs direction), preempted (host: the process was pushed off its CPU attrs.count times by
    attrs.preemptor_comm in one sample), blockio (attrs requests, bytes), straggler/resolved
    (the node agent's own verdict edges, attrs score and threshold). 'rank' is the process's
    global rank."""
    sel = select(ctx, args, node=True, rank=True)
    limit = args.get("limit", 100)
    with reading(ctx) as conn:
        where = pinned(conn, sel).where("e")
        where.equal("e.kind", "kind", args.get("kind"))
        where.equal("e.op", "op", args.get("op"))
        found = rows(conn, EVENTS.format(where=where.sql()), {**where.params, "limit": limit + 1})
    events = [{"t": iso(t), "id": event_id, "cluster": cluster, "node": node, "job": job,
               "rank": rank, "kind": kind, "op": op, "comm_hash": comm_hash, "seq": seq,
               "bytes": nbytes, "duration_ns": duration_ns,
               "attrs": {str(k): scalar(v) for k, v in (attrs or {}).items()}}
              for (t, event_id, cluster, node, job, rank, kind, op, comm_hash, seq, nbytes,
                   duration_ns, attrs) in found[:limit]]
    return {"events": events, "truncated": len(found) > limit, "window": sel.window.to_json()}


# -- find_stragglers ---------------------------------------------------------------------------

JOB_BAR_OUT = closed({"cluster": STR, "job": STR, "ranks": INT, "lag_median_ms": NUM_OR_NULL,
                      "lag_mad_ms": NUM_OR_NULL, "bar_ms": NUM_OR_NULL, "stragglers": INT})
RANK_OUT = closed({
    "cluster": STR, "job": STR, "rank": INT, "node": STR_OR_NULL, "samples": INT,
    "lag_median_ms": NUM_OR_NULL, "lag_p95_ms": NUM_OR_NULL, "lag_max_ms": NUM_OR_NULL,
    "last_arrivals": INT, "last_share": NUM_OR_NULL, "idle_caused_gpu_s": NUM_OR_NULL,
    "straggler": BOOL, "evidence": RANK_EVIDENCE_OUT})


def job_bars_json(found: Survey) -> list[dict]:
    out = []
    for (cluster, job), bar in sorted(found.bars.items()):
        members = [r for r in found.ranks if (r.cluster, r.job) == (cluster, job)]
        out.append({"cluster": cluster, "job": job, "ranks": len(members),
                    "lag_median_ms": ms(bar.median), "lag_mad_ms": ms(bar.mad),
                    "bar_ms": ms(bar.bar), "stragglers": sum(r.straggler for r in members)})
    return out


def rank_json(r: RankLag, found: Survey, evidence: Evidence) -> dict:
    return {"cluster": r.cluster, "job": r.job, "rank": r.rank, "node": r.node,
            "samples": r.samples, "lag_median_ms": ms(r.lag_median), "lag_p95_ms": ms(r.lag_p95),
            "lag_max_ms": ms(r.lag_max), "last_arrivals": r.last_arrivals,
            "last_share": num(r.last_arrivals / r.samples, 4) if r.samples else None,
            "idle_caused_gpu_s": num(r.idle_caused * found.scale, 3),
            "straggler": r.straggler, "evidence": rank_evidence_json(evidence, r)}


@tool("find_stragglers", summary="Ranks ranked by how late they enter collectives, with a robust "
      "bar and the host evidence of each",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "since": SINCE_ARG,
                        "until": UNTIL_ARG, "limit": LIMIT, "max_entries": MAX_ENTRIES}),
      output_schema=closed({"ranks": array(RANK_OUT), "jobs": array(JOB_BAR_OUT),
                            "coverage": COVERAGE_OUT, "window": WINDOW_OUT}))
def find_stragglers(ctx: ToolContext, args: dict) -> dict:
    """Which ranks hold the others up, most suspect first. For every collective instance (same
    communicator, same sequence number, at least 2 ranks) each rank's entry lag is its entry
    time minus the earliest entry of that instance. Per rank: samples, lag median/p95/max (ms),
    last_arrivals (instances it entered last) and idle_caused_gpu_s (GPU-seconds its peers waited
    for it there). Per job, the bar is median + 2·1.4826·MAD of the ranks' median lags (MAD
    floored at 0.5 ms, so identical ranks flag nothing); straggler = median lag above the bar
    (with at least 3 samples). Evidence per rank: its node's health score in the window (min,
    average, lowest signal: low cpu = host contention, low compute = slow GPU or launch rate,
    low memory = GPU memory pressure), how often fleetd listed its node under the bar, its
    preemptions (and the top preemptor's command) and block I/O. The window defaults to the
    whole job when 'job' is given, else the last hour. Clock offsets between hosts are not
    corrected yet: a lag includes its node's clock offset. Past 'max_entries' (instance, rank)
    entries only every k-th collective is read: coverage.stride is k (1 = all)."""
    sel = select(ctx, args)
    with reading(ctx) as conn:
        sel = pinned(conn, sel)
        found = survey(conn, sel, args.get("max_entries", DEFAULT_MAX_ENTRIES))
        shown = ordered(found.ranks)[:args.get("limit", 100)]
        evidence = gather_evidence(conn, sel, shown)
    return {"ranks": [rank_json(r, found, evidence) for r in shown], "jobs": job_bars_json(found),
            "coverage": found.coverage(), "window": sel.window.to_json()}


# -- find_outlier_nodes ------------------------------------------------------------------------

NODE_SCORES = """
SELECT s.cluster, s.job, s.node, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY s.score), min(s.score),
       avg(s.throughput), avg(s.compute), avg(s.memory), avg(s.cpu)
FROM health_scores s WHERE {where}
GROUP BY 1, 2, 3
"""
SIGNALS_OUT = closed({s: NUM_OR_NULL for s in SIGNALS})
SIGNAL_NAME = {"type": ["string", "null"], "enum": [*SIGNALS, None]}


@tool("find_outlier_nodes", summary="Nodes whose median health score is below the robust bar of "
      "their cohort, with the signal to blame",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "since": SINCE_ARG,
                        "until": UNTIL_ARG}),
      output_schema=closed({
          "outliers": array(closed({
              "cluster": STR, "job": STR_OR_NULL, "node": STR, "samples": INT,
              "score_median": NUM_OR_NULL, "score_min": NUM_OR_NULL, "bar": NUM_OR_NULL,
              "signals": SIGNALS_OUT, "lowest_signal": SIGNAL_NAME,
              "lowest_signal_value": NUM_OR_NULL})),
          "cohorts": array(closed({"cluster": STR, "job": STR_OR_NULL, "nodes": INT,
                                   "median": NUM_OR_NULL, "mad": NUM_OR_NULL,
                                   "bar": NUM_OR_NULL, "outliers": INT})),
          "window": WINDOW_OUT}))
def find_outlier_nodes(ctx: ToolContext, args: dict) -> dict:
    """Nodes that are unhealthy compared with their peers. Per cohort (a job, or a cluster's
    nodes that named no job) each node's median health score over the window is compared with
    the cohort's bar, median − 2·1.4826·MAD of those medians (MAD floored at 0.01); nodes below
    it are outliers, lowest first, with their average signals and the lowest one (low cpu = host
    contention, low compute = slow GPU or launch rate, low memory = GPU memory pressure, low
    throughput = fewer collectives than its own baseline). Scores are in [0, 1], higher is
    healthier. The window defaults to the whole job when 'job' is given, else the last hour."""
    sel = select(ctx, args)
    with reading(ctx) as conn:
        where = pinned(conn, sel).where("s", node=False, rank=False)
        found = rows(conn, NODE_SCORES.format(where=where.sql()), where.params)
    cohorts: dict[tuple, list] = defaultdict(list)
    for row in found:
        cohorts[(row[0], row[1])].append(row)
    outliers, summaries = [], []
    for (cluster, job), members in sorted(cohorts.items(), key=cohort_order):
        bar = lower_bar(np.array([m[4] for m in members]), SCORE_K, SCORE_MAD_FLOOR)
        below = [m for m in members if m[4] < bar.bar]
        summaries.append({"cluster": cluster, "job": job, "nodes": len(members),
                          "median": num(bar.median), "mad": num(bar.mad), "bar": num(bar.bar),
                          "outliers": len(below)})
        outliers += [outlier_json(m, bar) for m in below]
    outliers.sort(key=lambda o: (o["score_median"] if o["score_median"] is not None else 0))
    return {"outliers": outliers, "cohorts": summaries, "window": sel.window.to_json()}


def cohort_order(item: tuple) -> tuple[str, str]:
    (cluster, job), _members = item
    return cluster, job or ""


def outlier_json(row: tuple, bar: Bar) -> dict:
    cluster, job, node, samples, median, low, *signals = row
    named = {s: num(v) for s, v in zip(SIGNALS, signals)}
    signal, value = lowest_signal(named)
    return {"cluster": cluster, "job": job, "node": node, "samples": samples,
            "score_median": num(median), "score_min": num(low), "bar": num(bar.bar),
            "signals": named, "lowest_signal": signal, "lowest_signal_value": value}


# -- anomalies ---------------------------------------------------------------------------------

ANOMALY_TYPES = ("straggler", "resolved", "panic", "quorum_lost", "slow_calls",
                 "preemption_burst", "heavy_blockio", "failed_call")
EDGES = f"""
SELECT e.t, e.kind, e.cluster, e.node, e.job, e.rank, {jnum('score')}, {jnum('threshold')},
       e.attrs ->> 'mode'
FROM events e WHERE e.kind IN ('straggler', 'resolved') AND {{where}}
ORDER BY e.t DESC LIMIT :limit
"""
THRESHOLD_ALERTS = """
SELECT th.t, th.cluster, th.cohort, th.panic, th.quorum_met, th.active, th.median, th.threshold
FROM thresholds th WHERE {where} AND (th.panic OR NOT th.quorum_met)
ORDER BY th.t DESC LIMIT :limit
"""
CALL_DURATIONS = """
SELECT e.cluster, e.node, e.job, e.rank, e.kind, e.op, count(*),
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (ORDER BY e.duration_ns), max(e.t)
FROM events e
WHERE e.duration_ns IS NOT NULL
  AND e.kind IN ('comm_init', 'comm_destroy', 'sync', 'alloc', 'free', 'memcpy') AND {where}
GROUP BY 1, 2, 3, 4, 5, 6 HAVING count(*) >= :min_calls
"""
PREEMPTION_BURSTS = f"""
SELECT e.t, e.cluster, e.node, e.job, e.rank, {jnum('count')} AS preemptions,
       e.attrs ->> 'preemptor_comm', {jnum('preemptor_pid')}
FROM events e WHERE e.kind = 'preempted' AND {{where}} AND {jnum('count')} >= :burst
ORDER BY e.t DESC LIMIT :limit
"""
HEAVY_BLOCKIO = f"""
SELECT e.t, e.cluster, e.node, e.job, e.rank, {jnum('requests')}, e.bytes
FROM events e WHERE e.kind = 'blockio' AND {{where}}
  AND (coalesce(e.bytes, 0) >= :heavy_bytes OR coalesce({jnum('requests')}, 0) >= :heavy_requests)
ORDER BY e.t DESC LIMIT :limit
"""
FAILED_CALLS = """
SELECT e.t, e.cluster, e.node, e.job, e.rank, e.kind, e.op, (e.attrs ->> 'result')::numeric
FROM events e
WHERE e.kind IN ('sync', 'alloc', 'free') AND jsonb_typeof(e.attrs -> 'result') = 'number'
  AND (e.attrs ->> 'result')::numeric <> 0 AND {where}
ORDER BY e.t DESC LIMIT :limit
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
    (an op on one rank whose p99 call duration is at least 3× its p50 over at least 10 calls;
    t is its last call; NCCL calls are judged on the collectives collective_stats reads, every
    k-th past 100,000 entries, and their duration is the enqueue), preemption_burst (the
    process was pushed off its CPU at least 5 times in one sample; detail names the preemptor),
    heavy_blockio (at least 64 MiB or 1000 requests of block I/O in one sample), failed_call
    (a sync, allocation or free whose result ≠ 0, e.g. a failed cudaMalloc). The window
    defaults to the whole job when 'job' is given, else the last hour."""
    sel = select(ctx, args, node=True)
    limit = args.get("limit", 100)
    found: list[dict] = []
    with reading(ctx) as conn:
        where = pinned(conn, sel).where("e", rank=False)
        params = {**where.params, "limit": limit + 1}
        found += edges(conn, where, params)
        if sel.node is None:
            found += threshold_alerts(conn, sel, limit + 1)
        found += slow_calls(conn, sel, where, params)
        found += host_anomalies(conn, where, params)
        found += failed_calls(conn, where, params)
    found.sort(key=lambda a: a["t"], reverse=True)
    return {"anomalies": found[:limit], "truncated": len(found) > limit,
            "window": sel.window.to_json()}


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


def slow_calls(conn: Connection, sel: Selection, where: Where, params: dict) -> list[dict]:
    """Ops whose p99 call duration is at least 3× their p50: exact for the host-side calls,
    from the sampled collectives (as collective_stats reads them) for NCCL."""
    found = [(cluster, node, job, rank, op or kind, calls, p50, p99, last)
             for cluster, node, job, rank, kind, op, calls, (p50, p99), last in rows(
                 conn, CALL_DURATIONS.format(where=where.sql()),
                 {**params, "min_calls": SLOW_CALL_MIN_CALLS})]
    found += [(c.cluster, c.node, c.job, c.rank, c.op or "collective", c.calls, c.p50_ns,
               c.p99_ns, c.last)
              for c in sample_calls(conn, sel, sel.where("e", rank=False)).calls
              if c.calls >= SLOW_CALL_MIN_CALLS and c.p99_ns is not None]
    out = []
    for cluster, node, job, rank, name, calls, p50, p99, last in found:
        ratio = p99 / max(p50, 1.0)
        if ratio >= SLOW_CALL_RATIO:
            out.append(anomaly("slow_calls", last, cluster, node, job, rank,
                               f"{node}{where_rank(rank)}: {name} p99 {num(p99 / 1e3, 1)} µs is "
                               f"{num(ratio, 1)}× its p50 over {calls} calls",
                               op=name, calls=calls, p50_us=num(p50 / 1e3, 3),
                               p99_us=num(p99 / 1e3, 3), ratio=num(ratio, 2)))
    out.sort(key=lambda a: a["t"], reverse=True)
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


# -- collective_stats --------------------------------------------------------------------------

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
                        "direction": {"type": "string", "enum": list(DIRECTIONS),
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


# -- explain -----------------------------------------------------------------------------------

SYNCS = """
SELECT e.rank, coalesce(e.attrs -> 'peer_wait', 'false'::jsonb) = 'true'::jsonb, count(*),
       sum(e.duration_ns)
FROM events e WHERE e.kind = 'sync' AND e.duration_ns IS NOT NULL AND {where}
GROUP BY 1, 2
"""
RANK_EXISTS = """
SELECT EXISTS (SELECT 1 FROM events e
               WHERE e.cluster = :cluster AND e.job = :job AND e.rank = :rank)
"""
LATEST_VERDICT = """
SELECT v.t, v.cause, v.lag_ns, v.op, v.comm_hash, v.cost_gpu_seconds
FROM straggler_verdicts v
WHERE v.cluster = :cluster AND v.job = :job AND v.rank = :rank AND {window}
ORDER BY v.t DESC LIMIT 1
"""
FIXES = {
    "host_preemption": "pin the training processes with taskset (or a cpuset) or keep {comm} "
                       "off their cores",
    "io": "take blocking I/O off the training path: stage the data on local disk, use more "
          "data-loader workers, write checkpoints asynchronously",
    "slow_gpu": "check the GPU on {node} (nvidia-smi -q: clocks, throttling, XID errors; DCGM "
                "diagnostics) and drain the node if it stays slow",
    "memory_pressure": "lower the GPU memory this rank needs (smaller micro-batch, activation "
                       "checkpointing) and look for leaks with memory_hotspots",
    "network_or_peer": "look at what this rank waits for: collective_stats of its other "
                       "communicators, NCCL_DEBUG=INFO for its links, its node's clock offset",
    "unknown": "look at event_history of this rank around its late collectives",
}


@dataclass
class SyncWork:
    """Sync calls of one rank: self-work (its own kernels) and peer-wait (a collective)."""

    self_calls: int = 0
    self_ns: int = 0
    wait_calls: int = 0
    wait_ns: int = 0

    @property
    def self_ms(self) -> float | None:
        return self.self_ns / self.self_calls / 1e6 if self.self_calls else None

    @property
    def wait_ms(self) -> float | None:
        return self.wait_ns / self.wait_calls / 1e6 if self.wait_calls else None


@dataclass
class Facts:
    """What explain weighs for one rank."""

    lag: RankLag | None
    bar: Bar | None
    host: HostEvidence
    health: NodeHealth
    sync: SyncWork
    peers_self_ms: float | None
    peers_wait_ms: float | None
    verdict_cause: str | None = None


@dataclass
class Diagnosis:
    cause: str
    confidence: str
    fix: str | None
    findings: list[str]


def diagnose(facts: Facts) -> Diagnosis:
    """The cause of a rank's lateness, from its evidence; ``none`` when it is not late."""
    if facts.lag is None:
        return Diagnosis("unknown", "low", None,
                         ["no collective of this rank could be compared with its peers"])
    findings = describe_facts(facts)
    if not facts.lag.straggler:
        sure = facts.lag.samples >= 10
        return Diagnosis("none", "high" if sure else "low", None, findings)
    cause, confidence = blame(facts)
    if cause == "unknown" and facts.verdict_cause in CAUSES:
        cause, confidence = facts.verdict_cause, "medium"
        findings.append(f"fleetd's verdict names {cause}")
    fix = FIXES.get(cause)
    comm = facts.host.top_preemptor or "the competing processes"
    return Diagnosis(cause, confidence,
                     fix.format(comm=comm, node=facts.lag.node or "its node") if fix else None,
                     findings)


def blame(facts: Facts) -> tuple[str, str]:
    """(cause, confidence) for a rank known to be late, strongest evidence first."""
    signals, host = facts.health.signals, facts.host
    cpu_low = below(signals.get("cpu"), LOW_SIGNAL["cpu"])
    mostly_last = facts.lag.last_arrivals >= 0.5 * facts.lag.samples
    if host.preemptions >= PREEMPTION_BURST:
        return "host_preemption", "high" if cpu_low or mostly_last else "medium"
    if host.heavy_blockio:
        return "io", "medium"
    if cpu_low:
        return "host_preemption", "medium"
    if below(signals.get("memory"), LOW_SIGNAL["memory"]):
        return "memory_pressure", "medium"
    slow_kernels = ratio_above(facts.sync.self_ms, facts.peers_self_ms, 1.5)
    if below(signals.get("compute"), LOW_SIGNAL["compute"]) or slow_kernels:
        both = slow_kernels and below(signals.get("compute"), LOW_SIGNAL["compute"])
        return "slow_gpu", "high" if both else "medium"
    if ratio_above(facts.sync.wait_ms, facts.peers_wait_ms, 1.5):
        return "network_or_peer", "low"
    return "unknown", "low"


def below(value: float | None, bar: float) -> bool:
    return value is not None and value < bar


def ratio_above(mine: float | None, peers: float | None, factor: float) -> bool:
    return mine is not None and peers is not None and peers > 0 and mine >= factor * peers


def describe_facts(facts: Facts) -> list[str]:
    lag, host, health = facts.lag, facts.host, facts.health
    lines = [f"enters collectives {ms(lag.lag_median)} ms after the earliest rank (median of "
             f"{lag.samples}; peers' median {ms(facts.bar.median) if facts.bar else None} ms, "
             f"bar {ms(facts.bar.bar) if facts.bar else None} ms); last to arrive "
             f"{lag.last_arrivals} times"]
    if host.preemptions:
        lines.append(f"preempted {host.preemptions} times, mostly by {host.top_preemptor}")
    if host.blockio_requests or host.blockio_bytes:
        lines.append(f"block I/O: {host.blockio_requests} requests, "
                     f"{host.blockio_bytes / 2**20:.1f} MiB")
    signal, value = lowest_signal(health.signals)
    if signal is not None:
        lines.append(f"lowest health signal of {lag.node}: {signal} {value:.2f} "
                     f"(score avg {health.score_avg})")
    if facts.sync.self_ms is not None:
        lines.append(f"sync self-work {facts.sync.self_ms:.3f} ms per call "
                     f"(peers' median {num(facts.peers_self_ms, 3)} ms)")
    return lines


def sync_work(conn: Connection, sel: Selection) -> dict[int, SyncWork]:
    where = sel.where("e", node=False, rank=False)
    work: dict[int, SyncWork] = defaultdict(SyncWork)
    for rank, peer_wait, calls, total in rows(conn, SYNCS.format(where=where.sql()),
                                              where.params):
        if rank is None:
            continue
        if peer_wait:
            work[rank].wait_calls, work[rank].wait_ns = calls, whole(total)
        else:
            work[rank].self_calls, work[rank].self_ns = calls, whole(total)
    return work


def peers_median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def latest_verdict(conn: Connection, sel: Selection, rank: int) -> dict | None:
    window = Where().within("v.t", sel.window)
    found = conn.execute(text(LATEST_VERDICT.format(window=window.sql())),
                         {**window.params, "cluster": sel.cluster, "job": sel.job,
                          "rank": rank}).first()
    if found is None:
        return None
    t, cause, lag_ns, op, comm, cost = found
    return {"t": iso(t), "cause": cause, "lag_ms": None if lag_ns is None else num(lag_ns / 1e6, 3),
            "op": op, "comm_hash": comm, "cost_gpu_seconds": num(cost, 3)}


LAG_EVIDENCE_OUT = closed({
    "samples": INT, "lag_median_ms": NUM_OR_NULL, "lag_p95_ms": NUM_OR_NULL,
    "lag_max_ms": NUM_OR_NULL, "peers_lag_median_ms": NUM_OR_NULL, "bar_ms": NUM_OR_NULL,
    "straggler": BOOL, "last_arrivals": INT, "idle_caused_gpu_s": NUM_OR_NULL})
EXPLAIN_OUT = closed({
    "cluster": STR, "job": STR, "rank": INT, "node": STR_OR_NULL,
    "cause": {"type": "string", "enum": list(CAUSES)},
    "confidence": {"type": "string", "enum": ["high", "medium", "low"]},
    "fix": STR_OR_NULL, "findings": array(STR),
    "evidence": closed({
        "lag": nullable(LAG_EVIDENCE_OUT),
        "preemptions": closed({"total": INT,
                               "by": array(closed({"comm": STR, "count": INT}))}),
        "blockio": closed({"requests": INT, "bytes": INT, "heavy": BOOL}),
        "health": closed({"samples": INT, "score_min": NUM_OR_NULL, "score_avg": NUM_OR_NULL,
                          "signals": SIGNALS_OUT, "lowest_signal": SIGNAL_NAME,
                          "lowest_signal_value": NUM_OR_NULL, "threshold_listings": INT}),
        "sync": closed({"self_work_calls": INT, "self_work_ms_avg": NUM_OR_NULL,
                        "peer_wait_calls": INT, "peer_wait_ms_avg": NUM_OR_NULL,
                        "peers_self_work_ms_median": NUM_OR_NULL,
                        "peers_peer_wait_ms_median": NUM_OR_NULL}),
        "verdict": nullable(closed({"t": TIME, "cause": STR, "lag_ms": NUM_OR_NULL,
                                    "op": STR_OR_NULL, "comm_hash": STR_OR_NULL,
                                    "cost_gpu_seconds": NUM_OR_NULL}))}),
    "coverage": COVERAGE_OUT, "window": WINDOW_OUT})


@tool("explain", summary="Why one rank is late: the cause, how sure, the fix, and the evidence",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG,
                        "rank": described(RANK, "The rank (the process's global rank)."),
                        "since": SINCE_ARG, "until": UNTIL_ARG, "max_entries": MAX_ENTRIES},
                       ("job", "rank")),
      output_schema=EXPLAIN_OUT)
def explain(ctx: ToolContext, args: dict) -> dict:
    """The cause of one rank's lateness and its evidence. cause is one of host_preemption (its
    process was pushed off its CPU: preemption bursts, or a low cpu signal), io (heavy block I/O
    by it), memory_pressure (low GPU memory headroom), slow_gpu (low compute signal, or its
    syncs on its own kernels take much longer than its peers'), network_or_peer (it waits in
    collectives much longer than its peers: the delay comes from elsewhere), none (it is not
    late: its median entry lag is under the job's bar; see find_stragglers) or unknown (late
    with no evidence here). confidence is high, medium or low; fix is one line to try. Evidence:
    its lag against its peers (the bar is median + 2·1.4826·MAD of the ranks' median lags),
    preemptions by command, block I/O, its node's health score and signals, sync self-work
    against peer-wait, and fleetd's verdict when there is one. 404 when the job is not in the
    clusters you may see or has no such rank (a rank that took part in none of its compared
    collectives); 400 when the job ran in several of them and no 'cluster' says which. The
    window defaults to the whole job. Clock offsets between hosts are not corrected yet."""
    rank = args["rank"]
    with reading(ctx) as conn:
        cluster = job_cluster(conn, args["job"], args.get("cluster"))
        sel = replace(select(ctx, args), cluster=cluster)
        found = survey(conn, sel, args.get("max_entries", DEFAULT_MAX_ENTRIES))
        lag = found.rank(cluster, sel.job, rank)
        if lag is None and not rank_exists(conn, found, cluster, sel.job, rank):
            raise ToolError(f"no rank {rank} in job {sel.job!r}", "not_found", 404)
        node = lag.node if lag else None
        evidence = gather_evidence(conn, sel, [lag] if lag else [])
        work = sync_work(conn, sel)
        verdict = latest_verdict(conn, sel, rank)
    facts = explain_facts(found, lag, evidence, work, rank, verdict)
    diagnosis = diagnose(facts)
    return {"cluster": cluster, "job": sel.job, "rank": rank, "node": node,
            "cause": diagnosis.cause, "confidence": diagnosis.confidence, "fix": diagnosis.fix,
            "findings": diagnosis.findings, "evidence": explain_evidence(facts, found, verdict),
            "coverage": found.coverage(), "window": sel.window.to_json()}


def rank_exists(conn: Connection, found: Survey, cluster: str, job: str, rank: int) -> bool:
    """Whether the job has this rank. A job whose collectives were compared has exactly the
    ranks found there; only a job without them is searched (it has few events)."""
    if any((r.cluster, r.job) == (cluster, job) for r in found.ranks):
        return False
    return bool(conn.execute(text(RANK_EXISTS), {"cluster": cluster, "job": job,
                                                 "rank": rank}).scalar())


def explain_facts(found: Survey, lag: RankLag | None, evidence: Evidence,
                  work: dict[int, SyncWork], rank: int, verdict: dict | None) -> Facts:
    peers = [r for r in found.ranks if lag is not None and (r.cluster, r.job) == (
        lag.cluster, lag.job) and r.rank != rank]
    bar = found.bars.get((lag.cluster, lag.job)) if lag else None
    if bar is not None and peers:
        bar = Bar(float(np.median([p.lag_median for p in peers])), bar.mad, bar.bar)
    others = [w for r, w in work.items() if r != rank]
    return Facts(lag, bar,
                 (evidence.host.get((lag.cluster, lag.node, lag.rank)) if lag else None)
                 or HostEvidence(),
                 (evidence.health.get((lag.cluster, lag.node)) if lag else None) or NodeHealth(),
                 work.get(rank, SyncWork()), peers_median([w.self_ms for w in others]),
                 peers_median([w.wait_ms for w in others]),
                 verdict["cause"] if verdict else None)


def explain_evidence(facts: Facts, found: Survey, verdict: dict | None) -> dict:
    lag, host, health, work = facts.lag, facts.host, facts.health, facts.sync
    signal, value = lowest_signal(health.signals)
    return {
        "lag": None if lag is None else {
            "samples": lag.samples, "lag_median_ms": ms(lag.lag_median),
            "lag_p95_ms": ms(lag.lag_p95), "lag_max_ms": ms(lag.lag_max),
            "peers_lag_median_ms": ms(facts.bar.median) if facts.bar else None,
            "bar_ms": ms(facts.bar.bar) if facts.bar else None, "straggler": lag.straggler,
            "last_arrivals": lag.last_arrivals,
            "idle_caused_gpu_s": num(lag.idle_caused * found.scale, 3)},
        "preemptions": {"total": host.preemptions,
                        "by": [{"comm": comm, "count": count} for comm, count in
                               sorted(host.preemptors.items(), key=lambda kv: -kv[1])]},
        "blockio": {"requests": host.blockio_requests, "bytes": host.blockio_bytes,
                    "heavy": host.heavy_blockio},
        "health": {"samples": health.samples, "score_min": health.score_min,
                   "score_avg": health.score_avg, "signals": health.signals,
                   "lowest_signal": signal, "lowest_signal_value": value,
                   "threshold_listings": health.listings},
        "sync": {"self_work_calls": work.self_calls, "self_work_ms_avg": num(work.self_ms, 3),
                 "peer_wait_calls": work.wait_calls, "peer_wait_ms_avg": num(work.wait_ms, 3),
                 "peers_self_work_ms_median": num(facts.peers_self_ms, 3),
                 "peers_peer_wait_ms_median": num(facts.peers_wait_ms, 3)},
        "verdict": verdict,
    }


# -- get_cost ----------------------------------------------------------------------------------

RATE_ARGS = {
    "usd_per_gpu_hour": {"type": "number", "exclusiveMinimum": 0, "maximum": 10_000,
                         "description": "Price of one GPU-hour in USD; overrides gpu/provider."},
    "gpu": {"type": "string", "enum": GPUS,
            "description": "GPU model, to price with the provider's published on-demand rate."},
    "provider": {"type": "string", "enum": PROVIDERS, "description": "Cloud provider."},
}
COST_NOTE = ("idle = for every collective instance, the time each earlier rank waited for the "
             "last one (t_last − t_rank), one GPU per rank; clock offsets between hosts are not "
             "corrected yet")


@tool("get_cost", summary="GPU time idle at collectives because of late ranks, who caused it, "
      "and what it cost",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "since": SINCE_ARG,
                        "until": UNTIL_ARG, **RATE_ARGS, "max_entries": MAX_ENTRIES}),
      output_schema=closed({**COST_OUT["properties"], "note": STR, "coverage": COVERAGE_OUT,
                            "window": WINDOW_OUT}))
def get_cost(ctx: ToolContext, args: dict) -> dict:
    """What late ranks cost. At every collective instance each rank that arrived before the
    last one sits idle for t_last − t_rank: gpu_seconds_idle sums that over the window, one GPU
    per rank, and by_rank attributes each instance's idle time to the rank that arrived last
    (a tie credits each tied rank; share is of the attributed total). usd = GPU-hours ×
    usd_per_gpu_hour: the explicit rate if given, else the published on-demand rate per
    GPU-hour for gpu + provider (H100-80GB: ec2 12.29, gcp 11.06, lambda 2.49, coreweave 4.25;
    A100-80GB: ec2 4.10, lambda 1.29; for EC2 and GCP the 8-GPU instance's price divided by 8:
    list prices, not your bill), else null (GPU-seconds only). verdicts_gpu_seconds is what
    fleetd's straggler verdicts in the window put on it, when there are any. estimated is true
    when only every k-th collective was read (coverage.stride = k; the totals are scaled by k).
    The window defaults to the whole job when 'job' is given, else the last hour. Clock offsets
    between hosts are not corrected yet."""
    sel = select(ctx, args)
    rate, source = gpu_rate(args)
    with reading(ctx) as conn:
        sel = pinned(conn, sel)
        found = survey(conn, sel, args.get("max_entries", DEFAULT_MAX_ENTRIES))
        cost = cost_summary(conn, sel, found, rate, source)
    return {**cost, "note": COST_NOTE, "coverage": found.coverage(),
            "window": sel.window.to_json()}


# -- job_report --------------------------------------------------------------------------------

JOB_ROW = """
SELECT j."user", j.gpus, j.nodes, j.start, j."end" FROM jobs j
WHERE j.cluster = :cluster AND j.id = :job
"""
JOB_EVENTS = """
SELECT (SELECT count(*) FROM (SELECT 1 FROM events e
                              WHERE e.cluster = :cluster AND e.job = :job LIMIT :cap) counted),
       (SELECT min(e.t) FROM events e WHERE e.cluster = :cluster AND e.job = :job),
       (SELECT max(e.t) FROM events e WHERE e.cluster = :cluster AND e.job = :job)
"""
EVENT_COUNT_CAP = 1_000_000
JOB_NODES = """
SELECT DISTINCT s.node FROM health_scores s WHERE s.cluster = :cluster AND s.job = :job
"""
RANK_SCORES = """
SELECT s.node, avg(s.score) FROM health_scores s
WHERE s.cluster = :cluster AND s.job = :job GROUP BY 1
"""


@tool("job_report", summary="A sacct-style report of one job: where and how long it ran, each "
      "rank's lag and health, the stragglers and their cost",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, **RATE_ARGS,
                        "max_entries": MAX_ENTRIES}, ("job",)),
      output_schema=closed({
          "cluster": STR, "job": STR, "user": STR_OR_NULL, "gpus": INT_OR_NULL,
          "nodes": array(STR), "ranks": INT, "first_event": TIME_OR_NULL,
          "last_event": TIME_OR_NULL, "duration_s": NUM_OR_NULL, "collectives": INT,
          "events": INT, "events_capped": BOOL,
          "per_rank": array(closed({"rank": INT, "node": STR_OR_NULL, "collectives": INT,
                                    "lag_median_ms": NUM_OR_NULL, "score_avg": NUM_OR_NULL,
                                    "straggler": BOOL})),
          "top_stragglers": array(RANK_OUT), "cost": COST_OUT, "coverage": COVERAGE_OUT}))
def job_report(ctx: ToolContext, args: dict) -> dict:
    """Everything about one job over its whole run: who ran it and on how many GPUs (when the
    jobs table knows), its nodes, ranks, first and last event, duration, collectives and events
    stored (events are counted up to 1,000,000: events_capped says there are more); per rank:
    node, collectives, median entry lag (ms, see find_stragglers), its node's average health
    score and whether it is a straggler; the stragglers with their evidence; and the cost
    summary of get_cost (usd only with a rate: usd_per_gpu_hour, or gpu + provider). Collectives
    are those compared across ranks (an instance at least 2 ranks entered): past 'max_entries'
    every k-th is read and the counts are k × those read (coverage.stride = k). 404 when the job
    is not in the clusters you may see; 400 when it ran in several of them and no 'cluster'
    says which. Clock offsets between hosts are not corrected yet."""
    rate, source = gpu_rate(args)
    with reading(ctx) as conn:
        cluster = job_cluster(conn, args["job"], args.get("cluster"))
        sel = Selection(cluster, args["job"])
        found = survey(conn, sel, args.get("max_entries", DEFAULT_MAX_ENTRIES))
        facts = job_facts(conn, sel)
        stragglers = [r for r in ordered(found.ranks) if r.straggler]
        evidence = gather_evidence(conn, sel, stragglers)
        cost = cost_summary(conn, sel, found, rate, source)
    return job_json(sel, facts, found, stragglers, evidence, cost)


def job_facts(conn: Connection, sel: Selection) -> dict:
    params = {"cluster": sel.cluster, "job": sel.job}
    return {"job": conn.execute(text(JOB_ROW), params).first(),
            "events": conn.execute(text(JOB_EVENTS), {**params, "cap": EVENT_COUNT_CAP}).one(),
            "nodes": [n for (n,) in rows(conn, JOB_NODES, params)],
            "scores": dict(rows(conn, RANK_SCORES, params))}


def job_json(sel: Selection, facts: dict, found: Survey, stragglers: list[RankLag],
             evidence: Evidence, cost: dict) -> dict:
    user, gpus, job_nodes, _start, _end = facts["job"] or (None, None, [], None, None)
    count, first, last = facts["events"]
    lags = {r.rank: r for r in found.ranks}
    ranks = sorted(lags)
    nodes = sorted(set(job_nodes or []) | set(facts["nodes"])
                   | {r.node for r in found.ranks if r.node})
    per_rank = []
    for rank in ranks:
        lag = lags[rank]
        node = lag.node
        per_rank.append({"rank": rank, "node": node,
                         "collectives": lag.samples * found.stride,
                         "lag_median_ms": ms(lag.lag_median),
                         "score_avg": num(facts["scores"].get(node)) if node else None,
                         "straggler": lag.straggler})
    return {"cluster": sel.cluster, "job": sel.job, "user": user, "gpus": gpus, "nodes": nodes,
            "ranks": len(ranks), "first_event": iso(first), "last_event": iso(last),
            "duration_s": num((last - first).total_seconds(), 3) if first and last else None,
            "collectives": sum(r.samples for r in found.ranks) * found.stride,
            "events": count, "events_capped": count >= EVENT_COUNT_CAP,
            "per_rank": per_rank,
            "top_stragglers": [rank_json(r, found, evidence) for r in stragglers[:10]],
            "cost": cost, "coverage": found.coverage()}


# -- run_analysis ------------------------------------------------------------------------------

@tool("run_analysis", summary="One read-only SQL statement over the ingero tables of your "
      "clusters", capability="sql",
      input_schema=obj({
          "sql": {"type": "string", "minLength": 1, "maxLength": MAX_SQL_CHARS,
                  "description": "One SELECT, WITH, VALUES, TABLE or EXPLAIN statement."},
          "row_cap": {"type": "integer", "minimum": 1, "maximum": 10_000,
                      "description": "Most rows returned (default: the server's)."},
          "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 600,
                        "description": "Statement timeout in seconds (default: the server's)."}},
          ("sql",)),
      output_schema=closed({"columns": array(STR), "rows": array(array({})),
                            "truncated": BOOL, "elapsed_ms": NUM}))
def run_analysis(ctx: ToolContext, args: dict) -> dict:
    """Run one read-only statement and return its columns and rows (truncated says the row cap
    cut it short). Tables: events (t, id, cluster, node, job, rank, kind, op, comm_hash, seq,
    bytes, duration_ns, attrs jsonb), health_scores (cluster, node, t, job, score, state,
    throughput, compute, memory, cpu), thresholds (cluster, cohort, t, threshold, median, mad,
    active, quorum_met, panic, stragglers), peer_lag, straggler_verdicts, jobs, nodes. Only the
    rows of your clusters are visible; statements that write, change settings or reach files
    or the network are refused (400). Times come back in ISO 8601, intervals in seconds."""
    timeout = args.get("timeout_s")
    timeout_ms = None if timeout is None else max(1, round(timeout * 1000))
    try:
        result = ctx.sandbox.run(args["sql"], ctx.scope, row_cap=args.get("row_cap"),
                                 timeout_ms=timeout_ms)
    except SqlError as exc:
        raise ToolError(str(exc), exc.code, exc.status) from exc
    return {"columns": list(result.columns), "rows": [list(row) for row in result.rows],
            "truncated": result.truncated, "elapsed_ms": float(result.elapsed_ms)}
