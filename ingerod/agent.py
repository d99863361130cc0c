"""ingerod's main loop: sample, score, judge, push; read fleetd's replies in between.

The loop computes its next push time first, so a slow cycle never drifts the schedule; an error
in one cycle is logged and that cycle skipped. fleetd being away never stops the loop: the link
queues, the detector falls back to a cached or local bar.

A sharded fleetd (``--fleet`` lists several endpoints) gets one link per shard, each with its
own push numbers, queue and clock exchange. Each event goes to the shard that owns its job
(``ingero.shards``); the node's score goes with every push, and at least once a cycle to its
home shard: the owner of the job it ran events for last, or, before any, the shard its name
hashes to. A node running one job so pushes to one shard a cycle.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import zmq

from ingero import __version__, columns, shards, wire
from ingero.errors import ConfigError, IngeroError
from ingero.runtime import RateLimitedLog, SignalFlags, Watchdog, serve_metrics
from ingero.sdnotify import Notifier

from .detection import Detector
from .health import HealthModel
from .jobs import ControlSocket, JobSpool
from .link import FleetLink
from .metrics import AgentMetrics, Textfile
from .queue import PushQueue
from .sources import open_source

log = logging.getLogger("ingerod")
complaints = RateLimitedLog(log, 60.0)

MAX_PENDING_EVENTS = wire.MAX_EVENTS * 16
COLUMNS_FROM = 128    # events: a smaller push costs fleetd less as maps (numpy's cost per call)
HOST_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
QUIET_PUSHES = 5   # push intervals without a push to a shard before its rank verdicts lapse
POLL_CAP = 0.1


def queue_dir(cfg: SimpleNamespace) -> Path | None:
    """Each agent its own: per node name (several may share a host), node-wide or per job."""
    if cfg.queue_dir is None:
        return None
    return cfg.queue_dir / cfg.node.replace("/", "_") / (
        "node" if cfg.job is None else f"job-{cfg.job}")


def shard_queue(directory: Path | None, shard: int) -> Path | None:
    """Shard 0's pushes where an unsharded agent's are; shard K's beside them, in shard-K/."""
    return directory if directory is None or shard == 0 else directory / f"shard-{shard}"


def host_boot(path: Path = HOST_BOOT_ID) -> str | None:
    """The host's boot id: fleetd starts its estimate of this node's clock afresh when it
    changes (a reboot may step the clock; the agent's own stream goes on across it)."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def same_stream(identity: dict | None, boot_id: str) -> bool:
    return identity is not None and identity.get("boot_id") == boot_id


def resume(identities: list[dict | None], fleet: list[str]) -> dict:
    """The stream to go on with: the newest identity any shard's queue kept (a shard other
    than 0 may have had every push), if it was kept under the same --fleet list. Else a new
    stream, with a new boot id: a shard's queue follows its place in the list, and going on
    with the old stream would number pushes to a fleetd anew under a boot id it already knows
    (it would take them for resends)."""
    kept = [i for i in identities if i is not None]
    newest = max(kept, key=lambda i: i.get("t", 0.0), default=None)
    if newest is not None:
        was = newest.get("fleet", fleet[0] if len(fleet) == 1 else None)   # before shards
        if was == ",".join(fleet):
            return newest
        log.warning("--fleet changed since the last run (was %s): starting a new stream; its "
                    "unacknowledged pushes go to the endpoints now in their places", was)
    return {"boot_id": uuid.uuid4().hex[:16], "seq": 0, "event_seq": 0}


def stranded(directory: Path | None, shards_now: int) -> None:
    """Pushes queued for a shard the --fleet list no longer has are left on disk, and said."""
    if directory is None or not directory.is_dir():
        return
    for path in directory.glob("shard-*"):
        k = path.name.removeprefix("shard-")
        if k.isdigit() and int(k) >= shards_now and any(path.glob("push-*")):
            log.warning("%s holds pushes for shard %s, which --fleet no longer lists; they are "
                        "not sent", path, k)


def named(heard: list[list[tuple]]) -> list[tuple[str | None, int]]:
    """Every shard's (job, rank) named, once each."""
    return sorted(set().union(*heard), key=lambda jr: (str(jr[0]), jr[1]))


def capability(source) -> str:
    """What the hello says of the source: its name, and for the untraced one why
    (``untraced:no_kernel_headers``), so fleetd knows after a restart of either end."""
    return f"untraced:{source.reason}" if source.name == "untraced" else source.name


def fleet_keys(cfg: SimpleNamespace) -> list[Path]:
    """fleetd's public key file for each fleet endpoint: one for all, or one each."""
    keys, endpoints = [Path(key) for key in cfg.fleet_public_key], cfg.fleet
    if len(keys) == 1:
        return keys * len(endpoints)
    if len(keys) != len(endpoints):
        raise ConfigError(f"fleet_public_key names {len(keys)} files for {len(endpoints)} "
                          "fleet endpoints: give one for all of them, or one per endpoint in "
                          "the same order")
    return keys


class Agent:
    def __init__(self, cfg: SimpleNamespace, flags: SignalFlags | None = None,
                 notifier: Notifier | None = None, clock=time.monotonic):
        self.cfg = cfg
        keys = fleet_keys(cfg)
        self.flags = flags or SignalFlags()
        self.notifier = notifier or Notifier()
        self.watchdog = Watchdog(self.notifier)
        self.clock = clock
        self.metrics = AgentMetrics()
        queues = [PushQueue(shard_queue(queue_dir(cfg), k), cfg.node, self.metrics)
                  for k in range(len(cfg.fleet))]
        restored = [queue.restore() for queue in queues]
        stranded(queue_dir(cfg), len(cfg.fleet))
        self.boot_id = resume([i for i, _ in restored], cfg.fleet)["boot_id"]
        self.host_boot = host_boot()
        stream = [i for i, _ in restored if same_stream(i, self.boot_id)]
        self.health = HealthModel(cfg.warmup)
        self.detector = Detector(cfg.hysteresis, cfg.fleet_fresh, cfg.fleet_cached,
                                 cfg.local_threshold)
        # The control socket first, before the probes compile (seconds, at boot): a prolog
        # meanwhile finds this agent answering, and starts no second one beside it.
        self.control = None
        self.listen()
        try:
            self.source = open_source(cfg, clock())
        except BaseException:
            if self.control is not None:
                self.control.close()
            raise
        self.metrics.show_tracing(self.source.name, getattr(self.source, "reason", None))
        hello = wire.Hello(cfg.node, cfg.cluster, self.boot_id, [capability(self.source)],
                           cfg.push_interval, __version__)
        self.context = zmq.Context()
        self.poller = zmq.Poller()
        n = len(cfg.fleet)
        self.home = shards.owner(cfg.cluster, cfg.job, n) if cfg.job else shards.home(cfg.node, n)
        self.links = [   # the home link heartbeats; the others wait for work
            FleetLink(cfg, endpoint, key, hello, self.metrics, queue, unacked,
                      max(i["seq"] if same_stream(i, self.boot_id) else 0,
                          max(unacked, default=-1) + 1),
                      clock, self.context, self.poller, on_demand=k != self.home)
            for k, (endpoint, key, queue, (i, unacked))
            in enumerate(zip(cfg.fleet, keys, queues, restored))]
        self.metrics.queue_depth.set_function(lambda: sum(len(l.unacked) for l in self.links))
        self.event_seq = max((i["event_seq"] for i in stream), default=0)
        self.restarted_from = max((i["t"] for i in stream if "t" in i), default=None)
        self.pending: list[deque[dict]] = [deque() for _ in self.links]   # per shard
        self.job_events = [0] * len(self.links)   # this cycle's events with a job, per shard
        self.heard: list[list[tuple]] = [[] for _ in self.links]   # (job, rank), per shard
        self.last_pushed: dict[int, float] = {}
        self.mode = "none"
        self.state = "calibrating"
        self.straggler_ranks: list[tuple[str | None, int]] = []     # (job, rank)
        self.spool = JobSpool(cfg.jobs_dir, cfg.job, self.metrics)
        self.spooled: dict[tuple[int, int], list[str]] = {}  # (shard, seq) → its job records
        self.http = None
        self.textfile = None if cfg.metrics_textfile is None else \
            Textfile(cfg.metrics_textfile, self.metrics.registry, cfg.job)

    def run(self) -> int:
        if self.cfg.metrics_addr is not None:
            self.http = serve_metrics(self.cfg.metrics_addr, self.metrics.registry)
        fleet = ",".join(self.cfg.fleet)
        log.info("node %s (boot %s) pushing to %s every %.2fs from the %s source", self.cfg.node,
                 self.boot_id, fleet, self.cfg.push_interval, self.source.name)
        if self.restarted_from is not None:
            self.say_restarted(time.time())
        self.tick(self.clock())
        self.notifier.ready(f"pushing to {fleet}")
        next_push = self.clock()
        try:
            while not self.flags.stop:
                now = self.clock()
                if now >= next_push:
                    next_push = now + self.cfg.push_interval
                    self.cycle(now)
                wait = min(POLL_CAP, self.cfg.heartbeat_interval, max(0.0, next_push - now))
                self.receive(wait)
                if self.flags.reload or (self.control is not None
                                         and self.control.nudged.is_set()):
                    self.read_spool_now()
                now = self.clock()
                self.poll(now)
                self.tick(now)
                self._mode_change(self.detector.mode(self.state, self.reachable(now), now)[0])
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
                                          self.reachable(now), now)
        except Exception:
            self.metrics.refused.labels("loop_error").inc()
            complaints.warning("sample", "sampling failed; skipping this cycle",
                               exc_info=True)
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
        self.metrics.follow(self.metrics.events_lost, self.source.lost_events())
        self.metrics.follow(self.metrics.launches, self.source.launches_counted())
        for reason, count in self.source.take_refused().items():
            self.metrics.refused.labels(reason).inc(count)
        self.metrics.show(assessment.score, assessment.signals, verdict.mode, verdict.bar,
                          verdict.straggler, self.reachable(now))
        if self.textfile is not None:
            self.textfile.write()
        self.go_home(now)
        for k, link in enumerate(self.links):
            first = True
            while self.pending[k] or (first and k == self.home):
                # as many pushes as the backlog needs: a node tracing thousands of events a
                # second must not fall behind at one batch an interval (fleetd would judge
                # what arrives late, or drop it)
                self.last_pushed[k] = now
                push = self.build_push(k, assessment, exchange=first)
                link.push(push, {"boot_id": self.boot_id, "seq": link.seq,   # the next
                                 "event_seq": self.event_seq, "t": push.sent_at,
                                 "fleet": ",".join(self.cfg.fleet)})
                self.metrics.pushed.inc()
                first = False
            if link.fell_off:   # the records those pushes carried are read again
                for seq in link.fell_off:
                    self.spool.unsent(self.spooled.pop((k, seq), []))
                link.fell_off.clear()
            if k == self.home or self.pending[k] or not self.heard[k]:
                continue
            if now - self.last_pushed.get(k, now) > QUIET_PUSHES * self.cfg.push_interval:
                self.heard[k] = []   # no word of this shard's jobs for a while: it judges
                self.heard_ranks(named(self.heard))                  # none of ours now

    def poll(self, now: float) -> None:
        """Drain the source between pushes; an error here costs this pass only (what the
        node's processes show is theirs to choose: none of it may stop the agent)."""
        try:
            self.source.poll(now)
        except Exception:
            self.metrics.refused.labels("loop_error").inc()
            complaints.warning("poll", "reading the traced processes failed; going on",
                               exc_info=True)

    def go_home(self, now: float) -> None:
        """The node's score goes to the shard of the job it had the most events of this cycle
        (kept while it has none). That link heartbeats and counts silence; the others wait."""
        if len(self.links) == 1 or not any(self.job_events):
            return
        busiest = max(range(len(self.links)), key=self.job_events.__getitem__)
        self.job_events = [0] * len(self.links)
        if busiest != self.home:
            log.info("node score now goes to fleetd shard %d (%s), the owner of its job",
                     busiest, self.cfg.fleet[busiest])
            self.links[self.home].on_demand = True
            self.home = busiest
            self.links[busiest].on_demand = False
            self.links[busiest].woke = now

    def build_push(self, shard: int, assessment, exchange: bool = True) -> wire.Push:
        """The next batch of ``shard``'s pending events; the last clock exchange goes with the
        first push of a cycle only (a second copy would count twice). To a fleetd that takes
        them, the events of a push of at least ``COLUMNS_FROM`` go as columns (the few the
        columns cannot carry as maps beside); as many as a push of maps takes, so that one can
        stand in for it (``FleetLink``)."""
        pending, link = self.pending[shard], self.links[shard]
        batch = [pending.popleft() for _ in range(min(len(pending), wire.MAX_EVENTS))]
        packed, rest = columns.pack(batch) if link.columnar and \
            len(batch) >= COLUMNS_FROM else (None, batch)
        spooled = [event.pop("spool") for event in batch if "spool" in event]
        if spooled:
            self.spooled[shard, link.seq] = spooled
        push = wire.Push(link.seq, self.cfg.node, self.cfg.cluster, self.boot_id,
                         assessment.score, assessment.signals, assessment.state, time.time(),
                         self.cfg.push_interval, self.cfg.job, self.cfg.job_nodes, rest,
                         link.exchange if exchange else None, self.host_boot)
        if packed is not None:
            values = {name: getattr(push, name) for name in wire.Push.field_names()}
            push = wire.ColumnPush(**values, columns=packed)
        link.seq += 1
        return push

    def add_events(self, events: list[dict], echo: bool = False) -> None:
        """Give each event its node-namespaced id and queue it for its job's shard. Events of
        what the node's jobs did count towards which shard the node's score goes to; an
        ``echo`` of what a shard said (its rank verdicts heard or lapsed) does not: counted, a
        verdict's lapse after its job ended pulled the score back to that shard's old job."""
        for event in events:
            if "id" not in event:
                event["id"] = f"{self.cfg.node}:{self.boot_id}:{self.event_seq}"
                self.event_seq += 1
            job = event["attrs"].get("job") or self.cfg.job
            shard = shards.owner(self.cfg.cluster, job, len(self.pending))
            self.job_events[shard] += job is not None and not echo
            pending = self.pending[shard]
            pending.append(event)
            while len(pending) > MAX_PENDING_EVENTS:
                dropped = pending.popleft()
                self.metrics.events_dropped.inc()
                if "spool" in dropped:
                    self.spool.unsent([dropped["spool"]])

    def reachable(self, now: float) -> bool:
        """Whether the fleetd this node's score goes to answers."""
        return self.links[self.home].reachable(now)

    def tick(self, now: float) -> None:
        for link in self.links:
            link.tick(now)

    def receive(self, wait: float) -> None:
        """Whatever any shard sent within ``wait`` seconds, each stamped as it is read."""
        ready = dict(self.poller.poll(max(0, int(wait * 1000))))
        for k, link in enumerate(self.links):
            for message in link.receive(ready):
                self.on_message(k, message)

    def on_message(self, shard: int, message: wire.Message) -> None:
        if isinstance(message, wire.Reply):
            self.records_acked(shard, message.ack)
            self.detector.heard(message.threshold, message.quorum_met, message.cohort,
                                self.clock())
            self.heard[shard] = message.stragglers()
            self.heard_ranks(named(self.heard))
        elif isinstance(message, wire.Welcome):
            log.info("fleetd %s at %s answered", message.server_version, self.cfg.fleet[shard])

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

    def records_acked(self, shard: int, seq: int) -> None:
        """fleetd holds the job records of push ``seq``: delete them; a per-job agent whose
        job's end is among them has nothing left to do."""
        paths = self.spooled.pop((shard, seq), None)
        if paths and self.spool.sent(paths) and not self.flags.stop:
            log.info("job %s ended and its end record is delivered; stopping", self.cfg.job)
            self.flags.stop = True

    def heard_ranks(self, ranks: list[tuple[str | None, int]]) -> None:
        """fleetd's rank verdicts for this node, (job, rank): the agent's events and metrics
        say the same, per job (two jobs on a node may each have a rank 5)."""
        if ranks == self.straggler_ranks:
            return
        raised = set(ranks) - set(self.straggler_ranks)
        cleared = set(self.straggler_ranks) - set(ranks)
        self.straggler_ranks = list(ranks)
        self.metrics.straggler_ranks.set(len(ranks))
        for kind, which in (("rank_straggler", raised), ("rank_resolved", cleared)):
            for job in sorted({j for j, _ in which}, key=str):
                of_job = sorted(rank for j, rank in which if j == job)
                log.warning("fleetd: %s %s%s", kind.replace("_", " "), of_job,
                            "" if job is None else f" (job {job})")
                self.add_events([{"kind": kind, "t": time.time(), "attrs": {
                    "ranks": ",".join(map(str, of_job)),
                    **({} if job is None else {"job": job})}}], echo=True)

    def _mode_change(self, mode: str) -> None:
        """Noticed on every pass of the loop, not only at push time."""
        if mode != self.mode:
            log.info("detection mode: %s -> %s", self.mode, mode)
            self.mode = mode
            self.metrics.show_mode(mode)

    def drain(self) -> None:
        """On SIGTERM: give fleetd up to drain_timeout to acknowledge what is queued."""
        deadline = self.clock() + self.cfg.drain_timeout
        while any(link.unacked for link in self.links) and self.clock() < deadline:
            self.receive(min(POLL_CAP, deadline - self.clock()))
        left = sum(len(link.unacked) for link in self.links)
        log.info("stopping: %s", f"{left} batch(es) unacknowledged" if left else "all acked")

    def close(self) -> None:
        if self.control is not None:
            self.control.close()
        self.source.close()
        for link in self.links:
            link.close()
        self.context.term()
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        if self.textfile is not None:
            self.textfile.remove()
