"""fleetd's CPU for one push, with its events as maps (wire 1.2) and as columns (1.3).

The push is one second of an 8-GPU node at the reference mix (what ingerod traced per rank and
second on the GPU-bound sim job, ``trace_overhead``), its events made as ingerod makes them (a
BPF record decoded by ``ingerod.events.decode``, tagged with the rank's identity). Eight such
nodes make a 64-rank job. Each form goes through fleetd's own code for a push, in one process:
``FleetServer.handle`` (the frame checked off the wire, the cohort, the clock, the rank analysis
taking the events in, the reply) and the forwarder sealing what it accepted into its spool on
disk. As maps: every event checked one by one and forwarded to echod as a row. As columns: the
arrays checked whole, taken in by the analysis a group at a time, and the push's body passed to
echod as it came. CPU time (``time.process_time``), the two forms interleaved over rounds,
medians; the agent's encoding is outside the measurement. The rank analysis's tick is not in a
push's cost (it runs once per recompute: ``rank_analysis``).
Run: ``.venv/bin/python -m bench.push_cost``.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


from bench import harness
from fleetd.config import SETTINGS
from fleetd.forward import Forwarder
from fleetd.server import FleetServer
from ingero import columns, wire
from ingero.settings import load
from ingerod import events as bpf

NAME = "push_cost"
ROOT_BECAUSE = None
RANKS_PER_NODE = 8
NODES = 8
# Per rank and second, when trace_overhead has not run: its GPU-bound mix of the last run.
DEFAULT_MIX = {"sync": 166, "alloc": 88, "collective": 83, "free": 83, "memcpy": 17}
KIND_CODES = {name: code for code, name in bpf.KINDS.items()}
OPS = {"collective": 1, "sync": 40, "alloc": 60, "free": 63, "memcpy": 81}


def reference_mix() -> tuple[dict[str, int], str]:
    """Events per rank and second of the bulk kinds (a job's one-off inits left out)."""
    path = harness.RESULTS / "trace_overhead.json"
    if path.exists():
        name, workload = next(iter(json.loads(path.read_text())["workloads"].items()))
        mix = {k: n for k, n in workload["events_per_rank_second"].items() if k in OPS}
        return mix, f"trace_overhead's {name} run"
    return DEFAULT_MIX, "the default mix (trace_overhead has not run)"


def record(kind: str, rank: int, k: int, second: int) -> dict:
    """One event as ingerod sends it: a BPF record decoded, tagged with its rank's identity."""
    raw = bpf.RawEvent(ts=0, duration=50_000 + k, comm_hash=0xC0FFEE00C0FFEE00,
                       seq=second * 100 + k, count=1 << 24, bytes=1 << 26, stream=0x7F00,
                       addr=0x7F0000000000 + (rank << 20) + k, pid=4000 + rank,
                       tid=4000 + rank, kind=KIND_CODES[kind], op=OPS[kind],
                       rank=rank, nranks=RANKS_PER_NODE * NODES, peer=-1, datatype=7,
                       redop=0, flags=2 if kind == "sync" and k % 2 else 0)
    event = bpf.decode(raw)
    attrs = {key: v for key, v in event.items() if key not in ("kind", "ts_ns")}
    attrs.update(pid=4000 + rank, job="4242", requeue=0, restart=0, rank=rank,
                 local_rank=rank % RANKS_PER_NODE, world_size=RANKS_PER_NODE * NODES)
    return {"kind": event["kind"], "attrs": attrs}


def node_second(node: int, second: int, mix: dict[str, int], base: float = 1.8e9) -> list[dict]:
    """One node's events of its ``second``-th second after ``base`` (unix seconds), in time
    order, with ids as ingerod numbers them."""
    events = []
    for local in range(RANKS_PER_NODE):
        rank = node * RANKS_PER_NODE + local
        for kind, per_s in mix.items():
            for k in range(per_s):
                events.append((k / per_s + 1e-5 * local, record(kind, rank, k, second)))
    events.sort(key=lambda pair: pair[0])
    first = second * len(events)
    return [{"id": f"node{node}:b:{first + n}", "t": base + second + at, **event}
            for n, (at, event) in enumerate(events)]


def frames_of(node: int, second: int, mix: dict[str, int], form: str,
              base: float = 1.8e9) -> list[bytes]:
    """The push of ``node_second``'s events, as maps or columns."""
    events = node_second(node, second, mix, base)
    t = base + second
    fields = (second, f"node{node}", "bench", "b", 0.9, dict.fromkeys(wire.SIGNALS, 1.0),
              "active", t, 1.0, None, None)
    exchange = [t, t, t, t + 0.0002]
    if form == "maps":
        return wire.encode(wire.Push(*fields, events, exchange))
    packed, rest = columns.pack(events)
    return wire.encode(wire.ColumnPush(*fields, rest, exchange, None, packed))


def agent_cost(mix: dict[str, int], form: str, pushes: int = 10) -> float:
    """The agent's CPU to make a push's frames from its events (µs): on the compute node."""
    events = [node_second(0, second, mix) for second in range(pushes)]
    began = time.process_time()
    for second, batch in enumerate(events):
        fields = (second, "node0", "bench", "b", 0.9, dict.fromkeys(wire.SIGNALS, 1.0),
                  "active", 1.8e9 + second, 1.0, None, None)
        if form == "maps":
            wire.encode(wire.Push(*fields, batch))
        else:
            packed, rest = columns.pack(batch)
            wire.encode(wire.ColumnPush(*fields, rest, None, None, packed))
    return (time.process_time() - began) / pushes * 1e6


def measure(form: str, pushes: list[list[bytes]]) -> dict:
    """fleetd's CPU for the pushes (one second's, each), through its own code."""
    spool = Path(tempfile.mkdtemp(prefix="push-cost-"))
    cfg = load(SETTINGS, "FLEETD", None, {
        "echod": "inproc://push-cost", "spool_dir": str(spool), "spool_max_bytes": 8 << 30,
        "insecure_plaintext_zmq": True, "metrics_addr": "none"}, {})
    server = FleetServer(cfg)
    server.forwarder = Forwarder(cfg, server.context, server.metrics)
    server.forwarder.columnar = form == "columns"      # as echod's acks say
    try:
        began = time.process_time()
        for second in pushes:
            for frames in second:
                server.handle(b"agent", frames, time.time())
            server.forwarder.commit()
            for _identity, answer in server.outbox:
                wire.encode(answer)
            server.outbox.clear()
        cpu = time.process_time() - began
        began = time.process_time()
        for second in pushes:
            for frames in second:
                wire.decode(frames)
        decode = time.process_time() - began
        accepted = server.metrics.events._value.get()
        rejected = sum(m._value.get() for m in server.metrics.rejected._metrics.values())
    finally:
        server.forwarder.close()
        server.context.term()
        shutil.rmtree(spool, ignore_errors=True)
    count = sum(len(second) for second in pushes)
    return {"cpu_s": cpu, "decode_s": decode, "pushes": count, "events": accepted,
            "rejected": rejected, "bytes_per_push": statistics.mean(
                len(f[1]) for second in pushes for f in second)}


def run(args) -> dict:
    if args.smoke:
        args.seconds, args.rounds = 1, 1
    mix, source = reference_mix()
    pushes = {form: [[frames_of(node, second, mix, form) for node in range(NODES)]
                     for second in range(args.seconds)] for form in ("maps", "columns")}
    rounds = {"maps": [], "columns": []}
    for _ in range(args.rounds):
        for form in rounds:
            rounds[form].append(measure(form, pushes[form]))
    forms = {}
    for form, results in rounds.items():
        best = sorted(results, key=lambda r: r["cpu_s"])[len(results) // 2]
        forms[form] = {
            "us_per_push": round(best["cpu_s"] / best["pushes"] * 1e6, 1),
            "us_per_event": round(best["cpu_s"] / best["events"] * 1e6, 3),
            "decode_us_per_push": round(best["decode_s"] / best["pushes"] * 1e6, 1),
            "events_per_push": round(best["events"] / best["pushes"]),
            "bytes_per_push": round(best["bytes_per_push"]),
            "rejected": best["rejected"], "rounds_cpu_s": [round(r["cpu_s"], 3)
                                                           for r in results],
            "agent_us_per_push": round(statistics.median(
                agent_cost(mix, form, 2 if args.smoke else 10) for _ in range(args.rounds)), 1)}
    return {"mix": mix, "mix_from": source, "nodes": NODES, "ranks_per_node": RANKS_PER_NODE,
            "seconds": args.seconds, "rounds": args.rounds, "forms": forms,
            "columns_over_maps": round(forms["columns"]["us_per_push"]
                                       / forms["maps"]["us_per_push"], 4),
            "small": [small(events, args.rounds) for events in SMALL]}


SMALL = (16, 64, 128, 256)    # events a push: a node with little traffic, fleet_scale's pushes


def small(events: int, rounds: int) -> dict:
    """Where columns start to pay: pushes of an all-reduce entry and a sync per rank."""
    per = max(1, events // (2 * RANKS_PER_NODE))
    mix = {"collective": per, "sync": per}
    pushes = {form: [[frames_of(node, second, mix, form) for node in range(NODES)]
                     for second in range(10)] for form in ("maps", "columns")}
    cost = {form: [] for form in pushes}
    for _ in range(rounds):
        for form in pushes:
            measured = measure(form, pushes[form])
            cost[form].append(measured["cpu_s"] / measured["pushes"] * 1e6)
    return {"events": 2 * per * RANKS_PER_NODE,
            **{f"{form}_us_per_push": round(statistics.median(c), 1)
               for form, c in cost.items()}}


def add_arguments(parser) -> None:
    parser.add_argument("--seconds", type=int, default=10,
                        help="seconds of the job's pushes (8 nodes' each)")
    parser.add_argument("--rounds", type=int, default=3)


def summary(result: dict) -> str:
    maps, cols = result["forms"]["maps"], result["forms"]["columns"]
    return (f"a push of {cols['events_per_push']:,} events (1 s of an 8-GPU node) costs fleetd "
            f"{cols['us_per_push']:,} µs of CPU as columns, {maps['us_per_push']:,} µs as maps: "
            f"{result['columns_over_maps']}× ({cols['us_per_event']} vs {maps['us_per_event']} "
            "µs an event)")


def section(result: dict) -> str:
    rows = [[form, f"{f['us_per_push']:,} µs", f"{f['us_per_event']} µs",
             f"{f['decode_us_per_push']:,} µs", f"{f['bytes_per_push'] / 1024:,.0f} KiB",
             f"{f['events_per_push']:,}", f['rejected'], f"{f['agent_us_per_push']:,} µs"]
            for form, f in result["forms"].items()]
    mix = ", ".join(f"{n} {k}" for k, n in sorted(result["mix"].items()))
    return "\n\n".join([
        "## fleetd's CPU per push: `push_cost.py`",
        f"One push is one second of an 8-GPU node at the reference mix ({mix} per rank and "
        f"second, from {result['mix_from']}), its events made as ingerod makes them; "
        f"{result['nodes']} such nodes make a {result['nodes'] * result['ranks_per_node']}"
        f"-rank job, {result['seconds']} s of it. Each form goes through fleetd's own code for "
        "a push (`FleetServer.handle`: the checks, the cohort, the clock, the rank analysis "
        "taking the events in, the reply; then the forwarder sealing it into its spool on "
        "disk), in one process; CPU time, the two forms interleaved over "
        f"{result['rounds']} rounds, medians.",
        harness.table(["form", "fleetd CPU a push", "an event", "of which checking it off "
                       "the wire", "size", "events", "rejected", "the agent's CPU to make it"],
                      rows),
        f"Columns cost **{result['columns_over_maps']}×** what maps cost (target: at most "
        "0.1×). As maps, fleetd checks every event as a map and forwards it to echod as a row "
        "of its own; as columns it checks the arrays whole, the rank analysis takes them a "
        "group at a time, and the push's body goes to echod as it came. The agent pays for "
        "that on the compute node (the last column: its events are maps until it packs them; "
        "gathering them as columns from the perf buffers is still to come).",
        "A push of columns pays numpy's cost per call, the same for a few events as for "
        "thousands; small pushes (a collective and a sync per rank) show where columns start "
        "to pay, which is why ingerod sends a push of fewer than 128 events as maps:",
        harness.table(["events a push", "as maps", "as columns"],
                      [[r["events"], f"{r['maps_us_per_push']:,} µs",
                        f"{r['columns_us_per_push']:,} µs"] for r in result.get("small", [])]),
        harness.measured_line(result)])


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
