"""What a tool's arguments select and how it reads it: RFC 3339 times, the window, the cluster,
job, node and rank as bound SQL conditions, the caller's read-only transaction, and the JSON
values that go out (ISO 8601 UTC times, finite numbers or null)."""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from sqlalchemy import Connection, text

from ..store.chunks import CHUNK_SPAN
from ..registry import ToolContext, ToolError

HOUR = timedelta(hours=1)
WORK_MEM = "64MB"                      # the lag aggregates sort in memory


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
        end = until or datetime.fromtimestamp(ctx.now, UTC)
        since = end - HOUR if end - EARLIEST >= HOUR else EARLIEST
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
            where.within(f"{alias}.{time}", self.window, chunked=alias == "e")
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

    def within(self, column: str, window: Window, chunked: bool = False) -> Where:
        """``column`` in the window; ``chunked``: a time of the view ``events`` (``e.t``),
        whose chunks are bounded too (by ``chunk_t``, from a chunk's span earlier), or
        PostgreSQL would read every chunk of the selection to find the window's."""
        if window.since is not None:
            self.add(f"{column} >= :since", since=window.since)
        if window.until is not None:
            self.add(f"{column} < :until", until=window.until)
        alias = column.split(".")[0]
        if chunked and window.since is not None:
            self.add(f"{alias}.chunk_t >= :chunks_since",
                     chunks_since=max(window.since, datetime.min.replace(tzinfo=UTC) + CHUNK_SPAN)
                     - CHUNK_SPAN)
        if chunked and window.until is not None:
            self.add(f"{alias}.chunk_t < :until")
        return self

    def sql(self) -> str:
        return " AND ".join(self.clauses) or "TRUE"


def rows(conn: Connection, sql: str, params: dict) -> list:
    return conn.execute(text(sql), params).all()


# -- the raw events --------------------------------------------------------------------------

# The events kept a row each (never a call of the frequent kinds that succeeded: those are in
# chunks), with the view's columns: where nothing else can match, the chunks are not read.
EVENT_ROWS = "(SELECT r.*, r.t AS chunk_t FROM event_rows r)"
# A job's first and last event: from the rows' index, and from the chunks' first times (the
# last of a chunk begun at most its span before the last one begun).
JOB_SPANS = f"""
SELECT min(s.first), max(s.last)
FROM unnest(CAST(:span_clusters AS text[]), CAST(:span_jobs AS text[])) AS j(cluster, job)
CROSS JOIN LATERAL (
    SELECT least((SELECT min(r.t) FROM event_rows r
                  WHERE r.cluster = j.cluster AND r.job = j.job),
                 (SELECT min(c.t) FROM event_chunks c
                  WHERE c.cluster = j.cluster AND c.job = j.job)) AS first,
           greatest((SELECT max(r.t) FROM event_rows r
                     WHERE r.cluster = j.cluster AND r.job = j.job),
                    (SELECT max(c.t_last) FROM event_chunks c
                     WHERE c.cluster = j.cluster AND c.job = j.job
                       AND c.t >= (SELECT max(b.t) FROM event_chunks b
                                   WHERE b.cluster = j.cluster AND b.job = j.job)
                                  - make_interval(secs => {CHUNK_SPAN.total_seconds()}))) AS last
) s
"""
FIRST_SLICE = timedelta(minutes=1)
AHEAD = timedelta(days=1)               # how far ahead of now echod takes an event's time


def closed_window(conn: Connection, sel: Selection, now: float) -> Window | None:
    """The selection's window with its open ends closed: by the job's first and last event,
    or, with no job, a day past ``now``; None where no event can be in it."""
    since, until = sel.window.since, sel.window.until
    if sel.job is not None and (since is None or until is None):
        clusters = [sel.cluster] if sel.cluster is not None else list(sel.job_clusters or ())
        first, last = job_span(conn, [(cluster, sel.job) for cluster in clusters])
        if first is None:
            return None
        since, until = since or first, until or last + timedelta(microseconds=1)
    until = until or datetime.fromtimestamp(now, UTC) + AHEAD
    since = since or EARLIEST
    return Window(since, until) if since < until else None


def job_span(conn: Connection, jobs: list[tuple[str, str]]) -> tuple:
    """The first and last event of the jobs ((cluster, job) each); None, None for none."""
    return conn.execute(text(JOB_SPANS), {"span_clusters": [c for c, _ in jobs],
                                          "span_jobs": [j for _, j in jobs]}).one()


def time_ordered(conn: Connection, statement: str, where_of, window: Window, params: dict,
                 limit: int, newest_first: bool) -> list:
    """The rows of ``statement`` (with ``{where}``, ordered by e.t and limited by ``:limit``)
    in the closed ``window``, read a slice of it at a time from its start (or end), each
    slice four times the one before, until ``limit`` rows are read (``where_of``: a window's
    Where). PostgreSQL takes the first events in time from the rows' index, but from the
    chunks only after reading every chunk in the window, however few are wanted."""
    found: list = []
    span, edge = FIRST_SLICE, window.until if newest_first else window.since
    while len(found) < limit:
        part = Window(max(window.since, edge - span), edge) if newest_first else \
            Window(edge, min(window.until, edge + span))
        where = where_of(part)
        found += rows(conn, statement.format(where=where.sql()),
                      {**params, **where.params, "limit": limit - len(found)})
        edge = part.since if newest_first else part.until
        if edge == (window.since if newest_first else window.until):
            break
        span *= 4
    return found


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


def scalar(value: Any) -> Any:
    """An attribute value as JSON carries it (non-finite floats as null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)


# -- jobs --------------------------------------------------------------------------------------

# A job's clusters: those whose nodes ran it or whose jobs table lists it, and those fleetd
# judged it in (verdicts are kept when a full spool drops the events and scores before them).
JOB_CLUSTERS = """
SELECT c.cluster FROM (SELECT DISTINCT n.cluster FROM nodes n WHERE {nodes}) c
CROSS JOIN LATERAL (
    SELECT (SELECT 1 FROM events e WHERE e.cluster = c.cluster AND e.job = :job LIMIT 1) AS ran,
           (SELECT 1 FROM jobs j WHERE j.cluster = c.cluster AND j.id = :job) AS listed) found
WHERE found.ran IS NOT NULL OR found.listed IS NOT NULL
UNION
SELECT DISTINCT v.cluster FROM straggler_verdicts v WHERE v.job = :job AND {verdicts}
ORDER BY 1
"""


# -- Slurm's job ids ---------------------------------------------------------------------------

# JOB.STEP: ingero follows a job's processes, not its steps, so a step names its job
STEP = re.compile(r"(?P<job>[0-9]+(?:_[0-9]+|\+[0-9]+)?)\.(?:[0-9]+|batch|extern|interactive)")
SLURM_NAMED = """
SELECT DISTINCT j.id, coalesce(j.slurm_id, j.id) FROM jobs j
WHERE {where} AND (j.id = ANY (CAST(:names AS text[])) OR j.slurm_id = ANY (CAST(:names AS text[]))
                   OR split_part(split_part(j.slurm_id, '_', 1), '+', 1)
                      = ANY (CAST(:names AS text[])))
ORDER BY 2
"""


def job_names(name: str) -> str:
    """A job as the caller named it, its step (1234.0, 1234.batch) left off."""
    step = STEP.fullmatch(name)
    return step["job"] if step else name


def slurm_jobs(conn: Connection, names: list[str], cluster: str | None,
               user: str | None = None) -> dict[str, list]:
    """Each name (as sacct's -j takes it: 1234, 1234_7, 1234+1, a step of one, or the raw
    id) → the (raw id, Slurm's id) of the jobs it names (``user``'s only, when given): an
    array job's id names its tasks, a heterogeneous job's its components; a name the jobs
    table lacks names itself."""
    wanted = {name: job_names(name) for name in names if storable(name)}
    where = Where().equal("j.cluster", "cluster", cluster).equal('j."user"', "user", user)
    found = rows(conn, SLURM_NAMED.format(where=where.sql()),
                 {**where.params, "names": sorted(set(wanted.values()))})
    named = {}
    for name, job in wanted.items():
        mine = [(raw, slurm) for raw, slurm in found
                if job in (raw, slurm) or slurm.split("_")[0].split("+")[0] == job]
        named[name] = mine or [(job, job)]
    return named


def raw_job_args(conn: Connection, args: dict, user: str | None = None) -> dict:
    """A tool's 'job' and 'jobs' arguments in the raw ids the store keys jobs by: 'jobs' takes
    every job a name names; 'job' must name one (400 listing them when it names several).
    With ``user``, only that user's jobs are named (and listed)."""
    names = ([args["job"]] if "job" in args else []) + list(args.get("jobs", ()))
    if not names:
        return args
    named = slurm_jobs(conn, names, args.get("cluster"), user)
    args = dict(args)
    if "jobs" in args:
        args["jobs"] = list(dict.fromkeys(raw for name in args["jobs"] if name in named
                                          for raw, _ in named[name]))
    if "job" in args and args["job"] in named:
        jobs = named[args["job"]]
        if len({raw for raw, _ in jobs}) > 1:
            raise ToolError(f"job {args['job']!r} names {len(jobs)} jobs ("
                            + ", ".join(slurm for _, slurm in jobs[:20])
                            + "): name one", "ambiguous", 400)
        args["job"] = jobs[0][0]
    return args


def clusters_of_job(conn: Connection, job: str, cluster: str | None = None) -> list[str]:
    """The visible clusters that ran ``job``, list it in the jobs table, or judged it."""
    if not storable(job):
        return []
    nodes = Where().equal("n.cluster", "cluster", cluster)
    verdicts = Where().equal("v.cluster", "cluster", cluster)
    return [c for (c,) in rows(conn, JOB_CLUSTERS.format(nodes=nodes.sql(),
                                                         verdicts=verdicts.sql()),
                               {**nodes.params, **verdicts.params, "job": job})]


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
