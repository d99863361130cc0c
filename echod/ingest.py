"""echod's ingest: batches from fleetd, written to PostgreSQL, acknowledged after commit.

A ROUTER socket takes ``Forward`` batches (and ``ForwardColumns``: pushes of columns as the
agents sent them, checked here again and staged a column at a time, ``columnrows``). Each is
written in one transaction, up to ``writers`` batches at once, each on a connection (and a
PostgreSQL backend) of its own; only after the commit does fleetd get its ``ForwardAck``, and
only then does fleetd forget the batch. When
PostgreSQL is slow the loop is slow: batches wait in fleetd (backpressure, not loss). When
PostgreSQL is down the batch is not acknowledged, the loop backs off, and fleetd sends it
again later; the table keys make the replay change nothing.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import SimpleNamespace
from typing import Callable

import zmq

from ingero import wire
from ingero.errors import FrameError
from ingero.router import SecureRouter

from .errors import DatabaseUnavailable
from .store.writer import reason_label
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
        self.writers = ThreadPoolExecutor(cfg.writers, thread_name_prefix="echod-writer")
        self.writing: list[tuple[Future, bytes, wire.Forward, int]] = []
        self.finished, self.finishing = os.pipe()     # a writer done wakes the loop
        os.set_blocking(self.finished, False)
        self.poller = zmq.Poller()             # the socket and the writers
        self.busy = zmq.Poller()               # the writers only: all of them are busy
        self.keeping: threading.Thread | None = None    # retention, when it runs

    def open(self) -> None:
        self.endpoint = self.router.open(self.cfg.ingest_bind)
        self.socket = self.router.socket
        self.poller.register(self.socket, zmq.POLLIN)
        self.poller.register(self.finished, zmq.POLLIN)
        self.busy.register(self.finished, zmq.POLLIN)
        log.info("ingest listening on %s", self.endpoint)

    def close(self) -> None:
        self.writers.shutdown(wait=True)   # what is being written is committed, and acked
        if self.socket is not None:
            self.collect()
        self.router.close()
        self.context.term()
        os.close(self.finished)
        os.close(self.finishing)

    def run(self) -> int:
        try:
            self.open()
            self.notifier.ready(f"ingest on {self.endpoint}")
            next_housekeeping = time.monotonic()
            while not self.flags.stop:
                if self.backoff:
                    time.sleep(self.backoff)
                poller = self.poller if self.free() else self.busy
                ready = dict(poller.poll(POLL_MS))
                if self.socket in ready:
                    self.drain()
                if self.finished in ready:
                    self.collect()
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
        """Retention, hourly, beside ingest (thinning a day copies what it keeps, which takes
        a while on a large store); a failure is logged and tried again next time. One pass
        at a time: an hour that finds the last one still running lets it be."""
        if self.housekeeping is None or (self.keeping is not None and self.keeping.is_alive()):
            return
        self.keeping = threading.Thread(target=self._keep_house, name="echod-retention",
                                        daemon=True)
        self.keeping.start()

    def _keep_house(self) -> None:
        try:
            self.housekeeping()
        except Exception as exc:  # the database may be down; ingest goes on regardless
            self.complaints.warning("housekeeping", "retention skipped: %s", exc)

    def drain(self) -> None:
        """Take what waits while a writer is free; none while the store is known down."""
        while not self.flags.stop and self.free():
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.handle(frames[0], frames[1:])

    def free(self) -> bool:
        """Whether a writer may take a batch: one is idle, and while the store was found down
        only one batch at a time tries it."""
        return len(self.writing) < (1 if self.backoff else self.cfg.writers)

    def handle(self, identity: bytes, frames: list[bytes]) -> None:
        """Check a batch off the wire and give it to a writer (a bad frame is counted here)."""
        try:
            batch = wire.decode(frames, self.cfg.max_frame_bytes)
            if not isinstance(batch, wire.Forward):
                raise FrameError(f"{type(batch).__name__} is not sent to echod",
                                 "unexpected_type")
        except FrameError as exc:
            self.metrics.rejected_frames.labels(exc.reason).inc()
            self.complaints.warning(exc.reason, "dropped a bad frame (%s): %s", exc.reason, exc)
            seq = wire.forward_seq(frames)
            if seq is not None:     # refused, said so: fleetd would send it again forever
                self._send_ack(identity, wire.ForwardAck(seq, 0, 0, 1, [wire.COLUMNS]))
            return
        events, good, bad = batch.events, [], []
        if isinstance(batch, wire.ForwardColumns):
            for k, push in enumerate(batch.column_pushes()):
                (good if isinstance(push, wire.Push) else bad).append((k, push))
            good = [push for _, push in good]
            events = events + [row for push in good for row in push.stored_rows(push.events)]
        if bad:
            self.complaints.warning("pushes", "batch %d: %d push(es) of columns rejected, "
                                    "e.g. pushes[%d]: %s", batch.seq, len(bad), *bad[0])
        written = self.writers.submit(self.write, {
            "events": events, "pushes": good, "scores": batch.scores,
            "thresholds": batch.thresholds, "verdicts": batch.verdicts,
            "peer_lag": batch.peer_lag})
        written.add_done_callback(lambda _: os.write(self.finishing, b"."))
        self.writing.append((written, identity, batch, len(bad)))

    def collect(self) -> None:
        """Acknowledge the batches committed since; a store found down backs the loop off
        (the batch is not acknowledged: fleetd sends it again)."""
        try:
            while os.read(self.finished, 4096):
                pass
        except BlockingIOError:
            pass
        done, busy = [], []
        for writing in self.writing:      # each future asked once: it may finish meanwhile
            (done if writing[0].done() else busy).append(writing)
        self.writing = busy
        for written, identity, batch, bad in done:
            try:
                result = written.result()
            except DatabaseUnavailable as exc:
                self.metrics.db_errors.inc()
                self.backoff = min(BACKOFF_MAX, max(BACKOFF_START, self.backoff * 2))
                self.complaints.warning("db", "database unavailable, batch %d from %s left "
                                        "unacknowledged (fleetd resends it): %s", batch.seq,
                                        batch.source, exc)
                continue
            self.backoff = 0.0
            self._acknowledge(identity, batch, result, bad)

    def _acknowledge(self, identity: bytes, batch: wire.Forward, result, bad: int) -> None:
        rejected = len(result.rejected) + bad
        self.metrics.batches.inc()
        self.metrics.rows.labels("stored").inc(result.stored)
        self.metrics.rows.labels("duplicate").inc(result.duplicates)
        self.metrics.rows.labels("rejected").inc(rejected)
        now = time.time()
        self.metrics.last_commit.set(now)
        if batch.scores:
            received = [s["t"] for s in batch.scores if isinstance(s.get("t"), (int, float))]
            if received:
                self.metrics.delay.set(max(0.0, now - min(received)))
        for table, _index, reason in result.rejected:
            self.metrics.rejected_rows.labels(reason_label(table, reason)).inc()
        if result.rejected:
            table, index, reason = result.rejected[0]
            self.complaints.warning("rows", "batch %d: %d row(s) rejected, e.g. %s[%d]: %s",
                                    batch.seq, len(result.rejected), table, index, reason)
        self._send_ack(identity, wire.ForwardAck(batch.seq, result.stored, result.duplicates,
                                                 rejected, [wire.COLUMNS]))

    def _send_ack(self, identity: bytes, ack: wire.ForwardAck) -> None:
        try:
            self.socket.send_multipart([identity, *wire.encode(ack)], zmq.NOBLOCK)
        except zmq.Again:
            pass  # fleetd resends; the replay is harmless

    def _refused(self, why: str) -> None:
        self.metrics.auth_refused.inc()
        self.complaints.warning("auth", "refused a fleetd connection: %s", why)
