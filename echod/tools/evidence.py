"""The evidence of a rank's host: its node's health score and signals, how often fleetd listed it
under the bar, its process's preemptions (by other processes: its own threads taking turns
are not preemption) and its block I/O."""

from __future__ import annotations

import statistics

from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import timedelta

from sqlalchemy import Connection

from ingero.analysis.causes import HEAVY_BLOCKIO_BYTES, HEAVY_BLOCKIO_REQUESTS, PREEMPTED_MORE
from ingero.vocabulary import SIGNALS

from .lag import RankLag
from .schema import INT, NUM_OR_NULL, STR_OR_NULL, closed
from .selection import Selection, Where, Window, jnum, job_span, num, rows, whole

# -- health signals ----------------------------------------------------------------------------

def lowest_signal(signals: dict[str, float | None]) -> tuple[str | None, float | None]:
    """The signal with the smallest value, ignoring those not reported."""
    known = {name: value for name, value in signals.items() if value is not None}
    if not known:
        return None, None
    name = min(known, key=known.get)
    return name, known[name]


SIGNALS_OUT = closed({s: NUM_OR_NULL for s in SIGNALS})
SIGNAL_NAME = {"type": ["string", "null"], "enum": [*SIGNALS, None]}


# -- host and health evidence ------------------------------------------------------------------

# A preempted event caused by another program than the job's: not the rank's own process tree
# (its threads taking turns, its data-loader workers) nor another process of its job (ranks
# crowding a node are the job's own doing), as fleetd counts them (fleetd.ranks.common.foreign).
BY_ANOTHER_PROCESS = ("coalesce(e.attrs ->> 'preemptor_own', 'false') <> 'true' AND "
                      "(e.attrs ->> 'preemptor_job' IS NULL OR e.job IS NULL "
                      "OR e.attrs ->> 'preemptor_job' <> e.job)")
HOST_EVIDENCE = f"""
SELECT e.cluster, e.node, e.rank, e.kind, e.attrs ->> 'preemptor_comm' AS comm,
       sum({jnum('count')}) AS preemptions, sum({jnum('requests')}) AS requests,
       sum(e.bytes) AS bytes, max({jnum('requests')}) AS peak_requests,
       max(e.bytes) AS peak_bytes
FROM events e
JOIN unnest(CAST(:ev_clusters AS text[]), CAST(:ev_nodes AS text[])) AS n(cluster, node)
  ON e.cluster = n.cluster AND e.node = n.node
WHERE e.kind IN ('preempted', 'blockio') AND {{where}}
  AND {BY_ANOTHER_PROCESS}
GROUP BY 1, 2, 3, 4, 5
"""
SCORE_EVIDENCE = """
SELECT s.cluster, s.node, count(*), min(s.score), avg(s.score), avg(s.throughput),
       avg(s.compute), avg(s.memory), avg(s.cpu)
FROM health_scores s
JOIN unnest(CAST(:ev_clusters AS text[]), CAST(:ev_nodes AS text[])) AS n(cluster, node)
  ON s.cluster = n.cluster AND s.node = n.node
WHERE {where}
GROUP BY 1, 2
"""
LISTINGS = """
SELECT n.cluster, n.node, count(*)
FROM thresholds th
JOIN unnest(CAST(:ev_clusters AS text[]), CAST(:ev_nodes AS text[])) AS n(cluster, node)
  ON th.cluster = n.cluster AND n.node = ANY (th.stragglers)
WHERE {where}
GROUP BY 1, 2
"""

@dataclass
class NodeHealth:
    samples: int = 0
    score_min: float | None = None
    score_avg: float | None = None
    signals: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(SIGNALS))
    listings: int = 0


@dataclass
class HostEvidence:
    """What a rank's host did in the window: preemptions by whom, block I/O (heavy: a sample
    with at least 64 MiB or 1000 requests)."""

    preemptions: int = 0
    preemptors: dict[str, int] = field(default_factory=dict)
    beyond_peers: dict[str, int] = field(default_factory=dict)  # those preemptors that took
    # it PREEMPTED_MORE times as often as they took its job's other ranks on its node, or more
    blockio_requests: int = 0
    blockio_bytes: int = 0
    heavy_blockio: bool = False

    @property
    def top_preemptor(self) -> str | None:
        return max(self.preemptors, key=self.preemptors.get) if self.preemptors else None


@dataclass
class Evidence:
    health: dict[tuple[str, str], NodeHealth]
    host: dict[tuple[str, str, int], HostEvidence]


def evidence_window(conn: Connection, sel: Selection, ranks: list[RankLag]) -> Selection:
    """The selection with the window closed: a whole job's is its first to last event."""
    if sel.window.since is not None and sel.window.until is not None:
        return sel
    first, last = job_span(conn, sorted({(r.cluster, r.job) for r in ranks}))
    since = sel.window.since or first
    until = sel.window.until or (last + timedelta(microseconds=1) if last else None)
    return replace(sel, window=Window(since, until))


def gather_evidence(conn: Connection, sel: Selection, ranks: list[RankLag]) -> Evidence:
    """Health, threshold listings, preemptions and block I/O of the ranks' nodes."""
    located = [r for r in ranks if r.node is not None]
    if not located:
        return Evidence({}, {})
    sel = evidence_window(conn, sel, located)
    nodes = sorted({(r.cluster, r.node) for r in located})
    params = {"ev_clusters": [c for c, _ in nodes], "ev_nodes": [n for _, n in nodes]}
    return Evidence(node_health(conn, sel, params), host_evidence(conn, sel, params, located))


def node_health(conn: Connection, sel: Selection, params: dict) -> dict:
    health: dict[tuple[str, str], NodeHealth] = defaultdict(NodeHealth)
    where = sel.where("s", node=False, rank=False)
    for cluster, node, samples, low, avg, *signals in rows(
            conn, SCORE_EVIDENCE.format(where=where.sql()), {**params, **where.params}):
        health[(cluster, node)] = NodeHealth(samples, num(low), num(avg),
                                             {s: num(v) for s, v in zip(SIGNALS, signals)})
    listing = Where().within("th.t", sel.window)
    if sel.job is not None:
        listing.add("th.cohort = :cohort", cohort=f"job:{sel.job}")
    for cluster, node, count in rows(conn, LISTINGS.format(where=listing.sql()),
                                     {**params, **listing.params}):
        health[(cluster, node)].listings = count
    return health


def host_evidence(conn: Connection, sel: Selection, params: dict,
                  ranks: list[RankLag]) -> dict[tuple[str, str, int], HostEvidence]:
    """Per rank: its own process's host events plus its node's that name no rank. Which of
    its preemptors took it clearly more often than its job's other ranks on its node
    (``beyond_peers``): the job's ranks crowd each other on a busy node, each alike, and
    that is their own doing, not another process's."""
    where = sel.where("e", node=False, rank=False)
    on_node = defaultdict(list)
    for row in rows(conn, HOST_EVIDENCE.format(where=where.sql()), {**params, **where.params}):
        on_node[(row[0], row[1])].append(row[2:])
    host = {}
    for r in ranks:
        evidence = HostEvidence()
        for rank, kind, comm, preemptions, requests, nbytes, peak_requests, peak_bytes in \
                on_node[(r.cluster, r.node)]:
            if rank not in (None, r.rank):
                continue
            if kind == "preempted":
                evidence.preemptions += whole(preemptions)
                name = comm or "unknown"
                evidence.preemptors[name] = evidence.preemptors.get(name, 0) + whole(preemptions)
            else:
                evidence.blockio_requests += whole(requests)
                evidence.blockio_bytes += whole(nbytes)
                evidence.heavy_blockio |= (whole(peak_bytes) >= HEAVY_BLOCKIO_BYTES
                                           or whole(peak_requests) >= HEAVY_BLOCKIO_REQUESTS)
        host[(r.cluster, r.node, r.rank)] = evidence
    for r in ranks:
        evidence = host[(r.cluster, r.node, r.rank)]
        peers = by_rank_on(on_node[(r.cluster, r.node)], r.rank)
        for name, count in evidence.preemptors.items():
            usual = statistics.median([seen.get(name, 0) for seen in peers] or [0])
            if count >= PREEMPTED_MORE * usual:
                evidence.beyond_peers[name] = count
    return host


def by_rank_on(node_rows: list, rank: int) -> list[dict[str, int]]:
    """The preemptions of each other rank of the job on the node, by preemptor."""
    seen: dict[int, dict[str, int]] = defaultdict(dict)
    for other, kind, comm, preemptions, *_ in node_rows:
        if kind == "preempted" and other is not None and other != rank:
            name = comm or "unknown"
            seen[other][name] = seen[other].get(name, 0) + whole(preemptions)
    return list(seen.values())


RANK_EVIDENCE_OUT = closed({
    "score_min": NUM_OR_NULL, "score_avg": NUM_OR_NULL,
    "lowest_signal": {"type": ["string", "null"], "enum": [*SIGNALS, None]},
    "lowest_signal_value": NUM_OR_NULL, "threshold_listings": INT, "preemptions": INT,
    "top_preemptor": STR_OR_NULL, "blockio_requests": INT, "blockio_bytes": INT})


def rank_evidence_json(evidence: Evidence, r: RankLag) -> dict:
    health = evidence.health.get((r.cluster, r.node)) or NodeHealth()
    host = evidence.host.get((r.cluster, r.node, r.rank)) or HostEvidence()
    signal, value = lowest_signal(health.signals)
    return {"score_min": health.score_min, "score_avg": health.score_avg,
            "lowest_signal": signal, "lowest_signal_value": value,
            "threshold_listings": health.listings, "preemptions": host.preemptions,
            "top_preemptor": host.top_preemptor, "blockio_requests": host.blockio_requests,
            "blockio_bytes": host.blockio_bytes}
