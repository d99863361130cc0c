"""The writer: one forwarded batch into PostgreSQL, in one transaction, idempotently.

Every row is checked on its own; a bad row is rejected with its section, index and reason and
the rest of the batch is stored. Good rows are COPYed (binary) into temporary staging tables and
moved with ``INSERT … SELECT … ON CONFLICT DO NOTHING``, so a replayed row changes nothing and
counts as a duplicate. The day partitions the events need are made first, and the ``nodes`` seen
are upserted, all in the same transaction, committed before ``write_batch`` returns: the caller
acknowledges the batch only then.

The top of echod's writer: a batch's rows are checked by ``checks``, its pushes of columns
staged by ``columnrows`` (their frequent calls kept as ``chunks``), and written here; none of
those imports this module.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, case, func, text
from sqlalchemy.dialects.postgresql import insert

from ingero.vocabulary import LIFTED

from . import chunks, columnrows
from .checks import (CheckedBatch, Rejected, check_event, check_peer_lag, check_score,
                     check_threshold, check_verdict, note_row)
from .db import RETENTION_LOCK, ensure_partitions
from .jobrecords import upsert_jobs
from .models import Node
from .summaries import SUMMARIZE

MOVE_WORK_MEM = "64MB"          # to sort a staged batch in memory
NODES_PER_STATEMENT = 5000      # 5 parameters each, under PostgreSQL's 65535


@dataclass(frozen=True)
class IngestResult:
    """What became of a batch: rows newly stored, rows already there, rows refused (section,
    index in that section, reason)."""

    stored: int
    duplicates: int
    rejected: list[tuple[str, int, str]] = field(default_factory=list)


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
                raise Rejected(f"row: expected a map, got {type(row).__name__}")
            good.append(sink.check(row, now))
        except Rejected as exc:
            checked.rejected.append((sink.section, index, str(exc)))
            continue
        note_row(checked, sink.section, row, good[-1])
    return good


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


def write_apart(engine: Engine, checked: CheckedBatch) -> tuple[int, int]:
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


def units(checked: CheckedBatch) -> list[tuple[str, Any]]:
    """What a batch is made of, each refused whole or not at all: (section, row index),
    ("chunks", index), ("jobs", key)."""
    return [*((section, k) for section, rows in checked.rows.items() for k in range(len(rows))),
            *(("chunks", k) for k in range(len(checked.chunks))),
            *(("jobs", key) for key in checked.jobs)]


def subset(checked: CheckedBatch, part: list[tuple[str, Any]],
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


def write_checked(engine: Engine, checked: CheckedBatch) -> int:
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
