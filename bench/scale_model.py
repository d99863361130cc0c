"""Beyond one head node: what this machine measured, scaled to a large cluster by a stated model.

Not a benchmark of its own: ``bench/all.py`` builds this section of docs/benchmarks.md from the
other results, so every figure here is one of theirs multiplied out. The model is linear: each
part of the path costs CPU per event, per push and per job; a cluster makes so many of each a
second; a part needs that many CPUs, split across as many processes as one process can carry
(a Python process gets one CPU; we plan to 70% of it, so that replies do not queue).
"""

from __future__ import annotations

import math

from bench import fleet_scale, harness

GPUS = 10_000
GPUS_PER_NODE = 8
RANKS_PER_JOB = 64
PUSH_INTERVAL_S = 5.0            # ingerod's default --push-interval
HEADROOM = 0.7                   # of one CPU, what a process is planned to use
RETENTION_DAYS = 30              # echod's default --retention-days
INPUTS = ("trace_overhead", "rank_analysis", "fleet_scale", "ingest_rate", "tool_latency")


def events_per_gpu_s(trace: dict) -> tuple[float, str]:
    """The reference mix: what ingerod saw per rank and second on the GPU-bound sim job."""
    name, workload = next(iter(trace["workloads"].items()))
    mix = workload["events_per_rank_second"]
    return float(sum(mix.values())), (f"{workload['job']['step_ms']:g} ms steps ({name}): "
                                      + ", ".join(f"{n} {k}" for k, n in sorted(mix.items())))


def costs(results: dict) -> dict:
    """Per-unit CPU costs (µs) and bytes, from the measured results."""
    jobs = {j["ranks"]: j for j in results["rank_analysis"]["jobs"]}
    analysis = jobs.get(RANKS_PER_JOB) or next(iter(jobs.values()))
    ingest = results["ingest_rate"]["cpu_us_per_event"]
    scale = results["fleet_scale"]
    light = fleet_scale.answered_all(scale) or scale["rows"][0]
    taken_in = analysis["decode_us_per_event"] + analysis["observe_us_per_event"]
    stored = results["tool_latency"]
    return {
        # fleetd, per event: checked, spooled and forwarded (the ingest run), plus what the
        # rank analysis adds (taking it in, and its share of the tick)
        "fleetd_event": ingest["fleetd"] + analysis["observe_us_per_event"]
        + analysis["tick_over_one_second_of_decode"] * analysis["decode_us_per_event"],
        # fleetd, per push: what a small push costs beyond its events (CURVE, cohort, reply)
        "fleetd_push": max(0.0, light["fleetd_cpu_us_per_push"]
                           - light["events_per_push"] * taken_in),
        "echod_event": ingest["echod"],
        "postgres_event": ingest["postgres"],
        "bytes_event": (stored["events_table_bytes"] + stored["events_indexes_bytes"])
        / stored["events"],
        "light_agents": light["agents"],
    }


def processes(cpus: float) -> int:
    return max(1, math.ceil(cpus / HEADROOM))


def section(results: dict) -> str:
    missing = [name for name in INPUTS if name not in results]
    if missing or "cpu_us_per_event" not in results["ingest_rate"] or not any(
            "fleetd_cpu_us_per_push" in r for r in results["fleet_scale"]["rows"]):
        return ("## Beyond one head node (a model from the figures above)\n\nNeeds the full "
                f"results of {', '.join(INPUTS)}; missing or from an older version: "
                f"{', '.join(missing) or 'ingest_rate or fleet_scale'}. Run `make bench`.")
    per_gpu, mix = events_per_gpu_s(results["trace_overhead"])
    c = costs(results)
    events = GPUS * per_gpu
    nodes = GPUS // GPUS_PER_NODE
    fleetd = (events * c["fleetd_event"] + nodes / PUSH_INTERVAL_S * c["fleetd_push"]) / 1e6
    echod, postgres = events * c["echod_event"] / 1e6, events * c["postgres_event"] / 1e6
    per_event_all = c["fleetd_event"] + c["echod_event"] + c["postgres_event"]
    cpus_here = results["ingest_rate"]["measured"]["cpus"]
    gpus_here = cpus_here * 1e6 / (per_gpu * per_event_all)
    day_tb = events * 86_400 * c["bytes_event"] / 1e12
    rows = [
        ["fleetd (checks, rank analysis, spool, forwarding)",
         f"{c['fleetd_event']:.1f} µs an event + {c['fleetd_push']:.0f} µs a push",
         f"{fleetd:,.1f}", f"{processes(fleetd):,}, each owning whole jobs"],
        ["echod ingest (row checks, binary COPY)", f"{c['echod_event']:.1f} µs an event",
         f"{echod:,.1f}", f"{processes(echod):,} writers"],
        ["PostgreSQL (staging, insert, indexes, WAL)", f"{c['postgres_event']:.1f} µs an event",
         f"{postgres:,.1f}", "a server of its own (cores, not processes)"],
    ]
    return "\n\n".join([
        "## Beyond one head node (a model from the figures above)",
        "Built by `bench/all.py` from the results above (bench/scale_model.py); every figure is "
        "a measured per-unit cost of this machine multiplied out. The model is linear: each "
        "part costs CPU per event, per push and per job, a cluster makes so many a second, and "
        "a part needs that many CPUs, split across processes planned to "
        f"{HEADROOM:.0%} of one CPU each (fleetd and echod are Python: one CPU a process).",
        f"Reference load: {GPUS:,} GPUs, {GPUS_PER_NODE} a node ({nodes:,} ingerod agents "
        f"pushing every {PUSH_INTERVAL_S:g} s), in {RANKS_PER_JOB}-rank jobs, each GPU making "
        f"the events of the sim's GPU-bound job: {per_gpu:,.0f} a second ({mix}). That is a "
        f"fast-stepping job; a job with longer steps makes fewer. In all {events / 1e6:,.1f} "
        "million events a second.",
        harness.table(["part", "measured cost", f"CPUs at {GPUS:,} GPUs", "processes"], rows),
        f"Storage: {c['bytes_event']:.0f} bytes an event with its indexes (tool_latency's "
        f"table), so {day_tb:,.1f} TB a day, {day_tb * RETENTION_DAYS:,.0f} TB over echod's "
        f"default {RETENTION_DAYS}-day retention. Dropping a day is detaching and dropping one "
        "partition, whatever its size.",
        f"So one head node like this one ({cpus_here} CPUs, everything on it) keeps every "
        f"event of about {gpus_here:,.0f} GPUs at the reference mix, and one fleetd process "
        f"at {HEADROOM:.0%} of a CPU analyses about "
        f"{HEADROOM * 1e6 / (per_gpu * c['fleetd_event']):,.0f}: every event passes through "
        f"fleetd today. At {GPUS:,} GPUs the path splits as follows.",
        "- **fleetd by job** (built: `fleetd --shard K/N`, `ingerod --fleet A,B,...`; "
        "measured in the fleetd section above and tested end to end in tests/test_shards.py). "
        "The rank analysis never compares two jobs, so jobs are the unit to split: shard K "
        "owns the jobs whose cluster/job hashes to K, and each node-wide ingerod sends a "
        "job's events to the job's owner, with its score (a node runs one to a few jobs, so "
        "it pushes to one to a few shards). Each shard computes a cluster's node bar over the "
        "nodes that push to it.",
        "- **echod writers beside each fleetd** (not built: one echod writes today), each "
        "COPYing into the same partitioned tables. Every row carries its own id and a resent "
        "batch is stored once, so writers need not coordinate.",
        "- **PostgreSQL as a server of its own** (built: `echod --dsn`, tested against a "
        "separately started server in tests/test_external_postgres.py; echod(8) lists what "
        "its role needs), with streaming read replicas for the API (not built: echod has one "
        "DSN). Every tool is a read, and its answer is about one job, so a query's time "
        "depends on the job's size, not the cluster's: the query section above measures one "
        "job.",
        "- **Store less than everything** (not built). At this mix, storing every raw event "
        "is by far the largest cost. fleetd already forwards per-rank lag summaries "
        "(`peer_lag`) and its verdicts, which are small; answering from those and keeping raw "
        "events of only every k-th step would divide the echod, PostgreSQL and storage rows "
        "above by k.",
    ])
