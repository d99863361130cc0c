"""What echod keeps, and for how long.

Everything is kept for ``--retention-days``: the per-minute call summaries, peer lag, scores,
thresholds, verdicts, and the raw events around each verdict. The raw events of the frequent
call kinds (``THINNED``: summarized in ``call_stats``, and most of what a job makes) are kept
whole for ``--raw-days`` only, or per kind for ``--raw-days-by-kind``; the rare kinds
(communicators made and destroyed, process exits, preemptions, block I/O: few, and what
several tools read) are kept whole for the full retention unless named there. Past its raw
window, a day's partitions of ``event_rows`` and ``event_chunks`` are rewritten with only the
events still owed (a chunk whole, where any of its events is): the kinds whose window is still
open, the calls that failed, and every event of a verdict's job (and the node's job-less
events) from ``--evidence-window`` before the verdict's onset to as long after it cleared (or
was last seen). The kinds a day has lost are written in its rows partition's table comment,
so a day is rewritten once per window that closes, not every hour.

A day is dropped whole once it is past the retention. Thinning copies the kept rows into a
new table and swaps it in for the partition, so the disk is given back at once (a DELETE
would leave the space to the partition, which gets no new rows). Writes into that day wait
while it is copied, writes into any day only while it is swapped (``RETENTION_LOCK``); a
writer caught between the two is refused by PostgreSQL's deadlock check and its batch comes
again. echod runs it beside ingest, not in its way.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.types import Text

from .chunks import CHUNK_SPAN
from .db import DAY, RETENTION_LOCK, chunk_partition_name, day_bounds, event_partitions
from .models import FAILED_CALL

THINNED = ("collective", "sync", "alloc", "free", "memcpy")
COMMENT_KEY = "ingero_raw_dropped"
# Rows with a time of their own, deleted once it is past the retention; verdicts by the
# latest time they speak of.
AGED_ROWS = {
    "call_stats": "t",
    "peer_lag": "t",
    "health_scores": "t",
    "thresholds": "t",
    "straggler_verdicts": "coalesce(cleared, last_seen, t)",
}
# The verdicts' windows of evidence that reach into one day: [lo, hi] per job and node.
WINDOWS = """
    SELECT DISTINCT cluster, job, node,
           greatest(coalesce(onset, t) - make_interval(secs => :margin), :day_lo) AS lo,
           least(coalesce(cleared, last_seen, t) + make_interval(secs => :margin), :day_hi) AS hi
    FROM straggler_verdicts
    WHERE coalesce(onset, t) - make_interval(secs => :margin) < :day_hi
      AND coalesce(cleared, last_seen, t) + make_interval(secs => :margin) >= :day_lo"""


@dataclass(frozen=True)
class Policy:
    days: int                                   # everything
    raw_days: int                               # raw events of the THINNED kinds
    by_kind: dict[str, int] = field(default_factory=dict)
    evidence_s: float = 600.0                   # around a verdict, before and after

    @classmethod
    def of(cls, cfg) -> Policy:
        return cls(cfg.retention_days, cfg.raw_days, dict(cfg.raw_days_by_kind),
                   cfg.evidence_window)

    def raw_window(self, kind: str) -> int:
        """Days the raw events of ``kind`` are kept whole."""
        days = self.by_kind.get(kind, self.raw_days if kind in THINNED else self.days)
        return min(days, self.days)

    def expired(self, age_days: float) -> frozenset[str]:
        """The kinds whose raw window has closed on a day that ended ``age_days`` ago."""
        return frozenset(kind for kind in set(THINNED) | set(self.by_kind)
                         if self.raw_window(kind) <= age_days)


@dataclass(frozen=True)
class Step:
    """What retention does to one day partition: drop it, or thin it to these kinds lost."""
    partition: str
    day: date
    drop: bool
    kinds: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.drop:
            return f"dropped {self.partition}"
        return (f"thinned {self.partition}: raw {', '.join(self.kinds)} kept only around "
                "verdicts")


def dropped_kinds(connection: Connection, partition: str) -> frozenset[str]:
    """The kinds a partition has been thinned of already (its table comment)."""
    comment = connection.scalar(text("SELECT obj_description(CAST(:name AS regclass), "
                                     "'pg_class')"), {"name": partition})
    try:
        return frozenset(json.loads(comment or "{}").get(COMMENT_KEY, ()))
    except (ValueError, AttributeError):
        return frozenset()


def thinned_of(connection: Connection, kind: str) -> bool:
    """Whether retention has thinned the raw events of ``kind`` on any day."""
    return connection.scalar(text(
        "SELECT EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = CAST('event_rows' AS regclass) AND obj_description(c.oid, 'pg_class') "
        "LIKE :marked)"), {"marked": f'%"{COMMENT_KEY}"%"{kind}"%'})


def plan(connection: Connection, policy: Policy, now: float) -> list[Step]:
    """What is due, oldest day first."""
    steps = []
    for day, name in sorted(event_partitions(connection).items()):
        age = (now - day_bounds(day)[1].timestamp()) / DAY.total_seconds()
        if age >= policy.days:
            steps.append(Step(name, day, drop=True))
            continue
        done = dropped_kinds(connection, name)
        if not policy.expired(age) <= done:
            steps.append(Step(name, day, drop=False,
                              kinds=tuple(sorted(policy.expired(age) | done))))
    return steps


# Per window, a job's events by the partition's (cluster, job, t) index, and the node's events of
# no job by (cluster, node, t); windows of one job may overlap. A chunk is kept whole where any
# of its events is in a window (it began at most a chunk's span before the window).
EVIDENCE = """
    WITH windows AS ({windows})
    INSERT INTO {new}
    SELECT e.* FROM windows w JOIN {name} e ON e.cluster = w.cluster AND e.job = w.job
        AND e.t BETWEEN w.lo - {span} AND w.hi WHERE e.kind = ANY(:kinds) AND {overlaps}
    UNION ALL
    SELECT e.* FROM windows w JOIN {name} e ON e.cluster = w.cluster AND e.node = w.node
        AND e.t BETWEEN w.lo - {span} AND w.hi WHERE e.kind = ANY(:kinds) AND {overlaps}
        AND (e.job IS NULL OR w.job IS NULL)
    ON CONFLICT DO NOTHING"""


def thin(connection: Connection, step: Step, evidence_s: float) -> bool:
    """Swap the day's partitions of rows and of chunks for copies of what they still owe (see
    the module's doc); False where another echod did it first. Writes into the day wait while
    it is copied (a SHARE ROW EXCLUSIVE lock on the partitions, which readers pass); writes
    anywhere wait only for the swap (``RETENTION_LOCK``)."""
    name, chunks = step.partition, chunk_partition_name(step.day)
    if name not in event_partitions(connection).values():
        return False
    connection.execute(text(f"LOCK TABLE {name}, {chunks} IN SHARE ROW EXCLUSIVE MODE"))
    if set(step.kinds) <= dropped_kinds(connection, name):
        return False
    lo, hi = day_bounds(step.day)
    kinds = bindparam("kinds", list(step.kinds), type_=ARRAY(Text))
    copies = []
    for partition, parent, span, overlaps in (
            (name, "event_rows", "interval '0'", "TRUE"),
            (chunks, "event_chunks", f"interval '{CHUNK_SPAN.total_seconds():g} seconds'",
             "e.t_last >= w.lo")):
        new = f"{partition}_thinned"
        connection.execute(text(f"CREATE TABLE {new} (LIKE {parent} INCLUDING DEFAULTS "
                                "INCLUDING CONSTRAINTS)"))
        connection.execute(text(f"ALTER TABLE {new} ADD CONSTRAINT {new}_pkey PRIMARY KEY (t, id)"))
        connection.execute(text(f"INSERT INTO {new} SELECT * FROM {partition} "
                                "WHERE kind <> ALL(:kinds)").bindparams(kinds))
        connection.execute(text(EVIDENCE.format(windows=WINDOWS, new=new, name=partition,
                                                span=span, overlaps=overlaps)).bindparams(kinds),
                           {"margin": evidence_s, "day_lo": lo, "day_hi": hi})
        copies.append((partition, parent, new))
    # Failed calls are few and each is evidence (the failed-calls index finds them); they are
    # never in chunks.
    connection.execute(text(f"INSERT INTO {name}_thinned SELECT * FROM {name} WHERE {FAILED_CALL} "
                            "AND kind = ANY(:kinds) ON CONFLICT DO NOTHING").bindparams(kinds))
    # The partition's bound as a constraint first, so that attaching need not scan the copy.
    bounds = f"'{lo.isoformat()}'", f"'{hi.isoformat()}'"
    for partition, parent, new in copies:
        connection.execute(text(f"ALTER TABLE {new} ADD CONSTRAINT {partition}_day "
                                f"CHECK (t IS NOT NULL AND t >= {bounds[0]} AND t < {bounds[1]})"))
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": RETENTION_LOCK})
    for partition, parent, new in copies:
        connection.execute(text(f"ALTER TABLE {parent} DETACH PARTITION {partition}"))
        connection.execute(text(f"DROP TABLE {partition}"))
        connection.execute(text(f"ALTER TABLE {new} RENAME TO {partition}"))
        connection.execute(text(f"ALTER INDEX {new}_pkey RENAME TO {partition}_pkey"))
        connection.execute(text(f"ALTER TABLE {parent} ATTACH PARTITION {partition} "
                                f"FOR VALUES FROM ({bounds[0]}) TO ({bounds[1]})"))
    connection.execute(text(f"COMMENT ON TABLE {name} IS "
                            f"'{json.dumps({COMMENT_KEY: list(step.kinds)})}'"))
    return True


def drop(connection: Connection, step: Step) -> bool:
    """Drop a day past the retention; False where another echod did it first."""
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": RETENTION_LOCK})
    if step.partition not in event_partitions(connection).values():
        return False
    connection.execute(text(f"DROP TABLE {step.partition}, {chunk_partition_name(step.day)}"))
    return True


def apply(engine: Engine, policy: Policy, now: float | None = None,
          dry_run: bool = False) -> list[str]:
    """Drop and thin what is due as of ``now`` (default: the current time), each day in a
    transaction of its own, then delete the rows past the retention; say what was done."""
    now = time.time() if now is None else now
    with engine.connect() as connection:
        steps = plan(connection, policy, now)
    said = []
    # Rows go with the days of events they belong to: those whose whole day is past.
    cutoff = day_bounds((datetime.fromtimestamp(now, UTC) - timedelta(days=policy.days)).date())[0]
    if dry_run:
        return [step.describe() for step in steps]
    for step in steps:
        with engine.begin() as connection:
            done = drop(connection, step) if step.drop else \
                thin(connection, step, policy.evidence_s)
        if done:
            said.append(step.describe())
    with engine.begin() as connection:
        for table, when in AGED_ROWS.items():
            gone = connection.execute(text(f"DELETE FROM {table} WHERE {when} < :cutoff"),
                                      {"cutoff": cutoff}).rowcount
            if gone:
                said.append(f"deleted {gone} {table} rows from before {cutoff:%Y-%m-%d}")
    return said

