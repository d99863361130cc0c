"""What fleetd's online rank analysis costs next to what fleetd already pays for a push.

For jobs of 8, 64, 512 and 2,048 ranks (8 ranks a node), every node's push carries a second's worth of
its ranks' collectives and syncs (50 steps a second). Measured in one run, on the same pushes:
checking a push off the wire (``wire.decode``: what fleetd pays for every push anyway), the
analysis taking its events in (``RankAnalysis.observe``), and the analysis's tick over the job
(settle, judge, verdicts: once per recompute, not per push). Reported as ratios, since these
machines are shared and noisy: observe per event over decode per event, and a tick over the
pushes of one second. One rank is late, so the rules do their whole work.
Run: ``.venv/bin/python -m bench.rank_analysis [--json bench/results/rank-analysis.json]``.
"""

from __future__ import annotations

import statistics
import sys
import time
from types import SimpleNamespace


from bench import harness
from fleetd.config import SETTINGS
from fleetd.ranks import RankAnalysis
from ingero import wire

NAME = "rank_analysis"
ROOT_BECAUSE = None
STEPS_PER_S = 50
RANKS_PER_NODE = 8


def pushes_of_one_second(ranks: int, second: int) -> list[wire.Push]:
    """Each node's push: per rank and step, an all-reduce entry and the sync after it."""
    pushes = []
    for node in range(ranks // RANKS_PER_NODE):
        events = []
        for step in range(second * STEPS_PER_S, (second + 1) * STEPS_PER_S):
            for local in range(RANKS_PER_NODE):
                rank = node * RANKS_PER_NODE + local
                t = 1.8e9 + step / STEPS_PER_S + 1e-5 * local + (0.005 if rank == 3 else 0)
                tags = {"rank": rank, "job": "77", "pid": 1000 + rank}
                events.append({"id": f"n{node}:b:{len(events)}", "t": t, "kind": "collective",
                               "attrs": {"op": "ncclAllReduce", "comm_hash": "c0ffee00c0ffee00",
                                         "seq": step, "comm_rank": rank, "nranks": ranks,
                                         "bytes": 1 << 26, **tags}})
                events.append({"id": f"n{node}:b:{len(events)}", "t": t + 0.01, "kind": "sync",
                               "attrs": {"duration_ns": 6_000_000, "peer_wait": False, **tags}})
        sent = 1.8e9 + second                       # the exchange of the push before
        pushes.append(wire.Push(second, f"node{node}", "bench", "b", 0.9,
                                dict.fromkeys(wire.SIGNALS, 1.0), "active", 1.8e9 + second,
                                1.0, None, None, events, [sent, sent, sent, sent + 0.0002]))
    return pushes


def measure(ranks: int, seconds: int) -> dict:
    cfg = SimpleNamespace(**{s.name: s.default for s in SETTINGS})
    analysis = RankAnalysis(cfg)
    decode_s = observe_s = 0.0
    ticks, events = [], 0
    for second in range(seconds):
        frames = [wire.encode(p) for p in pushes_of_one_second(ranks, second)]
        began = time.perf_counter()
        pushes = [wire.decode(f) for f in frames]
        decode_s += time.perf_counter() - began
        began = time.perf_counter()
        for push in pushes:
            analysis.clocks.observe(push.node, push.clock)     # as fleetd does first
            analysis.observe(push, 1.8e9 + second + 1)
        observe_s += time.perf_counter() - began
        events += sum(len(p.events) for p in pushes)
        began = time.perf_counter()
        analysis.tick(1.8e9 + second + 1)
        ticks.append(time.perf_counter() - began)
    named = sorted(v.rank for v in analysis.active())
    return {"ranks": ranks, "events": events, "named": named,
            "decode_us_per_event": round(decode_s / events * 1e6, 3),
            "observe_us_per_event": round(observe_s / events * 1e6, 3),
            "observe_over_decode": round(observe_s / decode_s, 2),
            "tick_ms_median": round(statistics.median(ticks) * 1e3, 2),
            "tick_over_one_second_of_decode": round(
                statistics.median(ticks) / (decode_s / seconds), 3)}


def run(args) -> dict:
    if args.smoke:
        args.ranks, args.seconds = [8, 64], 2
    return {"steps_per_s": STEPS_PER_S, "seconds": args.seconds,
            "jobs": [measure(ranks, args.seconds) for ranks in args.ranks]}


def add_arguments(parser) -> None:
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 512, 2048])
    parser.add_argument("--seconds", type=int, default=6)


def summary(result: dict) -> str:
    largest = result["jobs"][-1]
    return (f"at {largest['ranks']} ranks a tick takes {largest['tick_ms_median']} ms, "
            f"{largest['tick_over_one_second_of_decode']}× the decoding of a second's pushes; "
            f"taking events in costs {largest['observe_over_decode']}× their decoding; late "
            f"rank named in {sum(3 in j['named'] for j in result['jobs'])} of "
            f"{len(result['jobs'])} jobs")


def section(result: dict) -> str:
    rows = [[j["ranks"], f"{j['observe_over_decode']}× ({j['observe_us_per_event']} µs an "
             "event)", f"{j['tick_ms_median']} ms", f"{j['tick_over_one_second_of_decode']}×",
             ", ".join(map(str, j["named"])) or "none"] for j in result["jobs"]]
    return "\n\n".join([
        "## fleetd's online rank analysis: `rank_analysis.py`",
        "What the analysis adds to fleetd, against what fleetd pays anyway for every push "
        "(checking it off the wire, `wire.decode`), on the same pushes in one run: jobs of "
        f"several sizes (8 ranks a node), each node pushing a second's worth of its ranks' "
        f"collectives and syncs ({result['steps_per_s']} steps a second), rank 3 5 ms late so "
        "that the rules run through to a verdict.",
        harness.table(["ranks", "taking a push's events in, over decoding them",
                       "a tick (settle, judge, verdicts)", "tick over one second of decoding",
                       "named"], rows),
        "The tick runs once per recompute (1 s by default) in fleetd's loop; most of it is "
        "numpy over the last 256 instances of each communicator.",
        harness.measured_line(result)])


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
