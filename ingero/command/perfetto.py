"""A job as a trace that ui.perfetto.dev (and chrome://tracing) opens: Chrome's trace-event JSON.

One process per node, one thread track per rank in it. A collective is a slice from the rank's
entry to the end of the wait that covered it (its next peer-wait sync), so a late rank shows a
late, short slice and its peers long ones; syncs are slices named for what they waited on;
fleetd's verdicts are instant markers on the straggler's own track (and a slice while they
lasted). The input is echod's ``job_timeline`` answer, clocks already corrected; times here are
microseconds since the job's first slice.
"""

from __future__ import annotations

import bisect
from datetime import datetime

US = 1e6
MIN_US = 1.0


def to_trace(timeline: dict) -> dict:
    """Trace-event JSON for one ``job_timeline`` answer."""
    slices = sorted(timeline["slices"], key=lambda s: s["t"])
    origin = slices[0]["t"] if slices else _first_verdict_time(timeline)
    nodes = _node_pids(timeline)
    events = _metadata(timeline, nodes)
    for rank_slices in _by_rank(slices).values():
        events += _rank_events(rank_slices, nodes, origin)
    for verdict in timeline.get("verdicts") or []:
        events += _verdict_events(verdict, nodes, origin)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"job": timeline["job"], "cluster": timeline["cluster"],
                          "truncated": timeline.get("truncated", False),
                          "origin_unix_s": origin}}


def _node_pids(timeline: dict) -> dict[str, int]:
    names = [n["node"] for n in timeline.get("nodes", [])]
    names += [r["node"] for r in timeline.get("ranks", []) if r["node"] not in names]
    names += sorted({s["node"] for s in timeline["slices"]} - set(names))
    return {name: pid for pid, name in enumerate(names, 1)}


def _metadata(timeline: dict, nodes: dict[str, int]) -> list[dict]:
    events = []
    for name, pid in nodes.items():
        events.append(_meta("process_name", pid, 0, {"name": name}))
        events.append(_meta("process_sort_index", pid, 0, {"sort_index": pid}))
    ranks = {(r["node"], r["rank"]) for r in timeline.get("ranks", [])}
    ranks |= {(s["node"], s["rank"]) for s in timeline["slices"]}
    for node, rank in sorted(ranks, key=lambda nr: nr[1]):
        events.append(_meta("thread_name", nodes[node], rank + 1, {"name": f"rank {rank}"}))
        events.append(_meta("thread_sort_index", nodes[node], rank + 1, {"sort_index": rank}))
    return events


def _meta(name: str, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "ph": "M", "ts": 0, "pid": pid, "tid": tid, "args": args}


def _by_rank(slices: list[dict]) -> dict[int, list[dict]]:
    found: dict[int, list[dict]] = {}
    for s in slices:
        found.setdefault(s["rank"], []).append(s)
    return found


def _rank_events(slices: list[dict], nodes: dict[str, int], origin: float) -> list[dict]:
    """One rank's slices in time order; a collective lasts until its wait ends."""
    events = []
    waits = [s for s in slices if s["kind"] == "sync" and s.get("peer_wait")]
    starts = [w["t"] for w in waits]
    for s in slices:
        start = (s["t"] - origin) * US
        duration = _duration_us(s)
        if s["kind"] == "collective":
            end = _covering_wait_end(s["t"], starts, waits)
            if end is not None:
                duration = max(duration, (end - s["t"]) * US)
        events.append({"name": _name(s), "cat": _category(s), "ph": "X",
                       "ts": round(start, 3), "dur": round(max(duration, MIN_US), 3),
                       "pid": nodes[s["node"]], "tid": s["rank"] + 1, "args": _args(s)})
    return events


def _duration_us(s: dict) -> float:
    return 0.0 if s.get("duration_ms") is None else s["duration_ms"] * 1e3


def _covering_wait_end(t: float, starts: list[float], waits: list[dict]) -> float | None:
    """The end of the first peer-wait sync that starts at or after ``t`` (seconds)."""
    at = bisect.bisect_left(starts, t)
    return None if at == len(waits) else waits[at]["t"] + _duration_us(waits[at]) / US


def _name(s: dict) -> str:
    if s["kind"] == "sync":
        return "wait for peers" if s.get("peer_wait") else "own kernels"
    name = s.get("op") or s["kind"]
    return f"{name} #{s['seq']}" if s["kind"] == "collective" and s.get("seq") is not None \
        else name


def _category(s: dict) -> str:
    if s["kind"] == "sync":
        return "wait" if s.get("peer_wait") else "self_work"
    return s["kind"]


def _args(s: dict) -> dict:
    return {k: s[k] for k in ("op", "comm_hash", "seq", "bytes", "duration_ms")
            if s.get(k) is not None}


def _verdict_events(v: dict, nodes: dict[str, int], origin: float) -> list[dict]:
    """A marker where the verdict's lateness began, and a slice while it lasted."""
    pid = nodes.get(v["node"])
    if pid is None:
        return []
    start = _unix(v.get("onset") or v["raised"])
    name = f"straggler: {v['kind']}, {v['cause']}"
    args = {k: v.get(k) for k in ("op", "lag_p50_ms", "lag_p99_ms", "severity", "period",
                                  "fix", "raised", "cleared") if v.get(k) is not None}
    events = [{"name": name, "cat": "verdict", "ph": "i", "s": "t",
               "ts": round((start - origin) * US, 3), "pid": pid, "tid": v["rank"] + 1,
               "args": args}]
    if v.get("cleared"):
        end = _unix(v["cleared"])
        events.append({"name": name, "cat": "verdict", "ph": "X",
                       "ts": round((start - origin) * US, 3),
                       "dur": round(max((end - start) * US, MIN_US), 3), "pid": pid,
                       "tid": v["rank"] + 1, "args": args})
    return events


def _unix(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def _first_verdict_time(timeline: dict) -> float:
    times = [_unix(v.get("onset") or v["raised"]) for v in timeline.get("verdicts") or []]
    return min(times, default=0.0)
