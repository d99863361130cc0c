"""The tools that find who is slow: find_stragglers (ranks late into collectives) and
find_outlier_nodes (nodes unhealthy compared with their cohort)."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from ingero.analysis import Bar, lower_bar

from ..registry import ToolContext, obj, tool
from .evidence import (RANK_EVIDENCE_OUT, SIGNAL_NAME, SIGNALS, SIGNALS_OUT, Evidence,
                       gather_evidence, lowest_signal, rank_evidence_json)
from .lag import COVERAGE_OUT, RankLag, Survey, ordered, survey
from .schema import (BOOL, CLUSTER_ARG, DEFAULT_MAX_ENTRIES, INT, JOB_ARG, LIMIT, MAX_ENTRIES,
                     NUM_OR_NULL, SINCE_ARG, STR, STR_OR_NULL, UNTIL_ARG, WINDOW_OUT, array,
                     closed)
from .selection import ms, num, pinned, reading, rows, select
from .verdicts import VERDICTS_OUT, read_verdicts

SCORE_K = 2.0
SCORE_MAD_FLOOR = 0.01                 # fleetd's mad_floor for scores


# -- find_stragglers ---------------------------------------------------------------------------

JOB_BAR_OUT = closed({"cluster": STR, "job": STR, "ranks": INT, "lag_median_ms": NUM_OR_NULL,
                      "lag_mad_ms": NUM_OR_NULL, "bar_ms": NUM_OR_NULL, "stragglers": INT,
                      "judged_by": {"type": "string", "enum": ["fleetd", "events"]}})
RANK_OUT = closed({
    "cluster": STR, "job": STR, "step": STR_OR_NULL, "rank": INT, "node": STR_OR_NULL,
    "samples": INT,
    "lag_median_ms": NUM_OR_NULL, "lag_p95_ms": NUM_OR_NULL, "lag_max_ms": NUM_OR_NULL,
    "last_arrivals": INT, "last_share": NUM_OR_NULL, "idle_caused_gpu_s": NUM_OR_NULL,
    "straggler": BOOL, "over_bar": BOOL, "evidence": RANK_EVIDENCE_OUT})


def job_bars_json(found: Survey) -> list[dict]:
    out = []
    for (cluster, job), bar in sorted(found.bars.items()):
        members = [r for r in found.ranks if (r.cluster, r.job) == (cluster, job)]
        out.append({"cluster": cluster, "job": job, "ranks": len(members),
                    "lag_median_ms": ms(bar.median), "lag_mad_ms": ms(bar.mad),
                    "bar_ms": ms(bar.bar), "stragglers": sum(r.straggler for r in members),
                    "judged_by": "fleetd" if (cluster, job) in found.judged else "events"})
    return out


def rank_json(r: RankLag, found: Survey, evidence: Evidence) -> dict:
    return {"cluster": r.cluster, "job": r.job, "step": r.step, "rank": r.rank, "node": r.node,
            "samples": r.samples, "lag_median_ms": ms(r.lag_median), "lag_p95_ms": ms(r.lag_p95),
            "lag_max_ms": ms(r.lag_max), "last_arrivals": r.last_arrivals,
            "last_share": num(r.last_share, 4),
            "idle_caused_gpu_s": num(r.idle_caused * found.scale, 3),
            "straggler": r.straggler, "over_bar": r.over_bar,
            "evidence": rank_evidence_json(evidence, r)}


@tool("find_stragglers", summary="Ranks ranked by how late they enter collectives, with a robust "
      "bar and the host evidence of each",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "since": SINCE_ARG,
                        "until": UNTIL_ARG, "limit": LIMIT, "max_entries": MAX_ENTRIES}),
      output_schema=closed({"verdicts": VERDICTS_OUT, "notes": VERDICTS_OUT,
                            "ranks": array(RANK_OUT),
                            "jobs": array(JOB_BAR_OUT), "coverage": COVERAGE_OUT,
                            "window": WINDOW_OUT}))
def find_stragglers(ctx: ToolContext, args: dict) -> dict:
    """Which ranks hold the others up, most suspect first. verdicts are fleetd's: ranks it named
    online, live in the window (live first, newest first), each with its kind (persistent;
    periodic, with the period in steps; slow_gpu; hang; died), cause, confidence, severity,
    the collective (op, comm_hash), onset step and time, lag p50/p99 (ms) with every node's
    clock corrected, the share of instances it entered last, its cost (GPU-seconds its peers
    waited for its lateness over the bar since its onset, and USD when fleetd has a rate), a
    fix, findings and evidence. notes are fleetd's too, of ranks late on the host that it did
    not name, severity info and no cost: kind ahead (its peers waited no longer for it since:
    its GPU queue was still ahead of it) or passed_down (it came late only because its GPU
    waited on a peer elsewhere first, a pipeline stage's send or another group's collective;
    the rank that held it up is judged where it was late). ranks is what this
    tool computes from the stored events: for every collective instance that every rank of its
    communicator has entered (same communicator, same sequence number) each rank's entry lag is
    its entry time minus the median entry of its peers there. A job's srun steps run
    processes of their own, each ranked from 0: a rank is one of a step (step: its Slurm step,
    null outside Slurm). Per rank: samples, lag
    median/p95/max (ms), last_arrivals (instances it entered last) and idle_caused_gpu_s
    (GPU-seconds its peers waited for it there). Per job, the bar is fleetd's: median +
    3·1.4826·MAD of the ranks' median lags (MAD floored at 1 ms), or where the median lags
    split in two groups a gap far wider than either's spread apart with at most half above
    it, the middle of that gap, whichever is lower; never under 2 ms nor 5% of the time between
    the job's collectives. over_bar = median lag, less its node's clock uncertainty, above
    the bar (with at least 8 samples). straggler is fleetd's word where fleetd judged the job
    (it wrote its lag summaries, a verdict or a note, or timed the job's nodes from its
    first push/reply exchange: jobs[].judged_by = 'fleetd'): the rank
    is among the verdicts above, whatever over_bar says, for fleetd weighs more than the bar
    (whether the peers' waits grew, whether the lateness was passed down, how recent it is);
    for a job fleetd wrote nothing on (judged_by = 'events'), it is over_bar. Evidence per
    rank: its node's health score in the window (min,
    average, lowest signal: low cpu = host contention, low compute = slow GPU or launch rate,
    low memory = GPU memory pressure), how often fleetd listed its node under the bar, its
    preemptions (and the top preemptor's command) and block I/O. The window defaults to the
    whole job when 'job' is given, else the last hour. Each node's times are put on fleetd's
    clock first (its offset at each time, as fleetd reported it with the node's first score
    at or after it). Past
    'max_entries' (instance, rank) entries, or where retention thinned the raw collectives,
    the lags come from fleetd's per-rank summaries, on its clock (coverage.source =
    'summaries'; a rank's median is the median of its runs' medians weighted by their
    instances, its p95 that of its runs pooled),
    or where there are none every k-th collective is read (coverage.stride is k)."""
    sel = select(ctx, args)
    with reading(ctx) as conn:
        sel = pinned(conn, sel)
        found = survey(conn, sel, args.get("max_entries", DEFAULT_MAX_ENTRIES))
        shown = ordered(found.ranks)[:args.get("limit", 100)]
        evidence = gather_evidence(conn, sel, shown)
        verdicts = read_verdicts(conn, sel, args.get("limit", 100))
        notes = read_verdicts(conn, sel, args.get("limit", 100), notes=True)
    return {"verdicts": verdicts, "notes": notes,
            "ranks": [rank_json(r, found, evidence) for r in shown],
            "jobs": job_bars_json(found), "coverage": found.coverage(),
            "window": sel.window.to_json()}


# -- find_outlier_nodes ------------------------------------------------------------------------

NODE_SCORES = """
SELECT s.cluster, s.job, s.node, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY s.score), min(s.score),
       avg(s.throughput), avg(s.compute), avg(s.memory), avg(s.cpu)
FROM health_scores s WHERE {where}
GROUP BY 1, 2, 3
"""


@tool("find_outlier_nodes", summary="Nodes whose median health score is below the robust bar of "
      "their cohort, with the signal to blame",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "since": SINCE_ARG,
                        "until": UNTIL_ARG}),
      output_schema=closed({
          "outliers": array(closed({
              "cluster": STR, "job": STR_OR_NULL, "node": STR, "samples": INT,
              "score_median": NUM_OR_NULL, "score_min": NUM_OR_NULL, "bar": NUM_OR_NULL,
              "signals": SIGNALS_OUT, "lowest_signal": SIGNAL_NAME,
              "lowest_signal_value": NUM_OR_NULL})),
          "cohorts": array(closed({"cluster": STR, "job": STR_OR_NULL, "nodes": INT,
                                   "median": NUM_OR_NULL, "mad": NUM_OR_NULL,
                                   "bar": NUM_OR_NULL, "outliers": INT})),
          "window": WINDOW_OUT}))
def find_outlier_nodes(ctx: ToolContext, args: dict) -> dict:
    """Nodes that are unhealthy compared with their peers. Per cohort (a job, or a cluster's
    nodes that named no job) each node's median health score over the window is compared with
    the cohort's bar, median − 2·1.4826·MAD of those medians (MAD floored at 0.01); nodes below
    it are outliers, lowest first, with their average signals and the lowest one (low cpu = host
    contention, low compute = slow GPU or launch rate, low memory = GPU memory pressure, low
    throughput = fewer collectives than its own baseline). Scores are in [0, 1], higher is
    healthier. The window defaults to the whole job when 'job' is given, else the last hour."""
    sel = select(ctx, args)
    with reading(ctx) as conn:
        where = pinned(conn, sel).where("s", node=False, rank=False)
        found = rows(conn, NODE_SCORES.format(where=where.sql()), where.params)
    cohorts: dict[tuple, list] = defaultdict(list)
    for row in found:
        cohorts[(row[0], row[1])].append(row)
    outliers, summaries = [], []
    for (cluster, job), members in sorted(cohorts.items(), key=cohort_order):
        bar = lower_bar(np.array([m[4] for m in members]), SCORE_K, SCORE_MAD_FLOOR)
        below = [m for m in members if m[4] < bar.bar]
        summaries.append({"cluster": cluster, "job": job, "nodes": len(members),
                          "median": num(bar.median), "mad": num(bar.mad), "bar": num(bar.bar),
                          "outliers": len(below)})
        outliers += [outlier_json(m, bar) for m in below]
    outliers.sort(key=lambda o: (o["score_median"] if o["score_median"] is not None else 0))
    return {"outliers": outliers, "cohorts": summaries, "window": sel.window.to_json()}


def cohort_order(item: tuple) -> tuple[str, str]:
    (cluster, job), _members = item
    return cluster, job or ""


def outlier_json(row: tuple, bar: Bar) -> dict:
    cluster, job, node, samples, median, low, *signals = row
    named = {s: num(v) for s, v in zip(SIGNALS, signals)}
    signal, value = lowest_signal(named)
    return {"cluster": cluster, "job": job, "node": node, "samples": samples,
            "score_median": num(median), "score_min": num(low), "bar": num(bar.bar),
            "signals": named, "lowest_signal": signal, "lowest_signal_value": value}
