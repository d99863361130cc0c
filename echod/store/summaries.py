"""Per-rank, per-minute summaries of the events (table ``call_stats``), written with them and
read by the tools instead of the raw events: the traced calls with their durations and bytes,
and the other kinds (host samples, edges, exits) counted the same way.

A minute of one rank's calls of one kind, op and communicator (syncs apart by whether they
waited on peers, failed calls apart from the others, copies by direction: ``detail``) is a
row: how many calls (an event that stands for several, the asynchronous copies an agent
counted in the kernel, counts as that many, and as small where their mean is), how many had a
duration, the durations' and bytes' sums (and the bytes of the calls with a duration), the
largest call's bytes, how many moved under 1 MiB, the first and last call's times, and the
durations as a histogram: bucket ``b`` holds durations ``d`` (ns) with
``floor(log2(d) * BUCKETS_PER_OCTAVE) == b`` (bucket -1 the zeros), with their count and
their sum. A quantile read from it takes the mean of the bucket it falls in: exact
where the bucket's durations are equal, and never further from the exact one than a bucket is
wide (2^(1/32), 2.2%); between two buckets it is interpolated as ``percentile_cont``
interpolates between values. Counts and sums are exact.

A tool's window [since, until) is answered from the rows of the whole minutes inside it, and
from the raw events of the two part minutes at its ends: the same calls as the raw events'.
"""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import datetime, timedelta

BUCKETS_PER_OCTAVE = 32
ZERO = -1                               # the bucket of durations of 0 ns
MINUTE = timedelta(minutes=1)
KEY = "cluster, job, node, rank, t, kind, op, comm_hash, peer_wait, failed, detail"
SMALL_BYTES = 2**20                     # a small allocation or copy
# A call's bucket in SQL (NULL: no duration): the same as ``bucket`` below.
BUCKET_SQL = (f"CASE WHEN {{d}} > 0 THEN floor(ln({{d}}::float8) * "
              f"{BUCKETS_PER_OCTAVE / math.log(2)!r})::int2 WHEN {{d}} = 0 THEN {ZERO} END")
PEER_WAIT_SQL = "coalesce({a}.kind = 'sync' AND {a}.attrs -> 'peer_wait' = 'true'::jsonb, false)"
# A call that returned an error (a number other than 0), as the failed-calls index has it.
FAILED_SQL = ("coalesce(jsonb_typeof({a}.attrs -> 'result') = 'number' "
              "AND {a}.attrs -> 'result' <> '0'::jsonb, false)")
DETAIL_SQL = "CASE WHEN {a}.kind = 'memcpy' THEN {a}.attrs ->> 'direction' END"
# How many calls an event stands for: 1, or the ``calls`` an agent counted in the kernel for
# one event (asynchronous copies, a sample's worth), held to [1, 2^32] (the wire checks only
# that it is an integer).
CALLS_SQL = ("CASE WHEN jsonb_typeof({a}.attrs -> 'calls') = 'number' THEN "
             "least(greatest(({a}.attrs ->> 'calls')::numeric, 1), 4294967296)::int8 "
             "ELSE 1 END")



def _each(column: str) -> str:
    """A per-bucket column of ``per_bucket`` as an array, in bucket order."""
    return (f"coalesce(array_agg({column} ORDER BY bucket) FILTER (WHERE bucket IS NOT NULL), "
            "'{}')")


# The tail of the statement that moves a batch's events in (``moved``: the rows stored, so a
# batch sent again adds nothing): its summary rows, one per minute and group.
SUMMARIZE = f"""
per_bucket AS (
    SELECT m.cluster, m.job, m.node, m.rank, date_trunc('minute', m.t) AS t, m.kind, m.op,
           m.comm_hash, {PEER_WAIT_SQL.format(a="m")} AS peer_wait,
           {FAILED_SQL.format(a="m")} AS failed, {DETAIL_SQL.format(a="m")} AS detail,
           {BUCKET_SQL.format(d="m.duration_ns")} AS bucket,
           sum({CALLS_SQL.format(a="m")}) AS calls,
           count(m.duration_ns) AS timed, sum(m.duration_ns) AS duration_ns,
           sum(m.bytes) AS bytes, sum(m.bytes) FILTER (WHERE m.duration_ns > 0) AS timed_bytes,
           max(m.bytes) AS max_bytes,
           coalesce(sum({CALLS_SQL.format(a="m")})
               FILTER (WHERE m.bytes < {SMALL_BYTES} * {CALLS_SQL.format(a="m")}), 0) AS small,
           min(m.t) AS first_t, max(m.t) AS last_t
    FROM moved m
    GROUP BY 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12),
summarized AS (
    INSERT INTO call_stats ({KEY}, calls, timed, duration_ns, bytes, timed_bytes, max_bytes,
                            small_calls, first_t, last_t, buckets, counts, sums)
    SELECT {KEY}, sum(calls), sum(timed), sum(duration_ns), sum(bytes), sum(timed_bytes),
           max(max_bytes), sum(small), min(first_t), max(last_t),
           {_each("bucket")}, {_each("timed")}, {_each("duration_ns")}
    FROM per_bucket GROUP BY {KEY})
"""


def bucket(ns: float) -> int:
    """The histogram bucket of a duration in ns (as ``BUCKET_SQL`` computes it)."""
    return ZERO if ns == 0 else math.floor(math.log(ns) * (BUCKETS_PER_OCTAVE / math.log(2)))


class Histogram:
    """Durations by bucket (count and sum), merged from summary rows and raw events."""

    __slots__ = ("counts", "sums")

    def __init__(self):
        self.counts: dict[int, int] = defaultdict(int)
        self.sums: dict[int, int] = defaultdict(int)

    def add(self, buckets, counts, sums) -> None:
        for b, n, total in zip(buckets, counts, sums):
            self.counts[int(b)] += int(n)
            self.sums[int(b)] += int(total)

    def total(self) -> int:
        return sum(self.counts.values())

    def quantile(self, q: float) -> float | None:
        """``percentile_cont(q)`` over the durations, read from the buckets."""
        n = self.total()
        if not n:
            return None
        position = q * (n - 1)
        low, frac = int(position), position - int(position)
        below = self._at(low)
        return below if not frac else below + frac * (self._at(low + 1) - below)

    def _at(self, index: int) -> float:
        """The ``index``-th duration (0-based, in order), as its bucket's mean."""
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if index < seen:
                return self.sums[b] / self.counts[b]
        last = max(self.counts)
        return self.sums[last] / self.counts[last]


def minutes(since: datetime | None, until: datetime | None) -> tuple:
    """Split a window in three: the part minute at its start (raw events), the whole minutes
    (summaries), the part minute at its end (raw events). Each is (since, until), None bound
    for open; a part is None where there is none."""
    first = None if since is None else _ceil(since)
    last = None if until is None else _floor(until)
    if first is not None and last is not None and first >= last:
        return (since, until), None, None             # within one minute: all raw
    head = (since, first) if since is not None and since < first else None
    tail = (last, until) if until is not None and last < until else None
    return head, (first, last), tail


def _floor(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


def _ceil(t: datetime) -> datetime:
    floor = _floor(t)
    return floor if floor == t else floor + MINUTE
