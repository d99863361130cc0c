"""Per-rank, per-minute summaries (call_stats): written with the events they summarize, once
(a batch sent again adds nothing), and what they say is what the raw events say: the same
counts and sums, quantiles within a histogram bucket (exact where its durations are equal)."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime

import numpy as np
import pytest
from sqlalchemy import text

from alembic import command

from bench.push_cost import node_second
from echod.store.db import alembic_config, upgrade
from echod.store.writer import write_batch
from tests.test_columnrows import push_of
from echod.store.summaries import (BUCKETS_PER_OCTAVE, CALLS_SQL, DETAIL_SQL, FAILED_SQL,
                                   SMALL_BYTES, Histogram, bucket, minutes)

BUCKET = 2 ** (1 / BUCKETS_PER_OCTAVE) - 1        # a quantile's error, at most
MIX = {"sync": 12, "alloc": 5, "collective": 6, "free": 5, "memcpy": 2}
BASE = 1.8e9 + 50                    # 10 s before a minute ends: pushes straddle it

CALLS = CALLS_SQL.format(a="events")      # an agent's count of async copies: that many calls
RAW = f"""
SELECT rank, kind, op, coalesce(kind = 'sync' AND attrs -> 'peer_wait' = 'true'::jsonb, false),
       sum({CALLS}), count(duration_ns), sum(duration_ns), sum(bytes),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ns),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY duration_ns)
FROM events WHERE job = '4242' GROUP BY 1, 2, 3, 4
"""
SUMMARY = """
SELECT s.rank, s.kind, s.op, s.peer_wait, u.bucket, sum(u.n), sum(u.total)
FROM call_stats s, unnest(s.buckets, s.counts, s.sums) AS u(bucket, n, total)
WHERE s.job = '4242' GROUP BY 1, 2, 3, 4, 5
"""
DETAIL = f"""
SELECT rank, kind, op, {FAILED_SQL.format(a="events")}, {DETAIL_SQL.format(a="events")},
       sum({CALLS}), sum(bytes) FILTER (WHERE duration_ns > 0), max(bytes),
       coalesce(sum({CALLS}) FILTER (WHERE bytes < {SMALL_BYTES} * {CALLS}), 0), min(t),
       max(t)
FROM events WHERE job = '4242' GROUP BY 1, 2, 3, 4, 5
"""
DETAIL_SUMMED = """
SELECT rank, kind, op, failed, detail, sum(calls), sum(timed_bytes), max(max_bytes),
       sum(small_calls), min(first_t), max(last_t)
FROM call_stats WHERE job = '4242' GROUP BY 1, 2, 3, 4, 5
"""
SUMMED = """
SELECT rank, kind, op, peer_wait, sum(calls), sum(timed), sum(duration_ns), sum(bytes)
FROM call_stats WHERE job = '4242' GROUP BY 1, 2, 3, 4
"""


def pushes(seconds: int, node: int = 0) -> list[dict]:
    """A node's batches as fleetd forwards them, one a second, each event tagged with it."""
    out = []
    for second in range(seconds):
        events = node_second(node, second, MIX, BASE)
        for k, event in enumerate(events):
            event.update(node=f"node{node}", cluster="bench", boot_id="b", job="4242")
            event["attrs"]["duration_ns"] = 1_000 + (k * 7919) % 5_000_000   # spread out
            if event["kind"] in ("alloc", "memcpy"):     # small and large, failed, two ways
                event["attrs"]["bytes"] = 1 + (k % 5) * 2**19
                event["attrs"]["result"] = 2 if k % 7 == 0 and event["kind"] == "alloc" else 0
                event["attrs"]["direction"] = ("host_to_device", "device_to_host")[k % 2]
            if event["kind"] == "memcpy" and k % 3 == 0:   # an agent's count of async copies
                event["attrs"].update(op="cudaMemcpyAsync", calls=1 + k % 4)
                del event["attrs"]["duration_ns"]
        out.append({"events": events})
    return out


def summarized(connection) -> dict:
    histograms = defaultdict(Histogram)
    for rank, kind, op, wait, b, n, total in connection.execute(text(SUMMARY)):
        histograms[(rank, kind, op, wait)].add([b], [n], [total])
    out = {}
    for rank, kind, op, wait, *sums in connection.execute(text(SUMMED)):
        durations = histograms[(rank, kind, op, wait)]
        out[(rank, kind, op, wait)] = (*sums, durations.quantile(0.5), durations.quantile(0.99))
    return out


def counted_copies(batches: list[dict]) -> int:
    return sum("calls" in e["attrs"] for b in batches for e in b["pushes"][0].stored_rows())


def failed_allocs(batches: list[dict]) -> int:
    return sum(e["kind"] == "alloc" and e["attrs"]["result"] != 0
               for b in batches for e in b["pushes"][0].stored_rows())


def as_columns(batch: dict, cluster: str = "bench") -> dict:
    """A batch of one node's events as the push of columns its agent sent."""
    events = batch["events"]
    return {"pushes": [push_of([{k: e[k] for k in ("id", "t", "kind", "attrs")} for e in events],
                               node=events[0]["node"], cluster=cluster, boot_id="b",
                               t=events[-1]["t"])]}


@pytest.mark.parametrize("form", ["maps", "columns"])    # rows, chunks (echod/store/chunks.py)
def test_summaries_say_what_the_raw_events_say_and_a_batch_sent_again_adds_nothing(engine, form):
    batches = pushes(20) if form == "maps" else [as_columns(batch) for batch in pushes(20)]
    for batch in batches:
        write_batch(engine, batch, now=BASE + 100)
    with engine.connect() as connection:
        raw = {tuple(row[:4]): tuple(row[4:]) for row in connection.execute(text(RAW))}
        summary = summarized(connection)
        minutes_stored = connection.scalar(text(
            "SELECT count(DISTINCT t) FROM call_stats WHERE job = '4242'"))
        chunked = connection.scalar(text("SELECT sum(cardinality(ts)) FROM event_chunks"))
    assert chunked == (None if form == "maps" else sum(    # the frequent calls, unless failed
        len(b["pushes"][0].columns.t) for b in batches) - 20 * 6 * 8 - failed_allocs(batches)
        - counted_copies(batches))
    assert minutes_stored == 2                          # the batches straddle a minute
    assert summary.keys() == raw.keys() and len(raw) >= 6
    for key, (calls, timed, ns, nbytes, median, p99) in raw.items():
        got = summary[key]
        assert got[:4] == (calls, timed, ns, nbytes), key
        assert got[4] == pytest.approx(median, rel=BUCKET * 1.01), key
        assert got[5] == pytest.approx(p99, rel=BUCKET * 1.01), key
    with engine.connect() as connection:
        detail = {tuple(row[:5]): tuple(row[5:]) for row in connection.execute(text(DETAIL))}
        assert {tuple(row[:5]): tuple(row[5:])
                for row in connection.execute(text(DETAIL_SUMMED))} == detail
    assert {key[3:] for key in detail if key[1] == "alloc"} == {(False, None), (True, None)}
    assert {key[4] for key in detail if key[1] == "memcpy"} == {"host_to_device",
                                                                "device_to_host"}
    assert any(small for _, _, _, small, *_ in detail.values())
    write_batch(engine, batches[3], now=BASE + 100)     # fleetd sends one again
    with engine.connect() as connection:
        assert summarized(connection) == summary


@pytest.mark.parametrize("before", ["0007", "0008"])   # no summaries; summaries of less
def test_an_upgrade_summarizes_the_events_stored_before_it(engine, before):
    for batch in pushes(5):
        write_batch(engine, batch, now=BASE + 100)
    with engine.connect() as connection:
        written = summarized(connection), set(connection.execute(text(DETAIL_SUMMED)))
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), before)
        assert (connection.scalar(text("SELECT to_regclass('call_stats')")) is None) == \
            (before == "0007")
    upgrade(engine)
    with engine.connect() as connection:
        assert (summarized(connection), set(connection.execute(text(DETAIL_SUMMED)))) == \
            written


def test_a_quantile_from_the_buckets_is_within_half_a_bucket_of_percentile_cont():
    rng = random.Random(7)
    for values in ([rng.lognormvariate(13, 1.5) for _ in range(999)],
                   [10_000.0] * 50 + [1e9] * 50,            # between two far buckets
                   [0.0, 0.0, 5.0], [123_456.0]):
        histogram = Histogram()
        for v in values:
            histogram.add([bucket(v)], [1], [v])
        for q in (0.0, 0.5, 0.95, 0.99, 1.0):
            exact = float(np.percentile(values, q * 100))
            low, high = (float(np.percentile(values, q * 100, method=m))
                         for m in ("lower", "higher"))
            spread = (high - low) * BUCKET + 1e-9
            assert histogram.quantile(q) == pytest.approx(
                exact, rel=BUCKET * 1.01, abs=spread), (q, values[:3])
    assert Histogram().quantile(0.5) is None
    equal = Histogram()
    equal.add([bucket(7e6)], [5], [35e6])            # a bucket's durations all equal: exact
    assert equal.quantile(0.5) == 7e6


def test_a_window_is_its_whole_minutes_and_the_raw_ends():
    at = lambda m, s=0: datetime(2026, 11, 26, 10, m, s, tzinfo=UTC)  # noqa: E731
    assert minutes(at(1, 30), at(5, 10)) == ((at(1, 30), at(2)), (at(2), at(5)),
                                             (at(5), at(5, 10)))
    assert minutes(at(1), at(5)) == (None, (at(1), at(5)), None)
    assert minutes(None, None) == (None, (None, None), None)
    assert minutes(at(1, 10), at(1, 50)) == ((at(1, 10), at(1, 50)), None, None)
    assert minutes(None, at(3, 1)) == (None, (None, at(3)), (at(3), at(3, 1)))


def test_events_kept_in_chunks_read_back_as_the_same_rows(engine):
    """The same pushes stored as maps (a row an event) and as columns (chunks), the second
    time from another node: the view ``events`` gives the same rows (times to the µs,
    attributes, NULLs) either way."""
    batches = pushes(3)
    for batch in batches:
        write_batch(engine, batch, now=BASE + 100)
        again = [{**e, "node": "node9", "id": e["id"].replace("node0:", "node9:")}
                 for e in batch["events"]]
        write_batch(engine, as_columns({"events": again}), now=BASE + 100)
    read = ("SELECT t, split_part(id, ':', 3), job, rank, kind, op, comm_hash, seq, bytes, "
            "duration_ns, attrs FROM events WHERE node = :node ORDER BY 1, 2")
    with engine.connect() as connection:
        rows, chunked = (connection.execute(text(read), {"node": node}).all()
                         for node in ("node0", "node9"))
        assert connection.scalar(text(
            "SELECT count(*) FROM event_chunks WHERE node = 'node9'")) > 0
    assert len(rows) == sum(len(b["events"]) for b in batches) and chunked == rows
