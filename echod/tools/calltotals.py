"""Counts, sums and duration quantiles of calls, read from the per-minute summaries
(``call_stats``) for the whole minutes of a window and from the raw events for the part minutes
at its ends: the same calls the raw events hold, read from a few rows a rank and minute."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime

from sqlalchemy import Connection

from ..store.summaries import (BUCKET_SQL, CALLS_SQL, DETAIL_SQL, FAILED_SQL, PEER_WAIT_SQL,
                               SMALL_BYTES, Histogram, minutes)
from .selection import Selection, Window, rows, whole

GROUPS = ("cluster", "job", "node", "rank", "kind", "op", "comm_hash", "peer_wait", "failed",
          "detail")
# What a raw event's group is where the summaries keep a column of their own.
DERIVED = {"peer_wait": PEER_WAIT_SQL, "failed": FAILED_SQL, "detail": DETAIL_SQL}

SUMMED = """
SELECT {by}, sum(s.calls), sum(s.timed), sum(s.duration_ns), sum(s.bytes), max(s.last_t),
       sum(s.timed_bytes), max(s.max_bytes), sum(s.small_calls), min(s.first_t)
FROM call_stats s WHERE {kinds} AND {where}
GROUP BY {by}
"""
BUCKETED = """
SELECT {by}, u.bucket, sum(u.n), sum(u.total)
FROM call_stats s CROSS JOIN LATERAL unnest(s.buckets, s.counts, s.sums) AS u(bucket, n, total)
WHERE {kinds} AND {where}
GROUP BY {by}, u.bucket
"""
CALLS = CALLS_SQL.format(a="e")
RAW = f"""
SELECT {{by}}, {{bucket}}, sum({CALLS}), count(e.duration_ns), sum(e.duration_ns), sum(e.bytes),
       max(e.t), sum(e.bytes) FILTER (WHERE e.duration_ns > 0), max(e.bytes),
       coalesce(sum({CALLS}) FILTER (WHERE e.bytes < {SMALL_BYTES} * {CALLS}), 0), min(e.t)
FROM events e WHERE {{kinds}} AND {{where}}
GROUP BY {{by}}, {{bucket}}
"""


@dataclass
class Totals:
    """Calls of one group: all, those with a duration, their sums (bytes: of all, and of those
    with a duration), the largest, how many under 1 MiB, the first and last, the durations."""

    calls: int = 0
    timed: int = 0
    duration_ns: int = 0
    bytes: int = 0
    last: datetime | None = None
    timed_bytes: int = 0
    max_bytes: int | None = None
    small: int = 0
    first: datetime | None = None
    durations: Histogram = field(default_factory=Histogram)

    def took(self, calls: int, timed: int, duration_ns, nbytes, last: datetime | None,
             timed_bytes, max_bytes, small, first: datetime | None) -> None:
        self.calls += int(calls)
        self.timed += int(timed)
        self.duration_ns += whole(duration_ns)
        self.bytes += whole(nbytes)
        self.timed_bytes += whole(timed_bytes)
        self.small += whole(small)
        if max_bytes is not None:
            self.max_bytes = max(whole(max_bytes), self.max_bytes or 0)
        if last is not None and (self.last is None or last > self.last):
            self.last = last
        if first is not None and (self.first is None or first < self.first):
            self.first = first


def call_totals(conn: Connection, sel: Selection, kinds: tuple[str, ...] | None,
                by: tuple[str, ...],
                *, node: bool = True, rank: bool = True,
                only: dict[str, str | None] | None = None,
                durations: bool = True) -> dict[tuple, Totals]:
    """Per group (the values of ``by``, names of GROUPS), the calls of ``kinds`` (None: events
    of every kind) the selection holds (``node`` and ``rank``: whether its node and rank
    narrow it; ``only``: groups that must have these values, None for any; ``durations``:
    whether to read the histograms too, for quantiles)."""
    assert set(by) <= set(GROUPS) and set(only or ()) <= set(GROUPS), (by, only)
    only = {name: value for name, value in (only or {}).items() if value is not None}
    head, whole_minutes, tail = minutes(sel.window.since, sel.window.until)
    out: dict[tuple, Totals] = defaultdict(Totals)
    params = {} if kinds is None else {"kinds": list(kinds)}
    of_kinds = "TRUE" if kinds is None else "{a}.kind = ANY (CAST(:kinds AS text[]))"
    if whole_minutes is not None:
        where = replace(sel, window=Window(*whole_minutes)).where("s", node=node, rank=rank)
        for name, value in only.items():
            where.equal(f"s.{name}", f"only_{name}", value)
        columns = ", ".join(f"s.{name}" for name in by)
        for row in rows(conn, SUMMED.format(by=columns, where=where.sql(),
                                            kinds=of_kinds.format(a="s")),
                        {**where.params, **params}):
            out[tuple(row[:len(by)])].took(*row[len(by):])
        bucketed = rows(conn, BUCKETED.format(by=columns, where=where.sql(),
                                              kinds=of_kinds.format(a="s")),
                        {**where.params, **params}) if durations else []
        for row in bucketed:
            out[tuple(row[:len(by)])].durations.add([row[-3]], [row[-2]], [row[-1]])
    raw = {name: DERIVED[name].format(a="e") if name in DERIVED else f"e.{name}"
           for name in GROUPS}
    columns = ", ".join(raw[name] for name in by)
    for part in (head, tail):
        if part is None:
            continue
        where = replace(sel, window=Window(*part)).where("e", node=node, rank=rank)
        for name, value in only.items():
            where.equal(raw[name], f"only_{name}", value)
        for row in rows(conn, RAW.format(by=columns, where=where.sql(),
                                         kinds=of_kinds.format(a="e"),
                                         bucket=BUCKET_SQL.format(d="e.duration_ns")),
                        {**where.params, **params}):
            key, (b, calls, timed, ns, *sums) = tuple(row[:len(by)]), row[len(by):]
            out[key].took(calls, timed, ns, *sums)
            if b is not None:
                out[key].durations.add([b], [timed], [ns])
    return dict(out)
