"""ingerod's main loop: sample, score, judge, push; read fleetd's replies in between.

The loop computes its next push time first, so a slow cycle never drifts the schedule; an error
in one cycle is logged and that cycle skipped. fleetd being away never stops the loop: the link
queues, the detector falls back to a cached or local bar.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import deque
from pathlib import Path
from types import SimpleNamespace

from ingero import __version__, wire
from ingero.errors import IngeroError
from ingero.runtime import SignalFlags, Watchdog, serve_metrics
from ingero.sdnotify import Notifier

from .detection import Detector
from .health import HealthModel
from .jobs import ControlSocket, JobSpool
from .link import FleetLink
from .metrics import AgentMetrics
from .queue import PushQueue
from .sources import open_source

log = logging.getLogger("ingerod")

MAX_PENDING_EVENTS = wire.MAX_EVENTS * 16
POLL_CAP = 0.1


def queue_dir(cfg: SimpleNamespace) -> Path | None:
    """Each agent its own: per node name (several may share a host), node-wide or per job."""
    if cfg.queue_dir is None:
        return None
    return cfg.queue_dir / cfg.node.replace("/", "_") / (
        "node" if cfg.job is None else f"job-{cfg.job}")


class Agent:
    def __init__(self, cfg: SimpleNamespace, flags: SignalFlags | None = None,
                 notifier: Notifier | None = None, clock=time.monotonic):
        self.cfg = cfg
        self.flags = flags or SignalFlags()
        self.notifier = notifier or Notifier()
        self.watchdog = Watchdog(self.notifier)
        self.clock = clock
        self.metrics = AgentMetrics()
        queue = PushQueue(queue_dir(cfg), cfg.node, self.metrics)
        identity, unacked = queue.restore()
        identity = identity or {"boot_id": uuid.uuid4().hex[:16], "seq": 0, "event_seq": 0}
        self.boot_id = identity["boot_id"]
        self.health = HealthModel(cfg.warmup)
        self.detector = Detector(cfg.hysteresis, cfg.fleet_fresh, cfg.fleet_cached,
                                 cfg.local_threshold)
        hello = wire.Hello(cfg.node, cfg.cluster, self.boot_id, [cfg.source],
                           cfg.push_interval, __version__)
        self.source = open_source(cfg, clock())
        self.link = FleetLink(cfg, hello, self.metrics, queue, unacked, clock)
        self.seq = max(identity["seq"], max(unacked, default=-1) + 1)
        self.event_seq = identity["event_seq"]
        self.restarted_from = identity.get("t")   # the last run's last push: untraced since
        self.pending_events: deque[dict] = deque()
        self.mode = "none"
        self.state = "calibrating"
        self.straggler_ranks: list[int] = []
        self.spool = JobSpool(cfg.jobs_dir, cfg.job, self.metrics)
        self.spooled: dict[int, list[str]] = {}    # push seq → job records it carries
        self.control = None
        self.http = None

    def run(self) -> int:
        if self.cfg.metrics_addr is not None:
            self.http = serve_metrics(self.cfg.metrics_addr, self.metrics.registry)
        self.listen()
        log.info("node %s (boot %s) pushing to %s every %.2fs from the %s source", self.cfg.node,
                 self.boot_id, self.cfg.fleet, self.cfg.push_interval, self.cfg.source)
        if self.restarted_from is not None:
            self.say_restarted(time.time())
        self.link.tick(self.clock())
        self.notifier.ready(f"pushing to {self.cfg.fleet}")
        next_push = self.clock()
        try:
            while not self.flags.stop:
                now = self.clock()
                if now >= next_push:
                    next_push = now + self.cfg.push_interval
                    self.cycle(now)
                wait = min(POLL_CAP, self.cfg.heartbeat_interval, max(0.0, next_push - now))
                for message in self.link.poll(wait):
                    self.on_message(message)
                if self.flags.reload or (self.control is not None
                                         and self.control.nudged.is_set()):
                    self.read_spool_now()
                now = self.clock()
                self.source.poll(now)
                self.link.tick(now)
                self._mode_change(self.detector.mode(self.state, self.link.reachable(now), now)[0])
                self.watchdog.tick(now)
            self.notifier.stopping()
            self.cycle(self.clock())  # what the source gathered since the last push goes too
            self.drain()
        finally:
            self.close()
        return 0

    def cycle(self, now: float) -> None:
        """One sample: score it, judge it, push it. An error skips this cycle only."""
        try:
            sample = self.source.sample(now)
            assessment = self.health.assess(sample)
            verdict = self.detector.judge(assessment.score, assessment.state,
                                          self.link.reachable(now), now)
        except Exception:
            log.exception("sampling failed; skipping this cycle")
            return
        self.state = assessment.state
        self._mode_change(verdict.mode)
        if verdict.edge is not None:
            bar = "none" if verdict.bar is None else f"{verdict.bar:.3f}"   # no bar: resolved
            log.warning("%s: score %.3f, bar %s (%s mode)", verdict.edge, assessment.score, bar,
                        verdict.mode)
            self.add_events([{"kind": verdict.edge, "t": time.time(), "attrs": {
                "score": assessment.score, "threshold": verdict.bar, "mode": verdict.mode}}])
        self.add_events(sample.events)
        self.add_events(self.spool.scan(self.cfg.node))
        self.metrics.events_lost.set(self.source.lost_events())
        self.metrics.show(assessment.score, assessment.signals, verdict.mode, verdict.bar,
                          verdict.straggler, self.link.reachable(now))
        push = self.build_push(assessment)
        self.link.push(push, {"boot_id": self.boot_id, "seq": self.seq,
                              "event_seq": self.event_seq, "t": push.sent_at})
        self.metrics.pushed.inc()

    def build_push(self, assessment) -> wire.Push:
        batch = [self.pending_events.popleft()
                 for _ in range(min(len(self.pending_events), wire.MAX_EVENTS))]
        spooled = [event.pop("spool") for event in batch if "spool" in event]
        if spooled:
            self.spooled[self.seq] = spooled
        push = wire.Push(self.seq, self.cfg.node, self.cfg.cluster, self.boot_id,
                         assessment.score, assessment.signals, assessment.state, time.time(),
                         self.cfg.push_interval, self.cfg.job, self.cfg.job_nodes, batch,
                         self.link.exchange)
        self.seq += 1
        return push

    def add_events(self, events: list[dict]) -> None:
        """Give each event its node-namespaced id and queue it for the next push."""
        for event in events:
            if "id" not in event:
                event["id"] = f"{self.cfg.node}:{self.boot_id}:{self.event_seq}"
                self.event_seq += 1
            self.pending_events.append(event)
        while len(self.pending_events) > MAX_PENDING_EVENTS:
            dropped = self.pending_events.popleft()
            self.metrics.events_dropped.inc()
            if "spool" in dropped:
                self.spool.unsent([dropped["spool"]])

    def on_message(self, message: wire.Message) -> None:
        if isinstance(message, wire.Reply):
            self.records_acked(message.ack)
            self.detector.heard(message.threshold, message.quorum_met, message.cohort,
                                self.clock())
            self.heard_ranks(message.straggler_ranks)
        elif isinstance(message, wire.Welcome):
            log.info("fleetd %s answered", message.server_version)

    def listen(self) -> None:
        """A node-wide agent answers the Slurm hooks on its control socket; a second agent on
        the node, or a path it cannot use, only costs the hooks their answer."""
        if self.cfg.job is not None or self.cfg.control_socket is None:
            return
        try:
            self.control = ControlSocket(self.cfg.control_socket,
                                         f"node {self.cfg.node}, pid {os.getpid()}", self.metrics)
        except (IngeroError, OSError) as exc:
            log.warning("not listening for the Slurm hooks: %s", exc)

    def say_restarted(self, now: float) -> None:
        """The same stream goes on after a restart; what the node did between the last run's
        last push and now was not traced (what the last run gathered after that push died with
        it). The gap goes to fleetd and echod as an event, so no timeline hides it."""
        untraced = max(0.0, now - self.restarted_from)
        log.warning("restarted: nothing traced for %.1f s, since the last run's last push",
                    untraced)
        self.add_events([{"kind": "agent_restart", "t": now, "attrs": {
            "untraced_from": self.restarted_from, "untraced_s": round(untraced, 3)}}])

    def read_spool_now(self) -> None:
        """A hook called, or SIGHUP: the job records go with the next push, not a cycle later.
        Settings are read at start only."""
        if self.flags.reload:
            self.flags.reload = False
            log.info("SIGHUP: reading the job spool now (settings change on restart only)")
        if self.control is not None:
            self.control.nudged.clear()
        self.add_events(self.spool.scan(self.cfg.node))

    def records_acked(self, seq: int) -> None:
        """fleetd holds the job records of push ``seq``: delete them; a per-job agent whose
        job's end is among them has nothing left to do."""
        for dropped in [s for s in self.spooled if s != seq and s not in self.link.unacked]:
            self.spool.unsent(self.spooled.pop(dropped))     # its push fell off the queue
        paths = self.spooled.pop(seq, None)
        if paths and self.spool.sent(paths) and not self.flags.stop:
            log.info("job %s ended and its end record is delivered; stopping", self.cfg.job)
            self.flags.stop = True

    def heard_ranks(self, ranks: list[int]) -> None:
        """fleetd's rank verdicts for this node: the agent's events and metrics say the same."""
        if ranks == self.straggler_ranks:
            return
        raised = sorted(set(ranks) - set(self.straggler_ranks))
        cleared = sorted(set(self.straggler_ranks) - set(ranks))
        self.straggler_ranks = list(ranks)
        self.metrics.straggler_ranks.set(len(ranks))
        for kind, which in (("rank_straggler", raised), ("rank_resolved", cleared)):
            if which:
                log.warning("fleetd: %s %s", kind.replace("_", " "), which)
                self.add_events([{"kind": kind, "t": time.time(), "attrs": {
                    "ranks": ",".join(map(str, which))}}])

    def _mode_change(self, mode: str) -> None:
        """Noticed on every pass of the loop, not only at push time."""
        if mode != self.mode:
            log.info("detection mode: %s -> %s", self.mode, mode)
            self.mode = mode
            self.metrics.show_mode(mode)

    def drain(self) -> None:
        """On SIGTERM: give fleetd up to drain_timeout to acknowledge what is queued."""
        deadline = self.clock() + self.cfg.drain_timeout
        while self.link.unacked and self.clock() < deadline:
            for message in self.link.poll(min(POLL_CAP, deadline - self.clock())):
                self.on_message(message)
        left = len(self.link.unacked)
        log.info("stopping: %s", f"{left} batch(es) unacknowledged" if left else "all acked")

    def close(self) -> None:
        if self.control is not None:
            self.control.close()
        self.source.close()
        self.link.close()
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
