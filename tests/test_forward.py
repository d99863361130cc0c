"""fleetd's forwarder keeps every batch within what echod accepts, however pushes arrive."""

from types import SimpleNamespace

import zmq

from fleetd.forward import PROBE_SEQ, Forwarder
from fleetd.metrics import FleetMetrics
from ingero import columns, wire
from ingero.framefile import encode as encode_file
from ingero.framefile import write_file

SIG = {"throughput": 1.0, "compute": 1.0, "memory": 1.0, "cpu": 1.0}


def push(seq: int, events: int) -> wire.Push:
    rows = [{"id": f"n:b:{seq}-{i}", "t": 1.8e9, "kind": "k", "attrs": {}} for i in range(events)]
    return wire.Push(seq, "n", "c", "b", 0.9, SIG, "active", 1.8e9, 1.0, None, None, rows)


def test_batches_are_sealed_as_they_fill_between_ticks(tmp_path):
    context = zmq.Context()
    cfg = SimpleNamespace(insecure_plaintext_zmq=True, echod="inproc://echod-forward-test",
                          forward_batch_rows=100, forward_interval=60.0, forward_window=8,
                          forward_resend_after=5.0, spool_dir=tmp_path,
                          spool_max_bytes=64 << 20, forward_batch_bytes=2 << 20)
    forwarder = Forwarder(cfg, context, FleetMetrics())
    try:
        for seq in range(50):  # 50 pushes of 60 events, no tick in between
            forwarder.add_push(push(seq, 60), 1.8e9)
        entries = list(forwarder.spool.entries.values())
        sizes = [entry.rows for entry in entries]
        assert len(sizes) >= 25 and max(sizes) <= 100 + 61
        assert sum(sizes) + forwarder.gathering.rows() == 50 * 61, "no row lost or doubled"
        for entry in entries:
            assert isinstance(wire.decode(forwarder.spool.frames(entry)), wire.Forward)
    finally:
        forwarder.close()
        context.term()


def column_push(seq: int, events: int, detail: bool = False) -> wire.ColumnPush:
    """A push of columns as fleetd decodes it off the wire (its body kept); with a ``detail``
    of 48 characters on each event."""
    rows = [{"id": f"n:b:{seq * 1000 + i}", "t": 1.8e9, "kind": "sync",
             "attrs": {"duration_ns": i, "rank": 1, **({"detail": f"{i:08d}{'y' * 40}"}
                                                        if detail else {})}}
            for i in range(events)]
    sent = wire.ColumnPush(seq, "n", "c", "b", 0.9, SIG, "active", 1.8e9, 1.0, "5", None, [],
                           None, None, columns.encode(rows))
    return wire.decode(wire.encode(sent))


def forwarder_and_echod(tmp_path, name: str):
    context = zmq.Context()
    echod = context.socket(zmq.ROUTER)
    echod.bind(f"inproc://{name}")
    cfg = SimpleNamespace(insecure_plaintext_zmq=True, echod=f"inproc://{name}",
                          forward_batch_rows=1000, forward_interval=60.0, forward_window=8,
                          forward_resend_after=60.0, spool_dir=tmp_path,
                          spool_max_bytes=64 << 20, forward_batch_bytes=2 << 20)
    return context, echod, cfg


def sent(echod) -> list:
    """The batches fleetd has sent and echod not yet read: (identity, batch)."""
    batches = []
    while echod.poll(300):
        identity, *frames = echod.recv_multipart()
        batches.append((identity, wire.decode(frames)))
    return batches


def answer(forwarder, echod, identity, batch, *capabilities) -> None:
    echod.send_multipart([identity, *wire.encode(wire.ForwardAck(
        batch.seq, 0, 0, 0, list(capabilities)))])
    assert forwarder.socket.poll(5000)
    forwarder.receive()


def test_pushes_of_columns_go_as_they_came_to_an_echod_that_takes_them_and_as_rows_after(
        tmp_path):
    """Before echod has said what it takes, one batch of rows at a time, and no batch of
    columns (the spool keeps the pushes' bodies); once it has, the pushes' own bodies; when
    an echod that does not take them answers (a downgrade), the batches of columns still in
    the spool become batches of rows, under the same numbers."""
    context, echod, cfg = forwarder_and_echod(tmp_path, "echod-columns-test")
    forwarder = Forwarder(cfg, context, FleetMetrics())
    try:
        for seq, events in ((0, 10), (1, 7)):       # gathered before echod is heard
            forwarder.add_push(column_push(seq, events), 1.8e9)
            forwarder.commit()
        assert [e.columnar for e in forwarder.spool.entries.values() if e.cls == 0] == [True] * 2
        forwarder.tick(0.0)
        ((identity, first),) = sent(echod)           # one batch in flight until echod is heard
        assert type(first) is wire.Forward and first.scores and not first.events
        answer(forwarder, echod, identity, first, wire.COLUMNS)
        forwarder.tick(0.0)
        batches = {batch.seq: batch for _, batch in sent(echod)}
        columns_sent = [b for b in batches.values() if type(b) is wire.ForwardColumns]
        assert sorted(b.row_count() for b in columns_sent) == [7, 10]
        for batch in batches.values():
            answer(forwarder, echod, identity, batch, wire.COLUMNS)
        assert not forwarder.spool.entries

        pushes = [column_push(seq, 20) for seq in (2, 3)]
        for push in pushes:
            forwarder.add_push(push, 1.8e9)
        forwarder.commit()
        (entry,) = [e for e in forwarder.spool.entries.values() if e.cls == 0]
        batch = wire.decode(forwarder.spool.frames(entry))
        assert type(batch) is wire.ForwardColumns and entry.rows == 40
        assert batch.pushes == [push.body for push in pushes], "the same bytes, not re-encoded"
        pushes.append(column_push(4, 5))
        forwarder.add_push(pushes[-1], 1.8e9)
        forwarder.commit()
        forwarder.tick(0.0)
        waiting = sent(echod)
        health = next(b for _, b in waiting if b.scores)
        answer(forwarder, echod, identity, health)    # an older echod acks another batch
        kept = {e.seq: wire.decode(forwarder.spool.frames(e))
                for e in forwarder.spool.entries.values() if e.cls == 0}
        assert [type(b) for b in kept.values()] == [wire.Forward] * 2
        assert [row for b in kept.values() for row in b.events] == \
            [row for push in pushes for row in push.stored_rows()]
        assert [forwarder.spool.entries[seq].rows for seq in kept] == [40, 5]
    finally:
        forwarder.close()
        echod.close()
        context.term()


def test_after_a_restart_a_spooled_batch_of_columns_waits_for_echods_word_never_going_as_rows(
        tmp_path):
    """echod stored a batch of columns and its ack was lost; fleetd restarted. Sent as rows
    to find out what echod takes, it would be stored twice (as chunks, then as rows): an empty
    batch asks first, and the batch goes as it was, columns, to an echod that takes them; as
    rows only to one that says it does not."""
    for capabilities, form in (([wire.COLUMNS], wire.ForwardColumns), ([], wire.Forward)):
        spool = tmp_path / form.__name__
        context, echod, cfg = forwarder_and_echod(spool, f"echod-restart-{form.__name__}")
        cfg.spool_dir = spool
        before = Forwarder(cfg, context, FleetMetrics())
        before.add_push(column_push(0, 10), 1.8e9)
        before.commit()
        stored = next(seq for seq, e in before.spool.entries.items() if e.columnar)
        before.close()                          # its ack never came: still spooled
        for scores in spool.glob("*.1.batch"):  # the scores' batch was acked (so none asks)
            scores.unlink()
        forwarder = Forwarder(cfg, context, FleetMetrics())
        try:
            assert [e.columnar for e in forwarder.spool.entries.values()] == [True]
            forwarder.tick(0.0)
            ((identity, asked),) = sent(echod)
            assert asked.seq == PROBE_SEQ and asked.row_count() == 0
            forwarder.tick(1.0)
            assert sent(echod) == [], "asked once a resend interval"
            answer(forwarder, echod, identity, asked, *capabilities)
            forwarder.tick(2.0)
            ((_, batch),) = sent(echod)
            assert type(batch) is form and batch.seq == stored and batch.row_count() == 10
        finally:
            forwarder.close()
            echod.close()
            context.term()


def test_a_batch_past_what_echod_takes_is_split_and_a_push_of_columns_alone_goes_as_rows(
        tmp_path):
    """A push of columns (4,096 events, as many as a push may carry, each with a detail) is
    larger alone than a batch may be (64 KiB, the least forward_batch_bytes allows): it is
    spooled as batches of its rows, each within forward_batch_bytes and the row bound, every
    row once. A spool an older fleetd left with a batch past today's bound is read back at
    start, not crashed on."""
    context = zmq.Context()
    cfg = SimpleNamespace(insecure_plaintext_zmq=True, echod="inproc://echod-split-test",
                          forward_batch_rows=2000, forward_interval=60.0, forward_window=8,
                          forward_resend_after=5.0, spool_dir=tmp_path,
                          spool_max_bytes=1 << 30, forward_batch_bytes=64 * 1024)
    forwarder = Forwarder(cfg, context, FleetMetrics())
    try:
        big = column_push(1, wire.MAX_EVENTS, detail=True)
        assert len(big.body) > cfg.forward_batch_bytes
        forwarder.add_push(push(0, 1999), 1.8e9)
        forwarder.add_push(big, 1.8e9)
        forwarder.commit()
        ids = []
        for entry in forwarder.spool.entries.values():
            frames = forwarder.spool.frames(entry)
            assert sum(map(len, frames)) <= cfg.forward_batch_bytes
            batch = wire.decode(frames)
            assert batch.row_count() <= wire.MAX_FORWARD_ROWS
            ids += [row["id"] for row in batch.events]
        assert len(ids) == len(set(ids)) == 1999 + wire.MAX_EVENTS
        assert sum(e.rows for e in forwarder.spool.entries.values()) == \
            1999 + wire.MAX_EVENTS + 2
    finally:
        forwarder.close()
    old = wire.Forward(7, "old", [{"id": f"n:b:{k}", "t": 1.8e9, "kind": "k", "node": "n",
                                   "attrs": {"pad": "x" * 200}} for k in range(19_000)])
    frames = wire.encode(old)
    assert sum(map(len, frames)) > wire.MAX_FRAME_BYTES
    write_file(tmp_path / "000000000099.0.batch", encode_file(frames), sync=False)
    again = Forwarder(cfg, context, FleetMetrics())
    try:
        assert again.spool.entries[99].rows == 19_000
    finally:
        again.close()
        context.term()
