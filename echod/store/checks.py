"""The checks of a forwarded batch's rows, row by row, before anything is written: each field
bounded and typed where it enters the store (a time within what the store keeps, a text within
``MAX_TEXT`` that PostgreSQL can hold, integers within their column, attributes as JSON of at
most ``MAX_ATTRS_JSON``); a row that fails one is ``Rejected`` with the reason, alone. What the
good rows tell of nodes, event days and jobs gathers in a ``CheckedBatch``.

The floor of echod's writer: imports only ``echod.store.jobrecords`` (and what it imports) and
``ingero``; ``attrsjson``, ``chunks``, ``columnrows`` and ``store`` stand above it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from ingero.fields import FieldChecks, encodable
from ingero.vocabulary import INT32, LIFTED, SIGNALS, UINT63

from .jobrecords import JOB_KINDS, job_fields, merge

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


class Rejected(Exception):
    """One row fails a check; the message is the reason reported for it."""


# -- field checks ------------------------------------------------------------------------------

STORE = FieldChecks(lambda name, why: Rejected(f"{name}: {why}"))
_fail = STORE.fail


def check_text(row: dict, name: str, optional: bool = False) -> str | None:
    value = row.get(name)
    if value is None and optional:
        return None
    return check_string(name, value)


def check_string(name: str, value: Any) -> str:
    """A text PostgreSQL can hold, of at most ``MAX_TEXT`` characters: plain ASCII passes at
    a glance; anything else is checked one by one, to pass it or say which check it fails."""
    if (type(value) is str and 0 < len(value) <= MAX_TEXT and value.isascii()
            and "\x00" not in value):
        return value
    return STORE.text(name, value, MAX_TEXT, utf8=True)


def check_number(name: str, value: Any, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    return STORE.number(name, value)


def check_integer(name: str, value: Any, bounds: tuple[int, int],
                  optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    return STORE.integer(name, value, *bounds)


check_bool = STORE.boolean


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
    return all("\x00" not in text and encodable(text)
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
    if type(value) is not str or len(value) > 4096 or not encodable(value) or "\x00" in value:
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


# -- what a batch's good rows tell ------------------------------------------------------------

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
    chunks: list[tuple] = field(default_factory=list)       # events as chunks (echod.store.chunks)
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
