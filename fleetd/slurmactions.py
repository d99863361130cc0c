"""What fleetd may do in Slurm about a verdict, each opt-in: note it in the job's AdminComment,
tell the job's user (``scontrol notify``), and drain a node that is named with a hardware-side
cause in enough distinct jobs (node reputation).

Each is a receiver of notices (``fleetd.outbox.Outbox``): it runs ``scontrol`` from its own
thread, so a slurmctld that is slow or down delays the action, never fleetd's replies, and the
notices wait on disk until Slurm answers.

Node reputation keeps its evidence in a ledger beside the notices (JSON, rewritten whole):
per node, the jobs whose ranks on it were named with a cause it drains for, with when and
whether a drain already used them. A node is drained once ``after`` distinct jobs within
``window_s`` name it that no earlier drain used, and only while the nodes ingero drained
(``Reason=ingero: ...``) stay within ``max_fraction`` of each of its partitions; the
evidence of a drain is never used again, so a node an operator resumed is drained again
only on new jobs.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections import OrderedDict
from pathlib import Path

from ingero import hostlist
from ingero.framefile import write_file
from ingero.slurmcommand import SlurmUnavailable, run_slurm

from .outbox import DELIVERED, REFUSED, RETRY

log = logging.getLogger("fleetd")

SLURM_JOB = re.compile(r"^\d+([_+]\d+)?$")
COMMENT_MAX = 1000                # characters of AdminComment ingero writes
REASON_PREFIX = "ingero:"
KEPT_JOBS = 10_000                # jobs whose comment lines are remembered


class Slurm:
    """scontrol and sinfo, with a timeout; ``env`` is theirs (SLURM_CONF, say)."""

    def __init__(self, env: dict | None = None, timeout_s: float = 10.0):
        self.env, self.timeout_s = env, timeout_s

    def run(self, *argv: str) -> str:
        return run_slurm(list(argv), self.timeout_s, self.env)


def slurm_job(payload: dict) -> str | None:
    job = payload.get("job")
    return job if isinstance(job, str) and SLURM_JOB.match(job) else None


def on_job(slurm: Slurm, job: str, what: str, *argv: str) -> str:
    """``scontrol argv`` about ``job``: delivered, refused when Slurm knows no such job (any
    more), else to be tried again."""
    try:
        slurm.run("scontrol", *argv)
    except SlurmUnavailable as exc:
        if "Invalid job id" in str(exc) or "Job has already finished" in str(exc):
            log.warning("%s of job %s: %s; dropped", what, job, exc)
            return REFUSED
        log.warning("%s of job %s: %s; trying again", what, job, exc)
        return RETRY
    return DELIVERED


class AdminComment:
    """The job's AdminComment holds a line per verdict ingero told of it, as it stands."""

    def __init__(self, slurm: Slurm):
        self.slurm = slurm
        self.lines: OrderedDict[str, dict[str, str]] = OrderedDict()   # job → vid → line

    def __call__(self, payload: dict) -> str:
        job = slurm_job(payload)
        if job is None:
            return DELIVERED                  # not a Slurm job: nothing to note
        line = (f"rank {payload['rank']} on {payload['node']} {payload['cause']} "
                f"{payload['severity']}")
        if payload["lag_ms"] is not None:
            line += f" {payload['lag_ms']:.0f} ms"
        if payload["event"] == "cleared":
            line += " (cleared)"
        lines = self.lines.setdefault(job, {})
        lines[payload["verdict_id"]] = line
        self.lines.move_to_end(job)
        while len(self.lines) > KEPT_JOBS:
            self.lines.popitem(last=False)
        comment = f"{REASON_PREFIX} " + "; ".join(lines.values()) + \
            f"; ingero explain -j {job}"
        return on_job(self.slurm, job, "AdminComment", "update", f"JobId={job}",
                      f"AdminComment={comment[:COMMENT_MAX]}")


class Notify:
    """``scontrol notify``: the job's user sees the verdict on their srun's terminal."""

    def __init__(self, slurm: Slurm):
        self.slurm = slurm

    def __call__(self, payload: dict) -> str:
        job = slurm_job(payload)
        if job is None or payload["event"] == "cleared":
            return DELIVERED
        return on_job(self.slurm, job, "scontrol notify", "notify", job,
                      payload["text"][:COMMENT_MAX])


class Reputation:
    """Evidence against nodes from verdicts with a hardware-side cause, and the drains it
    warrants."""

    def __init__(self, slurm: Slurm, ledger: Path | None, after: int, window_s: float,
                 max_fraction: float, causes: list[str], metrics, clock=time.time):
        self.slurm, self.path, self.after = slurm, ledger, after
        self.window_s, self.max_fraction, self.causes = window_s, max_fraction, set(causes)
        self.metrics, self.clock = metrics, clock
        self.evidence: dict[str, list[dict]] = {}    # node → {job, cluster, cause, t, used}
        if ledger is not None and ledger.exists():
            try:
                self.evidence = json.loads(ledger.read_text())["evidence"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("node reputation: %s does not read back (%s); starting afresh",
                            ledger, exc)

    def __call__(self, payload: dict) -> str:
        if payload["event"] in ("raised", "escalated") and payload["cause"] in self.causes \
                and payload["job"] is not None:
            kept = self.evidence.setdefault(payload["node"], [])
            if not any(e["job"] == payload["job"] and e["cluster"] == payload["cluster"]
                       for e in kept):
                kept.append({"job": payload["job"], "cluster": payload["cluster"],
                             "cause": payload["cause"], "t": self.clock(), "used": False})
                self._save()
        return self.judge(payload["node"])

    def start(self) -> None:
        """At start: judge every node (evidence a cap held back may be usable now)."""
        for node in list(self.evidence):
            self.judge(node)

    def judge(self, node: str) -> str:
        now = self.clock()
        kept = [e for e in self.evidence.get(node, []) if now - e["t"] <= self.window_s]
        self.evidence[node] = kept
        fresh = [e for e in kept if not e["used"]]
        if len({(e["cluster"], e["job"]) for e in fresh}) < self.after:
            return DELIVERED
        try:
            ran = self._ran_on(node, {e["job"] for e in fresh})
        except SlurmUnavailable as exc:
            log.warning("node %s: cannot ask Slurm which jobs ran there: %s; trying again",
                        node, exc)
            return RETRY
        unconfirmed = [e for e in fresh if e["job"] not in ran]
        if unconfirmed:
            self.metrics.drains.labels("unconfirmed").inc()
            log.warning("node %s: Slurm ran no job %s there; not counted against it",
                        node, ",".join(sorted({e["job"] for e in unconfirmed})))
            self.evidence[node] = kept = [e for e in kept if e["job"] in ran or e["used"]]
            self._save()
            fresh = [e for e in kept if not e["used"]]
            if len({(e["cluster"], e["job"]) for e in fresh}) < self.after:
                return DELIVERED
        causes = sorted({e["cause"] for e in fresh})
        jobs = [e["job"] for e in fresh]
        reason = f"{REASON_PREFIX} {','.join(causes)} in jobs {','.join(jobs)}"
        if len(reason) > 200:
            reason = reason[:190] + ",..."
        try:
            full = self._over_cap(node)
            if full is not None:
                self.metrics.drains.labels("cap").inc()
                log.warning("node %s: %s, but draining it would put %s; not drained",
                            node, reason.removeprefix(REASON_PREFIX).strip(), full)
                return DELIVERED
            self.slurm.run("scontrol", "update", f"NodeName={node}", "State=DRAIN",
                           f"Reason={reason} (ingero nodes)")
        except SlurmUnavailable as exc:
            log.warning("node %s: cannot drain it: %s; trying again", node, exc)
            return RETRY
        for e in fresh:
            e["used"] = True
        self._save()
        self.metrics.drains.labels("drained").inc()
        log.warning("node %s drained: %s", node, reason)
        return DELIVERED

    def _ran_on(self, node: str, jobs: set[str]) -> set[str]:
        """Which of ``jobs`` Slurm says ran on ``node`` (sacct, else the jobs slurmctld still
        holds): a job id a user's process made up, or a job of another node's, counts
        nothing against this one."""
        ids = sorted((j for j in jobs if j.isascii() and j.isdigit() and len(j) <= 18), key=int)
        if not ids:
            return set()
        try:
            out = self.slurm.run("sacct", "-a", "-X", "-n", "-P", "-j", ",".join(ids),
                                 "-o", "JobIDRaw,NodeList")
            lines = [line.split("|", 1) for line in out.splitlines() if "|" in line]
        except SlurmUnavailable:
            out = self.slurm.run("scontrol", "-o", "show", "job")
            fields = [dict(f.split("=", 1) for f in line.split() if "=" in f)
                      for line in out.splitlines()]
            lines = [(f.get("JobId", ""), f.get("NodeList", "")) for f in fields]
        ran = set()
        for job, nodes in lines:
            try:
                if job in ids and node in hostlist.expand(nodes):
                    ran.add(job)
            except hostlist.BadHostList:
                continue
        return ran

    def _over_cap(self, node: str) -> str | None:
        """What draining ``node`` would exceed, or None: per partition of the node, the nodes
        ingero drained (itself included) over the partition's nodes."""
        partitions = self.slurm.run("sinfo", "-h", "-N", "-n", node, "-o", "%P").split()
        for partition in {p.rstrip("*") for p in partitions}:
            rows = [line.split("|", 2) for line in self.slurm.run(
                "sinfo", "-h", "-N", "-p", partition, "-o", "%N|%T|%E").splitlines() if line]
            nodes = {name for name, _, _ in rows}
            drained = {name for name, state, reason in rows
                       if "drain" in state and reason.startswith(REASON_PREFIX)} | {node}
            if len(drained) > self.max_fraction * len(nodes):
                return (f"{len(drained)} of partition {partition}'s {len(nodes)} nodes drained "
                        f"by ingero, over --drain-max-fraction {self.max_fraction:g}")
        return None

    def _save(self) -> None:
        if self.path is None:
            return
        try:
            write_file(self.path, json.dumps({"evidence": self.evidence}).encode(), sync=True)
        except OSError as exc:
            log.warning("node reputation: cannot write %s: %s", self.path, exc.strerror)
