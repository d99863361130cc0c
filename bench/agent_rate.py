"""Does ingerod keep every event of a busy node? A sim job of one 8-rank node calling NCCL and
CUDA at several times the reference mix (the events per rank and second of trace_overhead's
GPU-bound run), traced by a node-wide ingerod as the shipped unit runs it (real uprobes),
pushed to a real fleetd and stored by a real echod. Counted: what the ranks did (their
collectives from their own records, their per-step CUDA calls from the steps they completed),
what the agent says it lost (ring buffer) or dropped (its queue), and what echod stored, per
kind; and the agent's CPU while the job ran.

    .venv/bin/python -m bench.agent_rate [--times 4] [--seconds 20] [--smoke]
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path


from bench import harness
from bench.push_cost import reference_mix
from stack.launch import free_port
from sim import scenario as scenarios
from sim.cluster import Cluster
from sim.records import read_record
from tests.support import metric

NAME = "agent_rate"
ROOT_BECAUSE = "the agent loads eBPF probes (CAP_BPF, CAP_PERFMON)"
TARGET_TIMES = 4                # the bar: 4x the reference mix with nothing lost
JOB_ID = "6100"
MEMCPY_EVERY = 5
STORED = """SELECT kind, count(*) FROM events
WHERE cluster = 'sim' AND job = '{job}' AND kind IN ('collective', 'sync', 'alloc', 'free',
                                                    'memcpy')
GROUP BY kind"""
SETTLE_S = 3.0                  # echod's count unchanged this long: everything is in


def add_arguments(parser) -> None:
    parser.add_argument("--times", type=float, default=TARGET_TIMES,
                        help="the reference mix's event rate times this")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the job runs")
    parser.add_argument("--ranks", type=int, default=8, help="ranks on the node")


SETUP_ALLOCS = 6                # a sim rank's cudaMallocs before its first step (rank.c)


def per_step(steps: int) -> dict[str, int]:
    """The CUDA calls of one sim rank's ``steps`` steps when it syncs every step: a cudaMalloc,
    the loss read's and the step's stream syncs, a cudaFree, and a blocking cudaMemcpy every
    MEMCPY_EVERY steps."""
    return {"sync": 2 * steps, "alloc": steps, "free": steps,
            "memcpy": steps // MEMCPY_EVERY}


def made(records) -> dict[str, int]:
    """What the ranks called, by kind: their collectives as each recorded them, their CUDA
    calls from the steps each completed, and its setup's allocations."""
    out = {"collective": sum(len(r.collectives) for r in records)}
    for record in records:
        for kind, n in per_step(record.summary["steps_done"]).items():
            out[kind] = out.get(kind, 0) + n
    out["alloc"] += SETUP_ALLOCS * len(records)
    return out


def job_for(args, mix: dict[str, int]) -> tuple[dict, float]:
    """The sim job whose ranks call at ``times`` the reference mix: its step is as long as
    the mix's rate makes a step's calls last."""
    calls_per_step = sum(per_step(MEMCPY_EVERY).values()) / MEMCPY_EVERY + 1   # + all-reduce
    rate = args.times * sum(mix.values())                    # events per rank and second
    step_s = calls_per_step / rate
    job = {"nodes": 1, "ranks_per_node": args.ranks, "steps": max(10, round(args.seconds / step_s)),
           "step_ms": round(step_s * 1e3 * 0.5, 3), "kernels": 4, "host_work_ms": 0.1,
           "allreduce_bytes": 1 << 16, "memcpy_every": MEMCPY_EVERY, "loss_every": 1,
           "timeout_s": 120}
    return job, rate


def stored(stack) -> dict[str, int]:
    rows = stack.client().sql(STORED.format(job=JOB_ID))["rows"]
    return {kind: int(n) for kind, n in rows}


def settled(stack, deadline_s: float = 120.0) -> dict[str, int]:
    """echod's counts once they stop growing (fleetd and echod drain what the agent sent)."""
    last, since, give_up = None, time.monotonic(), time.monotonic() + deadline_s
    while time.monotonic() < give_up:
        now = stored(stack)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= SETTLE_S:
            break
        time.sleep(0.5)
    return last or {}


def run(args) -> dict:
    import sim
    from stack.local import Stack

    if args.smoke:
        args.seconds, args.ranks = 3.0, 2
    mix, source = reference_mix()
    job, target_rate = job_for(args, mix)
    scenario = scenarios.parse({"name": "agent-rate", "description": "a busy node",
                                "job": {**job, "job_id": JOB_ID}})
    sim.build()
    root = Path(tempfile.mkdtemp(prefix="ingero-agent-rate-"))
    root.chmod(0o755)                         # the embedded PostgreSQL runs as postgres
    port = free_port()
    try:
        stack = Stack(root, 1, agent_flags=("--metrics-addr", f"127.0.0.1:{port}"),
                      echod_flags=("--drain-seconds", "0"))
        try:
            agent = stack.agents[0].process.pid
            time.sleep(2.0)                   # the agent's own start-up is not the job's
            cpu_before, began = harness.cpu_seconds(agent), time.monotonic()
            with Cluster(scenario, root / "job") as cluster:
                result = cluster.wait()
            wall = time.monotonic() - began
            agent_cpu = harness.cpu_seconds(agent) - cpu_before
            counts = settled(stack)
            lost = {name: int(metric(port, f"ingero_agent_{name}_total"))
                    for name in ("events_lost", "events_dropped", "batches_dropped")}
        finally:
            stack.stop()
        if not result.ok:
            raise RuntimeError(result.describe())
        records = [read_record(r.record_path) for r in result.ranks]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    expected = made(records)
    first = min(r.summary["start_ns"] for r in records)
    last = max(r.summary["end_ns"] for r in records)
    job_s = (last - first) / 1e9
    traced = sum(expected.values())
    return {"times_asked": args.times, "reference_mix": mix, "reference_source": source,
            "ranks": args.ranks, "job": job, "job_s": round(job_s, 2),
            "target_events_per_rank_s": round(target_rate),
            "events_per_rank_s": round(traced / args.ranks / job_s),
            "times_reached": round(traced / args.ranks / job_s / sum(mix.values()), 2),
            "expected": expected, "stored": counts,
            "missing": {kind: n - counts.get(kind, 0) for kind, n in expected.items()},
            "extra": {kind: n - expected.get(kind, 0) for kind, n in counts.items()
                      if n > expected.get(kind, 0)},
            "agent": {**lost, "cpu_share": round(agent_cpu / wall, 3),
                      "cpu_us_per_event": round(agent_cpu / max(traced, 1) * 1e6, 1)}}


def missing(result: dict) -> int:
    """Events the ranks made that echod does not hold."""
    return sum(max(0, n) for n in result["missing"].values())


def kept_all(result: dict) -> bool:
    """Every event stored once: none missing, none twice, none lost or dropped on the way."""
    agent = result["agent"]
    return not (missing(result) or result["extra"] or agent["events_lost"]
                or agent["events_dropped"] or agent["batches_dropped"])


def summary(result: dict) -> str:
    agent = result["agent"]
    return (f"ingerod at {result['times_reached']:g}x the reference mix "
            f"({result['events_per_rank_s']:,} events/s a rank, {result['ranks']} ranks): "
            f"{missing(result):,} of {sum(result['expected'].values()):,} events missing in "
            f"echod ({sum(result['extra'].values()):,} more than made), "
            f"{agent['events_lost']} lost and {agent['events_dropped']} dropped at the "
            f"agent; its CPU {agent['cpu_share']:.2f} ({agent['cpu_us_per_event']} µs an event)")


def section(result: dict) -> str:
    rows = [[kind, f"{n:,}", f"{result['stored'].get(kind, 0):,}",
             f"{result['missing'][kind]:,}"] for kind, n in result["expected"].items()]
    agent = result["agent"]
    reached = result["times_reached"]
    return "\n\n".join([
        "## What a busy node's agent keeps: `agent_rate.py`",
        f"One node of {result['ranks']} sim ranks, for {result['job_s']:g} s, calling at "
        f"{result['times_asked']:g}× the reference mix ({sum(result['reference_mix'].values())}"
        f" events a rank and second, {result['reference_source']}): steps of "
        f"{result['job']['step_ms']} ms of GPU work, each a cudaMalloc, two stream syncs, an "
        "all-reduce, a cudaFree, and a blocking copy every "
        f"{MEMCPY_EVERY} steps. A node-wide ingerod (real uprobes, as the shipped unit runs "
        "it) pushes to a real fleetd, which forwards to a real echod. Expected: the ranks' "
        "collectives from their own records, their CUDA calls from the steps they completed, "
        f"and the {SETUP_ALLOCS} allocations each makes before its first step.",
        harness.table(["kind", "made by the ranks", "stored by echod", "missing"], rows),
        f"The ranks reached {result['events_per_rank_s']:,} events a rank and second "
        f"({reached:g}× the reference mix, asked {result['times_asked']:g}×). At the agent: "
        f"{agent['events_lost']} events lost in the ring buffer, {agent['events_dropped']} "
        f"dropped from its queue, {agent['batches_dropped']} batches dropped. Its CPU while "
        f"the job ran: {agent['cpu_share']:.2f} of one CPU, {agent['cpu_us_per_event']} µs an "
        "event (reading, decoding, tagging, packing and pushing; the probes' own cost lands "
        "in the ranks and is trace_overhead's).",
        (f"Target met: every event stored once at {reached:g}× the reference mix."
         if kept_all(result) else
         f"Target missed: {missing(result):,} events missing in echod, "
         f"{sum(result['extra'].values()):,} stored more than made, {agent['events_lost']} "
         f"lost and {agent['events_dropped']} dropped at the agent."),
        *([] if reached >= TARGET_TIMES else [
            f"The job did not reach {TARGET_TIMES}× here: {result['ranks']} ranks, the agent, "
            "fleetd, echod and PostgreSQL share two CPUs, and the ranks' calls slowed with "
            "the probes."]),
        harness.measured_line(result)])


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
