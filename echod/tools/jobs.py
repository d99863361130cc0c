"""The tools the CLI lists and draws jobs with: list_jobs (the jobs seen in a window, as
``ingero jobs`` and ``ingero report`` print them) and job_timeline (one job's collectives,
waits and verdicts, clocks corrected, as ``ingero export`` turns them into a trace)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from sqlalchemy import Connection

from ingero.analysis.causes import CAUSES
from ingero.vocabulary import STATE_CODES

from ..registry import ToolContext, obj, tool
from .lag import node_offsets, offsets_at
from .schema import (BOOL, CLUSTER_ARG, INT, INT_OR_NULL, JOB_ARG, NAME, NUM, NUM_OR_NULL,
                     SINCE_ARG, STR, STR_OR_NULL, TIME_OR_NULL, UNTIL_ARG, WINDOW_OUT, array,
                     closed, described)
from .selection import (Selection, Where, closed_window, iso, job_cluster, ms, num, reading,
                        rows, storable, time_ordered, window_of)
from .verdicts import NOT_A_NOTE, VERDICTS_OUT, live_in, read_verdicts

# -- list_jobs ---------------------------------------------------------------------------------

STATES = tuple(STATE_CODES.values())        # sacct -s's, by name

# A job is seen in the window when its jobs row, its lag summaries, its verdicts or its nodes'
# scores fall in it; only these small tables are read, never the events. Its nodes' scores give
# its nodes and span where neither the jobs table nor its lag summaries do.
SEEN_JOBS = """
WITH scores AS (
    SELECT n.cluster, n.job, min(n.first) AS first, max(n.last) AS last,
           array_agg(n.node) AS nodes, bool_or(n.seen) AS seen
    FROM (SELECT s.cluster, s.job, s.node, min(s.t) AS first, max(s.t) AS last,
                 bool_or({scores_window}) AS seen
          FROM health_scores s WHERE s.job IS NOT NULL AND {scores}
          GROUP BY 1, 2, 3) n
    GROUP BY 1, 2),
seen AS (
    SELECT j.cluster, j.id AS job FROM jobs j
    WHERE {jobs} AND (CAST(:until AS timestamptz) IS NULL OR j.start IS NULL
                      OR j.start < :until)
             AND (CAST(:since AS timestamptz) IS NULL OR j."end" IS NULL OR j."end" >= :since)
    UNION SELECT p.cluster, p.job FROM peer_lag p WHERE p.job IS NOT NULL AND {lag}
    UNION SELECT v.cluster, v.job FROM straggler_verdicts v WHERE v.job IS NOT NULL AND {verdicts}
    UNION SELECT sc.cluster, sc.job FROM scores sc WHERE sc.seen
)
SELECT seen.cluster, seen.job, j."user", j.nodes, j.start, j."end",
       least(lag.first, sc.first), greatest(lag.last, sc.last), lag.ranks,
       coalesce(lag.nodes, '{{}}') || coalesce(sc.nodes, '{{}}'), named.ranks,
       named.gpu_seconds, named.usd, j.account, j.partition,
       coalesce(j.slurm_state, j.state), coalesce(j.slurm_exit_code, j.exit_code), j.gpus,
       j.slurm_id, j.restarts
FROM seen
LEFT JOIN jobs j ON j.cluster = seen.cluster AND j.id = seen.job
LEFT JOIN scores sc ON sc.cluster = seen.cluster AND sc.job = seen.job
CROSS JOIN LATERAL (
    SELECT min(p.t) AS first, max(p.t) AS last, count(DISTINCT p.rank) AS ranks,
           array_remove(array_agg(DISTINCT p.node), NULL) AS nodes
    FROM peer_lag p WHERE p.cluster = seen.cluster AND p.job = seen.job) lag
CROSS JOIN LATERAL (
    SELECT count(DISTINCT newest.rank) AS ranks, sum(newest.cost_gpu_seconds) AS gpu_seconds,
           sum(newest.cost_usd) AS usd
    FROM (SELECT DISTINCT ON (coalesce(v.vid, v.id::text)) v.rank, v.cost_gpu_seconds,
                 v.cost_usd
          FROM straggler_verdicts v
          WHERE v.cluster = seen.cluster AND v.job = seen.job AND v.kind IS NOT NULL
                AND """ + NOT_A_NOTE + """
          ORDER BY coalesce(v.vid, v.id::text), v.revision DESC NULLS LAST) newest) named
WHERE {user}
ORDER BY coalesce(j.start, least(lag.first, sc.first)), seen.cluster, seen.job
LIMIT :limit
"""

JOB_OUT = closed({
    "cluster": STR, "job": STR, "user": STR_OR_NULL, "nodes": array(STR), "ranks": INT_OR_NULL,
    "start": TIME_OR_NULL, "end": TIME_OR_NULL, "stragglers": INT,
    "cost_gpu_seconds": NUM_OR_NULL, "cost_usd": NUM_OR_NULL, "account": STR_OR_NULL,
    "partition": STR_OR_NULL, "state": STR_OR_NULL, "exit_code": STR_OR_NULL,
    "gpus": INT_OR_NULL, "job_id": STR, "restarts": INT})


@tool("list_jobs", summary="The jobs seen in a window: who ran them, where, how many ranks, "
      "when, how many stragglers fleetd named and what they cost",
      input_schema=obj({
          "cluster": CLUSTER_ARG, "since": SINCE_ARG, "until": UNTIL_ARG,
          "user": described(NAME, "Only this user's jobs."),
          "accounts": described(array(NAME) | {"maxItems": 1000},
                                "Only jobs charged to these Slurm accounts."),
          "partitions": described(array(NAME) | {"maxItems": 1000},
                                  "Only jobs run in these Slurm partitions."),
          "states": described(array({"type": "string", "enum": list(STATES)})
                              | {"maxItems": 32},
                              "Only jobs whose latest run ended in these states (Slurm's, "
                              "else the epilog's), or, RUNNING, has not ended."),
          "all_users": described(BOOL, "Every user's jobs, as sacct -a: what a token sees "
                                 "anyway; a user proven by MUNGE needs to be root or in "
                                 "echod's --munge-admin-group (without it, and without "
                                 "'user', such a user sees their own jobs)."),
          "jobs": described(array(NAME) | {"maxItems": 1000},
                            "Only these jobs, as sacct's -j names them (1234, 1234_7, 1234+1, "
                            "1234.0; an array or heterogeneous job's id names all of it)."),
          "limit": {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 1000}}),
      output_schema=closed({"jobs": array(JOB_OUT), "window": WINDOW_OUT}))
def list_jobs(ctx: ToolContext, args: dict) -> dict:
    """The jobs seen in the window (default: the last hour; with 'jobs', whole jobs): a job
    is seen when the jobs table has it running then (the Slurm prolog records it), or fleetd
    stored lag summaries, verdicts or health scores for it then. Per job: its user and nodes
    (from the jobs table, else the nodes of its lag summaries and health scores), its ranks
    (those with lag summaries), start and end (the jobs table's, else its first and last lag
    summary or health score), what the Slurm hooks recorded (account, partition, GPUs, how
    it ended: state and exit:signal, Slurm's own where sacct or scontrol told echod, else the
    epilog's), its id as Slurm prints it (job_id: 1234_7 for an array task, 1234+1 for a
    heterogeneous component; 'job' is the raw id every tool takes) and how many times Slurm
    requeued it (restarts; the row is its latest run), the ranks fleetd named (stragglers)
    and their verdicts' cost
    (GPU-seconds its peers waited, the newest revision of each verdict, over the whole job;
    USD when fleetd had a rate). Oldest first, at most 'limit'."""
    sel = Selection(args.get("cluster"), window=window_of(ctx, args, whole_job="jobs" in args))
    with reading(ctx) as conn:
        found = seen_jobs(conn, sel, args)
    return {"jobs": found, "window": sel.window.to_json()}


def seen_jobs(conn: Connection, sel: Selection, args: dict) -> list[dict]:
    jobs = Where().equal("j.cluster", "cluster", sel.cluster)
    lag = sel.where("p", node=False, rank=False)
    verdicts = live_in(sel)
    scores = sel.where("s", time=None, node=False, rank=False)
    scores_window = Where().within("s.t", sel.window)
    user = Where().equal('j."user"', "user", args.get("user"))
    if "accounts" in args:
        user.add("j.account = ANY (CAST(:accounts AS text[]))", accounts=list(args["accounts"]))
    if "partitions" in args:
        user.add("j.partition = ANY (CAST(:partitions AS text[]))",
                 partitions=list(args["partitions"]))
    if "states" in args:          # RUNNING: started, not ended
        user.add("(coalesce(j.slurm_state, j.state) = ANY (CAST(:states AS text[])) OR "
                 "('RUNNING' = ANY (CAST(:states AS text[])) AND j.start IS NOT NULL "
                 'AND j."end" IS NULL))', states=list(args["states"]))
    if "jobs" in args:
        named = [job for job in args["jobs"] if storable(job)]     # the others were never stored
        for where, alias in ((jobs, "j.id"), (lag, "p.job"), (verdicts, "v.job"),
                             (scores, "s.job")):
            where.add(f"{alias} = ANY (CAST(:jobs AS text[]))", jobs=named)
    sql = SEEN_JOBS.format(jobs=jobs.sql(), lag=lag.sql(), verdicts=verdicts.sql(),
                           scores=scores.sql(), scores_window=scores_window.sql(),
                           user=user.sql())
    params = {**jobs.params, **lag.params, **verdicts.params, **scores.params, **user.params,
              "since": sel.window.since, "until": sel.window.until,
              "limit": args.get("limit", 1000)}
    return [job_json(row) for row in rows(conn, sql, params)]


def job_json(row) -> dict:
    (cluster, job, user, job_nodes, start, end, first, last, ranks, seen_nodes, named,
     gpu_seconds, usd, account, partition, state, exit_code, gpus, slurm_id, restarts) = row
    return {"cluster": cluster, "job": job, "job_id": slurm_id or job, "restarts": restarts or 0,
            "user": user,
            "nodes": sorted(set(job_nodes or seen_nodes or [])), "ranks": ranks or None,
            "start": iso(start or first), "end": iso(end or last), "stragglers": named,
            "cost_gpu_seconds": num(gpu_seconds, 3), "cost_usd": num(usd, 6),
            "account": account, "partition": partition, "state": state, "exit_code": exit_code,
            "gpus": gpus}


# -- list_nodes --------------------------------------------------------------------------------

# The nodes fleetd named ranks on: each verdict once (its newest revision), counted per cause.
NAMED_NODES = """
SELECT n.cluster, n.node, sum(n.verdicts), array_agg(DISTINCT j.job ORDER BY j.job),
       jsonb_object_agg(n.cause, n.verdicts), max(n.last)
FROM (SELECT v.cluster, v.node, v.cause, count(DISTINCT coalesce(v.vid, v.id::text)) AS verdicts,
             max(v.t) AS last, array_remove(array_agg(DISTINCT v.job), NULL) AS jobs
      FROM straggler_verdicts v
      WHERE {where} AND v.kind IS NOT NULL AND """ + NOT_A_NOTE + """
      GROUP BY 1, 2, 3) n
LEFT JOIN LATERAL unnest(n.jobs) AS j(job) ON true
GROUP BY 1, 2
ORDER BY count(DISTINCT j.job) DESC, sum(n.verdicts) DESC, n.cluster, n.node
LIMIT :limit
"""

NODE_OUT = closed({
    "cluster": STR, "node": STR, "verdicts": INT, "jobs": array(STR),
    "causes": {"type": "object", "additionalProperties": INT}, "last": TIME_OR_NULL})


@tool("list_nodes", summary="The nodes fleetd named ranks on in a window: how many verdicts, in "
      "how many distinct jobs, for which causes (the evidence node reputation drains on)",
      input_schema=obj({
          "cluster": CLUSTER_ARG, "since": SINCE_ARG, "until": UNTIL_ARG,
          "causes": described(array({"type": "string", "enum": list(CAUSES)})
                              | {"maxItems": 64}, "Only verdicts with these causes."),
          "limit": {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 1000}}),
      output_schema=closed({"nodes": array(NODE_OUT), "window": WINDOW_OUT}))
def list_nodes(ctx: ToolContext, args: dict) -> dict:
    """Per node that fleetd named a rank on in the window (default: the last hour): its
    verdicts (each once, live in the window), the distinct jobs they were in and the count per
    cause; nodes named in the most jobs first, at most 'limit'. A node named in several
    jobs for a hardware-side cause (slow_gpu, hang, died) is the node's fault, not a job's."""
    sel = Selection(args.get("cluster"), window=window_of(ctx, args, whole_job=False))
    where = live_in(sel)
    if "causes" in args:
        where.add("v.cause = ANY (CAST(:causes AS text[]))", causes=list(args["causes"]))
    with reading(ctx) as conn:
        found = rows(conn, NAMED_NODES.format(where=where.sql()),
                     {**where.params, "limit": args.get("limit", 1000)})
    return {"nodes": [{"cluster": cluster, "node": node, "verdicts": int(verdicts),
                       "jobs": [j for j in jobs if j is not None],
                       "causes": {k: int(v) for k, v in sorted(causes.items())},
                       "last": iso(last)}
                      for cluster, node, verdicts, jobs, causes, last in found],
            "window": sel.window.to_json()}


# -- job_timeline ------------------------------------------------------------------------------

TIMELINE_KINDS = ("collective", "sync", "memcpy", "alloc")
TIMELINE = """
SELECT e.t, e.node, e.rank, e.kind, e.op, e.comm_hash, e.seq, e.bytes, e.duration_ns,
       CASE WHEN e.kind = 'sync'
            THEN coalesce(e.attrs -> 'peer_wait', 'false'::jsonb) = 'true'::jsonb END
FROM events e
WHERE {where} AND e.rank IS NOT NULL AND e.kind = ANY (CAST(:kinds AS text[]))
ORDER BY e.t
LIMIT :limit
"""

SLICE_OUT = closed({
    "rank": INT, "node": STR, "kind": {"type": "string", "enum": list(TIMELINE_KINDS)},
    "op": STR_OR_NULL, "comm_hash": STR_OR_NULL, "seq": INT_OR_NULL, "t": NUM,
    "duration_ms": NUM_OR_NULL, "peer_wait": {"type": ["boolean", "null"]},
    "bytes": INT_OR_NULL})


@tool("job_timeline", summary="One job's collectives, syncs, copies and allocations per rank, "
      "each node's clock corrected, with fleetd's verdicts: what a trace view draws",
      input_schema=obj({"cluster": CLUSTER_ARG, "job": JOB_ARG, "since": SINCE_ARG,
                        "until": UNTIL_ARG,
                        "max_events": {"type": "integer", "minimum": 1,
                                       "maximum": 2_000_000, "default": 200_000}}, ("job",)),
      output_schema=closed({
          "cluster": STR, "job": STR,
          "nodes": array(closed({"node": STR, "clock_offset_ms": NUM_OR_NULL})),
          "ranks": array(closed({"rank": INT, "node": STR})), "slices": array(SLICE_OUT),
          "truncated": BOOL, "verdicts": VERDICTS_OUT, "window": WINDOW_OUT}))
def job_timeline(ctx: ToolContext, args: dict) -> dict:
    """The job's traced calls per rank (events with a rank), oldest first, at most
    max_events of them (truncated says there were more; narrow since/until to see the rest;
    the window defaults to the whole job): collectives (op, communicator, sequence number,
    bytes), syncs (duration, and peer_wait: it waited on a collective rather than on the
    rank's own kernels), copies and allocations. t is seconds since the Unix epoch on
    fleetd's clock: each node's offset at each time, as fleetd reported it with the node's
    first score at or after it, is taken off (clock_offset_ms is the median fleetd reported
    in the window, else the nearest before or after it; null, and nothing taken off, where it
    reported none). With fleetd's verdicts on the job's ranks. 404
    when the job is not in the clusters you may see; 400 when it ran in several of them and
    no 'cluster' says which."""
    with reading(ctx) as conn:
        cluster = job_cluster(conn, args["job"], args.get("cluster"))
        sel = Selection(cluster, args["job"], window=window_of(ctx, args, whole_job=True))
        limit = args.get("max_events", 200_000)
        window = closed_window(conn, sel, ctx.now)
        found = [] if window is None else time_ordered(
            conn, TIMELINE, lambda part: replace(sel, window=part).where(
                "e", node=False, rank=False), window, {"kinds": list(TIMELINE_KINDS)},
            limit + 1, newest_first=False)
        verdicts = read_verdicts(conn, sel)
        truncated, found = len(found) > limit, found[:limit]
        nodes = sorted({row[1] for row in found} | {v["node"] for v in verdicts})
        clocks = node_offsets(conn, sel, {(cluster, node) for node in nodes})
        index = {node: i for i, node in enumerate(nodes)}
        stamps = np.array([row[0].timestamp() for row in found])
        stamps -= offsets_at(conn, [(cluster, node) for node in nodes],
                             np.array([index[row[1]] for row in found], np.int64), stamps,
                             clocks)
    slices = sorted((slice_json(row, t) for row, t in zip(found, stamps.round(6).tolist())),
                    key=lambda s: s["t"])
    return {"cluster": cluster, "job": sel.job,
            "nodes": [{"node": n, "clock_offset_ms": ms(clocks.get((cluster, n), (None,))[0])}
                      for n in nodes],
            "ranks": [{"rank": r, "node": n} for r, n in sorted({(s["rank"], s["node"])
                                                                for s in slices})],
            "slices": slices, "truncated": truncated, "verdicts": verdicts,
            "window": sel.window.to_json()}


def slice_json(row, t: float) -> dict:
    """A slice of the timeline from its row, at ``t`` (seconds, on fleetd's clock)."""
    _, node, rank, kind, op, comm_hash, seq, nbytes, duration_ns, peer_wait = row
    return {"rank": rank, "node": node, "kind": kind, "op": op, "comm_hash": comm_hash,
            "seq": seq, "t": t,
            "duration_ms": None if duration_ns is None else num(duration_ns / 1e6, 6),
            "peer_wait": peer_wait, "bytes": nbytes}
