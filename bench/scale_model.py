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
from echod import config as echod_config
from echod.store.chunks import CHUNKED
from echod.store.retention import THINNED
from fleetd import config as fleetd_config

GPUS = 10_000
GPUS_PER_NODE = 8
RANKS_PER_JOB = 64
PUSH_INTERVAL_S = 5.0            # ingerod's default --push-interval
HEADROOM = 0.7                   # of one CPU, what a process is planned to use
ECHOD_DEFAULTS = {s.name: s.default for s in echod_config.SETTINGS}
RETENTION_DAYS = ECHOD_DEFAULTS["retention_days"]
RAW_DAYS = ECHOD_DEFAULTS["raw_days"]
EVIDENCE_S = ECHOD_DEFAULTS["evidence_window"]
# fleetd's default --recompute-interval: a lag row for each rank every recompute
RECOMPUTE_S = next(s.default for s in fleetd_config.SETTINGS if s.name == "recompute_interval")
# An assumption, not a measurement: each job is named once a day, for 10 minutes; its raw
# events from the window before to the window after stay for the whole retention.
VERDICT_S = 600.0
INPUTS = ("trace_overhead", "rank_analysis", "fleet_scale", "ingest_rate", "tool_latency")


def events_per_gpu_s(trace: dict) -> tuple[float, str]:
    """The reference mix: what ingerod saw per rank and second on the first workload of
    trace_overhead (REAL-GPU.md's GPU-bound DDP step, as the sim's PyTorch loop runs it)."""
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
        **event_bytes(results),
        "bytes_call_row": stored["call_stats_bytes"] / max(stored["call_stats_rows"], 1),
        "bytes_lag_row": stored.get("peer_lag_bytes", 0) / max(stored.get("peer_lag_rows", 0), 1),
        "light_agents": light["agents"],
    }


def event_bytes(results: dict) -> dict:
    """Bytes an event takes stored with its indexes: kept a row each (collectives, the rare
    kinds) and kept in chunks (the frequent calls), from what the ingest run stored; both as
    tool_latency's tables where that run did not say."""
    kept = results["ingest_rate"].get("stored_bytes")
    if not kept or not kept["row_events"]:
        stored = results["tool_latency"]
        row = (stored["events_table_bytes"] + stored["events_indexes_bytes"]) / stored["events"]
        return {"bytes_row_event": row, "bytes_chunked_event": row, "bytes_from": "tool_latency"}
    return {"bytes_row_event": kept["rows"] / kept["row_events"],
            "bytes_chunked_event": kept["chunks"] / max(kept["chunked_events"], 1),
            "bytes_from": "ingest_rate"}


def bytes_of(kind: str, c: dict) -> float:
    return c["bytes_chunked_event"] if kind in CHUNKED else c["bytes_row_event"]


def storage(per_gpu: float, mix: dict[str, int], c: dict) -> tuple[list[list[str]], dict]:
    """Bytes a day at GPUS, and held at the retention defaults and with one raw day, by part
    (TB). Summary rows: echod writes one per push, rank and group of calls (kind, op,
    communicator, and for syncs whether they waited on peers); fleetd one lag row per rank
    and recompute."""
    share = {kind: n / sum(mix.values()) for kind, n in mix.items()}
    frequent, rare = (GPUS * per_gpu * 86_400 / 1e12 * sum(
        part * bytes_of(kind, c) for kind, part in share.items() if (kind in THINNED) == thinned)
        for thinned in (True, False))
    evidence = (VERDICT_S + 2 * EVIDENCE_S) / 86_400
    groups = len(mix) + ("sync" in mix)
    around = "raw events around verdicts (assumed: each job named once a day, for 10 min)"
    # part: (TB written a day, days kept at the defaults, days kept with --raw-days 1)
    parts = {
        "raw events of the frequent kinds": (frequent, RAW_DAYS, 1),
        "raw events of the rare kinds (kept whole)": (rare, RETENTION_DAYS, RETENTION_DAYS),
        around: (frequent * evidence, RETENTION_DAYS - RAW_DAYS, RETENTION_DAYS - 1),
        "call summaries (call_stats)": (GPUS * groups / PUSH_INTERVAL_S * 86_400
                                        * c["bytes_call_row"] / 1e12, RETENTION_DAYS,
                                        RETENTION_DAYS),
        "fleetd's lag summaries (peer_lag)": (GPUS / RECOMPUTE_S * 86_400
                                              * c["bytes_lag_row"] / 1e12, RETENTION_DAYS,
                                              RETENTION_DAYS),
    }
    rows = [[name, f"({day:,.2f} of the first)" if name == around else f"{day:,.2f}",
             f"{days} days", f"{day * days:,.1f}", f"{day * short:,.1f}"]
            for name, (day, days, short) in parts.items()]
    held = sum(day * days for day, days, _ in parts.values())
    one_day = sum(day * short for day, _, short in parts.values())
    written = sum(day for name, (day, _, _) in parts.items() if name != around)
    rows.append(["**all**", f"{written:,.2f}", "", f"**{held:,.0f}**", f"**{one_day:,.0f}**"])
    return rows, {"raw_day": frequent + rare, "held": held, "one_day": one_day,
                  "everything": (frequent + rare) * RETENTION_DAYS}


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
    mix_counts = results["trace_overhead"]["workloads"]
    layout, kept = storage(per_gpu, next(iter(mix_counts.values()))["events_per_rank_second"], c)
    day_tb = kept["raw_day"]
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
        f"the events of a real PyTorch DDP step as REAL-GPU.md measured it on an H200, run by "
        f"the sim's PyTorch loop: {per_gpu:,.0f} a second ({mix}): a collective for each of "
        f"its 26 gradient buckets, one loss read, its launches and ~120 asynchronous copies a "
        f"step counted in the kernel. A job with fewer buckets a step makes fewer. In all "
        f"{events / 1e6:,.1f} "
        "million events a second.",
        harness.table(["part", "measured cost", f"CPUs at {GPUS:,} GPUs", "processes"], rows),
        f"Storage: {c['bytes_row_event']:.0f} bytes an event kept a row with its indexes "
        "(collectives and the rare kinds), "
        f"{c['bytes_chunked_event']:.0f} an event kept in a chunk (syncs, allocations, frees "
        f"and copies: echod/chunks.py; both as {c['bytes_from']} stored them), "
        f"{c['bytes_call_row']:.0f} a call-summary row and {c['bytes_lag_row']:.0f} a lag "
        f"row (tool_latency's tables), so {day_tb:,.1f} TB of raw events a day. echod keeps "
        f"everything for --retention-days ({RETENTION_DAYS}) but the raw events of the "
        f"frequent call kinds, which it keeps whole for --raw-days ({RAW_DAYS}) and then only "
        f"within --evidence-window ({EVIDENCE_S:.0f} s) of a verdict (echod(8), Retention). "
        "In TB at this load:",
        harness.table(["part", "written a day", "kept", "held (the defaults)",
                       "held (--raw-days 1)"], layout),
        f"Keeping every raw event for {RETENTION_DAYS} days would hold "
        f"{kept['everything']:,.0f} TB; the defaults hold {kept['held']:,.0f} TB "
        f"({kept['held'] / kept['everything']:.0%}), one raw day {kept['one_day']:,.0f} TB "
        f"({kept['one_day'] / kept['everything']:.0%}). The summaries the tools answer from "
        "are a rounding error beside the raw events; what costs is the raw window. The CPU "
        "above does not change: every event is still checked and written once. Thinning a "
        "day copies what it keeps into a new table and swaps it in; dropping one is dropping "
        "a partition, whatever its size.",
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
        "- **Store less than everything** (built: echod's retention per kind, above; the tools "
        "answer from the call summaries and fleetd's lag summaries where raw events are "
        "thinned, tested end to end in tests/test_retention.py). Storage is what it saves; "
        "the CPU per event it does not. **Chunks** (built: echod/chunks.py) do: the frequent "
        "calls of a push are kept a row per job, rank, kind and minute holding them as arrays "
        "(the view `events` shows them a row each), so PostgreSQL writes a few rows and index "
        "entries a push instead of one an event; the collectives stay a row each, for the "
        "lag survey's lookups by communicator and sequence number, and are now most of "
        "PostgreSQL's work.",
    ])
