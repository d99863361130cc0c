"""fleetd's spool on its own: what a run leaves is read back whole, a bad file is dropped and
counted, and when room runs out (the byte bound, or a real full filesystem) raw events go
first and verdicts last."""

from __future__ import annotations

import os
import subprocess

import pytest

from fleetd.metrics import FleetMetrics
from fleetd.spool import EVENTS, HEALTH, VERDICTS, Spool, encode
from ingero import wire


def batch(seq: int, rows: int, pad: int = 0) -> list[bytes]:
    events = [{"id": f"n:b:{seq}:{i}", "t": 1.8e9, "kind": "k", "attrs": {"pad": "x" * pad}}
              for i in range(rows)]
    return wire.encode(wire.Forward(seq, "test", events=events))


def dropped(metrics: FleetMetrics, cls: str, reason: str) -> float:
    return metrics.registry.get_sample_value("ingero_fleet_spool_dropped_rows_total",
                                             {"class": cls, "reason": reason}) or 0.0


def fill(spool: Spool, cls: int, rows: int, pad: int = 0) -> int | None:
    seq = spool.take_seq()
    entry = spool.add(seq, cls, batch(seq, rows, pad), rows)
    spool.commit()
    return None if entry is None else seq


def test_a_restart_reads_back_every_batch_and_numbers_after_them(tmp_path):
    metrics = FleetMetrics()
    first = Spool(tmp_path, 1 << 20, metrics)
    first.recover()
    kept = [fill(first, cls, 3) for cls in (EVENTS, HEALTH, VERDICTS, EVENTS)]
    first.acknowledged(kept[1])
    (tmp_path / "000000000099.0.batch.tmp").write_bytes(b"half a write")
    (tmp_path / "000000000050.2.batch").write_bytes(b"INGSPOOL1\nnot whole")

    second = Spool(tmp_path, 1 << 20, metrics)
    assert second.recover() == 3
    assert list(second.entries) == [kept[0], kept[2], kept[3]]
    for seq, entry in second.entries.items():
        assert wire.decode(second.frames(entry)).events[0]["id"] == f"n:b:{seq}:0"
        assert entry.rows == 3
    assert second.take_seq() == kept[3] + 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        e.name for e in second.entries.values()), "the torn write and the bad file are gone"
    assert metrics.registry.get_sample_value("ingero_fleet_spool_corrupt_files_total") == 1
    assert metrics.registry.get_sample_value("ingero_fleet_spool_batches") == 3


def test_over_the_bound_events_go_first_and_verdicts_stay(tmp_path):
    metrics = FleetMetrics()
    spool = Spool(tmp_path, int(5.5 * len(encode(batch(0, 10)))), metrics)   # room for 5
    spool.recover()
    events = [fill(spool, EVENTS, 10) for _ in range(3)]
    verdicts = [fill(spool, VERDICTS, 10) for _ in range(4)]
    assert all(verdicts), "verdicts push events out"
    assert [seq in spool.entries for seq in events] == [False, False, True], "oldest first"
    assert dropped(metrics, "events", "full") == 20
    verdicts.append(fill(spool, VERDICTS, 10))
    assert verdicts[-1] is not None and len(spool.entries) == 5
    assert fill(spool, EVENTS, 10) is None, "an events batch never pushes a verdict out"
    assert dropped(metrics, "events", "full") == 40
    assert set(verdicts) <= set(spool.entries)


@pytest.fixture
def tiny_filesystem(tmp_path):
    mount = tmp_path / "spool"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mount)],
                   check=True)
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_filesystem_drops_events_by_priority_and_keeps_verdicts(tiny_filesystem):
    metrics = FleetMetrics()
    spool = Spool(tiny_filesystem, 1 << 30, metrics)   # the bound is far: the disk fills first
    spool.recover()
    for _ in range(300):            # ~800 KB into 256 KB: the oldest events make room
        assert fill(spool, EVENTS, 20, pad=100) is not None
    kept_events = len(spool.entries)
    assert dropped(metrics, "events", "disk_full") == 20 * (300 - kept_events) > 0
    verdicts = [fill(spool, VERDICTS, 20, pad=100) for _ in range(kept_events // 2)]
    assert all(verdicts), "each verdict batch made room by dropping events"
    assert dropped(metrics, "verdicts", "disk_full") == 0
    assert any(e.cls == EVENTS for e in spool.entries.values()), "only as many as needed"
    for entry in spool.entries.values():
        assert wire.decode(spool.frames(entry)).seq == entry.seq
    events = [e for e in spool.entries.values() if e.cls == EVENTS]
    print(f"drill: spool on a full 256 KiB filesystem | produced {300 * 20} event rows, "
          f"{len(verdicts) * 20} verdict rows | kept {sum(e.rows for e in events)} event rows, "
          f"{len(verdicts) * 20} verdict rows | dropped {dropped(metrics, 'events', 'disk_full'):.0f}"
          f" event rows (disk_full), 0 verdict rows")
