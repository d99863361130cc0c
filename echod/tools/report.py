"""The tools that sum up: get_cost (what late ranks cost) and job_report (one job, sacct-style)."""

from __future__ import annotations

from sqlalchemy import Connection, text

from ..registry import ToolContext, obj, tool
from .cost import COST_OUT, RATE_ARGS, cost_summary, gpu_rate
from .evidence import Evidence, gather_evidence
from .lag import COVERAGE_OUT, RankLag, Survey, ordered, survey
from .schema import (BOOL, CLUSTER_ARG, DEFAULT_MAX_ENTRIES, INT, INT_OR_NULL, JOB_ARG,
                     MAX_ENTRIES, NUM_OR_NULL, SINCE_ARG, STR, STR_OR_NULL, TIME_OR_NULL,
                     UNTIL_ARG, WINDOW_OUT, array, closed)
from .selection import Selection, iso, job_cluster, ms, num, pinned, reading, rows, select
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
    fleetd's straggler verdicts in the window put on it, when there are any. estimated is true
    when only every k-th collective was read (coverage.stride = k; the totals are scaled by k).
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
JOB_EVENTS = """
SELECT (SELECT count(*) FROM (SELECT 1 FROM events e
                              WHERE e.cluster = :cluster AND e.job = :job LIMIT :cap) counted),
       (SELECT min(e.t) FROM events e WHERE e.cluster = :cluster AND e.job = :job),
       (SELECT max(e.t) FROM events e WHERE e.cluster = :cluster AND e.job = :job)
"""
EVENT_COUNT_CAP = 1_000_000
JOB_NODES = """
SELECT DISTINCT s.node FROM health_scores s WHERE s.cluster = :cluster AND s.job = :job
"""
RANK_SCORES = """
SELECT s.node, avg(s.score) FROM health_scores s
WHERE s.cluster = :cluster AND s.job = :job GROUP BY 1
"""


@tool("job_report", summary="A sacct-style report of one job: where and how long it ran, each "
      "rank's lag and health, the stragglers and their cost",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, **RATE_ARGS,
                        "max_entries": MAX_ENTRIES}, ("job",)),
      output_schema=closed({
          "cluster": STR, "job": STR, "user": STR_OR_NULL, "gpus": INT_OR_NULL,
          "nodes": array(STR), "ranks": INT, "first_event": TIME_OR_NULL,
          "last_event": TIME_OR_NULL, "duration_s": NUM_OR_NULL, "collectives": INT,
          "events": INT, "events_capped": BOOL,
          "per_rank": array(closed({"rank": INT, "node": STR_OR_NULL, "collectives": INT,
                                    "lag_median_ms": NUM_OR_NULL, "score_avg": NUM_OR_NULL,
                                    "straggler": BOOL})),
          "verdicts": VERDICTS_OUT, "top_stragglers": array(RANK_OUT), "cost": COST_OUT,
          "coverage": COVERAGE_OUT}))
def job_report(ctx: ToolContext, args: dict) -> dict:
    """Everything about one job over its whole run: who ran it and on how many GPUs (when the
    jobs table knows), its nodes, ranks, first and last event, duration, collectives and events
    stored (events are counted up to 1,000,000: events_capped says there are more); per rank:
    node, collectives, median entry lag (ms, see find_stragglers), its node's average health
    score and whether it is a straggler; fleetd's verdicts on its ranks (see find_stragglers);
    the stragglers with their evidence; and the cost
    summary of get_cost (usd only with a rate: usd_per_gpu_hour, or gpu + provider). Collectives
    are those compared across ranks (an instance at least 2 ranks entered): past 'max_entries'
    every k-th is read and the counts are k × those read (coverage.stride = k). 404 when the job
    is not in the clusters you may see; 400 when it ran in several of them and no 'cluster'
    says which. Each node's times are put on fleetd's clock first."""
    rate, source = gpu_rate(args)
    with reading(ctx) as conn:
        cluster = job_cluster(conn, args["job"], args.get("cluster"))
        sel = Selection(cluster, args["job"])
        found = survey(conn, sel, args.get("max_entries", DEFAULT_MAX_ENTRIES))
        facts = job_facts(conn, sel)
        stragglers = [r for r in ordered(found.ranks) if r.straggler]
        evidence = gather_evidence(conn, sel, stragglers)
        cost = cost_summary(conn, sel, found, rate, source)
        verdicts = read_verdicts(conn, sel)
    return {**job_json(sel, facts, found, stragglers, evidence, cost), "verdicts": verdicts}


def job_facts(conn: Connection, sel: Selection) -> dict:
    params = {"cluster": sel.cluster, "job": sel.job}
    return {"job": conn.execute(text(JOB_ROW), params).first(),
            "events": conn.execute(text(JOB_EVENTS), {**params, "cap": EVENT_COUNT_CAP}).one(),
            "nodes": [n for (n,) in rows(conn, JOB_NODES, params)],
            "scores": dict(rows(conn, RANK_SCORES, params))}


def job_json(sel: Selection, facts: dict, found: Survey, stragglers: list[RankLag],
             evidence: Evidence, cost: dict) -> dict:
    user, gpus, job_nodes, _start, _end = facts["job"] or (None, None, [], None, None)
    count, first, last = facts["events"]
    lags = {r.rank: r for r in found.ranks}
    ranks = sorted(lags)
    nodes = sorted(set(job_nodes or []) | set(facts["nodes"])
                   | {r.node for r in found.ranks if r.node})
    per_rank = []
    for rank in ranks:
        lag = lags[rank]
        node = lag.node
        per_rank.append({"rank": rank, "node": node,
                         "collectives": lag.samples * found.stride,
                         "lag_median_ms": ms(lag.lag_median),
                         "score_avg": num(facts["scores"].get(node)) if node else None,
                         "straggler": lag.straggler})
    return {"cluster": sel.cluster, "job": sel.job, "user": user, "gpus": gpus, "nodes": nodes,
            "ranks": len(ranks), "first_event": iso(first), "last_event": iso(last),
            "duration_s": num((last - first).total_seconds(), 3) if first and last else None,
            "collectives": sum(r.samples for r in found.ranks) * found.stride,
            "events": count, "events_capped": count >= EVENT_COUNT_CAP,
            "per_rank": per_rank,
            "top_stragglers": [rank_json(r, found, evidence) for r in stragglers[:10]],
            "cost": cost, "coverage": found.coverage()}
