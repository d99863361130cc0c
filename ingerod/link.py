"""The agent's link to fleetd: a DEALER socket that treats its server as possibly gone.

Every push stays in a bounded queue until fleetd acknowledges its sequence number, in memory
and on disk (``queue``: a restarted agent sends it again); after a reconnect the queue is sent
again, in order (fleetd recognises resends by node, boot id and sequence); a push sent while
fleetd is not heard from is not timed (see ``push``). Liveness: any word from fleetd resets
it; after ``liveness`` heartbeat intervals of silence fleetd counts as unreachable and the
socket is replaced by a fresh one, with a capped exponential backoff between replacements.
Nothing here blocks: sends use NOBLOCK and polls have a timeout.

A sharded fleetd gives the agent one link per shard, all polled together. A link ``on_demand``
(a shard the node has had nothing for) is quiet while nothing waits on it: no heartbeats, and
its silence is not held against it, so N nodes do not cost every shard N heartbeats a second.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import zmq
from zmq.utils.monitor import recv_monitor_message

from ingero import curve, wire
from ingero.errors import FrameError
from ingero.runtime import RateLimitedLog

from .queue import PushQueue

log = logging.getLogger("ingerod")

MONITORED = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
             | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
             | zmq.EVENT_DISCONNECTED)


class FleetLink:
    def __init__(self, cfg: SimpleNamespace, endpoint: str, server_key: Path,
                 hello: wire.Hello, metrics,
                 queue: PushQueue, unacked: OrderedDict[int, list[bytes]], seq: int,
                 clock, context: zmq.Context, poller: zmq.Poller, on_demand: bool):
        self.cfg = cfg
        self.endpoint = endpoint
        self.seq = seq               # this link's next push number
        self.on_demand = on_demand
        self.woke = float("-inf")    # when an on-demand link last went from idle to waiting
        self.fell_off: list[int] = []   # pushes dropped from the full queue, for the agent
        self.queue = queue
        self.hello = hello
        self.metrics = metrics
        self.clock = clock
        self.context = context       # the agent's, shared by its links, as is the poller
        self.keys = None
        if not cfg.insecure_plaintext_zmq:
            self.keys = (curve.load_keypair(cfg.secret_key), curve.load_public(server_key))
        self.unacked = unacked       # what the last run left comes first
        self.socket = None
        self.monitor = None
        self.poller = poller
        self.last_heard = None
        self.last_sent = 0.0
        self.first_sent: dict[int, float] = {}     # push seq → when it was sent, sent once only
        self.exchange: list[float] | None = None   # the last push/reply times, for fleetd
        self.columnar = False        # fleetd takes pushes of columns (its Welcome said so)
        self.backoff = cfg.heartbeat_interval * cfg.liveness
        self.next_reconnect = 0.0
        self.complaints = RateLimitedLog(log, 30.0)

    # -- socket lifecycle ----------------------------------------------------------------------

    def connect(self) -> None:
        """A fresh socket; say hello and send every unacknowledged batch again, in order."""
        self._close_socket()
        socket = self.context.socket(zmq.DEALER)
        socket.linger = 0
        socket.sndhwm = max(1000, self.cfg.max_unacked * 2)
        socket.reconnect_ivl = 100
        socket.reconnect_ivl_max = int(self.cfg.reconnect_max * 1000)
        if self.keys is not None:
            keypair, server_public = self.keys
            curve.connect_curve(socket, keypair, server_public)
        self.monitor = socket.get_monitor_socket(MONITORED)
        socket.connect(self.endpoint)
        self.socket = socket
        self.poller.register(socket, zmq.POLLIN)
        self.poller.register(self.monitor, zmq.POLLIN)
        self._send(wire.encode(self.hello))
        self.first_sent.clear()    # a reply to a push sent twice cannot say which copy it had
        for frames in self.unacked.values():
            self._send(frames)
        self.metrics.resent.inc(len(self.unacked))

    def _close_socket(self) -> None:
        if self.socket is not None:
            self.poller.unregister(self.socket)
            self.poller.unregister(self.monitor)
            self.socket.disable_monitor()
            self.monitor.close(linger=0)
            self.socket.close(linger=0)
            self.socket = self.monitor = None

    def close(self) -> None:
        self._close_socket()

    # -- traffic -------------------------------------------------------------------------------

    def reachable(self, now: float) -> bool:
        heard = self.last_heard
        if heard is not None:
            heard = max(heard, self.woke)   # silence counts from when it had work again
        return heard is not None and \
            now - heard <= self.cfg.heartbeat_interval * self.cfg.liveness

    def idle(self) -> bool:
        """An on-demand link with nothing waiting for fleetd's answer."""
        return self.on_demand and not self.unacked

    def push(self, push: wire.Push, identity: dict) -> None:
        """Queue a batch (dropping the oldest beyond the bound) and send it; ``identity`` is
        where the agent's stream stands, kept with it."""
        frames = wire.encode(push)
        if self.idle():
            self.woke = self.clock()
        self.unacked[push.seq] = frames
        self.queue.keep(push.seq, frames, identity)
        while len(self.unacked) > self.cfg.max_unacked:
            seq, _ = self.unacked.popitem(last=False)
            self.fell_off.append(seq)
            self.queue.forget(seq)
            self.metrics.dropped.inc()
        sent_at = time.time()     # before the send: the push leaves no earlier than this
        # A push sent while fleetd is not heard from waits in ZeroMQ's queue for the link:
        # its send time says nothing of when it left, so its reply is no exchange.
        reachable = self.reachable(self.clock())
        if self._send(frames) and reachable:
            self.first_sent[push.seq] = sent_at
        while len(self.first_sent) > self.cfg.max_unacked:
            self.first_sent.pop(next(iter(self.first_sent)))

    def _send(self, frames: list[bytes]) -> bool:
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            self.complaints.warning("send", "fleetd link is backed up; the batch waits for "
                                    "the next reconnect")
            return False
        self.last_sent = self.clock()
        return True

    def receive(self, ready: dict) -> list[wire.Message]:
        """What this link's sockets among ``ready`` (the shared poller's answer) hold; acks
        drop batches from the queue."""
        if self.monitor is not None and self.monitor in ready:
            self._on_monitor_event()
        received = []
        if self.socket is not None and self.socket in ready:
            while True:
                try:
                    frames = self.socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                message = self._decode(frames, time.time())
                if message is not None:
                    received.append(message)
        return received

    def _decode(self, frames: list[bytes], received_at: float) -> wire.Message | None:
        try:
            message = wire.decode(frames)
        except FrameError as exc:
            self.metrics.rejected.inc()
            self.complaints.warning("frame", "dropped a bad frame from fleetd: %s", exc)
            return None
        self.last_heard = self.clock()
        self.backoff = self.cfg.heartbeat_interval * self.cfg.liveness
        if isinstance(message, wire.Welcome):
            self._welcomed(message)
        if isinstance(message, wire.Reply):
            self._timed(message, received_at)
        if isinstance(message, wire.Reply) and message.ack in self.unacked:
            del self.unacked[message.ack]
            self.queue.forget(message.ack)
        return message

    def _welcomed(self, welcome: wire.Welcome) -> None:
        """What fleetd takes: pushes of columns only where its Welcome lists them. Pushes of
        columns still waiting for a fleetd that does not (one before 1.3, after a downgrade,
        refuses them) go again as maps, under the same numbers."""
        self.columnar = wire.COLUMNS in welcome.capabilities and not self.cfg.wire_maps
        if self.columnar:
            return
        for seq, frames in list(self.unacked.items()):
            if frames[0][6] != wire.ColumnPush.TYPE:
                continue
            frames = wire.encode(wire.decode(frames).as_push())
            self.unacked[seq] = frames
            self.queue.rewrite(seq, frames)
            self._send(frames)

    def _timed(self, reply: wire.Reply, received_at: float) -> None:
        """The exchange's four times, taken as close to the socket as this side can: the push's
        own send (not when it was built, before its encoding and its queue file), the reply's
        arrival (not when the agent's loop got to it). Each delay left in would be a one-sided
        leg, and half of it an error in the node's clock offset. Each time brackets its event:
        the send is stamped just before the push goes, the arrival just after the reply is
        read. A send stamped after the push went (the agent preempted once ZeroMQ's I/O
        thread had it) shortens the round trip by as much as it biases the offset, so the
        worst such exchanges looked the best (CI under load: a node's ranks named 3-4 ms
        late while its clock claimed ±0.3 ms)."""
        sent_at = self.first_sent.pop(reply.ack, None)
        if sent_at is not None and not reply.duplicate:
            self.exchange = [sent_at, reply.recv_at, reply.sent_at, received_at]

    def _on_monitor_event(self) -> None:
        try:
            event = recv_monitor_message(self.monitor, zmq.NOBLOCK)
        except zmq.Again:
            return
        kind = event["event"]
        if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self.metrics.auth_failures.inc()
            self.complaints.warning("auth", "fleetd at %s refused this agent's key (add %s's "
                                    "public key to fleetd's authorised keys)", self.endpoint,
                                    self.hello.node)
        elif kind in (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL):
            self.metrics.auth_failures.inc()
            self.complaints.warning("handshake", "handshake with fleetd at %s failed: are both "
                                    "ends using CURVE (or both --insecure-plaintext-zmq), with "
                                    "fleetd's right public key?", self.endpoint)
        elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            log.debug("connected to fleetd at %s", self.endpoint)

    def tick(self, now: float) -> None:
        """Heartbeat when quiet; replace the socket when fleetd has been silent too long."""
        if self.socket is None:
            self.connect()
            self.next_reconnect = now + self.backoff
            return
        if self.idle():
            return
        if now - self.last_sent >= self.cfg.heartbeat_interval:
            self._send(wire.encode(wire.Heartbeat(time.time())))
        if not self.reachable(now) and now >= self.next_reconnect:
            if self.last_heard is not None:
                self.complaints.warning("silent", "fleetd at %s silent for %.1fs; reconnecting",
                                        self.endpoint, now - self.last_heard)
            self.metrics.reconnects.inc()
            self.connect()
            self.next_reconnect = now + self.backoff
            self.backoff = min(self.backoff * 2, self.cfg.reconnect_max)
