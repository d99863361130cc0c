"""The Perfetto export on a timeline made by hand: the trace-event shape, the tracks, a
collective lasting until its wait ends, the verdict on the straggler's own track."""

from __future__ import annotations

import json

from ingero.command.perfetto import to_trace

T0 = 1_764_000_000.0


def slice_(rank, node, kind, t, duration_ms=None, **fields):
    return {"rank": rank, "node": node, "kind": kind, "op": fields.get("op"),
            "comm_hash": fields.get("comm_hash"), "seq": fields.get("seq"), "t": t,
            "duration_ms": duration_ms, "peer_wait": fields.get("peer_wait"),
            "bytes": fields.get("bytes")}


TIMELINE = {
    "cluster": "sim", "job": "42",
    "nodes": [{"node": "a", "clock_offset_ms": 0.0}, {"node": "b", "clock_offset_ms": 250.0}],
    "ranks": [{"rank": 0, "node": "a"}, {"rank": 1, "node": "b"}],
    "slices": [
        slice_(0, "a", "collective", T0, 0.01, op="ncclAllReduce", seq=7, comm_hash="ab",
               bytes=4096),
        slice_(0, "a", "sync", T0 + 0.001, 299.0, peer_wait=True, op="cudaStreamSynchronize"),
        slice_(1, "b", "collective", T0 + 0.290, 0.01, op="ncclAllReduce", seq=7,
               comm_hash="ab", bytes=4096),
        slice_(1, "b", "sync", T0 + 0.291, 9.0, peer_wait=True, op="cudaStreamSynchronize"),
        slice_(1, "b", "sync", T0 + 0.320, 5.0, peer_wait=False, op="cudaStreamSynchronize"),
    ],
    "truncated": False,
    "verdicts": [{"rank": 1, "node": "b", "kind": "persistent", "cause": "host_work",
                  "op": "ncclAllReduce", "raised": "2025-11-24T16:00:02+00:00",
                  "onset": "2025-11-24T16:00:00.290000+00:00",
                  "cleared": "2025-11-24T16:00:10+00:00", "lag_p50_ms": 290.0,
                  "lag_p99_ms": 295.0, "severity": "critical", "fix": "profile", "period": None}],
}


def test_every_event_has_the_required_fields_and_the_json_is_plain():
    trace = json.loads(json.dumps(to_trace(TIMELINE), allow_nan=False))
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"]["job"] == "42"
    for e in trace["traceEvents"]:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(e)
        if e["ph"] == "X":
            assert e["dur"] > 0


def test_a_process_per_node_and_a_track_per_rank_in_it():
    events = to_trace(TIMELINE)["traceEvents"]
    processes = {e["args"]["name"]: e["pid"] for e in events if e["name"] == "process_name"}
    threads = {e["args"]["name"]: (e["pid"], e["tid"]) for e in events
               if e["name"] == "thread_name"}
    assert set(processes) == {"a", "b"}
    assert threads == {"rank 0": (processes["a"], 1), "rank 1": (processes["b"], 2)}


def test_a_collective_lasts_until_the_wait_that_covers_it_ends():
    events = to_trace(TIMELINE)["traceEvents"]
    early, late = (e for e in events if e.get("cat") == "collective")
    assert early["name"] == "ncclAllReduce #7" and early["ts"] == 0
    assert abs(early["dur"] - 300_000) < 1          # its peer waited 299 ms from 1 ms in
    assert abs(late["ts"] - 290_000) < 1 and abs(late["dur"] - 10_000) < 1
    names = {e["name"] for e in events if e["ph"] == "X"}
    assert {"wait for peers", "own kernels"} <= names


def test_the_verdict_marker_is_on_the_straggler_s_track_at_its_onset():
    events = to_trace(TIMELINE)["traceEvents"]
    threads = {e["args"]["name"]: (e["pid"], e["tid"]) for e in events
               if e["name"] == "thread_name"}
    marker = next(e for e in events if e["ph"] == "i")
    assert (marker["pid"], marker["tid"]) == threads["rank 1"]
    assert marker["name"] == "straggler: persistent, host_work"
    assert abs(marker["ts"] - 290_000) < 1
    span = next(e for e in events if e["ph"] == "X" and e["cat"] == "verdict")
    assert span["ts"] == marker["ts"] and abs(span["dur"] - 9_710_000) < 1
