"""fleetd at scale: N agents over the real protocol (CURVE on), one push a second each.

For each N, a fresh fleetd (no echod behind it: this measures fleetd's own path, from a push
off the wire through its checks, the cohort and the rank analysis, to the reply; the ingest
benchmark measures the rest) and a load generator of several processes (``fleet_load.py``),
each holding its share of the agents and pushing on a schedule spread over the second. An
agent is a node of a 64-rank job (8 nodes of 8 ranks): its push carries its ranks' collective
entries and syncs, which fleetd aligns per job. Measured: reply time from send to reply at
the agents (p50, p99), fleetd's CPU share and memory, its recompute time per job, and
whether the generator kept its schedule (it must not be what is measured).

    .venv/bin/python -m bench.fleet_scale [--agents 1000 5000 10000 20000] [--smoke]
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

import numpy as np

from bench import harness
from stack.launch import Daemon, KeyRing, free_port, wait_for
from tests.support import metric

NAME = "fleet_scale"
ROOT_BECAUSE = "tens of thousands of sockets need the hard descriptor limit raised"
TARGET_AGENTS, TARGET_P99_MS = 10_000, 10.0
HERE_AGENTS = 2_000              # what one fleetd must answer within the target on this machine
RANKS_PER_JOB = 64
DESCRIPTOR_MARGIN = 64           # fleetd's own files, sockets and metrics server


def generators(endpoint: str, keys: KeyRing, agents: int, processes: int, seconds: float,
               events: int) -> list[subprocess.Popen]:
    shares = np.array_split(np.arange(agents), processes)
    return [subprocess.Popen(
        [sys.executable, "-m", "bench.fleet_load", endpoint, str(keys.agent_secret),
         str(keys.fleet_public), str(len(share)), str(share[0]), str(agents), str(seconds),
         str(events), str(RANKS_PER_JOB)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        for share in shares if len(share)]


def measure(root: Path, agents: int, args, shards: int = 1) -> dict:
    """One size: ``shards`` fleetds (``--shard K/N``), each agent pushing to its job's owner."""
    keys = KeyRing.create(root / f"keys-{agents}-{shards}")
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(shards)]
    ports = [free_port() for _ in range(shards)]
    fleetds = [Daemon.module(f"fleetd-{agents}-{k}of{shards}", "fleetd", [
        "--config", "/dev/null", "--bind", endpoint, "--shard", f"{k}/{shards}",
        "--metrics-addr", f"127.0.0.1:{port}", *keys.fleetd_flags()], root)
        for k, (endpoint, port) in enumerate(zip(endpoints, ports))]
    try:
        for fleetd in fleetds:
            if not wait_for(lambda: "listening" in fleetd.log(), 60):
                raise RuntimeError(fleetd.log())
        load = generators(",".join(endpoints), keys, agents, args.processes, args.seconds,
                          args.events)
        for process in load:
            line = process.stdout.readline()
            if not line:
                raise RuntimeError(f"a generator stopped before its agents were welcomed:\n"
                                   f"{fleetds[0].log()[-2000:]}")
        pids = [fleetd.process.pid for fleetd in fleetds]
        rss_before = [harness.peak_rss_mib(pid) for pid in pids]
        cpu_before, began = [harness.cpu_seconds(pid) for pid in pids], time.monotonic()
        recompute_before = [(metric(port, "ingero_fleet_recompute_seconds_sum"),
                             metric(port, "ingero_fleet_recompute_seconds_count"))
                            for port in ports]
        for process in load:
            process.stdin.write("go\n")
            process.stdin.flush()
        profiler = (harness.profile(pids[0], args.seconds / 2, root / "profile.txt")
                    if agents == args.profile_at and shards == 1 else None)
        reports = [json.loads(process.communicate(timeout=args.seconds + 120)[0])
                   for process in load]
        wall = time.monotonic() - began
        cpu = [harness.cpu_seconds(pid) - before for pid, before in zip(pids, cpu_before)]
        recompute = [(metric(port, "ingero_fleet_recompute_seconds_sum") - before[0],
                      metric(port, "ingero_fleet_recompute_seconds_count") - before[1])
                     for port, before in zip(ports, recompute_before)]
        peak_rss = [harness.peak_rss_mib(pid) for pid in pids]
        events_accepted = [metric(port, "ingero_fleet_events_accepted_total") for port in ports]
        if profiler is not None and profiler.wait(60):
            raise RuntimeError(f"py-spy failed: {profiler.stderr.read()}")
    finally:
        for fleetd in fleetds:
            fleetd.stop(30)
    latencies = np.concatenate([r["latencies_ms"] for r in reports])
    pushed = sum(r["pushed"] for r in reports)
    jobs = -(-agents // (RANKS_PER_JOB // 8))
    per_shard = [{"cpu_share": round(c / wall, 3),
                  "cpu_us_per_push": round(c / max(e / args.events, 1) * 1e6),
                  "pushes_share": round(e / max(sum(events_accepted), 1), 3),
                  "rss_mib": round(r),
                  "recompute_ms_mean": round(t / max(n, 1) * 1e3, 2)}
                 for c, e, r, (t, n) in zip(cpu, events_accepted, peak_rss, recompute)]
    row = {"agents": agents, "shards": shards, "jobs": jobs, "events_per_push": args.events,
           "pushed": pushed, "answered": int(len(latencies)),
           "reply_ms_p50": round(float(np.percentile(latencies, 50)), 2),
           "reply_ms_p99": round(float(np.percentile(latencies, 99)), 2),
           "reply_ms_max": round(float(latencies.max()), 2),
           "fleetd_cpu_share": round(sum(cpu) / wall, 3),
           "fleetd_cpu_us_per_push": round(sum(cpu) / max(sum(events_accepted) / args.events, 1)
                                           * 1e6),
           "fleetd_rss_mib": {"connected": round(max(rss_before)), "peak": round(max(peak_rss))},
           "events_accepted": int(sum(events_accepted)),
           "recompute_ms_mean": max(s["recompute_ms_mean"] for s in per_shard),
           "recompute_us_per_job": round(sum(t for t, _ in recompute)
                                         / max(max(n for _, n in recompute), 1) / jobs * 1e6, 1),
           "generator_cpu_share": round(sum(r["cpu_s"] for r in reports) / wall, 3),
           "generator_behind_ms_p99": max(r["behind_ms_p99"] for r in reports)}
    if shards > 1:
        row["per_shard"] = per_shard
    if profiler is not None:
        row["profile"] = harness.profile_shares(root / "profile.txt")
    print(f"{agents} agents, {shards} fleetd(s): reply p50 {row['reply_ms_p50']} ms, p99 "
          f"{row['reply_ms_p99']} ms, fleetd {row['fleetd_cpu_share']:.2f} CPU, "
          f"{row['answered']}/{pushed} answered", file=sys.stderr, flush=True)
    return row


def run(args) -> dict:
    if args.smoke:
        args.agents, args.seconds, args.processes, args.profile_at = [200], 5.0, 2, 200
        args.sharded = [200]
    hard = descriptors()
    fits = [n for n in args.agents if n + DESCRIPTOR_MARGIN <= hard]
    skipped = {n: f"fleetd would need more than {n:,} descriptors; the hard limit here is "
               f"{hard:,} and cannot be raised" for n in args.agents if n not in fits}
    with tempfile.TemporaryDirectory(prefix="ingero-fleet-scale-") as tmp:
        return {"seconds": args.seconds, "processes": args.processes, "skipped": skipped,
                "rows": [measure(Path(tmp), n, args) for n in fits],
                "sharded": [measure(Path(tmp), n, args, args.shards) for n in args.sharded
                            if n + DESCRIPTOR_MARGIN <= hard]}


def descriptors() -> int:
    """The hard limit on open files fleetd will get, raised as far as this process may."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = int(Path("/proc/sys/fs/nr_open").read_text())
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, wanted))
        return wanted
    except (ValueError, OSError):
        return hard


def add_arguments(parser) -> None:
    parser.add_argument("--agents", type=int, nargs="+", default=[1000, 2000, 5000, 10000, 20000])
    parser.add_argument("--seconds", type=float, default=20.0, help="pushing time per size")
    parser.add_argument("--processes", type=int, default=4, help="generator processes")
    parser.add_argument("--profile-at", type=int, default=5000, metavar="AGENTS",
                        help="sample fleetd's stacks with py-spy for half the run at this size")
    parser.add_argument("--shards", type=int, default=2,
                        help="fleetd shards (--shard K/N) for the sharded sizes")
    parser.add_argument("--sharded", type=int, nargs="*", default=[5000, 10000],
                        metavar="AGENTS", help="sizes measured again with --shards fleetds")
    parser.add_argument("--events", type=int, default=16,
                        help="events per push (8 ranks: an all-reduce entry and a sync each)")


def at_target(result: dict, agents: int = TARGET_AGENTS) -> dict | None:
    return next((r for r in result["rows"] if r["agents"] == agents), None)


def summary(result: dict) -> str:
    row = at_target(result) or result["rows"][-1]
    split = next((r for r in reversed(result.get("sharded") or [])
                  if r["agents"] == row["agents"]), None)
    here = at_target(result, HERE_AGENTS)
    return (("" if here is None else f"{HERE_AGENTS:,} agents: reply p99 {here['reply_ms_p99']} "
             f"ms (target {TARGET_P99_MS:g} ms on this machine); ")
            + f"{row['agents']:,} agents at a push a second: reply p99 {row['reply_ms_p99']} ms "
            f"(target {TARGET_P99_MS:g} ms at {TARGET_AGENTS:,}), fleetd "
            f"{row['fleetd_cpu_share']:.2f} CPU, {row['fleetd_rss_mib']['peak']} MiB"
            + ("" if split is None else
               f"; over {split['shards']} fleetd shards p99 {split['reply_ms_p99']} ms, "
               f"{split['answered']:,} of {split['pushed']:,} answered, at most "
               f"{max(s['cpu_us_per_push'] for s in split['per_shard'])} µs of CPU a push "
               "each"))


def section(result: dict) -> str:
    rows = [[f"{r['agents']:,}", f"{r['reply_ms_p50']} ms", f"{r['reply_ms_p99']} ms",
             f"{r['answered']:,} of {r['pushed']:,}", f"{r['fleetd_cpu_share']:.2f}",
             f"{r['fleetd_cpu_us_per_push']} µs",
             f"{r['fleetd_rss_mib']['peak']} MiB",
             f"{r['recompute_us_per_job']} µs" if r["recompute_ms_mean"] else
             "none finished",
             f"{r['generator_cpu_share']:.2f} CPU, p99 {r['generator_behind_ms_p99']} ms late"]
            for r in result["rows"]]
    return "\n\n".join([
        "## fleetd at scale: `fleet_scale.py`",
        "For each size a fresh fleetd (CURVE on, no echod behind it: its own path from a push "
        "off the wire to the reply) serves agents from a load generator of "
        f"{result['processes']} processes (`fleet_load.py`), each agent a DEALER socket with "
        "CURVE pushing once a second at its own phase, for "
        f"{result['seconds']:g} s. Each agent is a node of a {RANKS_PER_JOB}-rank job (8 "
        "nodes of 8 ranks); its push carries its ranks' all-reduce entries and syncs, which "
        "fleetd aligns per job. Reply time is measured at the agents, send to reply.",
        harness.table(["agents", "reply p50", "reply p99", "answered", "fleetd CPU",
                       "fleetd CPU per push", "fleetd peak RSS", "recompute per job", "generator"], rows),
        f"Target: {TARGET_AGENTS:,} agents with a reply p99 under {TARGET_P99_MS:g} ms, and "
        f"on this 2-CPU machine {HERE_AGENTS:,} agents within it. The generator shares the "
        "machine with fleetd; its CPU and how late it ran behind its schedule are in the last "
        "column.",
        *([harness.against(f"reply p99 at {HERE_AGENTS:,} agents", row["reply_ms_p99"],
                           TARGET_P99_MS, "ms", False)]
          if (row := at_target(result, HERE_AGENTS)) else []),
        *([harness.against(f"reply p99 at {TARGET_AGENTS:,} agents", row["reply_ms_p99"],
                           TARGET_P99_MS, "ms", False)] if (row := at_target(result)) else []),
        *[f"Not measured: {n} agents, because {why}." for n, why in result["skipped"].items()],
        *bounds(result),
        *sharded(result),
        harness.measured_line(result)])


def bounds(result: dict) -> list[str]:
    """What one fleetd can serve, from its CPU per push below saturation, and its profile."""
    easy = answered_all(result)
    out = []
    if easy:
        per_push = easy["fleetd_cpu_us_per_push"]
        out.append(
            f"What bounds it: fleetd is one Python process, so one CPU, and here it shares two "
            f"with the generator. At {easy['agents']:,} agents, the most it answered in full, "
            f"it spent {per_push} µs of CPU on a push (checking it, the cohort, the rank "
            f"analysis and its tick, CURVE, the reply): one CPU of its own would carry about "
            f"{1e6 / per_push:,.0f} agents pushing once a second, and {TARGET_AGENTS:,} agents "
            f"need {TARGET_AGENTS * per_push / 1e6:.1f} CPUs. Past saturation replies queue and "
            "the p99 is the queue. Splitting jobs across several fleetd processes is what "
            "closes it: measured below (sharded), and scaled at the end of this page.")
    profiled = next((r for r in result["rows"] if r.get("profile")), None)
    if profiled:
        out += [f"Where fleetd's CPU went at {profiled['agents']:,} agents (py-spy, sampling "
                "half the run; a function's share of the busy samples includes what it called):",
                harness.table(["function", "share of samples"], [
                    [f"`{p['function']}`", f"{p['share']:.0%}"] for p in profiled["profile"]])]
        shares = {p["function"].split(" ")[0]: p["share"] for p in profiled["profile"]}
        if "RankAnalysis.tick" in shares and "FleetServer.serve_waiting" in shares:
            out.append(
                "The tick answers the pushes that arrive while it judges "
                "(`serve_waiting`), so its own work, judging the jobs, is "
                f"{shares['RankAnalysis.tick'] - shares['FleetServer.serve_waiting']:.0%} of "
                "the samples; the rest is the path of a push.")
    return out


def sharded(result: dict) -> list[str]:
    """The same load over several fleetds, each owning the jobs that hash to it."""
    rows = result.get("sharded") or []
    if not rows:
        return []
    table = [[f"{r['agents']:,}", str(r["shards"]), f"{r['reply_ms_p50']} ms",
              f"{r['reply_ms_p99']} ms", f"{r['answered']:,} of {r['pushed']:,}",
              " + ".join(f"{s['cpu_share']:.2f}" for s in r["per_shard"]),
              " / ".join(f"{s['cpu_us_per_push']} µs" for s in r["per_shard"]),
              " / ".join(f"{s['pushes_share']:.0%}" for s in r["per_shard"]),
              f"{r['generator_cpu_share']:.2f} CPU"] for r in rows]
    single = {r["agents"]: r for r in result["rows"]}
    out = [
        "### Sharded: several fleetds, each owning whole jobs",
        "The same load over N fleetd processes started with `--shard K/N`; each agent pushes "
        "to the owner of its job (CRC32 of cluster/job modulo N, computed alike by every "
        "node, as `ingerod --fleet A,B,...` does), so each job's rank analysis runs whole in "
        "one process and a node running one job pushes to one shard.",
        harness.table(["agents", "fleetds", "reply p50", "reply p99", "answered",
                       "CPU of each", "CPU per push, each", "pushes, each", "generator"], table)]
    for r in rows:
        worst = max(s["cpu_us_per_push"] for s in r["per_shard"])
        alone = single.get(r["agents"])
        compare = "" if alone is None else (
            f" (one fleetd alone: p99 {alone['reply_ms_p99']} ms, {alone['answered']:,} of "
            f"{alone['pushed']:,} answered, {alone['fleetd_cpu_share']:.2f} CPU)")
        out.append(
            f"At {r['agents']:,} agents over {r['shards']} fleetds{compare}: the pushes split "
            + " / ".join(f"{s['pushes_share']:.0%}" for s in r["per_shard"])
            + f" and each shard spent at most {worst} µs of CPU on a push, so a shard with a "
            f"CPU of its own carries about {1e6 / worst:,.0f} agents, and "
            f"{TARGET_AGENTS:,} agents need {-(-TARGET_AGENTS * worst // 1_000_000):.0f} "
            "shards at full load, or twice that to keep each shard half idle, which is "
            "where replies stay prompt.")
    out.append(
        "What this machine cannot show: the shards and the generator share its 2 CPUs, so "
        "past one CPU of fleetd work adding shards adds no CPU, and the reply time is the "
        "run queue's. The split is what is measured here (each shard's share of the pushes, "
        "and its CPU per push against one fleetd's); on a head node with a CPU per shard the "
        "shards do not contend.")
    return out


def answered_all(result: dict) -> dict | None:
    """The largest size at which fleetd answered every push."""
    full = [r for r in result["rows"] if r["answered"] == r["pushed"]]
    return full[-1] if full else None


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
