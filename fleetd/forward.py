"""fleetd's link to echod: everything accepted is forwarded, and kept until echod has it.

Rows (events, scores, thresholds) gather into a batch that is sealed when it is big enough or
old enough; sealed batches are numbered and kept until echod acknowledges them, which it does
only after its transaction commits. At most ``window`` batches are in flight; a batch not
acknowledged within ``resend_after`` is sent again (echod's keys make a replay change
nothing). Memory is bounded: beyond ``max_batches`` the oldest batch is dropped and counted.
Nothing here blocks the ROUTER loop: sends are NOBLOCK, acks are read when the poller says so.
"""

from __future__ import annotations

import logging
import socket as pysocket
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field

import zmq

from ingero import curve, wire
from ingero.errors import FrameError
from ingero.runtime import RateLimitedLog

log = logging.getLogger("fleetd")


@dataclass
class PendingBatch:
    frames: list[bytes]
    rows: int
    sent_at: float | None = None


@dataclass
class Gathering:
    """Rows not yet sealed into a batch."""

    events: list[dict] = field(default_factory=list)
    scores: list[dict] = field(default_factory=list)
    thresholds: list[dict] = field(default_factory=list)
    verdicts: list[dict] = field(default_factory=list)
    peer_lag: list[dict] = field(default_factory=list)
    since: float | None = None

    def rows(self) -> int:
        return (len(self.events) + len(self.scores) + len(self.thresholds) + len(self.verdicts)
                + len(self.peer_lag))


class Forwarder:
    def __init__(self, cfg, context: zmq.Context, metrics, clock=time.monotonic):
        self.cfg = cfg
        self.metrics = metrics
        self.clock = clock
        self.source = f"{pysocket.gethostname()}:{uuid.uuid4().hex[:12]}"
        self.gathering = Gathering()
        self.batches: OrderedDict[int, PendingBatch] = OrderedDict()
        self.next_seq = 0
        self.complaints = RateLimitedLog(log, 30.0)
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.sndhwm = 10_000
        if not cfg.insecure_plaintext_zmq:
            curve.connect_curve(self.socket, curve.load_keypair(cfg.secret_key),
                                curve.load_public(cfg.echod_public_key))
        self.socket.connect(cfg.echod)

    # -- gathering -----------------------------------------------------------------------------

    def add_push(self, push: wire.Push, recv_at: float, clock=None) -> None:
        """A fresh push's events and score; ``clock`` is its node's offset estimate (an
        ``ingero.analysis.clock.Offset``), so that echod can correct the node's times too."""
        identity = {"node": push.node, "cluster": push.cluster, "boot_id": push.boot_id}
        self.gathering.events += [{**event, **identity, "job": push.job_of(event)}
                                  for event in push.events]
        self.gathering.scores.append({
            "t": recv_at, "cluster": push.cluster, "node": push.node, "job": push.job,
            "score": push.score, "state": push.state, "signals": push.signals,
            "clock_offset": clock.offset if clock else None,
            "clock_uncertainty": clock.uncertainty if clock else None})
        self._started()
        if self.gathering.rows() >= self.cfg.forward_batch_rows:
            self.seal()  # many pushes can arrive between two ticks: keep batches bounded

    def add_threshold(self, row: dict) -> None:
        self.gathering.thresholds.append(row)
        self._started()

    def add_analysis(self, verdicts: list[dict], peer_lag: list[dict]) -> None:
        """Rank verdicts (each revision) and per-rank lag summaries, from the rank analysis."""
        if verdicts or peer_lag:
            self.gathering.verdicts += verdicts
            self.gathering.peer_lag += peer_lag
            self._started()

    def _started(self) -> None:
        if self.gathering.since is None:
            self.gathering.since = self.clock()

    def seal(self) -> None:
        """Number the gathered rows as one batch and queue it."""
        g = self.gathering
        message = wire.Forward(self.next_seq, self.source, g.events, g.scores, g.thresholds,
                               g.verdicts, g.peer_lag)
        self.batches[self.next_seq] = PendingBatch(wire.encode(message), g.rows())
        self.next_seq += 1
        self.gathering = Gathering()
        while len(self.batches) > self.cfg.forward_max_batches:
            _seq, dropped = self.batches.popitem(last=False)
            self.metrics.forward_dropped.inc(dropped.rows)
            self.complaints.warning("full", "echod is not keeping up: dropped a batch of %d "
                                    "rows (%d batches queued)", dropped.rows, len(self.batches))
        self.metrics.forward_queue.set(len(self.batches))

    # -- traffic -------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        g = self.gathering
        if g.rows() and (g.rows() >= self.cfg.forward_batch_rows
                         or now - g.since >= self.cfg.forward_interval):
            self.seal()
        in_flight = 0
        for batch in self.batches.values():
            if in_flight >= self.cfg.forward_window:
                break
            if batch.sent_at is None or now - batch.sent_at >= self.cfg.forward_resend_after:
                if batch.sent_at is not None:
                    self.metrics.forward_resent.inc()
                if not self._send(batch, now):
                    break
            in_flight += 1

    def _send(self, batch: PendingBatch, now: float) -> bool:
        try:
            self.socket.send_multipart(batch.frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
        batch.sent_at = now
        return True

    def receive(self) -> None:
        """Acknowledgements from echod: those batches are stored and can be forgotten."""
        while True:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                ack = wire.decode(frames)
            except FrameError as exc:
                self.complaints.warning("frame", "bad frame from echod: %s", exc)
                continue
            if isinstance(ack, wire.ForwardAck) and ack.ack in self.batches:
                del self.batches[ack.ack]
                self.metrics.forward_acked.inc()
                self.metrics.forward_rejected.inc(ack.rejected)
                self.metrics.forward_queue.set(len(self.batches))

    def flush(self, timeout: float) -> int:
        """On stop: seal what is gathered and give echod ``timeout`` to take it all."""
        if self.gathering.rows():
            self.seal()
        deadline = self.clock() + timeout
        while self.batches and self.clock() < deadline:
            self.tick(self.clock())
            if self.socket.poll(100, zmq.POLLIN):
                self.receive()
        return len(self.batches)

    def close(self) -> None:
        self.socket.close(linger=0)
