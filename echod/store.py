"""The writer: one forwarded batch into PostgreSQL, in one transaction, idempotently.

Every row is checked on its own; a bad row is rejected with its section, index and reason and
the rest of the batch is stored. Good rows are COPYed (binary) into temporary staging tables and
moved with ``INSERT … SELECT … ON CONFLICT DO NOTHING``, so a replayed row changes nothing and
counts as a duplicate. The day partitions the events need are made first, and the ``nodes`` seen
are upserted, all in the same transaction, committed before ``write_batch`` returns: the caller
acknowledges the batch only then.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import Connection, Engine, case, func, text
from sqlalchemy.dialects.postgresql import insert

from ingero.vocabulary import INT32, LIFTED, SIGNALS, UINT63

from . import chunks, columnrows
from .db import RETENTION_LOCK, ensure_partitions
from .jobrecords import JOB_KINDS, job_fields, merge, upsert_jobs
from .models import Node
from .summaries import SUMMARIZE

EARLIEST = datetime(2000, 1, 1, tzinfo=UTC).timestamp()
FUTURE_SLACK_S = 86_400
# Days back an event may be: echod sets it from --retention-days at start (None: to 2000). An
# event older than the store keeps would be dropped at the next retention pass, and each
# day of the past costs a partition: a node may not make thousands of them.
KEEP_DAYS: int | None = None


def earliest(now: float) -> float:
    """The earliest time an event may have, given ``now``."""
    if KEEP_DAYS is None:
        return EARLIEST
    return max(EARLIEST, now - (KEEP_DAYS + 1) * 86_400)
MAX_TEXT = 256
MAX_ATTRS_JSON = 16 * 1024
MAX_STRAGGLERS = 4096
MOVE_WORK_MEM = "64MB"          # to sort a staged batch in memory
NODES_PER_STATEMENT = 5000      # 5 parameters each, under PostgreSQL's 65535


class Rejected(Exception):
    """One row fails a check; the message is the reason reported for it."""


@dataclass(frozen=True)
class IngestResult:
    """What became of a batch: rows newly stored, rows already there, rows refused (section,
    index in that section, reason)."""

    stored: int
    duplicates: int
    rejected: list[tuple[str, int, str]] = field(default_factory=list)


# -- field checks ------------------------------------------------------------------------------

def _fail(name: str, why: str):
    raise Rejected(f"{name}: {why}")


def check_text(row: dict, name: str, optional: bool = False) -> str | None:
    value = row.get(name)
    if value is None and optional:
        return None
    return check_string(name, value)


def check_string(name: str, value: Any) -> str:
    if (type(value) is str and 0 < len(value) <= MAX_TEXT and value.isascii()
            and "\x00" not in value):
        return value
    return _check_string_slowly(name, value)


def _check_string_slowly(name: str, value: Any) -> str:
    """The checks again, one by one, to say which failed (or pass non-ASCII text)."""
    if type(value) is not str:
        _fail(name, f"expected a string, got {type(value).__name__}")
    if not value:
        _fail(name, "empty")
    if len(value) > MAX_TEXT:
        _fail(name, f"longer than {MAX_TEXT} characters ({len(value)})")
    if "\x00" in value or not _encodable(value):
        _fail(name, "not valid UTF-8 text")
    return value


def _encodable(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def check_number(name: str, value: Any, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if type(value) not in (float, int):
        _fail(name, f"expected a number, got {type(value).__name__}")
    if not math.isfinite(value):
        _fail(name, "not a finite number")
    return float(value)


def check_integer(name: str, value: Any, bounds: tuple[int, int],
                  optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if type(value) is not int:
        _fail(name, f"expected an integer, got {type(value).__name__}")
    if not bounds[0] <= value <= bounds[1]:
        _fail(name, "negative" if value < 0 <= bounds[0] else f"{value} out of range")
    return value


def check_bool(name: str, value: Any) -> bool:
    if type(value) is not bool:
        _fail(name, f"expected a boolean, got {type(value).__name__}")
    return value


def check_time(row: dict, now: float) -> datetime:
    """Unix seconds, not before 2000 nor older than the store keeps (``earliest``), and not
    more than a day ahead of ``now``."""
    t = check_number("t", row.get("t"))
    if t < EARLIEST:
        _fail("t", f"{t} is before 2000")
    if t < earliest(now):
        _fail("t", f"{t} is older than the {KEEP_DAYS} days the store keeps")
    if t > now + FUTURE_SLACK_S:
        _fail("t", f"{t} is more than a day in the future")
    return datetime.fromtimestamp(t, UTC)


SCALARS = frozenset((str, int, float, bool, type(None)))
STRING = frozenset((str,))
encode_json = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


def check_attrs(value: Any) -> dict:
    """Flat attributes: string keys and scalar values; a copy, for lifting columns out."""
    if value is None:
        return {}
    if type(value) is not dict:
        _fail("attrs", f"expected a map, got {type(value).__name__}")
    if not (STRING.issuperset(map(type, value)) and SCALARS.issuperset(map(type, value.values()))):
        for key, item in value.items():
            if type(key) is not str:
                _fail("attrs", f"key {key!r} is not a string")
            if type(item) not in SCALARS:
                _fail(f"attrs.{key}", f"expected a scalar, got {type(item).__name__}")
    return dict(value)


def attrs_json(attrs: dict) -> str:
    """The attributes as (ASCII) JSON of at most 16 KiB, for the jsonb column."""
    try:
        encoded = encode_json(attrs)
    except ValueError:
        bad = next(k for k, v in attrs.items() if type(v) is float and not math.isfinite(v))
        _fail(f"attrs.{bad}", "not a finite number")
    if len(encoded) > MAX_ATTRS_JSON:
        _fail("attrs", f"{len(encoded)} characters of JSON, more than {MAX_ATTRS_JSON}")
    if ("\\u0000" in encoded or "\\ud" in encoded) and not _attrs_storable(attrs):
        _fail("attrs", "not valid UTF-8 text")
    return encoded


def _attrs_storable(attrs: dict) -> bool:
    """No NUL and no lone surrogate (jsonb refuses both) in keys or string values."""
    return all("\x00" not in text and _encodable(text)
               for text in (*attrs, *attrs.values()) if type(text) is str)


# -- row checks: each returns the staging row ------------------------------------------------



def check_event(row: dict, now: float) -> tuple:
    """(t, id, cluster, node, job, rank, kind, op, comm_hash, seq, bytes, duration_ns, attrs)"""
    node = check_text(row, "node")
    event_id = check_text(row, "id")
    if not event_id.startswith(node + ":"):
        _fail("id", f"not namespaced by its node ({node}:<boot>:<seq>)")
    check_text(row, "boot_id", optional=True)
    attrs = check_attrs(row.get("attrs"))
    rank, op, comm_hash, seq, nbytes, duration_ns = lift_columns(attrs)
    return (check_time(row, now), event_id, check_text(row, "cluster"), node,
            check_text(row, "job", optional=True), rank, check_text(row, "kind"), op, comm_hash,
            seq, nbytes, duration_ns, attrs_json(attrs))


def lift_columns(attrs: dict) -> list:
    """Take the values that have columns of their own out of the attributes, checked."""
    values = [attrs.pop(name, None) for name, _ in LIFTED]
    for (name, bounds), value in zip(LIFTED, values):
        if value is None or (type(value) is int and bounds and bounds[0] <= value <= bounds[1]):
            continue
        if bounds is None:
            check_string(f"attrs.{name}", value)
        else:
            check_integer(f"attrs.{name}", value, bounds)
    return values


def check_score(row: dict, now: float) -> tuple:
    """(cluster, node, t, job, score, state, throughput, compute, memory, cpu, clock offset,
    clock uncertainty, boot id, seq)"""
    signals = row.get("signals") or {}
    if type(signals) is not dict:
        _fail("signals", f"expected a map, got {type(signals).__name__}")
    if unknown := set(signals) - set(SIGNALS):
        _fail("signals", f"unknown signals {sorted(map(str, unknown))}")
    return (check_text(row, "cluster"), check_text(row, "node"), check_time(row, now),
            check_text(row, "job", optional=True), check_number("score", row.get("score")),
            check_text(row, "state"),
            *(check_number(f"signals.{s}", signals.get(s), optional=True) for s in SIGNALS),
            *(check_number(k, row.get(k), optional=True)
              for k in ("clock_offset", "clock_uncertainty")),
            check_text(row, "boot_id", optional=True),
            check_integer("seq", row.get("seq"), UINT63, optional=True))


def check_threshold(row: dict, now: float) -> tuple:
    """(cluster, cohort, t, threshold, median, mad, active, quorum_met, panic, stragglers)"""
    return (check_text(row, "cluster"), check_text(row, "cohort"), check_time(row, now),
            *(check_number(k, row.get(k), optional=True) for k in ("threshold", "median", "mad")),
            check_integer("active", row.get("active"), (0, INT32[1])),
            check_bool("quorum_met", row.get("quorum_met")), check_bool("panic", row.get("panic")),
            check_stragglers(row.get("stragglers")))


def check_stragglers(value: Any) -> list[str]:
    if value is None:
        return []
    if type(value) is not list or len(value) > MAX_STRAGGLERS:
        _fail("stragglers", f"expected a list of at most {MAX_STRAGGLERS} node names")
    return [check_string(f"stragglers[{i}]", node) for i, node in enumerate(value)]


VERDICT_TEXT = ("vid", "cluster", "node", "kind", "cause", "confidence", "severity")
MAX_FINDINGS = 32


def check_verdict(row: dict, now: float) -> tuple:
    """A revision of a rank verdict (see the Sink below for the columns)."""
    vid, cluster, node, kind, cause, confidence, severity = (
        check_text(row, name) for name in VERDICT_TEXT)
    times = [None if row.get(name) is None else check_time({"t": row[name]}, now)
             for name in ("first_seen", "onset", "last_seen", "cleared")]
    if times[0] is None:
        _fail("first_seen", "missing: when the verdict was raised")
    evidence = check_evidence(row.get("evidence"), row.get("findings"))
    return (vid, check_integer("revision", row.get("revision"), (0, INT32[1])), times[0],
            cluster, check_text(row, "job", optional=True), node,
            check_integer("rank", row.get("rank"), INT32), kind, cause, confidence, severity,
            check_long_text("fix", row.get("fix")), check_text(row, "op", optional=True),
            check_text(row, "comm_hash", optional=True),
            check_integer("step", row.get("step"), UINT63, optional=True), *times[1:],
            seconds_ns("lag_p50_s", row), seconds_ns("lag_p99_s", row),
            check_number("last_share", row.get("last_share"), optional=True),
            check_integer("period", row.get("period"), INT32, optional=True),
            check_integer("occurrences", row.get("occurrences"), INT32),
            check_number("cost_gpu_s", row.get("cost_gpu_s"), optional=True),
            check_number("cost_usd", row.get("cost_usd"), optional=True), evidence)


def check_long_text(name: str, value: Any) -> str | None:
    """A sentence for people (a fix): up to 4 KiB of text."""
    if value is None:
        return None
    if type(value) is not str or len(value) > 4096 or not _encodable(value) or "\x00" in value:
        _fail(name, "expected text of at most 4096 characters")
    return value


def seconds_ns(name: str, row: dict) -> int | None:
    """Seconds as integer ns, within what the store's 64-bit columns hold (292 years)."""
    value = check_number(name, row.get(name), optional=True)
    if value is not None and not abs(value) < 2**63 / 1e9:
        _fail(name, f"{value} s out of range")
    return None if value is None else int(round(value * 1e9))


def check_evidence(evidence: Any, findings: Any) -> str:
    """The verdict's evidence map with its findings (sentences), as JSON for the jsonb column."""
    if evidence is None:
        evidence = {}
    if type(evidence) is not dict:
        _fail("evidence", f"expected a map, got {type(evidence).__name__}")
    if findings is not None and (type(findings) is not list or len(findings) > MAX_FINDINGS
                                 or any(type(f) is not str for f in findings)):
        _fail("findings", f"expected a list of at most {MAX_FINDINGS} sentences")
    try:
        encoded = encode_json({**evidence, "findings": findings or []})
    except (TypeError, ValueError):
        _fail("evidence", "not JSON with finite numbers")
    if len(encoded) > MAX_ATTRS_JSON or "\\u0000" in encoded:
        _fail("evidence", f"more than {MAX_ATTRS_JSON} characters of JSON, or a NUL")
    return encoded


def check_peer_lag(row: dict, now: float) -> tuple:
    """(t, cluster, job, comm_hash, seq_first, seq_last, rank, node, samples, lag median, p95,
    max, p99 in ns, last arrivals, idle caused and waited in ns; the last four from fleetd
    since echod 0009, else NULL; the Slurm step of the run, since 0013)"""
    return (check_time(row, now), check_text(row, "cluster"),
            check_text(row, "job", optional=True), check_text(row, "comm_hash"),
            check_integer("seq_first", row.get("seq_first"), UINT63),
            check_integer("seq_last", row.get("seq_last"), UINT63),
            check_integer("rank", row.get("rank"), INT32), check_text(row, "node", optional=True),
            check_integer("samples", row.get("samples"), (1, INT32[1])),
            *(check_integer(k, row.get(k), (-2**63, 2**63 - 1), optional=True)
              for k in ("lag_median_ns", "lag_p95_ns", "lag_max_ns", "lag_p99_ns")),
            *(check_integer(k, row.get(k), UINT63, optional=True)
              for k in ("last_arrivals", "idle_caused_ns", "waited_ns")),
            check_text(row, "step", optional=True))


# -- where each section goes -------------------------------------------------------------------

@dataclass(frozen=True)
class Sink:
    """A batch section's table: its key (rows move in key order, so that concurrent writers
    lock in the same order), its staging columns (name, COPY type) in row order, the row check,
    and the cast that turns a staged column into the stored one where they differ."""

    section: str
    table: str
    key: str
    columns: tuple[tuple[str, str], ...]
    check: Any
    casts: dict[str, str] = field(default_factory=dict)
    on_conflict: str = "DO NOTHING"
    summarize: str | None = None    # CTEs over ``moved`` (the rows stored) that summarize them

    def move(self) -> str:
        names = ", ".join(f'"{name}"' for name, _ in self.columns)
        values = ", ".join(self.casts.get(name, f'"{name}"') for name, _ in self.columns)
        move = (f"INSERT INTO {self.table} ({names}) SELECT {values} FROM stage_{self.table} "
                f"ORDER BY {self.key} ON CONFLICT {self.on_conflict}")
        if self.summarize is None:
            return move
        return f"WITH moved AS ({move} RETURNING *), {self.summarize} SELECT count(*) FROM moved"


SINKS = (
    Sink("events", "event_rows", "t, id", (
        ("t", "timestamptz"), ("id", "text"), ("cluster", "text"), ("node", "text"),
        ("job", "text"), ("rank", "int4"), ("kind", "text"), ("op", "text"),
        ("comm_hash", "text"), ("seq", "int8"), ("bytes", "int8"), ("duration_ns", "int8"),
        ("attrs", "text")), check_event, {"attrs": "attrs::jsonb"}, summarize=SUMMARIZE),
    Sink("scores", "health_scores", "cluster, node, t", (
        ("cluster", "text"), ("node", "text"), ("t", "timestamptz"), ("job", "text"),
        ("score", "float8"), ("state", "text"), ("throughput", "float8"), ("compute", "float8"),
        ("memory", "float8"), ("cpu", "float8"), ("clock_offset", "float8"),
        ("clock_uncertainty", "float8"), ("boot_id", "text"), ("seq", "int8")), check_score),
    Sink("thresholds", "thresholds", "cluster, cohort, t", (
        ("cluster", "text"), ("cohort", "text"), ("t", "timestamptz"), ("threshold", "float8"),
        ("median", "float8"), ("mad", "float8"), ("active", "int4"), ("quorum_met", "bool"),
        ("panic", "bool"), ("stragglers", "text[]")), check_threshold),
    Sink("peer_lag", "peer_lag", "cluster, job, comm_hash, rank, seq_first", (
        ("t", "timestamptz"), ("cluster", "text"), ("job", "text"), ("comm_hash", "text"),
        ("seq_first", "int8"), ("seq_last", "int8"), ("rank", "int4"), ("node", "text"),
        ("samples", "int4"), ("lag_median_ns", "int8"), ("lag_p95_ns", "int8"),
        ("lag_max_ns", "int8"), ("lag_p99_ns", "int8"), ("last_arrivals", "int8"),
        ("idle_caused_ns", "int8"), ("waited_ns", "int8"), ("step", "text")), check_peer_lag),
    # A verdict is revised while it lasts: the newest revision wins, a replay changes nothing.
    Sink("verdicts", "straggler_verdicts", "cluster, vid", VERDICT_COLUMNS := (
        ("vid", "text"), ("revision", "int4"), ("t", "timestamptz"), ("cluster", "text"),
        ("job", "text"), ("node", "text"), ("rank", "int4"), ("kind", "text"), ("cause", "text"),
        ("confidence", "text"), ("severity", "text"), ("fix", "text"), ("op", "text"),
        ("comm_hash", "text"), ("step", "int8"), ("onset", "timestamptz"),
        ("last_seen", "timestamptz"), ("cleared", "timestamptz"), ("lag_ns", "int8"),
        ("lag_p99_ns", "int8"), ("last_share", "float8"), ("period", "int4"),
        ("occurrences", "int4"), ("cost_gpu_seconds", "float8"), ("cost_usd", "float8"),
        ("evidence", "text")), check_verdict, {"evidence": "evidence::jsonb"},
        "(cluster, vid) DO UPDATE SET " + ", ".join(
            f'"{name}" = excluded."{name}"' for name, _ in VERDICT_COLUMNS
            if name not in ("cluster", "vid", "t"))
        + " WHERE straggler_verdicts.revision < excluded.revision"),
)
SECTIONS = {sink.section: sink for sink in SINKS}


# -- checking a batch --------------------------------------------------------------------------

@dataclass
class CheckedBatch:
    """The good rows of a batch by section, what was refused, and what the rows say about
    nodes ((cluster, node) → [first seen, last seen, boot id]) and event days."""

    rows: dict[str, list[tuple]] = field(default_factory=dict)
    rejected: list[tuple[str, int, str]] = field(default_factory=list)
    nodes: dict[tuple[str, str], list] = field(default_factory=dict)
    jobs: dict[tuple[str, str], dict] = field(default_factory=dict)    # from job records
    days: set[date] = field(default_factory=set)
    superseded: int = 0     # verdict revisions a newer one in the same batch replaces
    chunks: list[tuple] = field(default_factory=list)       # events as chunks (echod.chunks)
    chunk_stats: list[tuple] = field(default_factory=list)  # and their summaries
    chunked: int = 0        # events in the chunks

    def accepted(self) -> int:
        return sum(len(rows) for rows in self.rows.values()) + self.chunked

    def saw_node(self, cluster: str, node: str, t: datetime, boot_id: str | None) -> None:
        seen = self.nodes.get((cluster, node))
        if seen is None:
            self.nodes[(cluster, node)] = [t, t, boot_id]
            return
        seen[0] = min(seen[0], t)
        if t >= seen[1]:
            seen[1] = t
            seen[2] = boot_id or seen[2]


def check_batch(batch: Any, now: float) -> CheckedBatch:
    checked = CheckedBatch()
    if type(batch) is not dict:
        checked.rejected.append(("batch", -1, "expected a map of sections"))
        return checked
    for section, rows in batch.items():
        if section == "pushes":
            continue
        if section not in SECTIONS:
            checked.rejected.append((str(section), -1, "unknown section"))
        elif type(rows) is not list:
            checked.rejected.append((section, -1, "expected a list of rows"))
        else:
            checked.rows[section] = check_section(checked, SECTIONS[section], rows, now)
            if section == "verdicts":
                newest = newest_revisions(checked.rows[section])
                checked.superseded = len(checked.rows[section]) - len(newest)
                checked.rows[section] = newest
    first = len(batch.get("events") or ())
    for push in batch.get("pushes", ()):        # pushes of columns, as echod received them
        columnrows.stage(checked, push, now, first)
        first += push.columns.n
    return checked


def newest_revisions(rows: list[tuple]) -> list[tuple]:
    """One staged verdict row per (cluster, vid), its newest revision: an upsert may not touch
    a row twice in one statement, and a batch may carry several revisions of a verdict."""
    newest: dict[tuple, tuple] = {}
    for row in rows:
        key = (row[3], row[0])
        if key not in newest or row[1] > newest[key][1]:
            newest[key] = row
    return list(newest.values())


def check_section(checked: CheckedBatch, sink: Sink, rows: list, now: float) -> list[tuple]:
    good = []
    for index, row in enumerate(rows):
        try:
            if type(row) is not dict:
                _fail("row", f"expected a map, got {type(row).__name__}")
            good.append(sink.check(row, now))
        except Rejected as exc:
            checked.rejected.append((sink.section, index, str(exc)))
            continue
        note_row(checked, sink.section, row, good[-1])
    return good


def note_row(checked: CheckedBatch, section: str, row: dict, staged: tuple) -> None:
    """Record the node and day a good row tells of."""
    if section == "events":
        checked.days.add(staged[0].date())
        checked.saw_node(staged[2], staged[3], staged[0], row.get("boot_id"))
        t, _, cluster, node, job, _, kind = staged[:7]
        if kind in JOB_KINDS and job is not None:
            fields = job_fields(kind, node, t, row.get("attrs") or {})
            checked.jobs[(cluster, job)] = merge(checked.jobs.get((cluster, job), {}), fields)
    elif section == "scores":
        checked.saw_node(staged[0], staged[1], staged[2], None)


# -- writing -----------------------------------------------------------------------------------

def write_batch(engine: Engine, batch: dict, now: float | None = None) -> IngestResult:
    """Store a forwarded batch ({"events": [...], "scores": [...], "thresholds": [...]}) in one
    transaction, committed on return. ``now`` (unix seconds) bounds how far ahead times may be.
    Where the database refuses the batch for what it holds (a value its checks let through), the
    batch is stored in parts (``write_apart``), and only the rows at fault are refused."""
    checked = check_batch(batch, time.time() if now is None else now)
    if not checked.accepted():
        return IngestResult(0, 0, checked.rejected)
    accepted = checked.accepted()
    try:
        stored = write_checked(engine, checked)
    except Exception as exc:
        if not batch_fault(exc):
            raise
        stored, refused = write_apart(engine, checked)
        accepted -= refused
    return IngestResult(stored, accepted - stored + checked.superseded, checked.rejected)


# The errors that are the batch's (SQLSTATE classes 22 data exception and 23 integrity
# constraint violation: what a value can cause), not the database's: another try stores what
# the batch holds no better. Any other (a connection cut, a permission or schema taken away)
# is the database's: the batch waits for it, unacknowledged.
BATCH_FAULTS = ("22", "23")


def batch_fault(exc: BaseException) -> bool:
    """Whether the database refused a statement for the data in it: by its SQLSTATE, or a
    value psycopg could not send (a DataError raised before the server saw it)."""
    import psycopg

    orig = getattr(exc, "orig", None) or exc
    state = getattr(orig, "sqlstate", None)
    if state is not None:
        return state[:2] in BATCH_FAULTS
    return isinstance(orig, psycopg.DataError)


def first_line(exc: BaseException) -> str:
    return (str(getattr(exc, "orig", None) or exc).strip().splitlines() or ["?"])[0]


_REASON = re.compile(r"[a-z_]{1,24}(?:\.(?:" + "|".join(name for name, _ in LIFTED) + r"))?")


def reason_label(section: str, why: str) -> str:
    """A refusal's reason as a metric label, from a set the code fixes (a batch's own texts,
    an attribute's name say, never become one)."""
    if why.startswith("refused by the database"):
        return "database"
    if section == "batch":
        return "batch"
    field_name = why.split(":", 1)[0]
    return field_name if ":" in why and _REASON.fullmatch(field_name) else "other"


def write_apart(engine: Engine, checked: "CheckedBatch") -> tuple[int, int]:
    """Store a batch the database refused in halves, and each half that it refuses in halves
    again, down to a row (or a chunk of events, or a job record) refused on its own with the
    database's reason: about log2(rows) transactions for each row at fault. Returns the rows
    stored and the rows refused; those refused join ``checked.rejected``."""
    stored, refused, parts = 0, 0, [units(checked)]
    stats: dict[str, list[tuple]] = {}
    for row in checked.chunk_stats:
        stats.setdefault(row[1], []).append(row)        # by the chunk they summarise
    while parts:
        part = parts.pop()
        try:
            stored += write_checked(engine, one := subset(checked, part, stats))
            continue
        except Exception as exc:
            if not batch_fault(exc):
                raise
            why = first_line(exc)
        if len(part) > 1:
            parts += [part[len(part) // 2:], part[:len(part) // 2]]
        else:
            refused += one.accepted()
            checked.rejected.append((part[0][0], part[0][1], f"refused by the database: {why}"))
    return stored, refused


def units(checked: "CheckedBatch") -> list[tuple[str, Any]]:
    """What a batch is made of, each refused whole or not at all: (section, row index),
    ("chunks", index), ("jobs", key)."""
    return [*((section, k) for section, rows in checked.rows.items() for k in range(len(rows))),
            *(("chunks", k) for k in range(len(checked.chunks))),
            *(("jobs", key) for key in checked.jobs)]


def subset(checked: "CheckedBatch", part: list[tuple[str, Any]],
           stats: dict[str, list[tuple]]) -> "CheckedBatch":
    """The batch's ``part`` as a batch of its own (its nodes and days whole: upserted alike);
    ``stats``: the chunks' summary rows by chunk id."""
    out = CheckedBatch(nodes=checked.nodes, days=checked.days)
    for section, which in part:
        if section == "chunks":
            chunk = checked.chunks[which]
            out.chunks.append(chunk)
            out.chunk_stats += stats.get(chunk.id, [])
            out.chunked += len(chunk.numbers)
        elif section == "jobs":
            out.jobs[which] = checked.jobs[which]
        else:
            out.rows.setdefault(section, []).append(checked.rows[section][which])
    return out


def write_checked(engine: Engine, checked: "CheckedBatch") -> int:
    """One transaction: a checked batch's rows, chunks, nodes and jobs; the rows stored."""
    with engine.begin() as connection:
        connection.execute(text("SELECT pg_advisory_xact_lock_shared(:key)"),
                           {"key": RETENTION_LOCK})
        connection.execute(text(f"SET LOCAL work_mem = '{MOVE_WORK_MEM}'"))
        ensure_partitions(connection, checked.days)
        stored = sum(copy_and_move(connection, SECTIONS[section], rows)
                     for section, rows in checked.rows.items() if rows)
        if checked.chunks:
            stored += store_chunks(connection, checked)
        upsert_nodes(connection, checked.nodes)
        upsert_jobs(connection, checked.jobs)
    return stored


def copy_and_move(connection: Connection, sink: Sink, rows: list[tuple]) -> int:
    """COPY rows into a staging table, move the new ones into the table; return how many."""
    with connection.connection.driver_connection.cursor() as cursor:
        stage(cursor, f"stage_{sink.table}", sink.columns, rows)
        cursor.execute(sink.move())
        return cursor.rowcount if sink.summarize is None else cursor.fetchone()[0]


def stage(cursor, table: str, columns: tuple[tuple[str, str], ...], rows: list[tuple] = (),
          data: bytes | None = None) -> None:
    """A temporary table of ``columns`` (name, COPY type), dropped at commit, holding ``rows``
    or the binary COPY ``data`` made for it."""
    cursor.execute(f"CREATE TEMP TABLE {table} ("
                   + ", ".join(f'"{name}" {kind}' for name, kind in columns) + ") ON COMMIT DROP")
    names = ", ".join(f'"{name}"' for name, _ in columns)
    with cursor.copy(f"COPY {table} ({names}) FROM STDIN (FORMAT BINARY)") as copy:
        if data is not None:
            copy.write(data)
            return
        copy.set_types([kind for _, kind in columns])
        for row in rows:
            copy.write_row(row)


def store_chunks(connection: Connection, checked: CheckedBatch) -> int:
    """Store the batch's chunks and the summaries of those new; return their events."""
    with connection.connection.driver_connection.cursor() as cursor:
        stage(cursor, "stage_event_chunks", chunks.CHUNK_COLUMNS,
              data=chunks.copy_data(checked.chunks))
        stage(cursor, "stage_chunk_stats", chunks.STAT_COLUMNS, checked.chunk_stats)
        cursor.execute(chunks.MOVE)
        return int(cursor.fetchone()[0])


def upsert_nodes(connection: Connection, nodes: dict[tuple[str, str], list]) -> None:
    """Widen each node's first/last seen to include this batch; keep the newest boot id."""
    values = [{"cluster": cluster, "name": name, "first_seen": first, "last_seen": last,
               "boot_id": boot_id}
              for (cluster, name), (first, last, boot_id) in sorted(nodes.items())]
    for start in range(0, len(values), NODES_PER_STATEMENT):
        statement = insert(Node).values(values[start:start + NODES_PER_STATEMENT])
        new = statement.excluded
        connection.execute(statement.on_conflict_do_update(
            index_elements=[Node.cluster, Node.name],
            set_={"first_seen": func.least(Node.first_seen, new.first_seen),
                  "last_seen": func.greatest(Node.last_seen, new.last_seen),
                  "boot_id": case((new.last_seen >= Node.last_seen,
                                   func.coalesce(new.boot_id, Node.boot_id)),
                                  else_=Node.boot_id)}))
