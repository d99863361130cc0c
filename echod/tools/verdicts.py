"""fleetd's rank verdicts as stored: who was named, of what kind, why, since when, at what cost.

fleetd judges ranks online, with every node's clock corrected, and revises a verdict while it
lasts; the store keeps the newest revision. The tools show these verdicts beside what they
compute from raw events, and prefer them where they say more (the cause, the onset, a hang).
"""

from __future__ import annotations

from sqlalchemy import Connection

from ingero.analysis.causes import CAUSES
from ingero.rates import USD_PLACES

from .schema import (INT, INT_OR_NULL, NUM_OR_NULL, STR, STR_OR_NULL, TIME, TIME_OR_NULL, array,
                     closed)
from .selection import Selection, Where, iso, ms, num, rows

NOTE_KINDS = ("ahead", "passed_down")   # ranks late on the host that fleetd does not name
KINDS = ("persistent", "periodic", "slow_gpu", "hang", "died", *NOTE_KINDS)
SEVERITIES = ("critical", "major", "minor", "info")
NOT_A_NOTE = "v.kind NOT IN (" + ", ".join(f"'{k}'" for k in NOTE_KINDS) + ")"

VERDICT_OUT = closed({
    "cluster": STR, "job": STR_OR_NULL, "rank": INT, "node": STR,
    "kind": {"type": "string", "enum": list(KINDS)},
    "cause": {"type": "string", "enum": list(CAUSES)},
    "confidence": STR_OR_NULL, "severity": {"type": ["string", "null"],
                                            "enum": [*SEVERITIES, None]},
    "op": STR_OR_NULL, "comm_hash": STR_OR_NULL, "step": INT_OR_NULL, "period": INT_OR_NULL,
    "raised": TIME, "onset": TIME_OR_NULL, "last_seen": TIME_OR_NULL, "cleared": TIME_OR_NULL,
    "lag_p50_ms": NUM_OR_NULL, "lag_p99_ms": NUM_OR_NULL, "last_share": NUM_OR_NULL,
    "occurrences": INT_OR_NULL, "cost_gpu_seconds": NUM_OR_NULL, "cost_usd": NUM_OR_NULL,
    "fix": STR_OR_NULL, "findings": array(STR), "evidence": {"type": "object"}})
VERDICTS_OUT = array(VERDICT_OUT)

# A verdict belongs to the window when it was live in it: raised before its end, and not
# cleared before its start.
VERDICTS = """
SELECT v.cluster, v.job, v.rank, v.node, v.kind, v.cause, v.confidence, v.severity, v.op,
       v.comm_hash, v.step, v.period, v.t, v.onset, v.last_seen, v.cleared, v.lag_ns,
       v.lag_p99_ns, v.last_share, v.occurrences, v.cost_gpu_seconds, v.cost_usd, v.fix,
       v.evidence
FROM straggler_verdicts v
WHERE {where} AND v.kind IS NOT NULL
ORDER BY v.cleared IS NOT NULL, v.t DESC, v.rank
LIMIT :limit
"""


def live_in(sel: Selection) -> Where:
    """The conditions on straggler_verdicts v of the selection's verdicts live in its window."""
    where = sel.where("v", time=None, node=False)
    if sel.window.until is not None:
        where.add("v.t < :until", until=sel.window.until)
    if sel.window.since is not None:
        where.add("(v.cleared IS NULL OR v.cleared >= :since)", since=sel.window.since)
    return where


def read_verdicts(conn: Connection, sel: Selection, limit: int = 100,
                  notes: bool = False) -> list[dict]:
    """The verdicts live in the selection's window, live ones first, newest first; with
    ``notes``, fleetd's notes instead: ranks late on the host whose lateness cost nobody (its
    GPU queue was still ahead) or was another's, passed down (severity info, no cost)."""
    where = live_in(sel)
    where.add(f"NOT ({NOT_A_NOTE})" if notes else NOT_A_NOTE)
    return [verdict_json(row) for row in rows(conn, VERDICTS.format(where=where.sql()),
                                              {**where.params, "limit": limit})]


def verdict_json(row) -> dict:
    (cluster, job, rank, node, kind, cause, confidence, severity, op, comm_hash, step, period,
     raised, onset, last_seen, cleared, lag_ns, lag_p99_ns, last_share, occurrences, cost,
     cost_usd, fix, evidence) = row
    evidence = dict(evidence or {})
    findings = [str(f) for f in evidence.pop("findings", [])]
    return {"cluster": cluster, "job": job, "rank": rank, "node": node, "kind": kind,
            "cause": cause if cause in CAUSES else "unknown", "confidence": confidence,
            "severity": severity if severity in SEVERITIES else None, "op": op,
            "comm_hash": comm_hash, "step": step, "period": period, "raised": iso(raised),
            "onset": iso(onset), "last_seen": iso(last_seen), "cleared": iso(cleared),
            "lag_p50_ms": None if lag_ns is None else ms(lag_ns / 1e9),
            "lag_p99_ms": None if lag_p99_ns is None else ms(lag_p99_ns / 1e9),
            "last_share": num(last_share, 4), "occurrences": occurrences,
            "cost_gpu_seconds": num(cost, 3), "cost_usd": num(cost_usd, USD_PLACES), "fix": fix,
            "findings": findings, "evidence": evidence}
