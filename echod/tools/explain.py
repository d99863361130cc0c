"""The explain tool: one rank's lateness, its cause and the evidence for it."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np
from sqlalchemy import Connection, text

from ingero.analysis import Bar
from ingero.analysis.causes import CAUSES

from ..registry import ToolContext, ToolError, obj, tool
from .calltotals import call_totals
from .diagnosis import Facts, SyncWork, diagnose
from .evidence import (SIGNAL_NAME, SIGNALS_OUT, Evidence, HostEvidence, NodeHealth,
                       gather_evidence, lowest_signal)
from .lag import COVERAGE_OUT, RankLag, Survey, survey
from .schema import (BOOL, CLUSTER_ARG, DEFAULT_MAX_ENTRIES, INT, JOB_ARG, MAX_ENTRIES,
                     NUM_OR_NULL, RANK, SINCE_ARG, STR, STR_OR_NULL, UNTIL_ARG,
                     WINDOW_OUT, array, closed, described, nullable)
from .selection import Selection, job_cluster, ms, num, reading, select
from .verdicts import VERDICT_OUT, read_verdicts

RANK_EXISTS = """
SELECT EXISTS (SELECT 1 FROM events e
               WHERE e.cluster = :cluster AND e.job = :job AND e.rank = :rank)
"""


def sync_work(conn: Connection, sel: Selection) -> dict[int, SyncWork]:
    """Per rank, its timed syncs in the selection: self-work (peer_wait false or absent) and
    peer-wait, counted and summed, with the median self-work sync (from the per-minute
    summaries: within a histogram bucket, 2.2%)."""
    work: dict[int, SyncWork] = defaultdict(SyncWork)
    for (rank, peer_wait), calls in call_totals(conn, sel, ("sync",), ("rank", "peer_wait"),
                                                node=False, rank=False).items():
        if rank is None or not calls.timed:
            continue
        if peer_wait:
            work[rank].wait_calls, work[rank].wait_ns = calls.timed, calls.duration_ns
        else:
            work[rank].self_calls, work[rank].self_ns = calls.timed, calls.duration_ns
            work[rank].self_median_ns = calls.durations.quantile(0.5)
    return work


def peers_median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def latest_verdict(conn: Connection, sel: Selection, rank: int,
                   notes: bool = False) -> dict | None:
    """fleetd's verdict on the rank in the window: a live one, else the latest; with
    ``notes``, its note on it instead (late on the host, not named)."""
    found = read_verdicts(conn, replace(sel, rank=rank), limit=1, notes=notes)
    return found[0] if found else None


LAG_EVIDENCE_OUT = closed({
    "samples": INT, "lag_median_ms": NUM_OR_NULL, "lag_p95_ms": NUM_OR_NULL,
    "lag_max_ms": NUM_OR_NULL, "peers_lag_median_ms": NUM_OR_NULL, "bar_ms": NUM_OR_NULL,
    "straggler": BOOL, "over_bar": BOOL, "last_arrivals": INT,
    "idle_caused_gpu_s": NUM_OR_NULL})
EXPLAIN_OUT = closed({
    "cluster": STR, "job": STR, "rank": INT, "node": STR_OR_NULL,
    "cause": {"type": "string", "enum": list(CAUSES)},
    "confidence": {"type": "string", "enum": ["high", "medium", "low"]},
    "fix": STR_OR_NULL, "findings": array(STR),
    "evidence": closed({
        "lag": nullable(LAG_EVIDENCE_OUT),
        "preemptions": closed({"total": INT,
                               "by": array(closed({"comm": STR, "count": INT}))}),
        "blockio": closed({"requests": INT, "bytes": INT, "heavy": BOOL}),
        "health": closed({"samples": INT, "score_min": NUM_OR_NULL, "score_avg": NUM_OR_NULL,
                          "signals": SIGNALS_OUT, "lowest_signal": SIGNAL_NAME,
                          "lowest_signal_value": NUM_OR_NULL, "threshold_listings": INT}),
        "sync": closed({"self_work_calls": INT, "self_work_ms_avg": NUM_OR_NULL,
                        "peer_wait_calls": INT, "peer_wait_ms_avg": NUM_OR_NULL,
                        "peers_self_work_ms_median": NUM_OR_NULL,
                        "peers_peer_wait_ms_median": NUM_OR_NULL}),
        "verdict": nullable(VERDICT_OUT)}),
    "coverage": COVERAGE_OUT, "window": WINDOW_OUT})


@tool("explain", summary="Why one rank is late: the cause, how sure, the fix, and the evidence",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG,
                        "rank": described(RANK, "The rank (the process's global rank)."),
                        "since": SINCE_ARG, "until": UNTIL_ARG, "max_entries": MAX_ENTRIES},
                       ("job", "rank")),
      output_schema=EXPLAIN_OUT)
def explain(ctx: ToolContext, args: dict) -> dict:
    """The cause of one rank's lateness and its evidence. When fleetd named the rank a
    straggler in the window (its verdicts are judged online with every node's clock corrected:
    see find_stragglers), its verdict gives the cause, confidence and fix, and its findings
    come first; its causes add allocation (slow GPU allocations), hang (it never entered a
    collective its peers entered) and died (its process exited while they waited). Otherwise
    the same cause rules run on the stored evidence, strongest first: host_preemption (other
    processes preempted it often: not its own threads; or, weaker, a low cpu signal), slow_gpu
    (its syncs on its own kernels take 1.3 times its peers' or more; or, weaker, a low compute
    signal), io (heavy block I/O by it and its workers), memory_pressure (low GPU memory headroom),
    network_or_peer (it waits in collectives much longer than its peers: the delay comes from
    elsewhere), host_work (late with none of these: its own host code, such as data loading,
    Python or garbage collection); none when it is not late (its median entry lag is under the
    job's bar; see find_stragglers) or fleetd judged the job and did not name it (its note
    says why, where it wrote one: its lateness cost nobody, or was passed down), unknown when
    none of its collectives could be compared.
    confidence is high, medium or low; fix is one line to try. Evidence: its lag against its
    peers (the bar is fleetd's; see find_stragglers), preemptions by
    command, block I/O, its node's health score and signals, sync self-work against
    peer-wait, and fleetd's verdict when there is one. 404 when the job is not in the
    clusters you may see or has no such rank (a rank that took part in none of its compared
    collectives); 400 when the job ran in several of them and no 'cluster' says which. The
    window defaults to the whole job. Each node's times are put on fleetd's clock first."""
    rank = args["rank"]
    with reading(ctx) as conn:
        cluster = job_cluster(conn, args["job"], args.get("cluster"))
        sel = replace(select(ctx, args), cluster=cluster)
        found = survey(conn, sel, args.get("max_entries", DEFAULT_MAX_ENTRIES))
        lag = found.rank(cluster, sel.job, rank)
        verdict = latest_verdict(conn, sel, rank)
        note = latest_verdict(conn, sel, rank, notes=True) if verdict is None else None
        if lag is None and verdict is None and not rank_exists(conn, found, cluster, sel.job,
                                                               rank):
            raise ToolError(f"no rank {rank} in job {sel.job!r}", "not_found", 404)
        node = lag.node if lag else verdict["node"] if verdict else None
        evidence = gather_evidence(conn, sel, [lag] if lag else [])
        work = sync_work(conn, sel)
    facts = explain_facts(found, lag, evidence, work, rank, verdict)
    facts.note = note
    facts.judged = lag is not None and (lag.cluster, lag.job) in found.judged
    diagnosis = diagnose(facts)
    return {"cluster": cluster, "job": sel.job, "rank": rank, "node": node,
            "cause": diagnosis.cause, "confidence": diagnosis.confidence, "fix": diagnosis.fix,
            "findings": diagnosis.findings, "evidence": explain_evidence(facts, found, verdict),
            "coverage": found.coverage(), "window": sel.window.to_json()}


def rank_exists(conn: Connection, found: Survey, cluster: str, job: str, rank: int) -> bool:
    """Whether the job has this rank. A job whose collectives were compared has exactly the
    ranks found there; only a job without them is searched (it has few events)."""
    if any((r.cluster, r.job) == (cluster, job) for r in found.ranks):
        return False
    return bool(conn.execute(text(RANK_EXISTS), {"cluster": cluster, "job": job,
                                                 "rank": rank}).scalar())


def explain_facts(found: Survey, lag: RankLag | None, evidence: Evidence,
                  work: dict[int, SyncWork], rank: int, verdict: dict | None) -> Facts:
    peers = [r for r in found.ranks if lag is not None and (r.cluster, r.job) == (
        lag.cluster, lag.job) and r.rank != rank]
    bar = found.bars.get((lag.cluster, lag.job)) if lag else None
    if bar is not None and peers:
        bar = Bar(float(np.median([p.lag_median for p in peers])), bar.mad, bar.bar)
    others = [w for r, w in work.items() if r != rank]
    return Facts(lag, bar,
                 (evidence.host.get((lag.cluster, lag.node, lag.rank)) if lag else None)
                 or HostEvidence(),
                 (evidence.health.get((lag.cluster, lag.node)) if lag else None) or NodeHealth(),
                 work.get(rank, SyncWork()), peers_median([w.self_ms for w in others]),
                 peers_median([w.wait_ms for w in others]), verdict)


def explain_evidence(facts: Facts, found: Survey, verdict: dict | None) -> dict:
    lag, host, health, work = facts.lag, facts.host, facts.health, facts.sync
    signal, value = lowest_signal(health.signals)
    return {
        "lag": None if lag is None else {
            "samples": lag.samples, "lag_median_ms": ms(lag.lag_median),
            "lag_p95_ms": ms(lag.lag_p95), "lag_max_ms": ms(lag.lag_max),
            "peers_lag_median_ms": ms(facts.bar.median) if facts.bar else None,
            "bar_ms": ms(facts.bar.bar) if facts.bar else None, "straggler": lag.straggler,
            "over_bar": lag.over_bar,
            "last_arrivals": lag.last_arrivals,
            "idle_caused_gpu_s": num(lag.idle_caused * found.scale, 3)},
        "preemptions": {"total": host.preemptions,
                        "by": [{"comm": comm, "count": count} for comm, count in
                               sorted(host.preemptors.items(), key=lambda kv: -kv[1])]},
        "blockio": {"requests": host.blockio_requests, "bytes": host.blockio_bytes,
                    "heavy": host.heavy_blockio},
        "health": {"samples": health.samples, "score_min": health.score_min,
                   "score_avg": health.score_avg, "signals": health.signals,
                   "lowest_signal": signal, "lowest_signal_value": value,
                   "threshold_listings": health.listings},
        "sync": {"self_work_calls": work.self_calls, "self_work_ms_avg": num(work.self_ms, 3),
                 "peer_wait_calls": work.wait_calls, "peer_wait_ms_avg": num(work.wait_ms, 3),
                 "peers_self_work_ms_median": num(facts.peers_self_ms, 3),
                 "peers_peer_wait_ms_median": num(facts.peers_wait_ms, 3)},
        "verdict": verdict,
    }
