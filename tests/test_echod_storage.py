"""echod's storage against a real PostgreSQL: migrations, the batch writer, day partitions and
retention, and the embedded cluster.

The session's PostgreSQL and the per-test databases (blank or migrated) come from tests/pg.py.
The writer commits its own transactions, so a fresh database per test stands in for a
rolled-back transaction.
"""

from __future__ import annotations

import math
import re
import shutil
import time
from datetime import UTC, datetime, timedelta

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from echod.store.chunks import CHUNKED
from echod.store.db import event_partitions, head_revision, make_engine, status, upgrade
from echod.embedded import EmbeddedPostgres, find_bindir
from echod.errors import EmbeddedDatabaseError, SchemaTooNew
from echod.store.models import Base, Event, HealthScore, Node, Threshold
from echod.store.retention import Policy
from echod.store.retention import apply as apply_retention
from echod.store.writer import write_batch
from echod.tools.anomalies import FAILED_CALLS
from ingero import columns, wire

from .pg import FAST_BUT_UNSAFE, state_dir

CLUSTER = "testcluster"


def event(node: str, seq: int, t: float, **attrs) -> dict:
    return {"id": f"{node}:boot-{node}:{seq}", "t": t, "kind": "collective", "node": node,
            "cluster": CLUSTER, "boot_id": f"boot-{node}", "job": "4242", "attrs": attrs}


def score(node: str, t: float, value: float = 0.9) -> dict:
    return {"t": t, "cluster": CLUSTER, "node": node, "job": "4242", "score": value,
            "state": "active",
            "signals": {"throughput": 0.9, "compute": 0.8, "memory": 0.7, "cpu": 0.6}}


def threshold(t: float, cohort: str = "job:4242") -> dict:
    return {"t": t, "cluster": CLUSTER, "cohort": cohort, "threshold": 0.61, "median": 0.9,
            "mad": 0.05, "active": 8, "quorum_met": True, "panic": False,
            "stragglers": ["node03"]}


def count(session: Session, model) -> int:
    return session.scalar(select(func.count()).select_from(model))


def schema_of(engine) -> list[tuple]:
    with engine.connect() as connection:
        return connection.execute(text(
            "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'public' ORDER BY 1")).all()


# -- migrations --------------------------------------------------------------------------------

def test_upgrade_twice_is_a_no_op_and_status_reports_head(blank_engine):
    assert status(blank_engine) == (None, head_revision())
    assert upgrade(blank_engine) == head_revision()
    migrated = schema_of(blank_engine)
    assert {("event_rows", "p"), ("event_chunks", "p"), ("events", "v")} <= set(migrated)
    assert upgrade(blank_engine) == head_revision()
    assert schema_of(blank_engine) == migrated
    assert status(blank_engine) == (head_revision(), head_revision())


def test_a_database_from_a_newer_echod_is_refused(engine):
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    with pytest.raises(SchemaTooNew) as refused:
        upgrade(engine)
    assert refused.value.current == "9999_from_the_future"
    assert refused.value.head == head_revision()
    assert "9999_from_the_future" in str(refused.value) and head_revision() in str(refused.value)
    assert status(engine) == ("9999_from_the_future", head_revision())


def test_models_describe_what_the_migrations_create(engine):
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert differences == []
    with engine.connect() as connection:       # the chunks' CHECK is the kinds echod chunks
        check = connection.scalar(text(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'ck_event_chunks_kinds'"))
    assert sorted(re.findall(r"'(\w+)'", check)) == sorted(CHUNKED), check


# -- the writer --------------------------------------------------------------------------------

def chain_attrs(i: int) -> dict:
    """Attributes of every JSON scalar kind, some lifted into columns, and a causal chain id."""
    return {"chain_id": f"chain-{i // 8}", "op": "ncclAllReduce", "comm_hash": "9f2c4e01aa55b3d7",
            "seq": 1000 + i, "rank": i % 8, "bytes": 4096 * (i + 1), "duration_ns": 1500 + i,
            "nranks": 8, "in_group": i % 2 == 0, "latency_s": 0.000123 * (i + 1),
            "root": None, "ts_ns": 2**64 - 1 - i, "delta": -i, "where": "rank→peer ✓",
            "note": "slow 🐢, not NUL: \\u0000"}


def test_events_from_eight_nodes_are_all_stored_with_their_attrs_intact(engine):
    now = time.time()
    nodes = [f"node{n:02d}" for n in range(8)]
    events = [event(nodes[i % 8], i // 8, now - 60 + i * 0.01, step=i // 8) for i in range(2000)]
    chained = list(range(5, 2000, 25))[:80]
    for i in chained:
        events[i]["attrs"] = chain_attrs(i)
    result = write_batch(engine, {"events": events})
    assert (result.stored, result.duplicates, result.rejected) == (2000, 0, [])
    with Session(engine) as session:
        per_node = dict(session.execute(
            select(Event.node, func.count()).group_by(Event.node)).all())
        assert per_node == {node: 250 for node in nodes}
        stored = session.scalars(select(Event).where(Event.attrs.has_key("chain_id"))).all()
        assert len(stored) == 80
        by_id = {e.id: e for e in stored}
        for i in chained:
            sent, kept = events[i], by_id[events[i]["id"]]
            assert reassembled_attrs(kept) == sent["attrs"]
            assert kept.t == datetime.fromtimestamp(sent["t"], UTC)
            assert (kept.node, kept.cluster, kept.job, kept.kind) == (
                sent["node"], CLUSTER, "4242", "collective")
        seen = session.execute(select(Node.name, Node.boot_id)).all()
        assert sorted(seen) == [(node, f"boot-{node}") for node in nodes]


def reassembled_attrs(kept: Event) -> dict:
    lifted = {"op": kept.op, "comm_hash": kept.comm_hash, "seq": kept.seq, "rank": kept.rank,
              "bytes": kept.nbytes, "duration_ns": kept.duration_ns}
    return {**kept.attrs, **{k: v for k, v in lifted.items() if v is not None}}


def test_a_replayed_batch_stores_nothing_twice(engine):
    now = time.time()
    batch = {"events": [event("node01", i, now - 30 + i) for i in range(20)],
             "scores": [score(f"node0{n}", now - 5) for n in range(4)],
             "thresholds": [threshold(now - 5)]}
    first = write_batch(engine, batch)
    assert (first.stored, first.duplicates, first.rejected) == (25, 0, [])
    with Session(engine) as session:
        before = session.execute(select(Node.name, Node.first_seen, Node.last_seen)).all()
    again = write_batch(engine, batch)
    assert (again.stored, again.duplicates, again.rejected) == (0, 25, [])
    with Session(engine) as session:
        assert (count(session, Event), count(session, HealthScore),
                count(session, Threshold)) == (20, 4, 1)
        assert session.execute(select(Node.name, Node.first_seen, Node.last_seen)).all() == before


def test_bad_rows_are_rejected_one_by_one_and_the_good_ones_stored(engine):
    now = time.time()
    good = [event("node01", i, now - 10) for i in range(3)]
    bad = [
        {**event("node01", 10, now), "t": "yesterday"},                 # wrong type
        {**event("node01", 11, now), "kind": 7},                        # wrong type
        {**event("node01", 12, now), "job": "j" * 300},                 # huge string
        event("node01", 13, now, bytes=-4096),                          # negative bytes
        event("node01", 14, 86_400.0 * 100),                            # April 1970
        event("node01", 15, now, latency=math.inf),                     # not finite
        event("node01", 16, now, blob="x" * 17_000),                    # attrs over 16 KiB
        event("node01", 17, now, nested={"a": 1}),                      # attrs not flat
        event("node01", 18, now + 3 * 86_400),                          # days ahead
        {**event("node01", 19, now), "id": "node02:boot:19"},           # not its node's id
    ]
    scores = [score("node01", now), {**score("node02", now), "score": math.nan},
              {**score("node03", now), "signals": {"cpu": "high"}}]
    thresholds = [threshold(now), {**threshold(now, "c2"), "active": "8"}]
    result = write_batch(engine, {"events": good[:1] + bad + good[1:], "scores": scores,
                                  "thresholds": thresholds})
    assert result.stored == 3 + 1 + 1
    reasons = {(section, index): reason for section, index, reason in result.rejected}
    assert sorted(reasons) == [("events", i) for i in range(1, 11)] + [
        ("scores", 1), ("scores", 2), ("thresholds", 1)]
    expected_words = {("events", 1): "t: expected a number", ("events", 2): "kind: expected a",
                      ("events", 3): "job: longer than 256", ("events", 4): "attrs.bytes: neg",
                      ("events", 5): "before 2000", ("events", 6): "attrs.latency: not a finite",
                      ("events", 7): "more than 16384", ("events", 8): "attrs.nested: expected",
                      ("events", 9): "in the future", ("events", 10): "id: not namespaced",
                      ("scores", 1): "score: not a finite", ("scores", 2): "signals.cpu",
                      ("thresholds", 1): "active: expected an integer"}
    for key, words in expected_words.items():
        assert words in reasons[key], (key, reasons[key])
    with Session(engine) as session:
        assert sorted(session.scalars(select(Event.id))) == sorted(e["id"] for e in good)
        assert session.scalars(select(HealthScore.node)).all() == ["node01"]
        assert session.scalars(select(Threshold.cohort)).all() == ["job:4242"]


def test_a_call_past_what_any_call_moves_is_refused_alone_and_a_minutes_sums_fit(engine):
    """A failed cudaMalloc carries the size it was asked for: 2^62 bytes twice would sum past
    a 64-bit integer in the minute's summary, and the batch, with every cluster's rows in it,
    would never commit. Past 64 TiB a size is refused as a row; what is left sums."""
    now = time.time()
    asked = [{**event("node01", k, now - 5, bytes=2**62, result=2), "kind": "alloc"}
             for k in range(3)]
    fine = [{**event("node01", 10 + k, now - 5, bytes=2**46, duration_ns=2**46,
                     result=0), "kind": "alloc"} for k in range(3)]
    result = write_batch(engine, {"events": asked + fine})
    assert result.stored == 3
    assert [(i, why.split(":")[0]) for _, i, why in result.rejected] == [
        (0, "attrs.bytes"), (1, "attrs.bytes"), (2, "attrs.bytes")]
    with engine.connect() as connection:
        assert connection.execute(text("SELECT sum(bytes) FROM call_stats")).scalar() == \
            3 * 2**46


def test_rows_the_database_refuses_are_refused_alone_and_the_rest_of_the_batch_stored(engine):
    """Whatever the database refuses that the checks let through (here a constraint of its
    own), only the rows at fault are refused: the batch is stored in halves, and halves of
    those, and a batch of many clusters' rows is never dropped, nor sent again forever."""
    with engine.begin() as connection:
        connection.execute(text("ALTER TABLE event_rows ADD CONSTRAINT no_seq_13 "
                                "CHECK (seq IS DISTINCT FROM 13) NOT VALID"))
    now = time.time()
    events = [{**event("node01", k, now - 10), "attrs": {"seq": k}} for k in range(40)]
    result = write_batch(engine, {"events": events, "scores": [score("node01", now)]})
    assert result.stored == 40
    assert [(s, i) for s, i, _ in result.rejected] == [("events", 13)]
    assert "refused by the database" in result.rejected[0][2] and \
        "no_seq_13" in result.rejected[0][2], result.rejected
    with Session(engine) as session:
        assert len(session.scalars(select(Event.id)).all()) == 39
        assert session.scalars(select(HealthScore.node)).all() == ["node01"]
    replay = write_batch(engine, {"events": events, "scores": [score("node01", now)]})
    assert (replay.stored, replay.duplicates, len(replay.rejected)) == (0, 40, 1)


# -- partitions and retention ------------------------------------------------------------------

def test_events_of_three_days_land_in_three_partitions_and_retention_drops_the_oldest(engine):
    now = time.time()
    today = datetime.fromtimestamp(now, UTC).replace(hour=12, minute=0, second=0, microsecond=0)
    days = [today - timedelta(days=d) for d in (3, 2, 1)]
    events = [event("node01", 10 * d + i, (day + timedelta(minutes=i)).timestamp())
              for d, day in enumerate(days) for i in range(5)]
    assert write_batch(engine, {"events": events}, now=now).stored == 15
    names = [f"events_{day:%Y%m%d}" for day in days]
    with engine.connect() as connection:
        assert sorted(event_partitions(connection).values()) == names
        placed = dict(connection.execute(text(
            "SELECT tableoid::regclass::text, count(*) FROM event_rows GROUP BY 1")).all())
    assert placed == {name: 5 for name in names}
    whole = Policy(days=2, raw_days=2)
    assert apply_retention(engine, whole, now=now) == [   # the day and its summaries
        f"dropped {names[0]}", f"deleted 5 call_stats rows from before {days[1]:%Y-%m-%d}"]
    assert apply_retention(engine, whole, now=now) == []
    with engine.connect() as connection:
        assert sorted(event_partitions(connection).values()) == names[1:]
        assert connection.scalar(text("SELECT count(*) FROM events")) == 10


def test_a_day_past_its_raw_window_keeps_the_kinds_still_owed_and_the_evidence_of_a_verdict(
        engine):
    """Raw window 1 day for the summarized kinds, 2 for syncs, the whole 30 for the rest; a
    verdict on job 4242 from 11:00 to 11:30 with 10 minutes of evidence either side."""
    now = time.time()
    noon = datetime.fromtimestamp(now, UTC).replace(hour=12, minute=0, second=0,
                                                    microsecond=0) - timedelta(days=2)
    minutes = [noon - timedelta(hours=2) + timedelta(minutes=m) for m in range(240)]
    events = [event("node01", m, t.timestamp()) for m, t in enumerate(minutes)]
    events += [{**event("node01", 1000 + m, t.timestamp() + 1), "kind": "sync"}
               for m, t in enumerate(minutes)]
    events += [{**event("node01", 2000 + m, t.timestamp() + 2), "job": "7", "kind": "collective"}
               for m, t in enumerate(minutes)]                     # another job: no verdict
    events += [{**event("node01", 3000, noon.timestamp()), "kind": "process_exit"},
               {**event("node01", 3001, noon.timestamp(), result=2), "job": "7", "kind": "alloc"}]
    onset, cleared = noon - timedelta(hours=1), noon - timedelta(minutes=30)
    batch = {"events": events, "verdicts": [verdict(0, onset.timestamp(),
                                                   cleared=cleared.timestamp())]}
    assert write_batch(engine, batch, now=now).stored == len(events) + 1
    name = f"events_{noon:%Y%m%d}"
    policy = Policy(days=30, raw_days=1, by_kind={"sync": 2}, evidence_s=600)
    thinned = f"thinned {name}: raw alloc, collective, free, memcpy kept only around verdicts"
    assert apply_retention(engine, policy, now=now, dry_run=True) == [thinned]
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM events")) == len(events)
    assert apply_retention(engine, policy, now=now) == [thinned]
    assert apply_retention(engine, policy, now=now) == []           # once per closed window
    kept = "SELECT kind, job, min(t), max(t), count(*) FROM events GROUP BY 1, 2 ORDER BY 1, 2"
    with engine.connect() as connection:
        rows = {(kind, job): (lo, hi, n) for kind, job, lo, hi, n in
                connection.execute(text(kept))}
        sums = connection.execute(text(
            "SELECT kind, sum(calls) FROM call_stats GROUP BY 1 ORDER BY 1")).all()
    window = (onset - timedelta(minutes=10), cleared + timedelta(minutes=10))
    assert rows[("collective", "4242")] == (*window, 51)         # the evidence, minute by minute
    assert ("collective", "7") not in rows                       # nobody named there
    assert rows[("sync", "4242")][2] == 240                      # its own window is still open
    assert rows[("process_exit", "4242")][2] == 1                # rare: kept whole
    assert rows[("alloc", "7")][2] == 1                          # a failed call: evidence
    assert sums == [("alloc", 1), ("collective", 480), ("process_exit", 1),   # summaries stay
                    ("sync", 240)]
    # A day later the syncs' window closes too: the same partition is thinned once more.
    said = apply_retention(engine, policy, now=now + 86_400)
    assert said == [f"thinned {name}: raw alloc, collective, free, memcpy, sync kept only "
                    "around verdicts"]
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM events WHERE kind = 'sync'")) == 50
        indexes = "SELECT count(*) FROM pg_indexes WHERE tablename = :name"
        for partition, table in ((name, "event_rows"),
                                 (name.replace("events_", "event_chunks_"), "event_chunks")):
            assert connection.scalar(text(indexes), {"name": partition}) == \
                connection.scalar(text(indexes), {"name": table})   # with them all
    # Past the whole retention, the day, its summaries and the verdict go.
    said = apply_retention(engine, policy, now=now + 31 * 86_400)
    assert said[0] == f"dropped {name}" and any("call_stats" in s for s in said), said
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT count(*) FROM straggler_verdicts")) == 0


# -- the embedded cluster ----------------------------------------------------------------------

def test_embedded_cluster_listens_on_its_socket_only_and_keeps_data_across_restarts():
    where = state_dir()
    cluster = EmbeddedPostgres(where, settings=FAST_BUT_UNSAFE)
    try:
        with cluster:
            assert f"host={where / 'socket'}".replace("/", "%2F") in cluster.dsn
            engine = make_engine(cluster.dsn)
            with engine.connect() as connection:
                assert connection.scalar(text("SHOW listen_addresses")) == ""
                assert connection.scalar(text("SHOW unix_socket_directories")) == str(
                    cluster.socket_dir)
                assert connection.scalar(text("SELECT inet_server_addr()")) is None
            upgrade(engine)
            now = time.time()
            result = write_batch(engine, {"events": [event("node07", i, now) for i in range(5)]})
            assert result.stored == 5
            engine.dispose()
        assert not cluster.running()
        with EmbeddedPostgres(where) as again:
            engine = make_engine(again.dsn)
            assert status(engine) == (head_revision(), head_revision())
            with Session(engine) as session:
                assert sorted(session.scalars(select(Event.id))) == [
                    f"node07:boot-node07:{i}" for i in range(5)]
            engine.dispose()
    finally:
        cluster.stop()
        shutil.rmtree(where, ignore_errors=True)


def test_embedded_cluster_failures_say_why(tmp_path):
    with pytest.raises(EmbeddedDatabaseError, match="no PostgreSQL server programs"):
        find_bindir(str(tmp_path / "*" / "bin"))
    where = state_dir()
    try:
        broken = EmbeddedPostgres(where, settings={"shared_buffers": "lots"})
        with pytest.raises(EmbeddedDatabaseError, match="shared_buffers") as failed:
            broken.start()
        assert "pg_ctl start failed" in str(failed.value)
    finally:
        shutil.rmtree(where, ignore_errors=True)


# -- rank verdicts and peer lag ----------------------------------------------------------------

def verdict(revision: int, t: float, **changes) -> dict:
    return {"vid": "v1", "revision": revision, "cluster": CLUSTER, "job": "4242", "rank": 5,
            "node": "node01", "kind": "persistent", "cause": "host_work", "confidence": "medium",
            "severity": "critical", "fix": "profile the host code", "findings": ["late"],
            "op": "ncclAllReduce", "comm_hash": "00000000c0ffee00", "step": 12, "onset": t,
            "first_seen": t, "last_seen": t + revision, "cleared": None, "lag_p50_s": 0.29,
            "lag_p99_s": 0.3, "last_share": 1.0, "period": None, "occurrences": 20,
            "cost_gpu_s": 2.5 * (revision + 1), "cost_usd": None,
            "evidence": {"bar_ms": 4.2}, **changes}


def test_the_newest_revision_of_a_verdict_wins_and_a_replay_changes_nothing(engine):
    now = time.time()
    first = write_batch(engine, {"verdicts": [verdict(0, now), verdict(2, now), verdict(1, now)]})
    assert (first.stored, first.duplicates, first.rejected) == (1, 2, [])
    assert write_batch(engine, {"verdicts": [verdict(1, now)]}).stored == 0   # older: ignored
    cleared = write_batch(engine, {"verdicts": [verdict(3, now, cleared=now + 5)]})
    assert cleared.stored == 1
    with engine.connect() as connection:
        row = connection.execute(text(
            "SELECT revision, lag_ns, cost_gpu_seconds, cleared IS NOT NULL, evidence "
            "FROM straggler_verdicts")).one()
    assert row[:4] == (3, 290_000_000, 10.0, True)
    assert row[4] == {"bar_ms": 4.2, "findings": ["late"]}


def test_a_verdict_without_its_raise_time_is_rejected_alone(engine):
    now = time.time()
    result = write_batch(engine, {"verdicts": [verdict(0, now, first_seen=None)],
                                  "events": [event("node01", 1, now)]})
    assert result.stored == 1 and result.rejected[0][:2] == ("verdicts", 0)
    assert "first_seen" in result.rejected[0][2]


def test_a_later_job_record_never_changes_whose_job_it_is(engine):
    """jobs.user decides who reads a job through MUNGE: a second job_start naming another user
    (forged with a stolen agent key, in the same batch or a later one) changes nothing."""
    now = time.time()

    def start(seq: int, user: str, node: str = "node01") -> dict:
        return {**event(node, seq, now - 60 + seq), "kind": "job_start",
                "attrs": {"job": "4242", "user": user, "nodelist": "node0[1-2]"}}
    write_batch(engine, {"events": [start(1, "alice")]})
    write_batch(engine, {"events": [start(2, "mallory", "node02"), start(3, "mallory")]})
    with engine.connect() as connection:
        assert connection.execute(text('SELECT "user" FROM jobs')).all() == [("alice",)]


def test_a_verdicts_lag_past_what_the_store_holds_is_rejected_alone(engine):
    now = time.time()
    result = write_batch(engine, {"verdicts": [verdict(0, now, lag_p50_s=1e300)],
                                  "events": [event("node01", 1, now)]})
    assert result.stored == 1 and result.rejected[0][:2] == ("verdicts", 0)
    assert "lag_p50_s: 1e+300 s out of range" in result.rejected[0][2]


def test_peer_lag_rows_are_stored_once(engine):
    row = {"t": time.time(), "cluster": CLUSTER, "job": "4242", "comm_hash": "00000000c0ffee00",
           "seq_first": 0, "seq_last": 9, "rank": 3, "node": "node01", "samples": 10,
           "lag_median_ns": -87, "lag_p95_ns": 573_183, "lag_max_ns": 681_748}
    assert write_batch(engine, {"peer_lag": [row]}).stored == 1
    assert write_batch(engine, {"peer_lag": [row]}).duplicates == 1


def test_failed_calls_are_found_through_their_partial_index_and_no_result_breaks_a_write(
        engine):
    """Migration 0007's index holds calls whose result is a number other than 0: a result of
    any other shape (a string, null, a float zero) must neither fail the write nor count."""
    now = time.time()
    results = [0, 0.0, -1, 2.5, "oops", None, True, 719]
    events = [{**event("node01", i, now - 10 + i, result=value), "kind": "sync"}
              for i, value in enumerate(results)]
    assert write_batch(engine, {"events": events}).stored == len(results)
    failed = FAILED_CALLS.format(where="e.cluster = :cluster")
    with engine.connect() as connection:
        found = connection.execute(text(failed), {"cluster": CLUSTER, "limit": 50}).all()
        connection.execute(text("SET enable_seqscan = off"))
        plan = "\n".join(r[0] for r in connection.execute(
            text("EXPLAIN " + failed), {"cluster": CLUSTER, "limit": 50}))
        children = connection.scalars(text(
            "SELECT inhrelid::regclass::text FROM pg_inherits "
            "WHERE inhparent = 'ix_events_failed_calls'::regclass")).all()
    assert sorted(float(row[-1]) for row in found) == [-1.0, 2.5, 719.0]
    assert children and any(f"using {child} " in plan for child in children), plan


def test_an_event_older_than_the_store_keeps_is_refused_and_makes_no_partition(
        engine, monkeypatch):
    """A node that backdates its events one day each would have echod make a partition a day
    back to 2000; echod (--retention-days 30) refuses those older than it keeps, as maps and as
    columns, and stores the rest."""
    from echod.store import checks
    monkeypatch.setattr(checks, "KEEP_DAYS", 30)
    now = time.time()
    backdated = [event("node01", 40 + d, now - d * 86_400) for d in (10, 40, 400, 4000)]
    result = write_batch(engine, {"events": backdated})
    assert result.stored == 1
    assert [reason.split(" is ")[-1] for _, _, reason in result.rejected] == [
        "older than the 30 days the store keeps"] * 3
    pushed = wire.decode(wire.encode(wire.ColumnPush(
        0, "node02", "c", "b", 0.9, {s: 0.9 for s in wire.SIGNALS}, "active", now, 1.0, None,
        None, [], None, None, columns.encode([
            {"id": f"node02:b:{d}", "t": now - d * 86_400, "kind": "sync",
             "attrs": {"duration_ns": 10, "rank": 0}} for d in (1, 50, 5000)]))))
    result = write_batch(engine, {"pushes": [pushed]})
    assert result.stored == 1 and len(result.rejected) == 2
    with engine.connect() as connection:
        days = event_partitions(connection)
    oldest = datetime.fromtimestamp(now - 31 * 86_400, UTC).date()
    assert not [day for day in days if day < oldest], sorted(days)


def test_a_pushs_walk_from_its_columns_to_the_database_passes_each_store_module_once(engine):
    """A push of columns as fleetd forwards it, stored: every call from one of the store's
    modules into another goes down the room's one-way order (tests/test_package.py's ROOMS),
    so the walk enters each module from above and, once it has left it downwards, never comes
    back up into it (it went back into store.py four times when the writer was a circle)."""
    import sys

    from .test_columnrows import NOW, push_of
    from .test_columns import events
    from .test_package import ROOMS

    order = [f"echod.store.{name}" for name in ROOMS["echod.store"]]
    push = push_of(events(400))
    edges: set[tuple[str, str]] = set()

    def seen(frame, event, _arg):
        if event != "call" or frame.f_globals.get("__name__") not in order:
            return
        caller = frame.f_back
        while caller is not None and caller.f_globals.get("__name__") not in order:
            caller = caller.f_back
        if caller is not None and caller.f_globals["__name__"] != frame.f_globals["__name__"]:
            edges.add((caller.f_globals["__name__"], frame.f_globals["__name__"]))

    sys.setprofile(seen)
    try:
        result = write_batch(engine, {"events": push.stored_rows(push.events),
                                      "pushes": [push]}, NOW)
    finally:
        sys.setprofile(None)
    assert result.stored == 400 and not result.rejected, result
    upward = sorted((a, b) for a, b in edges if order.index(b) > order.index(a))
    assert upward == [], upward
    walked = {name.rpartition(".")[2] for edge in edges for name in edge}
    assert {"writer", "columnrows", "chunks", "attrsjson", "checks"} <= walked, edges
