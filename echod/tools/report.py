"""The tools that sum up: get_cost (what late ranks cost) and job_report (one job, sacct-style)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text

from ..registry import ToolContext, obj, tool
from .calltotals import call_totals
from .cost import COST_OUT, RATE_ARGS, cost_summary, gpu_rate, usd
from .evidence import Evidence, gather_evidence
from .lag import COVERAGE_OUT, RankLag, Survey, ordered, survey
from .schema import (BOOL, CLUSTER_ARG, DEFAULT_MAX_ENTRIES, INT, INT_OR_NULL, JOB_ARG,
                     MAX_ENTRIES, NUM_OR_NULL, SINCE_ARG, STR, STR_OR_NULL, TIME_OR_NULL,
                     UNTIL_ARG, WINDOW_OUT, array, closed)
from .explain import peers_median, sync_work
from .selection import (Selection, Where, iso, job_cluster, ms, num, pinned, reading, rows,
                        select, window_of)
from .verdicts import VERDICTS_OUT, read_verdicts
from .stragglers import RANK_OUT, rank_json


# -- get_cost ----------------------------------------------------------------------------------

COST_NOTE = ("idle = for every collective instance, the time each earlier rank waited for the "
             "last one (t_last − t_rank), one GPU per rank; each node's times on fleetd's clock")


@tool("get_cost", summary="GPU time idle at collectives because of late ranks, who caused it, "
      "and what it cost",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "since": SINCE_ARG,
                        "until": UNTIL_ARG, **RATE_ARGS, "max_entries": MAX_ENTRIES}),
      output_schema=closed({**COST_OUT["properties"], "note": STR, "coverage": COVERAGE_OUT,
                            "window": WINDOW_OUT}))
def get_cost(ctx: ToolContext, args: dict) -> dict:
    """What late ranks cost. At every collective instance each rank that arrived before the
    last one sits idle for t_last − t_rank: gpu_seconds_idle sums that over the window, one GPU
    per rank, and by_rank attributes each instance's idle time to the rank that arrived last
    (a tie credits each tied rank; share is of the attributed total). usd = GPU-hours ×
    usd_per_gpu_hour: the explicit rate if given, else the published on-demand rate per
    GPU-hour for gpu + provider (H100-80GB: ec2 12.29, gcp 11.06, lambda 2.49, coreweave 4.25;
    A100-80GB: ec2 4.10, lambda 1.29; for EC2 and GCP the 8-GPU instance's price divided by 8:
    list prices, not your bill), else null (GPU-seconds only). verdicts_gpu_seconds is what
    fleetd's straggler verdicts in the window put on it, when there are any. Past
    'max_entries', or where retention thinned the raw collectives, the idle time comes from
    fleetd's per-rank summaries (coverage.source = 'summaries'); estimated is true when only
    every k-th collective was read (coverage.stride = k; the totals are scaled by k).
    The window defaults to the whole job when 'job' is given, else the last hour. Each node's
    times are put on fleetd's clock first."""
    sel = select(ctx, args)
    rate, source = gpu_rate(args)
    with reading(ctx) as conn:
        sel = pinned(conn, sel)
        found = survey(conn, sel, args.get("max_entries", DEFAULT_MAX_ENTRIES))
        cost = cost_summary(conn, sel, found, rate, source)
    return {**cost, "note": COST_NOTE, "coverage": found.coverage(),
            "window": sel.window.to_json()}


# -- job_report --------------------------------------------------------------------------------

JOB_ROW = """
SELECT j."user", j.gpus, j.nodes, j.start, j."end" FROM jobs j
WHERE j.cluster = :cluster AND j.id = :job
"""
JOB_NODES = """
SELECT DISTINCT s.node FROM health_scores s
WHERE s.cluster = :cluster AND s.job = :job AND {window}
"""
RANK_SCORES = """
SELECT s.node, avg(s.score) FROM health_scores s
WHERE s.cluster = :cluster AND s.job = :job AND {window} GROUP BY 1
"""
# Each rank's Slurm step: the most common one its events carry (every event of a process
# carries it), among its communicator set-ups (few, and kept whole by retention), or where a
# rank has none in the window (its agent started later), among the first STEP_SAMPLE
# collectives read.
JOB_STEPS = """
SELECT s.rank, mode() WITHIN GROUP (ORDER BY s.step)
FROM (SELECT e.rank, e.attrs ->> 'step' AS step FROM events e
      WHERE e.cluster = :cluster AND e.job = :job AND e.rank IS NOT NULL
        AND e.kind = :kind AND e.attrs ->> 'step' IS NOT NULL AND {window}
      LIMIT :sample) s
GROUP BY 1
"""
STEP_SAMPLE = 200_000

PER_RANK_OUT = closed({
    "rank": INT, "node": STR_OR_NULL, "step": STR_OR_NULL, "collectives": INT,
    "lag_median_ms": NUM_OR_NULL, "lag_p99_ms": NUM_OR_NULL, "last_share": NUM_OR_NULL,
    "self_work_ms": NUM_OR_NULL, "peers_self_work_ms": NUM_OR_NULL,
    "score_avg": NUM_OR_NULL, "straggler": BOOL, "over_bar": BOOL, "verdict": STR_OR_NULL,
    "note": STR_OR_NULL, "cause": STR_OR_NULL, "cost_gpu_seconds": NUM_OR_NULL,
    "cost_usd": NUM_OR_NULL})


@tool("job_report", summary="A sacct-style report of one job: where and how long it ran, each "
      "rank's lag and health, the stragglers and their cost",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "since": SINCE_ARG,
                        "until": UNTIL_ARG, **RATE_ARGS, "max_entries": MAX_ENTRIES}, ("job",)),
      output_schema=closed({
          "cluster": STR, "job": STR, "user": STR_OR_NULL, "gpus": INT_OR_NULL,
          "nodes": array(STR), "ranks": INT, "start": TIME_OR_NULL, "end": TIME_OR_NULL,
          "first_event": TIME_OR_NULL, "last_event": TIME_OR_NULL,
          "duration_s": NUM_OR_NULL, "collectives": INT, "events": INT, "events_capped": BOOL,
          "per_rank": array(PER_RANK_OUT), "verdicts": VERDICTS_OUT, "notes": VERDICTS_OUT,
          "top_stragglers": array(RANK_OUT), "cost": COST_OUT, "coverage": COVERAGE_OUT,
          "window": WINDOW_OUT}))
def job_report(ctx: ToolContext, args: dict) -> dict:
    """Everything about one job, over its whole run or over since/until (everything but the
    jobs table's row is measured in that window): who ran it and on how many GPUs, its start
    and end (when the jobs table knows), its nodes, ranks, first and last event, duration,
    collectives and events traced (every one, from the per-minute summaries; events_capped is
    false, kept for older readers); per rank of each Slurm step (each srun step runs ranks of
    its own, ranked from 0, each measured against its own step's ranks): its step, node,
    collectives, median and 99th-percentile entry lag (ms, see find_stragglers), last_share
    (the share of its collectives it entered last), self_work_ms (its median sync on its own
    kernels, peer_wait false) against peers_self_work_ms (the median of the other ranks'
    medians), its node's average health score, whether it is a straggler (fleetd's word
    where it judged the job, else the stored events': see find_stragglers) and whether its
    median lag is over the job's bar by the stored events (over_bar), fleetd's verdict on it
    (the kind of a live one, else of its newest) and its cause, fleetd's note on it where it
    did not name it (ahead, passed_down: see find_stragglers), and cost_gpu_seconds, the time
    its peers waited for it where it came last (cost_usd with the rate: usd_per_gpu_hour, or
    gpu + provider, else the rate fleetd priced its verdicts on the job with); fleetd's
    verdicts and notes on its ranks (see find_stragglers); the
    stragglers with their evidence; and the cost summary of get_cost. Collectives are those
    compared across ranks (an instance at least 2 ranks entered): past 'max_entries', or where
    retention thinned the raw collectives, the lags come from fleetd's per-rank summaries
    (coverage.source = 'summaries'), or where there are none every k-th is read and the
    counts are k × those read (coverage.stride = k). 404 when the job is
    not in the clusters you may see; 400 when it ran in several of them and no 'cluster' says
    which. Each node's times are put on fleetd's clock first."""
    rate, source = gpu_rate(args)
    with reading(ctx) as conn:
        cluster = job_cluster(conn, args["job"], args.get("cluster"))
        sel = Selection(cluster, args["job"], window=window_of(ctx, args, whole_job=True))
        found = survey(conn, sel, args.get("max_entries", DEFAULT_MAX_ENTRIES))
        facts = job_facts(conn, sel, {r.rank for r in found.ranks})
        stragglers = [r for r in ordered(found.ranks) if r.straggler]
        evidence = gather_evidence(conn, sel, stragglers)
        verdicts = read_verdicts(conn, sel)
        notes = read_verdicts(conn, sel, notes=True)
        if rate is None and (rate := verdict_rate(verdicts)) is not None:
            source = "fleetd's verdicts"
        cost = cost_summary(conn, sel, found, rate, source)
    return {**job_json(sel, facts, found, stragglers, evidence, cost, verdicts, notes),
            "verdicts": verdicts, "notes": notes, "window": sel.window.to_json()}


def verdict_rate(verdicts: list[dict]) -> float | None:
    """The USD per GPU-hour fleetd priced its verdicts with, when it had a rate."""
    for v in verdicts:
        if v["cost_usd"] is not None and v["cost_gpu_seconds"]:
            return round(v["cost_usd"] / v["cost_gpu_seconds"] * 3600.0, 4)
    return None


def job_facts(conn: Connection, sel: Selection, ranks: set[int]) -> dict:
    """What job_report says beside the lags (of ``ranks``), all of it measured in the window
    but the jobs table's row."""
    params = {"cluster": sel.cluster, "job": sel.job}
    scores = Where().within("s.t", sel.window)
    return {"job": conn.execute(text(JOB_ROW), params).first(),
            "events": job_events(conn, sel),
            "nodes": [n for (n,) in rows(conn, JOB_NODES.format(window=scores.sql()),
                                         {**params, **scores.params})],
            "scores": dict(rows(conn, RANK_SCORES.format(window=scores.sql()),
                                {**params, **scores.params})),
            "steps": job_steps(conn, sel, params, ranks),
            "work": sync_work(conn, sel)}


def job_events(conn: Connection, sel: Selection) -> tuple[int, datetime | None, datetime | None]:
    """How many events the job's ranks and nodes made in the window, the first and the last:
    from the per-minute summaries (every event, whatever retention kept of the raw ones)."""
    totals = call_totals(conn, sel, None, ("job",), node=False, rank=False,
                         durations=False).values()
    firsts = [t.first for t in totals if t.first is not None]
    lasts = [t.last for t in totals if t.last is not None]
    return (sum(t.calls for t in totals), min(firsts, default=None), max(lasts, default=None))


def job_steps(conn: Connection, sel: Selection, params: dict, ranks: set[int]
              ) -> dict[int, str]:
    """Each rank's Slurm step (see JOB_STEPS)."""
    events = Where().within("e.t", sel.window)
    steps: dict[int, str] = {}
    for kind in ("comm_init", "collective"):
        if steps and ranks <= steps.keys():
            break
        for rank, step in rows(conn, JOB_STEPS.format(window=events.sql()),
                               {**params, **events.params, "kind": kind,
                                "sample": STEP_SAMPLE}):
            steps.setdefault(rank, step)
    return steps


def job_json(sel: Selection, facts: dict, found: Survey, stragglers: list[RankLag],
             evidence: Evidence, cost: dict, verdicts: list[dict], notes: list[dict]) -> dict:
    user, gpus, job_nodes, start, end = facts["job"] or (None, None, [], None, None)
    count, first, last = facts["events"]
    nodes = sorted(set(job_nodes or []) | set(facts["nodes"])
                   | {r.node for r in found.ranks if r.node})
    per_rank = []
    for lag in sorted(found.ranks, key=lambda r: (step_order(r.step), r.rank)):
        note = matching(notes, lag)
        per_rank.append(rank_row(lag, found, facts, matching(verdicts, lag),
                                 note and note["kind"], cost["usd_per_gpu_hour"]))
    return {"cluster": sel.cluster, "job": sel.job, "user": user, "gpus": gpus, "nodes": nodes,
            "ranks": len({r.rank for r in found.ranks}), "start": iso(start), "end": iso(end),
            "first_event": iso(first), "last_event": iso(last),
            "duration_s": num((last - first).total_seconds(), 3) if first and last else None,
            "collectives": sum(r.samples for r in found.ranks) * found.stride,
            "events": count, "events_capped": False,
            "per_rank": per_rank,
            "top_stragglers": [rank_json(r, found, evidence) for r in stragglers[:10]],
            "cost": cost, "coverage": found.coverage()}


def step_order(step: str | None) -> tuple:
    """A Slurm step as it sorts: none first, then by number (0, 1, ... 10), then by name
    (batch, extern)."""
    if step is None:
        return (0, 0, "")
    return (1, int(step), "") if step.isdigit() else (2, 0, step)


def matching(verdicts: list[dict], lag: RankLag) -> dict | None:
    """fleetd's verdict (or note) on this rank of this step: the first of ``verdicts`` (live
    first, newest first) on the rank in the step of the run fleetd judged (its evidence's
    run); a verdict or a rank that knows no step (a fleetd before steps were told, a job
    outside Slurm) matches any."""
    for verdict in verdicts:
        step = ((verdict.get("evidence") or {}).get("run") or {}).get("step")
        if verdict["rank"] == lag.rank and (step is None or lag.step is None
                                            or str(step) == lag.step):
            return verdict
    return None


def rank_row(lag: RankLag, found: Survey, facts: dict, verdict: dict | None, note: str | None,
             rate: float | None) -> dict:
    work = facts["work"]
    own = work.get(lag.rank)
    caused = lag.idle_caused * found.scale
    return {"rank": lag.rank, "node": lag.node,
            "step": lag.step if lag.step is not None else facts["steps"].get(lag.rank),
            "collectives": lag.samples * found.stride, "lag_median_ms": ms(lag.lag_median),
            "lag_p99_ms": ms(lag.lag_p99),
            "last_share": num(lag.last_share, 4),
            "self_work_ms": num(own.self_median_ms, 3) if own else None,
            "peers_self_work_ms": num(peers_median(
                [w.self_median_ms for r, w in work.items() if r != lag.rank]), 3),
            "score_avg": num(facts["scores"].get(lag.node)) if lag.node else None,
            "straggler": lag.straggler, "over_bar": lag.over_bar,
            "verdict": verdict["kind"] if verdict else None, "note": note,
            "cause": verdict["cause"] if verdict else None,
            "cost_gpu_seconds": num(caused, 3), "cost_usd": usd(caused, rate)}
