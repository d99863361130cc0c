"""fleetd's forwarder keeps every batch within what echod accepts, however pushes arrive."""

from types import SimpleNamespace

import zmq

from fleetd.forward import Forwarder
from fleetd.metrics import FleetMetrics
from ingero import wire

SIG = {"throughput": 1.0, "compute": 1.0, "memory": 1.0, "cpu": 1.0}


def push(seq: int, events: int) -> wire.Push:
    rows = [{"id": f"n:b:{seq}-{i}", "t": 1.8e9, "kind": "k", "attrs": {}} for i in range(events)]
    return wire.Push(seq, "n", "c", "b", 0.9, SIG, "active", 1.8e9, 1.0, None, None, rows)


def test_batches_are_sealed_as_they_fill_between_ticks(tmp_path):
    context = zmq.Context()
    cfg = SimpleNamespace(insecure_plaintext_zmq=True, echod="inproc://echod-forward-test",
                          forward_batch_rows=100, forward_interval=60.0, forward_window=8,
                          forward_resend_after=5.0, spool_dir=tmp_path,
                          spool_max_bytes=64 << 20)
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
