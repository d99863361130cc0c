"""The frequent calls of a push of columns as chunks, and their summaries, made over arrays.

A row an event costs PostgreSQL a heap tuple, five index entries and their WAL: most of what
ingest spent (docs/benchmarks.md). The calls that make most of a job's events (``CHUNKED``:
syncs, allocations, frees, copies) are kept instead as ``event_chunks`` rows (migration 0010),
one per job, rank, kind and minute of a push, holding the events as arrays; the view ``events``
shows them one row an event, as they were. A failed call stays a row of its own (the
failed-calls index finds each), and so does an event whose attributes the summaries would read
differently as JSON than here (a ``peer_wait`` that is no boolean, a ``direction`` that is no
text), and an agent's count of several calls: few or none.

Their per-minute summaries (``call_stats``) are made here with numpy, as ``summaries.SUMMARIZE``
makes them in SQL from rows (the same groups, buckets by the same logarithm, the same NULLs),
and stored in the statement that stores the chunks, for the chunks it stored only: a push sent
again adds neither.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from ingero.analysis.segments import group_rows
from ingero.columns import EventColumns

from . import attrsjson, checks
from .summaries import BUCKETS_PER_OCTAVE, SMALL_BYTES, ZERO

CHUNKED = ("sync", "alloc", "free", "memcpy")
PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)         # a timestamptz counts µs from it
NO_RANK = -2**40                                    # outside any rank's range
UNIX_AT_PG_EPOCH = 946_684_800
MINUTE_US = 60_000_000
CHUNK_SPAN = timedelta(minutes=1)                   # a chunk's events lie in one minute

CHUNK_COLUMNS = (
    ("t", "timestamptz"), ("id", "text"), ("t_last", "timestamptz"), ("cluster", "text"),
    ("node", "text"), ("job", "text"), ("rank", "int4"), ("kind", "text"),
    ("id_prefix", "text"), ("numbers", "int8[]"), ("ts", "int8[]"), ("op", "text[]"),
    ("comm_hash", "text[]"), ("seq", "int8[]"), ("bytes", "int8[]"),
    ("duration_ns", "int8[]"), ("common", "jsonb"), ("attrs", "text[]"))
STAT_COLUMNS = (
    ("chunk_t", "timestamptz"), ("chunk_id", "text"), ("cluster", "text"), ("job", "text"),
    ("node", "text"), ("rank", "int4"), ("t", "timestamptz"), ("kind", "text"), ("op", "text"),
    ("comm_hash", "text"), ("peer_wait", "bool"), ("failed", "bool"), ("detail", "text"),
    ("calls", "int8"), ("timed", "int8"), ("duration_ns", "int8"), ("bytes", "int8"),
    ("timed_bytes", "int8"), ("max_bytes", "int8"), ("small_calls", "int8"),
    ("first_t", "timestamptz"), ("last_t", "timestamptz"), ("buckets", "int2[]"),
    ("counts", "int4[]"), ("sums", "int8[]"))
STAT_NAMES = ", ".join(name for name, _ in STAT_COLUMNS[2:])
CHUNK_NAMES = ", ".join(name for name, _ in CHUNK_COLUMNS)
# Chunks in key order (concurrent writers lock alike); the summaries of those stored only.
MOVE = f"""
WITH moved AS (
    INSERT INTO event_chunks ({CHUNK_NAMES})
    SELECT {CHUNK_NAMES} FROM stage_event_chunks ORDER BY t, id
    ON CONFLICT DO NOTHING RETURNING t, id, cardinality(ts) AS n),
summarized AS (
    INSERT INTO call_stats ({STAT_NAMES})
    SELECT {", ".join("s." + name for name, _ in STAT_COLUMNS[2:])}
    FROM stage_chunk_stats s JOIN moved m ON m.t = s.chunk_t AND m.id = s.chunk_id)
SELECT coalesce(sum(n), 0) FROM moved
"""


@dataclass(frozen=True)
class Chunk:
    """One chunk as ``build`` makes it: its columns as arrays (texts as codes into strings,
    -1 for none; integers with where they are present), times in µs since 2000."""

    t: int
    id: str
    t_last: int
    cluster: str
    node: str
    job: str | None
    rank: int | None
    kind: str
    id_prefix: str
    numbers: np.ndarray
    ts: np.ndarray
    op: tuple[np.ndarray, list[str]]
    comm_hash: tuple[np.ndarray, list[str]]
    seq: tuple[np.ndarray, np.ndarray]
    bytes: tuple[np.ndarray, np.ndarray]
    duration_ns: tuple[np.ndarray, np.ndarray]
    common: str | None          # JSON: the attributes every event has alike
    attrs: list[str] | None     # JSON: each event's others (None: there are none)

    def row(self) -> tuple:
        """As the staging row it stands for (CHUNK_COLUMNS; NULL arrays as None)."""
        def texts(coded):
            codes, strings = coded
            listed = [strings[k] if k >= 0 else None for k in codes.tolist()]
            return None if all(v is None for v in listed) else listed

        def ints(pair):
            values, present = pair
            return None if not present.any() else [
                v if p else None for v, p in zip(values.tolist(), present.tolist())]
        return (stamp(self.t), self.id, stamp(self.t_last), self.cluster, self.node, self.job,
                self.rank, self.kind, self.id_prefix, self.numbers.tolist(), self.ts.tolist(),
                texts(self.op), texts(self.comm_hash), ints(self.seq), ints(self.bytes),
                ints(self.duration_ns), self.common, self.attrs)

    def encoded(self) -> bytes:
        """The chunk as a tuple of binary COPY (CHUNK_COLUMNS), its arrays made from numpy."""
        return b"".join((
            FIELDS, _timestamp(self.t), _text(self.id), _timestamp(self.t_last),
            _text(self.cluster), _text(self.node), _text(self.job),
            NULL if self.rank is None else struct.pack(">ii", 4, self.rank), _text(self.kind),
            _text(self.id_prefix), _int8s(self.numbers), _int8s(self.ts),
            _texts(*self.op), _texts(*self.comm_hash), _int8s(*self.seq), _int8s(*self.bytes),
            _int8s(*self.duration_ns), _jsonb(self.common),
            NULL if self.attrs is None else _ascii_texts(self.attrs)))


# -- binary COPY -------------------------------------------------------------------------------

SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)     # no flags, no header extension
TRAILER = b"\xff\xff"
FIELDS = struct.pack(">h", 18)                      # len(CHUNK_COLUMNS)
NULL = struct.pack(">i", -1)
INT8_OID, TEXT_OID = 20, 25
INT8_ELEMENT = np.dtype([("size", ">i4"), ("value", ">i8")])


def copy_data(chunks: list[Chunk]) -> bytes:
    """The chunks as binary COPY data, signature to trailer."""
    return b"".join((SIGNATURE, *(chunk.encoded() for chunk in chunks), TRAILER))


def _sized(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def _timestamp(us: int) -> bytes:
    return struct.pack(">iq", 8, us)


def _text(value: str | None) -> bytes:
    return NULL if value is None else _sized(value.encode())


def _jsonb(value: str | None) -> bytes:
    """JSON text as jsonb's binary form: its version (1), then the text."""
    return NULL if value is None else _sized(b"\x01" + value.encode())


def _array_header(oid: int, n: int, nulls: bool) -> bytes:
    return struct.pack(">5i", 1, int(nulls), oid, n, 1)


def _int8s(values: np.ndarray, present: np.ndarray | None = None) -> bytes:
    """An int8[] (NULL where ``present`` has none; NULL elements where it is False)."""
    if present is not None and not present.all():
        if not present.any():
            return NULL
        return _sized(_array_header(INT8_OID, len(values), True) + b"".join(
            struct.pack(">iq", 8, v) if p else NULL
            for v, p in zip(values.tolist(), present.tolist())))
    body = np.empty(len(values), INT8_ELEMENT)
    body["size"] = 8
    body["value"] = values
    return _sized(_array_header(INT8_OID, len(values), False) + body.tobytes())


def _texts(codes: np.ndarray, strings: list[str]) -> bytes:
    """A text[] of codes into ``strings`` (-1: a NULL element; NULL where all are)."""
    absent = codes < 0
    if absent.all():
        return NULL
    table = np.array([_sized(text.encode()) for text in strings] + [NULL], dtype=object)
    return _sized(_array_header(TEXT_OID, len(codes), bool(absent.any()))
                  + b"".join(table[codes].tolist()))


def _ascii_texts(texts: list[str]) -> bytes:
    """A text[] of ASCII texts, each one's size put before it by numpy, not one by one."""
    joined = "".join(texts)
    if not joined.isascii():
        return _sized(_array_header(TEXT_OID, len(texts), False)
                      + b"".join(_sized(text.encode()) for text in texts))
    data = np.frombuffer(joined.encode("ascii"), np.uint8)
    sizes = np.fromiter(map(len, texts), np.int64, len(texts))
    n = len(texts)
    out = np.empty(len(data) + 4 * n, np.uint8)
    out[np.arange(len(data)) + 4 * (np.repeat(np.arange(n), sizes) + 1)] = data
    prefixes = np.cumsum(sizes) - sizes + 4 * np.arange(n)
    out[prefixes[:, None] + np.arange(4)] = sizes.astype(">i4").view(np.uint8).reshape(n, 4)
    return _sized(_array_header(TEXT_OID, n, False) + out.tobytes())


def chunkable(cols: EventColumns) -> np.ndarray:
    """Which events may go into chunks: of the ``CHUNKED`` kinds, not failed (a number other
    than 0 as ``result``), with a boolean ``peer_wait`` and a text ``direction`` if any, and
    each one call (an agent's count of asynchronous copies, ``calls``, is a row: the
    summaries count it as that many, one a sample a process)."""
    ok = np.isin(cols.kind, [k for k, name in enumerate(cols.kinds) if name in CHUNKED])
    result = cols.attrs.get("result")
    if result is not None and result.strings is None and result.code != "b1":
        ok &= ~(result.mask(cols.n) & (result.values != 0))
    peer_wait = cols.attrs.get("peer_wait")
    if peer_wait is not None and peer_wait.code != "b1":
        ok &= ~peer_wait.mask(cols.n)
    direction = cols.attrs.get("direction")
    if direction is not None and direction.strings is None:
        ok &= ~direction.mask(cols.n)
    calls = cols.attrs.get("calls")
    if calls is not None:
        ok &= ~calls.mask(cols.n)
    return ok


def pg_micros(t: np.ndarray) -> np.ndarray:
    """Unix seconds as PostgreSQL's µs since 2000, rounded as ``datetime.fromtimestamp``
    rounds them (half to even, of the fraction): a chunk's events keep the times the same
    events as rows get."""
    fraction, whole = np.modf(t)
    return (whole.astype(np.int64) - UNIX_AT_PG_EPOCH) * 1_000_000 \
        + np.round(fraction * 1e6).astype(np.int64)


def stamp(us: int) -> datetime:
    return PG_EPOCH + timedelta(microseconds=us)


def build(push, cols: EventColumns, at: np.ndarray) -> tuple[list[Chunk], list[tuple]]:
    """The chunks of the events at ``at`` (checked by ``columnrows.stage``) and their summary
    rows."""
    if not len(at):
        return [], []
    us = pg_micros(cols.t[at])
    job_codes, jobs = _job_codes(cols, push.job, at)
    rank = cols.ints("rank", NO_RANK)[at]
    ranks, rank_codes = np.unique(rank, return_inverse=True)
    minute = us // MINUTE_US
    chunk_keys, chunk_of = group_rows(job_codes, rank_codes.ravel(), cols.kind[at], minute)
    order = np.lexsort((np.arange(len(at)), us, chunk_of))       # by chunk, then time
    starts = np.flatnonzero(np.r_[True, np.diff(chunk_of[order]) != 0])
    ends = np.r_[starts[1:], len(order)]
    numbers = cols.id_first + (at if cols.id_offsets is None
                               else cols.id_offsets[at].astype(np.int64))
    texts = {name: cols.coded(name) for name in ("op", "comm_hash")}
    ints = {name: _numbers(cols, name, at) for name in ("seq", "bytes", "duration_ns")}
    common, each = _attrs(cols, at[order], starts)
    chunks, firsts = [], []
    ranks = [None if r == NO_RANK else r for r in ranks.tolist()]
    for c, ((j, r, kind, _minute), lo, hi) in enumerate(zip(chunk_keys.tolist(),
                                                            starts.tolist(), ends.tolist())):
        rows = order[lo:hi]
        first = f"{cols.id_prefix}{numbers[rows[0]]}"
        firsts.append((stamp(int(us[rows[0]])), first))
        chunks.append(Chunk(
            int(us[rows[0]]), first, int(us[rows[-1]]), push.cluster, push.node, jobs[j],
            ranks[r], cols.kinds[kind], cols.id_prefix, numbers[rows], us[rows],
            *((codes[at][rows], strings) for codes, strings in texts.values()),
            *((values[rows], present[rows]) for values, present in ints.values()),
            common[c], each[c]))
    stats = summarize(push, cols, at, us, chunk_of, chunk_keys, jobs, ranks, firsts)
    return chunks, stats


def _attrs(cols: EventColumns, events: np.ndarray, starts: np.ndarray
           ) -> tuple[list[str | None], list[list[str] | None]]:
    """Each chunk's attributes as JSON (``events``: the chunks' events in order, ``starts``:
    where each chunk's begin): those its events all have alike, once, and each event's others
    (None for either where there are none). Column by column over all the chunks at once."""
    alike: list[list[str]] = [[] for _ in starts]
    sizes = np.diff(np.r_[starts, len(events)])
    without = {}
    for name, column in attrsjson.attributes(cols).items():
        present = column.mask(cols.n)[events]
        if not present.any():
            continue
        values = column.values[events]
        same = np.minimum.reduceat(present, starts) & (
            np.maximum.reduceat(values, starts) == np.minimum.reduceat(values, starts))
        if not same.any():
            continue
        key = checks.encode_json(name)
        for c, rendered in zip(np.flatnonzero(same).tolist(),
                               attrsjson.rendered(column, events[starts[same]]).tolist()):
            alike[c].append(f"{key}:{rendered}")
        without[name] = np.repeat(same, sizes)
    texts = attrsjson.texts(cols, events, without)
    bare = np.minimum.reduceat(texts == "{}", starts)
    return ([("{" + ",".join(parts) + "}") if parts else None for parts in alike],
            [None if none else texts[lo:lo + n].tolist()
             for none, lo, n in zip(bare.tolist(), starts.tolist(), sizes.tolist())])


def _job_codes(cols: EventColumns, default: str | None, at: np.ndarray
               ) -> tuple[np.ndarray, list]:
    """The events' jobs (their process's, else the push's: as ``columnrows._job``) as codes
    into the jobs returned."""
    codes, texts = cols.codes("job")
    names = [text or default for text in texts] + [default]
    return np.where(codes[at] < 0, len(texts), codes[at]), names


def _numbers(cols: EventColumns, name: str, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """An integer attribute at ``at`` as int64 and where it is present (the lifted columns'
    checks passed: integers in range)."""
    column = cols.attrs.get(name)
    if column is None:
        return np.zeros(len(at), np.int64), np.zeros(len(at), bool)
    return column.values[at].astype(np.int64), column.mask(cols.n)[at]


def buckets(durations: np.ndarray) -> np.ndarray:
    """Each duration's histogram bucket, as ``summaries.BUCKET_SQL`` computes it (the same
    logarithm, libm's, once per distinct duration)."""
    distinct, index = np.unique(durations, return_inverse=True)
    scale = BUCKETS_PER_OCTAVE / math.log(2)
    of = np.array([math.floor(math.log(d) * scale) if d > 0 else ZERO
                   for d in distinct.tolist()], np.int64)
    return of[index.ravel()]


def summarize(push, cols: EventColumns, at: np.ndarray, us: np.ndarray, chunk_of: np.ndarray,
              chunk_keys: np.ndarray, jobs: list, ranks: list, firsts: list) -> list[tuple]:
    """Summary rows: per chunk, op, communicator, peer wait and copy direction (the chunk
    fixes job, node, rank, kind and minute; its calls never failed)."""
    op, ops = cols.coded("op")
    comm, comms = cols.coded("comm_hash")
    peer_wait = (cols.flags("peer_wait") & cols.of_kind("sync"))[at]
    direction, directions = cols.coded("direction")
    direction = np.where(cols.of_kind("memcpy"), direction, -1)[at]
    groups, group = group_rows(chunk_of, op[at], comm[at], peer_wait.astype(np.int64), direction)
    order = np.argsort(group, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(group[order]) != 0])
    duration, timed = _numbers(cols, "duration_ns", at)
    nbytes, has_bytes = _numbers(cols, "bytes", at)

    def total(values: np.ndarray, where: np.ndarray) -> list:
        """Per group, the sum of ``values`` where ``where``; None where there is none."""
        sums = np.add.reduceat(np.where(where, values, 0)[order], starts)
        counts = np.add.reduceat(where[order].astype(np.int64), starts)
        return [int(s) if n else None for s, n in zip(sums.tolist(), counts.tolist())]

    calls = np.diff(np.r_[starts, len(order)])
    timed_n = np.add.reduceat(timed[order].astype(np.int64), starts)
    biggest = np.maximum.reduceat(np.where(has_bytes, nbytes, -1)[order], starts)
    small = np.add.reduceat((has_bytes & (nbytes < SMALL_BYTES))[order].astype(np.int64),
                            starts)
    first = np.minimum.reduceat(us[order], starts)
    last = np.maximum.reduceat(us[order], starts)
    histograms = _histograms(group[timed], buckets(duration[timed]), duration[timed],
                             len(groups))
    durations, all_bytes, timed_bytes = (
        total(duration, timed), total(nbytes, has_bytes),
        total(nbytes, has_bytes & timed & (duration > 0)))
    rows = []
    for g, (chunk, o, c, wait, d) in enumerate(groups.tolist()):
        j, r, k, minute = chunk_keys[chunk].tolist()
        rows.append((*firsts[chunk], push.cluster, jobs[j], push.node, ranks[r],
                     stamp(minute * MINUTE_US), cols.kinds[k], ops[o] if o >= 0 else None,
                     comms[c] if c >= 0 else None, bool(wait), False,
                     directions[d] if d >= 0 else None, int(calls[g]), int(timed_n[g]),
                     durations[g], all_bytes[g], timed_bytes[g],
                     None if biggest[g] < 0 else int(biggest[g]), int(small[g]),
                     stamp(int(first[g])), stamp(int(last[g])), *histograms[g]))
    return rows


def _histograms(group: np.ndarray, bucket: np.ndarray, duration: np.ndarray,
                n: int) -> list[tuple]:
    """Per group: its buckets in order, each one's count and sum."""
    out = [([], [], []) for _ in range(n)]
    if not len(group):
        return out
    pairs, index = group_rows(group, bucket)
    counts = np.bincount(index, minlength=len(pairs))
    order = np.argsort(index, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(index[order]) != 0])
    sums = np.add.reduceat(duration[order], starts)
    for (g, b), count, total in zip(pairs.tolist(), counts.tolist(), sums.tolist()):
        out[g][0].append(b)
        out[g][1].append(count)
        out[g][2].append(total)
    return out
