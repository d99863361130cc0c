"""The tools over a whole cluster: cluster_summary (what it looks like now) and event_history
(the stored events themselves)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from ingero.vocabulary import KINDS

from ..registry import ToolContext, obj, tool
from .schema import (BOOL, CLUSTER_ARG, INT, INT_OR_NULL, JOB_ARG, LIMIT, NAME, NODE_ARG,
                     NUM_OR_NULL, RANK_ARG, SCALAR, SINCE_ARG, STR, STR_OR_NULL, TIME,
                     TIME_OR_NULL, UNTIL_ARG, WINDOW_OUT, array, closed, described)
from .selection import (Where, Window, closed_window, iso, num, pinned, reading, rows, scalar,
                        select, time_ordered)

REPORTING_S = 300                      # a node that sent nothing for this long is not reporting
RECENT_S = 3600                        # what cluster_summary calls recent


# -- cluster_summary ---------------------------------------------------------------------------

NODE_COUNTS = """
SELECT n.cluster, count(*), count(*) FILTER (WHERE n.last_seen >= :reporting), max(n.last_seen)
FROM nodes n WHERE {where} GROUP BY 1 ORDER BY 1
"""
RECENT_JOBS = """
SELECT DISTINCT n.cluster, s.job FROM nodes n
CROSS JOIN LATERAL (SELECT DISTINCT h.job FROM health_scores h
                    WHERE h.cluster = n.cluster AND h.node = n.name AND h.t >= :recent
                      AND h.job IS NOT NULL) s
WHERE {where} AND n.last_seen >= :recent
UNION
SELECT j.cluster, j.id FROM jobs j
WHERE {jobs} AND (j."end" IS NULL OR j."end" >= :recent) AND j.start <= :now
"""
LATEST_THRESHOLDS = """
SELECT DISTINCT ON (th.cluster, th.cohort) th.cluster, th.cohort, th.t, th.threshold, th.median,
       th.mad, th.active, th.quorum_met, th.panic, th.stragglers
FROM thresholds th WHERE {where} AND th.t >= :recent
ORDER BY th.cluster, th.cohort, th.t DESC
"""
LATEST_SCORES = """
SELECT n.cluster, n.name, h.job, h.score, h.t FROM nodes n
CROSS JOIN LATERAL (SELECT h.job, h.score, h.t FROM health_scores h
                    WHERE h.cluster = n.cluster AND h.node = n.name AND h.t >= :recent
                    ORDER BY h.t DESC LIMIT 1) h
WHERE {where}
"""
COHORT_OUT = closed({"cohort": STR, "t": TIME, "threshold": NUM_OR_NULL, "median": NUM_OR_NULL,
                     "mad": NUM_OR_NULL, "active": INT, "quorum_met": BOOL, "panic": BOOL,
                     "stragglers": array(STR)})
UNDER_BAR_OUT = closed({"node": STR, "job": STR_OR_NULL, "score": NUM_OR_NULL, "t": TIME,
                        "cohort": STR, "threshold": NUM_OR_NULL})


@tool("cluster_summary", summary="Per cluster: nodes reporting, recent jobs, each cohort's "
      "straggler bar and the nodes under it now",
      input_schema=obj({"cluster": CLUSTER_ARG}),
      output_schema=closed({
          "clusters": array(closed({
              "cluster": STR, "nodes_known": INT, "nodes_reporting": INT,
              "last_seen": TIME_OR_NULL, "jobs_recent": array(STR),
              "cohorts": array(COHORT_OUT), "under_bar": array(UNDER_BAR_OUT)})),
          "reporting_window_s": INT, "recent_window_s": INT}))
def cluster_summary(ctx: ToolContext, args: dict) -> dict:
    """What each cluster looks like now. Per cluster: nodes known and nodes reporting (anything
    received in the last 5 minutes), jobs recent (a node pushed a health score for it in the last
    hour, or the jobs table has it running), the latest straggler threshold of every cohort
    recomputed in the last hour (cohort 'job:<id>' or 'cluster:<name>'; threshold = median −
    2·1.4826·MAD of the cohort's health scores; quorum_met false means too few nodes to judge;
    panic means so many nodes are under the bar that fleetd stopped flagging), and the nodes whose
    latest score (last hour) is under their cohort's latest threshold now. Scores and signals are
    in [0, 1], higher is healthier."""
    now = datetime.fromtimestamp(ctx.now, UTC)
    nodes = Where().equal("n.cluster", "cluster", args.get("cluster"))
    jobs = Where().equal("j.cluster", "cluster", args.get("cluster"))
    thresholds = Where().equal("th.cluster", "cluster", args.get("cluster"))
    recent = now - timedelta(seconds=RECENT_S)
    params = {**nodes.params, "reporting": now - timedelta(seconds=REPORTING_S),
              "recent": recent, "now": now}
    with reading(ctx) as conn:
        counts = rows(conn, NODE_COUNTS.format(where=nodes.sql()), params)
        recent_jobs = rows(conn, RECENT_JOBS.format(where=nodes.sql(), jobs=jobs.sql()), params)
        cohorts = rows(conn, LATEST_THRESHOLDS.format(where=thresholds.sql()), params)
        scores = rows(conn, LATEST_SCORES.format(where=nodes.sql()), params)
    clusters = {c: summary_of(c) for c in sorted({r[0] for r in counts} | {r[0] for r in cohorts})}
    for cluster, known, reporting, last_seen in counts:
        clusters[cluster].update(nodes_known=known, nodes_reporting=reporting,
                                 last_seen=iso(last_seen))
    for cluster, job in sorted(recent_jobs):
        clusters[cluster]["jobs_recent"].append(job)
    bars = {}
    for cluster, cohort, t, threshold, median, mad, active, quorum, panic, stragglers in cohorts:
        bars[(cluster, cohort)] = threshold
        clusters[cluster]["cohorts"].append({
            "cohort": cohort, "t": iso(t), "threshold": num(threshold), "median": num(median),
            "mad": num(mad), "active": active, "quorum_met": quorum, "panic": panic,
            "stragglers": list(stragglers)})
    for cluster, node, job, score, t in sorted(scores):
        cohort = f"job:{job}" if job else f"cluster:{cluster}"
        bar = bars.get((cluster, cohort))
        if bar is not None and score < bar and cluster in clusters:
            clusters[cluster]["under_bar"].append({"node": node, "job": job, "score": num(score),
                                                   "t": iso(t), "cohort": cohort,
                                                   "threshold": num(bar)})
    return {"clusters": list(clusters.values()), "reporting_window_s": REPORTING_S,
            "recent_window_s": RECENT_S}


def summary_of(cluster: str) -> dict:
    return {"cluster": cluster, "nodes_known": 0, "nodes_reporting": 0, "last_seen": None,
            "jobs_recent": [], "cohorts": [], "under_bar": []}


# -- event_history -----------------------------------------------------------------------------

EVENTS = """
SELECT e.t, e.id, e.cluster, e.node, e.job, e.rank, e.kind, e.op, e.comm_hash, e.seq, e.bytes,
       e.duration_ns, e.attrs
FROM events e WHERE {where}
ORDER BY e.t DESC, e.id DESC LIMIT :limit
"""
EVENT_OUT = closed({
    "t": TIME, "id": STR, "cluster": STR, "node": STR, "job": STR_OR_NULL, "rank": INT_OR_NULL,
    "kind": STR, "op": STR_OR_NULL, "comm_hash": STR_OR_NULL, "seq": INT_OR_NULL,
    "bytes": INT_OR_NULL, "duration_ns": INT_OR_NULL,
    "attrs": {"type": "object", "additionalProperties": SCALAR}})


@tool("event_history", summary="Stored events, newest first, filtered by cluster, job, node, "
      "rank, kind, op and time",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "node": NODE_ARG,
                        "rank": RANK_ARG,
                        "kind": {"type": "string", "enum": list(KINDS),
                                 "description": "Only events of this kind."},
                        "op": described(NAME, "Only this operation (e.g. ncclAllReduce, "
                                              "cudaStreamSynchronize, cudaMalloc)."),
                        "since": SINCE_ARG, "until": UNTIL_ARG, "limit": LIMIT}),
      output_schema=closed({"events": array(EVENT_OUT), "truncated": BOOL,
                            "window": WINDOW_OUT}))
def event_history(ctx: ToolContext, args: dict) -> dict:
    """The raw events, newest first (at most 'limit', default 100; 'truncated' says more
    matched). The window defaults to the whole job when 'job' is given, else the last hour.
    Kinds: collective (op, comm_hash, seq = the communicator's sequence number, bytes; attrs
    comm_rank, nranks, count, datatype, stream…; duration_ns is the enqueue call, not the
    transfer), comm_init/comm_destroy, sync (duration_ns; attrs peer_wait: the sync covered a
    collective), alloc/free (bytes; attrs addr, result ≠ 0 = failed), memcpy (bytes, duration_ns,
    attrs direction), preempted (host: the process was pushed off its CPU attrs.count times by
    attrs.preemptor_comm in one sample), blockio (attrs requests, bytes), straggler/resolved
    (the node agent's own verdict edges, attrs score and threshold). 'rank' is the process's
    global rank."""
    sel = select(ctx, args, node=True, rank=True)
    limit = args.get("limit", 100)
    with reading(ctx) as conn:
        sel = pinned(conn, sel)
        window = closed_window(conn, sel, ctx.now)

        def where_of(part: Window) -> Where:
            where = replace(sel, window=part).where("e")
            where.equal("e.kind", "kind", args.get("kind"))
            return where.equal("e.op", "op", args.get("op"))
        found = [] if window is None else time_ordered(conn, EVENTS, where_of, window, {},
                                                       limit + 1, newest_first=True)
    events = [{"t": iso(t), "id": event_id, "cluster": cluster, "node": node, "job": job,
               "rank": rank, "kind": kind, "op": op, "comm_hash": comm_hash, "seq": seq,
               "bytes": nbytes, "duration_ns": duration_ns,
               "attrs": {str(k): scalar(v) for k, v in (attrs or {}).items()}}
              for (t, event_id, cluster, node, job, rank, kind, op, comm_hash, seq, nbytes,
                   duration_ns, attrs) in found[:limit]]
    return {"events": events, "truncated": len(found) > limit, "window": sel.window.to_json()}
