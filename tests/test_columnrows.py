"""echod stages a push of columns a column at a time (echod/store/columnrows.py) and a batch of the
same events as maps row by row (echod/store/writer.py): both must stage the same rows, refuse the
same events for the same reasons, and say the same of nodes, days and jobs, whatever the
events hold (what the wire itself refuses, a text past 256 characters or not UTF-8, never
reaches echod). No database: what reaches PostgreSQL is what is compared."""

from __future__ import annotations

import json

import pytest

from echod.store import checks, chunks, writer
from echod.store.chunks import Chunk
from ingero import columns, wire
from tests.test_columns import SIG, events

NOW = 1.8e9 + 3600


def push_of(evs: list[dict], node: str = "node7", job: str | None = None, cluster: str = "c",
            boot_id: str = "b0", t: float = NOW) -> wire.ColumnPush:
    """The events as an agent pushes them (as columns), and as fleetd forwards them."""
    packed, rest = columns.pack(evs)
    frames = wire.encode(wire.ColumnPush(3, node, cluster, boot_id, 0.9, SIG, "active", t, 1.0,
                                         job, None, rest, None, None, packed))
    return wire.decode(frames)


def rows_of(chunk: Chunk) -> list[tuple]:
    """A chunk's events as the rows the view ``events`` shows (and echod would have staged
    them as rows): (t, id, cluster, node, job, rank, kind, op, comm_hash, seq, bytes,
    duration_ns, attrs as JSON text)."""
    (_t, _id, _last, cluster, node, job, rank, kind, prefix, numbers, ts, *values, common,
     attrs) = chunk.row()
    values = [[None] * len(ts) if column is None else column for column in values]
    alike = json.loads(common or "{}")
    return [(chunks.stamp(us), f"{prefix}{number}", cluster, node, job, rank, kind, *row,
             checks.encode_json({**alike, **json.loads(each or "{}")}))
            for us, number, *row, each in zip(ts, numbers, *values, attrs or [None] * len(ts))]


def both(push: wire.ColumnPush) -> tuple[checks.CheckedBatch, checks.CheckedBatch]:
    as_rows = writer.check_batch({"events": push.stored_rows()}, NOW)
    as_columns = writer.check_batch({"events": push.stored_rows(push.events),
                                    "pushes": [push]}, NOW)
    return as_rows, as_columns


def staged(checked: checks.CheckedBatch) -> list[tuple]:
    """The events staged, as rows or in chunks, as the rows they are read as (the attributes
    as a map: a chunk's come in two parts, and PostgreSQL keeps JSON's keys in its order)."""
    return sorted((*row[:12], sorted(json.loads(row[12]).items()))
                  for row in checked.rows.get("events", []) + [
                      row for chunk in checked.chunks for row in rows_of(chunk)])


def assert_alike(push: wire.ColumnPush) -> checks.CheckedBatch:
    as_rows, as_columns = both(push)
    assert staged(as_columns) == staged(as_rows)
    assert not as_rows.chunks         # maps: a row an event
    assert sorted(r for _, _, r in as_columns.rejected) == \
        sorted(r for _, _, r in as_rows.rejected)
    assert (as_columns.nodes, as_columns.days, as_columns.jobs) == \
        (as_rows.nodes, as_rows.days, as_rows.jobs)
    return as_columns


def test_an_agents_events_stage_as_their_rows_would():
    checked = assert_alike(push_of(events(600)))
    assert len(staged(checked)) == 600 and not checked.rejected
    # the frequent calls in chunks of one kind, job, rank and minute each, the others rows
    assert checked.chunks and checked.rows["events"]
    for row in checked.rows["events"]:     # of the frequent kinds, failed calls only
        assert row[6] not in chunks.CHUNKED or json.loads(row[12]).get("result") not in (0, None)
    assert {c.kind for c in checked.chunks} <= set(chunks.CHUNKED)
    assert all(len({(r[4], r[5], r[6], r[0].replace(second=0, microsecond=0))
                    for r in rows_of(c)}) == 1 for c in checked.chunks)


def spoil(evs: list[dict], at: int, **attrs) -> list[dict]:
    evs[at]["attrs"].update(attrs)
    return evs


@pytest.mark.parametrize("make, refused", [
    (lambda e: e[:5] + [{**e[5], "t": 9.0e8}] + e[6:], "t: 900000000.0 is before 2000"),
    (lambda e: e[:5] + [{**e[5], "t": NOW + 2 * 86_400}] + e[6:], "more than a day"),
    (lambda e: spoil(e, 4, rank=2**40), "attrs.rank: 1099511627776 out of range"),
    (lambda e: spoil(e, 4, op="all\x00reduce"), "attrs.op: not valid UTF-8"),
    (lambda e: spoil(e, 4, **{f"k{i}": "\u00e9" * 255 for i in range(16)}), "attrs: 24"),
    (lambda e: spoil(e, 5, seq=2**63), "attrs.seq: 9223372036854775808 out of range"),
])
def test_an_event_either_form_refuses_is_refused_alike_and_the_rest_stored(make, refused):
    checked = assert_alike(push_of(make(events(200))))
    assert len(checked.rejected) == 1 and refused in checked.rejected[0][2], checked.rejected
    assert len(staged(checked)) == 199


def test_a_non_ascii_text_and_a_percent_sign_stage_alike():
    evs = spoil(spoil(events(200), 3, note="größe 100%"), 7, **{"50%": 1.5, "flag": True})
    checked = assert_alike(push_of(evs))
    assert not checked.rejected


def test_job_starts_and_ends_fill_the_job_records_alike():
    evs = events(100)
    evs[10] = {**evs[10], "kind": "job_start",
               "attrs": {"job": "77", "user": "ada", "partition": "gpu", "nodes": 2}}
    evs[90] = {**evs[90], "kind": "job_end", "attrs": {"job": "77", "exit_code": 0}}
    checked = assert_alike(push_of(evs))
    assert checked.jobs[("c", "77")], checked.jobs


def test_events_without_a_job_of_their_own_take_the_pushs():
    evs = [{**e, "attrs": {k: v for k, v in e["attrs"].items() if k != "job"}}
           for e in events(150)]
    checked = assert_alike(push_of(evs, job="4242"))
    assert {row[4] for row in staged(checked)} == {"4242"}


def test_a_node_whose_ids_are_not_its_own_is_refused_event_by_event():
    checked = assert_alike(push_of(events(150), node="node8"))
    assert not checked.rows.get("events") and len(checked.rejected) == 150


def test_an_attribute_shape_an_event_stages_as_the_rows_would():
    """A user's processes choose their attributes: 3,000 events, each with its own subset of
    20 names (its own shape), stage as their rows; each shape costs a slice of one sort (it
    cost a pass over every event, 2.6 s for 65,536 such events)."""
    import random
    rnd = random.Random(7)
    names = [f"a{k}" for k in range(20)]
    evs = [{"id": f"node7:b0:{i}", "t": NOW - 1 + i / 1e4, "kind": rnd.choice(["sync", "alloc"]),
            "attrs": {"rank": i % 4, "duration_ns": i, **{name: rnd.choice([i, f"s{i}", 0.5])
                                                          for name in rnd.sample(names, 5)}}}
           for i in range(3000)]
    checked = assert_alike(push_of(evs))
    assert len(staged(checked)) == 3000 and not checked.rejected
