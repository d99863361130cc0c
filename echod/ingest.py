"""echod's ingest: batches from fleetd, written to PostgreSQL, acknowledged after commit.

A ROUTER socket takes ``Forward`` batches (and ``ForwardColumns``: pushes of columns as the
agents sent them, checked here again and staged a column at a time, ``columnrows``). Each is
written in one transaction; only after the commit does fleetd get its ``ForwardAck``, and
only then does fleetd forget the batch. When
PostgreSQL is slow the loop is slow: batches wait in fleetd (backpressure, not loss). When
PostgreSQL is down the batch is not acknowledged, the loop backs off, and fleetd sends it
again later; the table keys make the replay change nothing.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Callable

import zmq

from ingero import wire
from ingero.errors import FrameError
from ingero.router import SecureRouter

from .errors import DatabaseUnavailable
from ingero.runtime import RateLimitedLog, SignalFlags, Watchdog
from ingero.sdnotify import Notifier

log = logging.getLogger("echod")

POLL_MS = 100
HOUSEKEEPING_S = 3600.0
BACKOFF_START, BACKOFF_MAX = 0.1, 1.0   # a store that comes back is used within a second


class IngestServer:
    def __init__(self, cfg: SimpleNamespace, write: Callable[[dict], object], metrics,
                 flags: SignalFlags | None = None, notifier: Notifier | None = None,
                 housekeeping: Callable[[], object] | None = None,
                 on_reload: Callable[[], object] | None = None,
                 on_tick: Callable[[float], object] | None = None):
        """``on_reload`` runs on SIGHUP after the authorised keys are re-read; ``on_tick`` runs
        every loop (at least every 100 ms) and may raise to stop echod."""
        self.cfg = cfg
        self.on_reload = on_reload
        self.on_tick = on_tick
        self.write = write
        self.housekeeping = housekeeping
        self.metrics = metrics
        self.flags = flags or SignalFlags()
        self.notifier = notifier or Notifier()
        self.watchdog = Watchdog(self.notifier)
        self.complaints = RateLimitedLog(log, 10.0)
        self.context = zmq.Context()
        self.router = SecureRouter(self.context, cfg, "fleetd", self._refused, log)
        self.socket = None
        self.endpoint = None
        self.backoff = 0.0

    def open(self) -> None:
        self.endpoint = self.router.open(self.cfg.ingest_bind)
        self.socket = self.router.socket
        log.info("ingest listening on %s", self.endpoint)

    def close(self) -> None:
        self.router.close()
        self.context.term()

    def run(self) -> int:
        try:
            self.open()
            self.notifier.ready(f"ingest on {self.endpoint}")
            next_housekeeping = time.monotonic()
            while not self.flags.stop:
                if self.backoff:
                    time.sleep(self.backoff)
                if self.socket.poll(POLL_MS, zmq.POLLIN):
                    self.drain()
                now = time.monotonic()
                if now >= next_housekeeping:
                    next_housekeeping = now + HOUSEKEEPING_S
                    self.keep_house()
                if self.flags.reload:
                    self.flags.reload = False
                    self.router.reload()
                    if self.on_reload is not None:
                        self.on_reload()
                if self.on_tick is not None:
                    self.on_tick(now)
                self.watchdog.tick(now)
            self.notifier.stopping()
        finally:
            self.close()
        return 0

    def keep_house(self) -> None:
        """Retention, hourly; a failure is logged and tried again next time."""
        if self.housekeeping is None:
            return
        try:
            self.housekeeping()
        except Exception as exc:  # the database may be down; ingest goes on regardless
            self.complaints.warning("housekeeping", "retention skipped: %s", exc)

    def drain(self) -> None:
        """Handle what waits, one batch at a time; stop early while the store is down."""
        while not self.flags.stop:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not self.handle(frames[0], frames[1:]):
                return

    def handle(self, identity: bytes, frames: list[bytes]) -> bool:
        """False when the store is unavailable (the caller backs off)."""
        try:
            batch = wire.decode(frames, self.cfg.max_frame_bytes)
            if not isinstance(batch, wire.Forward):
                raise FrameError(f"{type(batch).__name__} is not sent to echod",
                                 "unexpected_type")
        except FrameError as exc:
            self.metrics.rejected_frames.labels(exc.reason).inc()
            self.complaints.warning(exc.reason, "dropped a bad frame (%s): %s", exc.reason, exc)
            return True
        events, good, bad = batch.events, [], []
        if isinstance(batch, wire.ForwardColumns):
            for k, push in enumerate(batch.column_pushes()):
                (good if isinstance(push, wire.Push) else bad).append((k, push))
            good = [push for _, push in good]
            events = events + [row for push in good for row in push.stored_rows(push.events)]
        try:
            result = self.write({"events": events, "pushes": good, "scores": batch.scores,
                                 "thresholds": batch.thresholds, "verdicts": batch.verdicts,
                                 "peer_lag": batch.peer_lag})
        except DatabaseUnavailable as exc:
            self.metrics.db_errors.inc()
            self.backoff = min(BACKOFF_MAX, max(BACKOFF_START, self.backoff * 2))
            self.complaints.warning("db", "database unavailable, batch %d from %s left "
                                    "unacknowledged (fleetd resends it): %s", batch.seq,
                                    batch.source, exc)
            return False
        self.backoff = 0.0
        rejected = len(result.rejected) + len(bad)
        self.metrics.batches.inc()
        self.metrics.rows.labels("stored").inc(result.stored)
        self.metrics.rows.labels("duplicate").inc(result.duplicates)
        self.metrics.rows.labels("rejected").inc(rejected)
        if bad:
            self.complaints.warning("pushes", "batch %d: %d push(es) of columns rejected, "
                                    "e.g. pushes[%d]: %s", batch.seq, len(bad), *bad[0])
        elif rejected:
            table, index, reason = result.rejected[0]
            self.complaints.warning("rows", "batch %d: %d row(s) rejected, e.g. %s[%d]: %s",
                                    batch.seq, rejected, table, index, reason)
        ack = wire.ForwardAck(batch.seq, result.stored, result.duplicates, rejected,
                              [wire.COLUMNS])
        try:
            self.socket.send_multipart([identity, *wire.encode(ack)], zmq.NOBLOCK)
        except zmq.Again:
            pass  # fleetd resends; the replay is harmless
        return True

    def _refused(self, why: str) -> None:
        self.metrics.auth_refused.inc()
        self.complaints.warning("auth", "refused a fleetd connection: %s", why)
