"""Producers → fleetd → echod → PostgreSQL, all real: counts per node, replays, a database
restart in the middle of ingest, bad rows counted one by one."""

from __future__ import annotations

import logging
import random
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest
import zmq
from sqlalchemy import text

from echod.store.db import make_engine
from echod.embedded import EmbeddedPostgres
from echod.errors import EmbeddedDatabaseError
from ingero import columns, curve, wire
from stack.launch import free_port, stop_all, wait_for

from .support import Producer, forward, metric
from .test_fuzz_frames import GARBAGE, mutate


@pytest.fixture
def state_dir():
    """Under /tmp itself: the postgres user must reach it (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="echod-ingest-"))
    path.chmod(0o755)
    yield path
    EmbeddedPostgres(path / "postgres").stop()
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pipeline(spawn, keys, state_dir, tmp_path):
    """echod on its embedded PostgreSQL, and fleetd forwarding to it."""
    ingest = f"tcp://127.0.0.1:{free_port()}"
    fleet = f"tcp://127.0.0.1:{free_port()}"
    echod = spawn("echod", "echod", ["--ingest-bind", ingest, "--state-dir", str(state_dir),
                                     "--api-bind", "none",
                                     "--metrics-addr", "none", *keys.echod_flags()])
    assert wait_for(lambda: "ingest listening" in echod.log() or not echod.alive(), 120), \
        echod.log()
    assert echod.alive(), echod.log()
    fleet_port = free_port()
    fleetd = spawn("fleetd", "fleetd", [
        "--bind", fleet, "--metrics-addr", f"127.0.0.1:{fleet_port}",
        "--forward-resend-after", "1", *keys.fleetd_flags(),
        *keys.forwarding_flags(ingest, tmp_path / "fleetd-spool")])
    database = EmbeddedPostgres(state_dir / "postgres")
    engine = make_engine(database.start())
    yield dict(ingest=ingest, fleet=fleet, echod=echod, fleetd=fleetd, fleet_port=fleet_port,
               engine=engine, database=database)
    engine.dispose()
    stop_all([fleetd, echod])   # before state_dir stops PostgreSQL: echod would start it again


def per_node(engine) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT node, count(*) FROM events GROUP BY node"))
        return dict(rows.all())


def test_eight_producers_exactly_250_each(pipeline, keys):
    producers = [Producer(pipeline["fleet"], keys, f"node{i}") for i in range(8)]
    for _ in range(5):
        for producer in producers:
            producer.push(50, chain_id=f"{producer.node}-chain")
    assert all(p.collect_acks(20) == 5 for p in producers)
    engine = pipeline["engine"]
    assert wait_for(lambda: sum(per_node(engine).values()) >= 2000, 60), per_node(engine)
    time.sleep(1)
    assert per_node(engine) == {f"node{i}": 250 for i in range(8)}
    with engine.connect() as connection:
        chains = connection.execute(text(
            "SELECT attrs->>'chain_id', count(*) FROM events GROUP BY 1")).all()
    assert sorted(chains) == sorted((f"node{i}-chain", 250) for i in range(8))
    for producer in producers:
        producer.close()


def test_5000_events_at_1000_per_second_with_a_postgres_restart(pipeline, keys):
    producers = [Producer(pipeline["fleet"], keys, f"node{i}") for i in range(8)]

    def produce(producer):
        for _ in range(25):  # 25 pushes of 25 events, one every 0.2 s: 125 events/s each
            producer.push(25)
            time.sleep(0.2)

    threads = [threading.Thread(target=produce, args=(p,)) for p in producers]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    database = pipeline["database"]
    beside_the_reviver(database, database.stop)  # PostgreSQL goes away in the middle of ingest
    time.sleep(1.5)
    beside_the_reviver(database, database.start)  # ...and comes back
    for thread in threads:
        thread.join()
    engine = pipeline["engine"]
    engine.dispose()
    assert wait_for(lambda: sum(per_node(engine).values()) >= 5000, 90), per_node(engine)
    time.sleep(1)
    assert per_node(engine) == {f"node{i}": 625 for i in range(8)}, "loss or duplication"
    # echod saw the outage: a write failed, or its reviver found PostgreSQL down first (and
    # started it again before a write came: seen once, with Ansible running beside). A batch
    # that failed is one fleetd sends again.
    log = pipeline["echod"].log()
    assert "database unavailable" in log or "private PostgreSQL is down" in log, log
    if "database unavailable" in log:
        assert metric(pipeline["fleet_port"], "ingero_fleet_forward_resent_total") > 0
    for producer in producers:
        producer.close()


def beside_the_reviver(database: EmbeddedPostgres, action) -> None:
    """Stop or start the private cluster echod watches too: its reviver may start it again
    between the shutdown and pg_ctl's check that the server is gone (a whole run: "pg_ctl:
    server does not shut down", the server's log showing the shutdown and a new start 70 ms
    later), or between the test's check that it is down and its own start. Either way it went
    down, and it is up again."""
    try:
        action()
    except EmbeddedDatabaseError:
        assert wait_for(database.running, 30), "neither the test nor echod's reviver started it"


def events(node: str, n: int, **changes) -> list[dict]:
    now = time.time()
    rows = [{"id": f"{node}:b:{i}", "t": now, "kind": "sync", "node": node, "cluster": "c",
             "boot_id": "b", "job": "7", "attrs": {"duration_ns": 1000 + i}} for i in range(n)]
    for index, change in changes.items():
        rows[int(index.removeprefix("row"))].update(change)
    return rows


def test_a_replayed_batch_changes_nothing(pipeline, keys):
    batch = wire.Forward(0, "test", events("replayed", 40))
    first = forward(keys, pipeline["ingest"], batch)
    again = forward(keys, pipeline["ingest"], batch)
    assert (first.ack, first.stored, first.duplicates) == (0, 40, 0)
    assert (again.ack, again.stored, again.duplicates) == (0, 0, 40)
    assert per_node(pipeline["engine"])["replayed"] == 40


def test_a_batch_held_up_in_postgresql_holds_up_no_other(pipeline, keys):
    """echod writes two batches at once (--writers, default 2), each on its own connection:
    while one waits on a row lock, the next is committed and acknowledged; the held one is
    acknowledged once the lock goes, and nothing is lost."""
    assert forward(keys, pipeline["ingest"], wire.Forward(10, "test", events("held", 3))).stored
    acks = {}
    with pipeline["engine"].connect() as locker:
        locker.execute(text("SELECT 1 FROM nodes WHERE name = 'held' FOR UPDATE"))
        held = threading.Thread(target=lambda: acks.update(held=forward(
            keys, pipeline["ingest"], wire.Forward(11, "test", events("held", 6)))))
        held.start()
        assert wait_for(lambda: locked_out(pipeline["engine"]), 10), "never reached the lock"
        acks["free"] = forward(keys, pipeline["ingest"], wire.Forward(12, "test",
                                                                      events("free", 4)))
        assert held.is_alive(), "the held batch was acknowledged before its commit"
        locker.rollback()
    held.join(30)
    assert (acks["held"].ack, acks["held"].stored, acks["free"].stored) == (11, 6, 4)
    stored = per_node(pipeline["engine"])
    assert (stored["held"], stored["free"]) == (9, 4)


def test_a_connection_cut_in_the_middle_of_a_write_is_backed_off_and_nothing_lost(
        pipeline, keys):
    """The writer has COPYed a batch into its staging table and waits to move it (a lock held
    here); its connection is cut then, as a database restart or a failover cuts it. echod backs
    off and does not acknowledge the batch; fleetd sends it again; it is stored once."""
    engine, producer = pipeline["engine"], Producer(pipeline["fleet"], keys, "cut")
    producer.push(10)               # today's partition made first: the write waits no sooner
    assert wait_for(lambda: per_node(engine).get("cut") == 10, 60), per_node(engine)
    with engine.connect() as locker:
        locker.execute(text("LOCK TABLE event_rows IN SHARE MODE"))
        producer.push(50)
        assert wait_for(lambda: locked_out(engine), 30), pipeline["echod"].log()
        with engine.connect() as cutter:
            cut = cutter.execute(text(
                "WITH writer AS MATERIALIZED (SELECT pid FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND pid <> pg_backend_pid() "
                "AND query LIKE '%INSERT INTO event_rows%') "
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM writer"))
            assert cut.scalar() == 1
        locker.rollback()
    assert producer.collect_acks(20) == 2
    assert wait_for(lambda: per_node(engine).get("cut") == 60, 60), per_node(engine)
    time.sleep(1)
    assert per_node(engine)["cut"] == 60, "loss or duplication"
    assert pipeline["echod"].alive(), pipeline["echod"].log()
    assert "database unavailable" in pipeline["echod"].log()
    assert metric(pipeline["fleet_port"], "ingero_fleet_forward_resent_total") > 0
    producer.close()


def locked_out(engine) -> bool:
    """Whether some backend waits for a lock (the held batch's, on the nodes row)."""
    with engine.connect() as connection:
        return connection.execute(text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")).scalar() > 0


def test_a_batch_that_fails_its_checks_is_acknowledged_as_refused_not_left_to_come_again(
        pipeline, keys):
    """A batch past what a message may hold (fleetd splits its own; an older one, or another
    sender, may not) is refused whole, and said so: unanswered, it would come again forever."""
    too_long = wire.Forward(77, "test", events("long", 1) * (wire.MAX_FORWARD_ROWS + 1))
    ack = forward(keys, pipeline["ingest"], too_long)
    assert (ack.ack, ack.stored, ack.rejected) == (77, 0, 1)
    assert "bad_msgpack" in pipeline["echod"].log() and pipeline["echod"].alive()
    assert forward(keys, pipeline["ingest"], wire.Forward(78, "test", events("after", 3))) \
        .stored == 3


def test_a_row_the_database_refuses_is_refused_alone_and_echod_serves_on(pipeline, keys):
    """The database refuses a row the checks let through (a constraint of its own here; a
    64-bit sum past its range, say): echod stores the rest of the batch, refuses that row,
    and goes on serving every cluster."""
    with pipeline["engine"].begin() as connection:
        connection.execute(text("ALTER TABLE event_rows ADD CONSTRAINT no_duration_1013 "
                                "CHECK (duration_ns IS DISTINCT FROM 1013) NOT VALID"))
    ack = forward(keys, pipeline["ingest"], wire.Forward(5, "test", events("refused", 40)))
    assert (ack.stored, ack.rejected) == (39, 1)
    assert pipeline["echod"].alive() and "no_duration_1013" in pipeline["echod"].log()
    assert forward(keys, pipeline["ingest"], wire.Forward(6, "test", events("next", 3))) \
        .stored == 3


def test_bad_rows_are_rejected_one_by_one(pipeline, keys):
    rows = events("mixed", 10, row2={"t": "yesterday"}, row5={"attrs": {"bytes": -5}},
                  row7={"node": "x" * 1000})
    ack = forward(keys, pipeline["ingest"], wire.Forward(1, "test", rows))
    assert (ack.stored, ack.rejected) == (7, 3)
    assert per_node(pipeline["engine"])["mixed"] == 7
    assert pipeline["echod"].alive()


def column_push_frames(node: str, n: int) -> list[bytes]:
    """A push of columns, as an agent sends it and fleetd passes its body on."""
    evs = [{"id": f"{node}:b:{i}", "t": time.time(), "kind": "sync",
            "attrs": {"duration_ns": 1000 + i, "job": "7", "rank": i % 4}} for i in range(n)]
    return wire.encode(wire.ColumnPush(0, node, "c", "b", 0.9, {s: 0.9 for s in wire.SIGNALS},
                                       "active", time.time(), 1.0, None, None, [], None, None,
                                       columns.encode(evs)))


def test_pushes_of_columns_are_stored_as_their_rows_would_be_and_a_bad_one_alone_refused(
        pipeline, keys):
    as_rows = wire.decode(column_push_frames("rows", 30)).stored_rows()   # an older fleetd's
    first = forward(keys, pipeline["ingest"], wire.Forward(2, "test", as_rows))
    assert wire.COLUMNS in first.capabilities, "echod says it takes columns"
    good, bad = column_push_frames("cols", 30)[1], column_push_frames("bad", 5)[1]
    bad = bad.replace(b"duration_ns", b"duration_xx")[:-3]
    ack = forward(keys, pipeline["ingest"], wire.ForwardColumns(
        3, "test", events("cols-rows", 4), pushes=[good, bad]))
    assert (ack.stored, ack.rejected) == (34, 1)
    with pipeline["engine"].connect() as connection:
        stored = {node: connection.execute(text(
            "SELECT kind, attrs, job, cluster, duration_ns FROM events WHERE node = :n "
            "ORDER BY id"), {"n": node}).all() for node in ("rows", "cols")}
    assert stored["cols"] == stored["rows"] and len(stored["cols"]) == 30
    assert "1 push(es) of columns rejected" in pipeline["echod"].log()


def test_an_unknown_fleetd_key_is_refused(pipeline, keys, tmp_path):
    stranger_public, stranger_secret = curve.generate(tmp_path / "stranger", "stranger")
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    curve.connect_curve(socket, curve.load_keypair(stranger_secret),
                        curve.load_public(keys.echod_public))
    socket.connect(pipeline["ingest"])
    socket.send_multipart(wire.encode(wire.Forward(0, "intruder", events("intruder", 5))))
    assert not socket.poll(2000), "echod answered a fleetd it does not know"
    socket.close()
    context.term()
    assert "intruder" not in per_node(pipeline["engine"])


def test_an_agent_killed_with_pushes_unacknowledged_sends_them_after_its_restart(
        pipeline, spawn, keys, tmp_path):
    """fleetd is away; the agent queues its pushes (on disk) and is killed -9; fleetd comes back
    and so does the agent, on the same queue: the pushes of its first life reach echod, each
    score once, the stream's numbers running on without a gap."""
    fleetd = pipeline["fleetd"]
    fleetd.stop()
    args = ["--source", "synthetic", "--fleet", pipeline["fleet"], "--node", "restarted",
            "--push-interval", "0.2", "--metrics-addr", "none", "--queue-dir",
            str(tmp_path / "queue"), *keys.ingerod_flags()]
    first = spawn("ingerod-1", "ingerod", args)
    queue = tmp_path / "queue" / "restarted" / "node"
    assert wait_for(lambda: len(list(queue.glob("push-*"))) >= 10, 30), first.log()
    first.process.kill()
    first.process.wait()
    kept = len(list(queue.glob("push-*")))
    spawn("fleetd-2", "fleetd", fleetd.argv[3:])
    second = spawn("ingerod-2", "ingerod", args)
    assert wait_for(lambda: f"queue: {kept} push(es)" in second.log(), 30), second.log()

    def scores():
        with pipeline["engine"].connect() as c:
            return c.execute(text("SELECT boot_id, seq FROM health_scores "
                                  "WHERE node = 'restarted' ORDER BY seq")).all()
    assert wait_for(lambda: len(scores()) >= kept + 5, 60), (kept, scores())
    rows = scores()
    assert len({boot for boot, _ in rows}) == 1, "one stream across the restart"
    assert [seq for _, seq in rows] == list(range(len(rows))), "every push once, none missing"
    with pipeline["engine"].connect() as c:
        gap = c.execute(text("SELECT attrs FROM events WHERE node = 'restarted' "
                             "AND kind = 'agent_restart'")).scalar_one()
    assert 0 < gap["untraced_s"] < 60, gap
    assert second.stop() == 0


def test_retention_runs_beside_ingest_one_pass_at_a_time(caplog):
    """Thinning a large day takes a while: the ingest loop starts it and goes on; an hour that
    finds it still running starts no second pass; a pass that fails is logged."""
    from echod.ingest import IngestServer
    from ingero.runtime import RateLimitedLog

    started, release, passes = threading.Event(), threading.Event(), []

    def housekeeping():
        passes.append(threading.current_thread().name)
        started.set()
        if not release.wait(10):
            raise RuntimeError("never released")
        raise ConnectionError("the database went away")

    server = IngestServer.__new__(IngestServer)     # the loop's housekeeping alone
    server.housekeeping, server.keeping = housekeeping, None
    server.complaints = RateLimitedLog(logging.getLogger("echod.test"), 0.0)
    server.keep_house()
    assert started.wait(5)                         # keep_house returned while it runs
    server.keep_house()
    release.set()
    server.keeping.join(5)
    assert passes == ["echod-retention"] and not server.keeping.is_alive()
    assert "retention skipped: the database went away" in caplog.text


def big_push(producer: Producer, first: int, n: int, detail: bool) -> list[bytes]:
    """The producer's next push: ``n`` syncs as columns, each with four texts of its own of
    about 240 characters (1 KB each on the wire: stored as rows) or without (15 bytes each:
    as chunks)."""
    def texts(i: int) -> dict:
        return {name: f"{i:08d}{name}{'y' * 228}" for name in ("detail", "pad1", "pad2", "pad3")}
    evs = [{"id": f"big:{producer.boot}:{first + i}", "t": time.time(), "kind": "sync",
            "attrs": {"duration_ns": 1000 + i, "job": "7", "rank": i % 4,
                      **(texts(i) if detail else {})}}
           for i in range(n)]
    return wire.encode(wire.ColumnPush(
        producer.seq, "big", "c", producer.boot, 0.9, {s: 0.9 for s in wire.SIGNALS},
        "active", time.time(), 1.0, None, None, [], None, None, columns.encode(evs)))


def test_pushes_of_columns_and_1999_rows_with_fleetd_killed_before_the_acks_are_stored_once(
        pipeline, spawn, keys):
    """With echod stopped, five pushes of 4,000 syncs of columns (batches of columns as they
    came, stored as chunks), 1,999 events as maps, and a push of 4,096 events of columns (as
    many as a push may carry) of about 4 MB (past what a batch to echod may be: as its rows,
    in batches). fleetd sends what its window allows and
    is stopped; echod goes on and stores it, and fleetd, never reading the acks, is killed -9.
    Started again on its spool, it sends everything again: every event is stored once (the
    batch of columns sent again as rows, as a fleetd that has not yet heard from echod sent
    each batch, would be stored twice), and the spool empties."""
    fleetd, echod, engine = pipeline["fleetd"], pipeline["echod"], pipeline["engine"]
    producer = Producer(pipeline["fleet"], keys, "big", cluster="c")
    try:
        producer.push(1)                  # fleetd hears from echod that it takes columns
        assert wait_for(lambda: metric(pipeline["fleet_port"], "ingero_fleet_spool_batches")
                        == 0 and per_node(engine).get("big") == 1, 30), fleetd.log()
        echod.process.send_signal(signal.SIGSTOP)
        for first in range(10_000, 30_000, 4000):
            producer.send(big_push(producer, first, 4000, detail=False))
        producer.push(1000)
        producer.push(999)
        frames = big_push(producer, 100_000, wire.MAX_EVENTS, detail=True)
        assert 3_500_000 < sum(map(len, frames)) < wire.MAX_FRAME_BYTES
        producer.send(frames)
        assert producer.collect_acks(30) == 9, fleetd.log()      # spooled: answered
    finally:
        producer.close()
        time.sleep(2)                     # fleetd sends its window's worth; echod takes none
        fleetd.process.send_signal(signal.SIGSTOP)
        echod.process.send_signal(signal.SIGCONT)
    # fleetd's window (8 batches: each push's columns and its health row) reached echod
    assert wait_for(lambda: per_node(engine).get("big", 0) >= 1 + 16_000, 60), per_node(engine)
    time.sleep(2)                         # echod stores the rest that reached it
    fleetd.process.kill()                 # the acks it never read are lost with it
    fleetd.process.wait()
    again = spawn("fleetd-again", "fleetd", fleetd.argv[3:])
    total = 1 + 20_000 + 1999 + wire.MAX_EVENTS
    assert wait_for(lambda: metric(pipeline["fleet_port"], "ingero_fleet_spool_batches") == 0
                    and per_node(engine).get("big", 0) >= total, 120), \
        (per_node(engine), again.log()[-3000:])
    with engine.connect() as connection:
        counts = connection.execute(text("SELECT count(*), count(DISTINCT id) FROM events "
                                         "WHERE node = 'big'")).one()
    assert tuple(counts) == (total, total), "every event once"
    assert again.alive() and echod.alive()


def fuzz_batch(rnd, seq: int) -> wire.Forward:
    """A batch as fleetd forwards it: rows of events and scores, or pushes of columns."""
    node = f"fuzz{rnd.randrange(20)}"
    first = rnd.randrange(10**6)
    rows = [{"id": f"{node}:b:{first + k}", "t": time.time() - rnd.random() * 60,
             "kind": rnd.choice(["collective", "sync", "alloc", "preempted"]), "node": node,
             "cluster": "fuzz", "boot_id": "b", "job": rnd.choice(["1", "2", None]),
             "attrs": {"rank": rnd.randrange(8), "duration_ns": rnd.randrange(10**6),
                       "bytes": rnd.randrange(2**40), "op": "ncclAllReduce",
                       "comm_hash": "00000000c0ffee00", "seq": k}}
            for k in range(rnd.randrange(1, 30))]
    if rnd.random() < 0.2:
        return wire.ForwardColumns(seq, "fuzz", pushes=[column_push_frames(node, 20)[1]])
    scores = [{"t": time.time(), "cluster": "fuzz", "node": node, "job": None, "boot_id": "b",
               "seq": seq, "score": rnd.random(), "state": "active",
               "signals": {s: 0.9 for s in wire.SIGNALS}}]
    return wire.Forward(seq, "fuzz", rows, scores=scores)


def mutate_row(rnd, batch: wire.Forward) -> wire.Forward:
    """One field of one row made wrong, in a batch that still decodes."""
    if batch.events:
        row = rnd.choice(batch.events)
        target = row["attrs"] if rnd.random() < 0.5 else row
        target[rnd.choice(list(target))] = rnd.choice(GARBAGE)
    return batch


def test_echod_survives_random_and_mutated_batches_and_stores_the_good_ones(pipeline, keys):
    """1,000 batches at echod's ingest socket, as a fleetd gone wrong would send them: well
    formed, a row made wrong, or the frames mangled (bytes flipped, cut short, fields dropped
    or garbage, another version or type, too many frames). echod refuses what it must, stays
    up with its memory bounded, and a batch sent after them all is stored whole."""
    rnd = random.Random(20261130)
    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    curve.connect_curve(socket, curve.load_keypair(keys.fleet_secret),
                        curve.load_public(keys.echod_public))
    socket.connect(pipeline["ingest"])
    pid = pipeline["echod"].process.pid
    acks = 0
    try:
        for seq in range(1000):
            batch = fuzz_batch(rnd, seq)
            frames = wire.encode(mutate_row(rnd, batch) if rnd.random() < 0.3 else batch)
            socket.send_multipart(mutate(rnd, frames) if rnd.random() < 0.4 else frames)
            while socket.poll(0):
                socket.recv_multipart()
                acks += 1
        ack = forward(keys, pipeline["ingest"], wire.Forward(9999, "test", events("after", 25)))
        assert ack.stored == 25 and per_node(pipeline["engine"])["after"] == 25
        while socket.poll(2000):
            socket.recv_multipart()
            acks += 1
    finally:
        socket.close()
        context.term()
    echod = pipeline["echod"]
    assert echod.alive() and acks >= 500, (acks, echod.log()[-3000:])
    assert "Traceback" not in echod.log() and "internal error" not in echod.log(), echod.log()
    with open(f"/proc/{pid}/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    assert peak < 1024 * 1024, f"echod's peak resident memory {peak} KiB"
