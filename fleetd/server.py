"""fleetd's ROUTER loop: check every frame, answer every agent on the socket it pushed on.

One thread owns the socket. Each pass polls with a short timeout, handles what arrived (each
message type by its own method), makes the rows it accepted durable in the spool and only then
sends the answers (a push is acknowledged once fleetd can no longer lose it: one fsync per pass,
however many pushes it holds), recomputes the thresholds when the timer says so, pings the
systemd watchdog, and acts on the signals the handlers recorded.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace

import zmq

from ingero import __version__, curve, shards, wire
from ingero.errors import FrameError
from ingero.router import SecureRouter
from ingero.runtime import RateLimitedLog, SignalFlags, Watchdog, serve_metrics
from ingero.sdnotify import Notifier

from ingero.rates import rate

from .clocks import ClockBook
from .cohorts import Fleet, ThresholdPolicy
from .forward import Forwarder
from .limits import raise_nofile
from .metrics import FleetMetrics
from .notify import Notices
from .ranks import RankAnalysis

log = logging.getLogger("fleetd")

POLL_MS = 100
DRAIN_BATCH = 1000
SERVE_BATCH = 16         # a stop of the tick handles what waits this many messages at a time,
SERVE_RATIO = 50         # for at most this many times as long as the tick judged since its
SERVE_LEAST_S = 0.010    # last stop (and at least this long): past saturation the tick still
                         # ends (a stop serving all that waited, it never did), and it takes
                         # no more than a tenth of fleetd from the replies
FORWARD_FLUSH_S = 5.0


class FleetServer:
    def __init__(self, cfg: SimpleNamespace, flags: SignalFlags | None = None,
                 notifier: Notifier | None = None, clock=time.monotonic):
        self.cfg = cfg
        self.flags = flags or SignalFlags()
        self.notifier = notifier or Notifier()
        self.watchdog = Watchdog(self.notifier)
        self.clock = clock
        self.metrics = FleetMetrics()
        self.shard, self.shards = cfg.shard
        self.fleet = Fleet(
            ThresholdPolicy(cfg.k, cfg.ema_alpha, cfg.mad_floor, cfg.quorum, cfg.ttl_multiplier,
                            cfg.panic_fraction, cfg.coverage_alert),
            {} if self.shards > 1 else cfg.expected_nodes, cfg.max_nodes)
        self.misrouted = RateLimitedLog(log, 30.0)
        self.clocks = ClockBook()
        self.ranks = RankAnalysis(cfg, clocks=self.clocks)
        self.bad_frames = RateLimitedLog(log, 10.0)
        self.failures = RateLimitedLog(log, 60.0)
        self.context = zmq.Context()
        self.router = SecureRouter(self.context, cfg, "agent", self._refused, log)
        self.socket = None
        self.served = 0.0                     # when the tick's last stop to serve ended
        self.forwarder = None
        self.poller = zmq.Poller()
        self.http = None
        self.endpoint = None
        self.outbox: list[tuple[bytes, wire.Message]] = []   # answers waiting for the commit
        self.notices = None

    # -- lifecycle -----------------------------------------------------------------------------

    def open(self) -> None:
        """Bind the socket (and the metrics listener); errors here stop the daemon at start."""
        before, now, short = raise_nofile(self.cfg.max_nodes)
        log.info("file descriptors: soft limit %d%s", now,
                 f" (raised from {before})" if now > before else "")
        if short:
            log.warning("%s", short)
        self.ranks.rate = rate(self.cfg.gpu_model, self.cfg.gpu_provider,
                               self.cfg.usd_per_gpu_hour, self.cfg.rates_file)
        self.endpoint = self.router.open(self.cfg.bind)
        self.socket = self.router.socket
        self.poller.register(self.socket, zmq.POLLIN)
        self.notices = Notices(self.cfg, self.metrics)
        self.notices.start()
        if self.cfg.echod is not None:
            self.forwarder = Forwarder(self.cfg, self.context, self.metrics, self.clock)
            self.poller.register(self.forwarder.socket, zmq.POLLIN)
            log.info("forwarding to echod at %s", self.cfg.echod)
        where = ""
        if self.cfg.metrics_addr is not None:
            self.http = serve_metrics(self.cfg.metrics_addr, self.metrics.registry)
            where = f", metrics on {self.cfg.metrics_addr[0]}:{self.http.server_port}"
        log.info("listening on %s%s", self.endpoint, where)
        if self.shards > 1:
            log.info("shard %d of %d: the jobs whose cluster/job hashes here are analysed here; "
                     "a cluster's node scores are split between the shards", self.shard,
                     self.shards)
            if self.cfg.expected_nodes:
                log.warning("--expected-nodes ignored: one shard of %d sees only part of a "
                            "cluster, so its coverage cannot be computed here", self.shards)

    def close(self) -> None:
        """Release everything ``open`` got, however far it got."""
        if self.notices is not None:
            self.notices.close()
        if self.forwarder is not None:
            self.forwarder.close()
        self.router.close()
        if self.http is not None:
            self.http.shutdown()
            self.http.server_close()
        self.context.term()

    def run(self) -> int:
        """Serve until SIGTERM; then answer what already arrived, and return 0."""
        try:
            self.open()
            self.notifier.ready(f"listening on {self.endpoint}")
            next_recompute = self.clock()
            while not self.flags.stop:
                now = self.clock()
                if now >= next_recompute:
                    next_recompute = now + self.cfg.recompute_interval
                    with self.metrics.recompute_seconds.time():
                        self.guarded_recompute(now)
                wait = min(POLL_MS, max(0, int((next_recompute - now) * 1000)))
                ready = dict(self.poller.poll(wait))
                if self.socket in ready:
                    self.drain()
                    self.answer()
                if self.forwarder is not None:
                    if self.forwarder.socket in ready:
                        self.forwarder.receive()
                    self.forwarder.tick(self.clock())
                self.watchdog.tick(self.clock())
                if self.flags.reload:
                    self.flags.reload = False
                    self.router.reload()
            self.notifier.stopping()
            self.drain()
            self.answer()
            if self.forwarder is not None:
                left = self.forwarder.flush(FORWARD_FLUSH_S)
                if left:
                    log.warning("stopping: echod did not acknowledge %d batch(es)", left)
            log.info("stopping: drained; exiting")
        finally:
            self.close()
        return 0

    # -- messages ------------------------------------------------------------------------------

    def serve_waiting(self) -> None:
        """Answer what arrived while a long computation ran (called from inside it), a few
        messages at a time, until none waits or the stop's share of time has passed."""
        now = time.perf_counter()
        until = now + max(SERVE_LEAST_S, SERVE_RATIO * (now - self.served))
        while self.drain(SERVE_BATCH):
            self.answer()
            if time.perf_counter() >= until:
                break
        self.served = time.perf_counter()

    def drain(self, most: int = DRAIN_BATCH) -> int:
        """Handle what is waiting, at most ``most`` messages, without blocking. All are
        read first, each stamped as it leaves the socket: a push's receive time must not include
        the handling of the pushes ahead of it (half of that would go into its node's clock
        offset). Each comes with the name its sender's key is authorised as; returns how many
        were read."""
        waiting, read = [], 0
        while read < most:
            try:
                frames, sender = self.router.receive()
            except zmq.Again:
                break
            read += 1
            recv_at = time.time()
            if sender is None:
                self.metrics.rejected.labels("revoked").inc()
                self.bad_frames.warning(
                    "revoked", "dropped a message from an agent whose key is no longer in "
                    "%s (revoked, then SIGHUP)", self.cfg.authorized_keys)
                continue
            waiting.append((frames, recv_at, sender))
        for frames, recv_at, sender in waiting:
            self.handle(frames[0], frames[1:], recv_at, sender)
        return read

    def handle(self, identity: bytes, frames: list[bytes], recv_at: float,
               sender: str = "") -> None:
        """One message from ``sender`` (the name its key is authorised as; '' when anyone
        may send)."""
        self.metrics.frames.inc()
        try:
            message = wire.decode(frames, self.cfg.max_frame_bytes)
            handler = self.HANDLERS.get(type(message))
            if handler is None:
                raise FrameError(f"{type(message).__name__} is not sent to fleetd",
                                 "unexpected_type")
            self.check_sender(sender, message)
            answer = handler(self, message, recv_at)
            self.metrics.messages.labels(type(message).__name__.lower()).inc()
        except FrameError as exc:
            self.metrics.rejected.labels(exc.reason).inc()
            self.bad_frames.warning(f"{exc.reason} {sender}", "dropped a bad frame (%s): %s",
                                    exc.reason, exc)  # once an interval per reason and key
            return
        except Exception:  # a bug must cost one message, never the daemon
            self.metrics.rejected.labels("internal_error").inc()
            log.exception("internal error handling a message; dropped it")
            return
        if answer is not None:
            self.outbox.append((identity, answer))

    def answer(self) -> None:
        """Make what the pass accepted durable, then send the pass's answers."""
        if self.forwarder is not None:
            self.forwarder.commit()
        outbox, self.outbox = self.outbox, []
        for identity, message in outbox:
            if hasattr(message, "sent_at"):
                message.sent_at = time.time()   # the clock estimate wants the real send time
            self.send(identity, message)
            if isinstance(message, wire.Reply):
                self.metrics.reply_seconds.observe(message.sent_at - message.recv_at)

    def send(self, identity: bytes, message: wire.Message) -> None:
        try:
            self.socket.send_multipart([identity, *wire.encode(message)], zmq.NOBLOCK)
        except zmq.Again:
            self.bad_frames.warning("send", "reply to a slow agent dropped (queue full)")

    def check_sender(self, sender: str, message: wire.Message) -> None:
        """A message that names its node and cluster (hello, push) must come under the key
        authorised for them: ``NODE.key`` or ``NODE@CLUSTER.key`` (``curve.bound_to``), unless
        --insecure-any-node-key. A key stolen from one node then speaks for that node only."""
        node = getattr(message, "node", None)
        if not sender or node is None or self.cfg.insecure_any_node_key:
            return
        bound_node, bound_cluster = curve.bound_to(sender)
        if node != bound_node or bound_cluster not in (None, message.cluster):
            raise FrameError(f"the key authorised as {sender} sent a {type(message).__name__} "
                             f"as node {node} of cluster {message.cluster}", "key_not_node")

    def on_hello(self, hello: wire.Hello, recv_at: float) -> wire.Welcome:
        log.info("hello from node %s (cluster %s, boot %s, capabilities %s)", hello.node,
                 hello.cluster, hello.boot_id, ",".join(hello.capabilities) or "-")
        untraced = [c.partition(":")[2] for c in hello.capabilities if c.startswith("untraced")]
        if untraced:                   # said at every hello: known after a restart of either end
            self.ranks.untraced_node(hello.node, untraced[0] or None)
        else:
            self.ranks.untraced.pop(hello.node, None)      # its agent traces again
        return wire.Welcome(__version__, recv_at, time.time(), [wire.COLUMNS])

    def on_push(self, push: wire.Push, recv_at: float) -> wire.Reply:
        if self.fleet.full(push.node):
            raise FrameError(f"refused node {push.node}: already tracking {self.cfg.max_nodes} "
                             "nodes", "too_many_nodes")
        fresh = self.fleet.new(push)
        if fresh and self.shards > 1:
            self.check_owner(push)
        if fresh:
            self.metrics.batches.inc()
            self.metrics.events.inc(push.event_count())
            self.clocks.observe(push.node, push.clock, push.host_boot)
            now = time.time()
            screened = self.ranks.screen(push, now)
            self.ranks.observe(push, now, screened)
            if self.forwarder is not None:
                self.forwarder.add_push(push, recv_at, self.clocks.offsets.get(push.node),
                                        kept=screened)
            log.debug("accepted push node=%s boot=%s seq=%d", push.node, push.boot_id, push.seq)
        else:
            self.metrics.resent.inc()
            log.debug("resend push node=%s boot=%s seq=%d", push.node, push.boot_id, push.seq)
        _, cohort = self.fleet.observe(push, self.clock())     # handled: now it is recorded
        named = self.ranks.straggler_ranks(push.node)
        return wire.Reply(
            ack=push.seq, cohort=cohort.name,
            threshold=cohort.threshold if cohort.computed else None,
            quorum_met=cohort.quorum_met, panic=cohort.panic,
            straggler=push.node in cohort.stragglers or bool(named), recv_at=recv_at,
            sent_at=time.time(), agent_sent_at=push.sent_at, duplicate=not fresh,
            straggler_ranks=[rank for _job, rank in named],
            straggler_jobs=[job for job, _rank in named])

    def check_owner(self, push: wire.Push) -> None:
        """Events of a job another shard owns are kept (nothing accepted is lost) but that job's
        analysis is split: the agents' --fleet lists disagree. Counted and said."""
        jobs = push.jobs() - {None}
        strays = sorted(j for j in jobs if shards.owner(push.cluster, j, self.shards) != self.shard)
        if strays:
            self.metrics.misrouted.inc()
            self.misrouted.warning(
                "misrouted", "node %s sent events of job %s/%s, which shard %d owns, to shard "
                "%d of %d: its --fleet must list the %d shards' endpoints in shard order, the "
                "same on every node", push.node, push.cluster, strays[0],
                shards.owner(push.cluster, strays[0], self.shards), self.shard, self.shards,
                self.shards)

    def on_query(self, query: wire.Query, recv_at: float) -> wire.Status:
        c = self.fleet.cohorts.get(query.cohort)
        if c is None:
            return wire.Status(query.cohort, False, None, None, None, False, False, 0, None, [],
                               time.time())
        return wire.Status(c.name, True, c.threshold, c.median, c.mad, c.quorum_met, c.panic,
                           c.active, c.expected, sorted(c.stragglers), time.time())

    def on_heartbeat(self, beat: wire.Heartbeat, recv_at: float) -> wire.Heartbeat:
        return wire.Heartbeat(time.time())

    HANDLERS = {wire.Hello: on_hello, wire.Push: on_push, wire.ColumnPush: on_push,
                wire.Query: on_query, wire.Heartbeat: on_heartbeat}

    # -- timers --------------------------------------------------------------------------------

    def guarded_recompute(self, now: float) -> None:
        """A bug in one recompute costs that recompute, never the daemon."""
        try:
            self.recompute(now)
        except Exception:
            self.metrics.analysis_errors.inc()
            self.failures.warning("recompute", "recompute failed; the next one goes on",
                                  exc_info=True)

    def recompute(self, now: float) -> None:
        for edge in self.fleet.recompute(now):
            cohort = self.fleet.cohorts[edge.cohort]
            if edge.node is None:
                log.warning("cohort %s %s: %d of %d active nodes under the bar", edge.cohort,
                            "PANIC (cohort-wide slowdown, no per-node verdicts)"
                            if edge.raised else "panic cleared",
                            cohort.under, cohort.active)
            elif edge.raised:
                self.metrics.flagged.labels(cohort.cluster).inc()
                node = self.fleet.nodes[edge.node]
                log.warning("straggler: node %s in %s, score %.3f under threshold %.3f "
                            "(median %.3f)", edge.node, edge.cohort, node.score,
                            cohort.threshold, cohort.median)
            else:
                log.info("straggler cleared: node %s in %s", edge.node, edge.cohort)
        self.metrics.publish(self.fleet.cohorts, self.cfg.coverage_alert)
        self.judge_ranks()
        if self.forwarder is not None:
            t = time.time()
            for c in self.fleet.cohorts.values():
                if c.computed:
                    self.forwarder.add_threshold({
                        "t": t, "cluster": c.cluster, "cohort": c.name, "threshold": c.threshold,
                        "median": c.median, "mad": c.mad, "active": c.active,
                        "quorum_met": c.quorum_met, "panic": c.panic,
                        "stragglers": sorted(c.stragglers)})

    def judge_ranks(self) -> None:
        """The rank analysis's tick: verdicts raised, updated or cleared go to echod."""
        failed = self.ranks.failed
        self.served = time.perf_counter()      # the tick judges from now to its first stop
        changed = self.ranks.tick(time.time(), between=self.serve_waiting)
        self.metrics.analysis_errors.inc(self.ranks.failed - failed)
        self.metrics.publish_ranks(self.ranks, self.clocks, changed)
        if self.notices is not None:
            self.notices.tell(changed, self.ranks.user_of, self.ranks.tracked_jobs)
        verdicts, peer_lag = self.ranks.take_rows()
        if self.forwarder is not None:
            self.forwarder.add_analysis(verdicts, peer_lag)

    def _refused(self, why: str) -> None:
        self.metrics.auth_refused.inc()
        self.bad_frames.warning("auth", "refused an agent's connection: %s", why)
