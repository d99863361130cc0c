"""Telling people and systems about verdicts: what to say (``Announcer``), and to whom
(``Notices``: a webhook, a command, Slurm), each receiver through a durable queue of its own
(``fleetd.outbox``), so that a slow or dead receiver never holds up a reply to an agent.

A verdict is told when it is raised, when it escalates (its severity rises, or a late rank
hangs or dies) and when it clears; notes (severity info) are not verdicts and are not told.
Raises are limited a minute per job, per node and per cluster (``--on-verdict-job-rate``,
``--on-verdict-node-rate``, ``--on-verdict-cluster-rate``): one job with a hundred ranks named
at once is one incident, not a hundred pages, and a user making up job ids on a node pages no
more than the node's share; what is held back is counted, and the job's next notice says how
many. A verdict not told is not told cleared either.

Each receiver has its own queue (``fleetd.outbox``). One that refuses a notice outright (an
HTTP 4xx other than 408 and 429, or a redirect, which is never followed) has it dropped,
counted and logged. Delivery is at least once (fleetd may stop between a POST and its
removal), so each notice carries an id a receiver keeps the first of.

Imports ``fleetd.outbox`` and ``fleetd.slurmactions`` (the receivers that act in Slurm), and
``ingero``; nothing else of fleetd.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from ingero import httpclient, webhook
from ingero.analysis.causes import verdict_line
from ingero.errors import IngeroError
from ingero.runtime import RateLimitedLog

from .outbox import DELIVERED, REFUSED, RETRY, Outbox
from .slurmactions import AdminComment, Notify, Reputation, Slurm

log = logging.getLogger("fleetd")

RANK = {"minor": 1, "major": 2, "critical": 3}
STOPPED = ("hang", "died")          # a rank that stopped: worse than late, whatever the severity
POST_TIMEOUT_S = 5.0
MAX_ANSWER_BYTES = 64 * 1024        # of a receiver's answer, read and thrown away


def iso(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, timezone.utc).isoformat().replace("+00:00", "Z")


def explain_command(verdict) -> str:
    return f"ingero explain -j {verdict.job} --rank {verdict.rank} --cluster {verdict.cluster}"


def one_line(verdict, user: str | None) -> str:
    """The verdict in a line: what the summary lines of Slurm and chat carry."""
    lag_ms = None if verdict.lag_p50_s is None else verdict.lag_p50_s * 1e3
    owner = f" ({user})" if user else ""
    cost = f", {verdict.cost_gpu_s:.0f} GPU-s" if verdict.cost_gpu_s >= 1 else ""
    return (f"job {verdict.job}{owner} "
            + verdict_line(verdict.rank, verdict.node, verdict.kind, verdict.period, lag_ms,
                           verdict.op, verdict.cause)
            + f" ({verdict.severity}{cost})")


def notice(verdict, event: str, user: str | None, at: float, suppressed: int = 0) -> dict:
    """The notice of ``event`` on ``verdict``, as the schema (ingero/verdict-notice.schema.json)
    describes it."""
    said = {"raised": "straggler", "escalated": "straggler now " + verdict.severity,
            "cleared": "cleared"}[event]
    text = f"ingero: {said}: {one_line(verdict, user)}"
    if event != "cleared":
        text += f". Why: {explain_command(verdict)}"
    if suppressed:
        text += f" ({suppressed} more verdict(s) of this job not told)"
    lag = lambda s: None if s is None else round(s * 1e3, 3)   # noqa: E731
    return {
        "schema": webhook.SCHEMA_ID, "id": f"{verdict.vid}-{event}-{verdict.revision}",
        "event": event, "at": iso(at), "verdict_id": verdict.vid,
        "revision": verdict.revision, "cluster": verdict.cluster, "job": verdict.job,
        "user": user, "node": verdict.node, "rank": verdict.rank, "kind": verdict.kind,
        "cause": verdict.cause, "severity": verdict.severity,
        "confidence": verdict.confidence, "op": verdict.op, "lag_ms": lag(verdict.lag_p50_s),
        "period": verdict.period, "onset": iso(verdict.onset),
        "raised": iso(verdict.first_seen), "cleared": iso(verdict.cleared),
        "findings": list(verdict.findings), "fix": verdict.fix,
        "cost": {"gpu_seconds": round(verdict.cost_gpu_s, 3), "usd": verdict.cost_usd},
        "explain": explain_command(verdict), "suppressed": suppressed, "text": text}


class Announcer:
    """Which verdict changes to tell, within the rates a minute of their job, node and
    cluster."""

    def __init__(self, per_job_per_minute: int, clock=time.monotonic,
                 per_node_per_minute: int | None = None,
                 per_cluster_per_minute: int | None = None):
        self.rate = per_job_per_minute
        self.rates = {"node": per_node_per_minute, "cluster": per_cluster_per_minute}
        self.clock = clock
        self.told: dict[str, tuple] = {}              # vid → (severity, kind) last told
        self.sent: dict[tuple, deque] = {}            # (cluster, job) → when raises were told
        self.held: dict[tuple, int] = {}              # (cluster, job) → raises not told since
        self.wider: dict[tuple, deque] = {}           # ("node"/"cluster", ...) → the same
        self.suppressed = 0

    def notices(self, changed, user_of: Callable, at: float) -> list[dict]:
        out = []
        for verdict in changed:
            if verdict.severity not in RANK:
                continue                               # a note, not a verdict
            event = self._event(verdict)
            if event is None:
                continue
            key = (verdict.cluster, verdict.job)
            if event == "raised" and not self._allowed(key, verdict):
                self.held[key] = self.held.get(key, 0) + 1
                self.suppressed += 1
                continue
            out.append(notice(verdict, event, user_of(verdict.cluster, verdict.job), at,
                              self.held.pop(key, 0)))
            if event == "cleared":
                del self.told[verdict.vid]
            else:
                self.told[verdict.vid] = (verdict.severity, verdict.kind)
        return out

    def _event(self, verdict) -> str | None:
        told = self.told.get(verdict.vid)
        if verdict.cleared is not None:
            return "cleared" if told is not None else None
        if told is None:
            return "raised" if verdict.revision == 0 else None
        severity, kind = told
        worse = RANK[verdict.severity] > RANK[severity] or (
            verdict.kind in STOPPED and kind not in STOPPED)
        return "escalated" if worse else None

    def _allowed(self, key: tuple, verdict) -> bool:
        """Whether a raise fits its job's, node's and cluster's minute (taking its place in
        each if so)."""
        now = self.clock()
        windows = [(self.sent.setdefault(key, deque()), self.rate)]
        for scope, rate in self.rates.items():
            if rate is not None:
                place = ("node", verdict.cluster, verdict.node) if scope == "node" \
                    else ("cluster", verdict.cluster)
                windows.append((self.wider.setdefault(place, deque()), rate))
        for times, _ in windows:
            while times and now - times[0] >= 60.0:
                times.popleft()
        if any(len(times) >= rate for times, rate in windows):
            return False
        for times, _ in windows:
            times.append(now)
        return True

    def forget_jobs(self, live: set[tuple]) -> None:
        """Drop the rate state of jobs no longer tracked, and of nodes and clusters with no
        raise in the last minute."""
        for table in (self.sent, self.held):
            for key in [k for k in table if k not in live]:
                del table[key]
        now = self.clock()
        for place in [p for p, times in self.wider.items()
                      if not times or now - times[-1] >= 60.0]:
            del self.wider[place]


class Webhook:
    """POST a notice as JSON, signed with the shared secret (None: unsigned, by choice)."""

    def __init__(self, url: str, secret: bytes | None):
        self.url, self.secret = url, secret
        self.complaints = RateLimitedLog(log, 60.0)
        self.opener = httpclient.opener()      # a redirect is refused, never followed

    def __call__(self, payload: dict) -> str:
        body = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "ingero-fleetd",
                   "X-Ingero-Notice": payload["id"]}
        if self.secret is not None:
            headers[webhook.SIGNATURE] = webhook.sign(self.secret, body)
        request = urllib.request.Request(self.url, body, headers, method="POST")
        try:
            with self.opener.open(request, timeout=POST_TIMEOUT_S) as answer:
                answer.read(MAX_ANSWER_BYTES)
            return DELIVERED
        except urllib.error.HTTPError as exc:
            exc.close()
            if exc.code in (408, 429) or exc.code >= 500:
                self.complaints.warning("http", "webhook %s answered %d; trying again",
                                        self.url, exc.code)
                return RETRY
            log.error("webhook %s refused notice %s with HTTP %d; dropped it", self.url,
                      payload["id"], exc.code)
            return REFUSED
        except (OSError, urllib.error.URLError) as exc:
            self.complaints.warning("down", "webhook %s unreachable (%s); trying again",
                                    self.url, getattr(exc, "reason", exc))
            return RETRY


def read_secret(path: Path) -> bytes:
    """The shared secret: the file's first line, which must not be empty."""
    secret = path.read_bytes().strip()
    if not secret:
        raise ValueError(f"{path} is empty")
    if os.stat(path).st_mode & 0o077:
        log.warning("%s is readable by others than its owner; whoever reads it can forge "
                    "verdict notices", path)
    return secret


class Notices:
    """Every receiver fleetd's settings name, fed the verdicts that changed at each tick."""

    def __init__(self, cfg, metrics, env: dict | None = None):

        self.metrics = metrics
        self.announcer = Announcer(cfg.on_verdict_job_rate,
                                   per_node_per_minute=cfg.on_verdict_node_rate,
                                   per_cluster_per_minute=cfg.on_verdict_cluster_rate)
        self.cfg = cfg
        self.base = None if cfg.spool_dir is None else Path(cfg.spool_dir) / "notices"
        self.outboxes: list[Outbox] = []
        secret = None
        if cfg.on_verdict and not cfg.on_verdict_unsigned:
            if cfg.on_verdict_secret_file is None:
                raise IngeroError("--on-verdict needs --on-verdict-secret-file (the secret "
                                  "receivers check the notices with), or "
                                  "--on-verdict-unsigned")
            try:
                secret = read_secret(cfg.on_verdict_secret_file)
            except (OSError, ValueError) as exc:
                raise IngeroError(f"--on-verdict-secret-file: {exc}") from None
        for url in cfg.on_verdict:
            name = "webhook-" + hashlib.sha256(url.encode()).hexdigest()[:12]
            log.info("verdict notices to %s (%s, %s)", url, name,
                     "signed" if secret else "UNSIGNED")
            self._add(name, Webhook(url, secret))
        slurm = Slurm(env)
        if cfg.slurm_admin_comment:
            self._add("admin_comment", AdminComment(slurm))
        if cfg.slurm_notify:
            self._add("slurm_notify", Notify(slurm))
        if cfg.drain_after:
            ledger = None if self.base is None else self.base / "reputation.json"
            if self.base is not None:
                self.base.mkdir(parents=True, exist_ok=True)
            reputation = Reputation(slurm, ledger, cfg.drain_after, cfg.drain_window,
                                    cfg.drain_max_fraction, cfg.drain_causes, metrics)
            self._add("reputation", reputation, reputation.start)
            log.info("node reputation on: a node named with %s in %d distinct jobs within "
                     "%.0f s is drained (at most %g of a partition)",
                     "/".join(cfg.drain_causes), cfg.drain_after, cfg.drain_window,
                     cfg.drain_max_fraction)

    def _add(self, name: str, deliver, on_start=None) -> None:
        directory = None if self.base is None else self.base / name
        self.outboxes.append(Outbox(name, directory, deliver, self.metrics, on_start,
                                    self.cfg.on_verdict_max_pending,
                                    self.cfg.on_verdict_expiry))

    def start(self) -> None:
        for outbox in self.outboxes:
            outbox.start()

    def tell(self, changed, user_of, live_jobs: Callable[[], set[tuple]]) -> None:
        if not self.outboxes:
            return
        before = self.announcer.suppressed
        for payload in self.announcer.notices(changed, user_of, time.time()):
            for outbox in self.outboxes:
                outbox.put(payload)
        self.metrics.notices_suppressed.inc(self.announcer.suppressed - before)
        self.announcer.forget_jobs(live_jobs())

    def close(self) -> None:
        for outbox in self.outboxes:
            left = outbox.close()
            if left:
                log.info("notices for %s: %d not delivered yet, kept for the next run",
                         outbox.name, left)
