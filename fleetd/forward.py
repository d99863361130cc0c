"""fleetd's link to echod: everything accepted is forwarded, and kept until echod has it.

Rows (events, scores, thresholds, verdicts, peer lag) and pushes of columns (the body each
agent sent, passed on as it came, unless echod has said it takes none) gather until they are
sealed: when there are enough, when the oldest is old enough, or when agents wait for their
answer (fleetd answers a push only once its rows are in the spool). Sealing makes up to three
batches, one per class of row (raw events, health, verdicts), so that a full spool can drop
the least valuable first; each is numbered, written to the spool (``fleetd.spool``) and kept
until echod acknowledges it, which it does only after its transaction commits. Until echod's
first ack says whether it takes columns, one batch of rows is in flight (or, where only
batches of columns wait, an empty batch that asks); then at most ``window`` batches are; a
batch not acknowledged within ``resend_after`` is sent again (echod's keys make a replay
change nothing). A batch of columns never goes as rows to an echod that takes columns: one it
stored before its ack was lost (and fleetd restarted) would be stored twice, as chunks and as
rows. Nothing here blocks the ROUTER loop: sends are NOBLOCK, acks are read when the poller
says so.
"""

from __future__ import annotations

import logging
import socket as pysocket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from ingero import curve, wire
from ingero.errors import FrameError
from ingero.runtime import RateLimitedLog

from .spool import EVENTS, HEALTH, VERDICTS, Spool

log = logging.getLogger("fleetd")

# The number of the empty batch that asks echod what it takes: no spooled batch has it.
PROBE_SEQ = 2**63 - 1


@dataclass
class Gathering:
    """Rows not yet sealed into a batch."""

    events: list[dict] = field(default_factory=list)
    scores: list[dict] = field(default_factory=list)
    thresholds: list[dict] = field(default_factory=list)
    verdicts: list[dict] = field(default_factory=list)
    peer_lag: list[dict] = field(default_factory=list)
    pushes: list[bytes] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)     # the events each of those holds
    since: float | None = None

    def rows(self) -> int:
        return (len(self.events) + len(self.scores) + len(self.thresholds) + len(self.verdicts)
                + len(self.peer_lag) + sum(self.counts))

    def by_class(self) -> list[tuple[int, dict[str, list]]]:
        """The rows as one batch per class, the classes that have any."""
        classes = ((EVENTS, {"events": self.events, "pushes": self.pushes}),
                   (HEALTH, {"scores": self.scores, "thresholds": self.thresholds,
                             "peer_lag": self.peer_lag}),
                   (VERDICTS, {"verdicts": self.verdicts}))
        return [(cls, sections) for cls, sections in classes if any(sections.values())]


class Forwarder:
    def __init__(self, cfg, context: zmq.Context, metrics, clock=time.monotonic):
        self.cfg = cfg
        self.metrics = metrics
        self.clock = clock
        self.source = f"{pysocket.gethostname()}:{uuid.uuid4().hex[:12]}"
        self.gathering = Gathering()
        self.columnar: bool | None = None   # echod takes pushes of columns (None: not heard)
        self.asked_at: float | None = None  # when the empty batch that asks was last sent
        self.spool = Spool(cfg.spool_dir, cfg.spool_max_bytes, metrics)
        self.spool.recover()
        self.complaints = RateLimitedLog(log, 30.0)
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        self.socket.sndhwm = 10_000
        if not cfg.insecure_plaintext_zmq:
            curve.connect_curve(self.socket, curve.load_keypair(cfg.secret_key),
                                curve.load_public(cfg.echod_public_key))
        self.socket.connect(cfg.echod)

    # -- gathering -----------------------------------------------------------------------------

    def add_push(self, push: wire.Push, recv_at: float, clock=None, kept=None) -> None:
        """A fresh push's events and score; ``clock`` is its node's offset estimate (an
        ``ingero.analysis.clock.Offset``), so that echod can correct the node's times too.
        ``kept``: the events fleetd took (``RankAnalysis.screen``): where it refused some, the
        rest go as rows."""
        maps, mask = kept if kept is not None else (push.events, None)
        whole = len(maps) == len(push.events) and (mask is None or mask.all())
        if whole and self.columnar is not False and push.body is not None:   # as it came
            self.gathering.pushes.append(push.body)
            self.gathering.counts.append(push.event_count())
        elif whole:
            self.gathering.events += push.stored_rows()
        else:
            columns = push.columns.rows(np.flatnonzero(mask)) if mask is not None else []
            self.gathering.events += push.stored_rows(columns + maps)
        self.gathering.scores.append({
            "t": recv_at, "cluster": push.cluster, "node": push.node, "job": push.job,
            "boot_id": push.boot_id, "seq": push.seq,
            "score": push.score, "state": push.state, "signals": push.signals,
            "clock_offset": clock.offset if clock else None,
            "clock_uncertainty": clock.uncertainty if clock else None})
        self._started()
        if self.gathering.rows() >= self.cfg.forward_batch_rows:
            self.seal()  # many pushes can arrive between two commits: keep batches bounded

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
        """Write the gathered rows to the spool, one batch per class (or several: ``keep``).
        Call ``commit`` before answering the agents whose rows they hold."""
        g, self.gathering = self.gathering, Gathering()
        for cls, sections in g.by_class():
            pushes = sections.pop("pushes", [])
            self.keep(cls, [(name, row) for name, rows in sections.items() for row in rows]
                      + [("pushes", (body, n)) for body, n in zip(pushes, g.counts)])

    def keep(self, cls: int, items: list[tuple[str, Any]]) -> None:
        """Spool ``items`` ((section, row), or ("pushes", (body, its events))) as one batch,
        or, where that would be past ``forward_batch_bytes`` or a list past what a message
        holds, as two of half the items each, and so on: no batch is past what echod takes,
        and one push of columns past it alone goes as its rows."""
        seq = self.spool.take_seq()
        sections: dict[str, list] = {}
        for name, item in items:
            sections.setdefault(name, []).append(item)
        pushes = sections.pop("pushes", [])
        message = wire.ForwardColumns(seq, self.source, **sections,
                                      pushes=[body for body, _ in pushes]) if pushes \
            else wire.Forward(seq, self.source, **sections)
        frames = wire.encode(message)
        fits = sum(map(len, frames)) <= self.cfg.forward_batch_bytes and all(
            len(rows) <= wire.MAX_FORWARD_ROWS for rows in sections.values()) and \
            len(pushes) <= wire.MAX_FORWARD_PUSHES
        if fits or (len(items) == 1 and not pushes):
            self.spool.add(seq, cls, frames, sum(map(len, sections.values()))
                           + sum(n for _, n in pushes))
        elif len(items) > 1:
            self.keep(cls, items[:len(items) // 2])
            self.keep(cls, items[len(items) // 2:])
        else:                   # one push of columns, too large for a batch: as its rows
            rows = wire.ForwardColumns(0, self.source, pushes=[pushes[0][0]]).as_forward()
            self.keep(cls, [("events", row) for row in rows.events])

    def commit(self) -> None:
        """Seal what is gathered and make it durable: the agents may be answered."""
        if self.gathering.rows():
            self.seal()
        self.spool.commit()

    # -- traffic -------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        g = self.gathering
        if g.rows() and now - g.since >= self.cfg.forward_interval:
            self.commit()
        in_flight, columns_wait = 0, False
        # Until echod's first ack says what it takes, one batch at a time, of rows: an echod
        # before 1.3 refuses a batch of columns unanswered.
        window = self.cfg.forward_window if self.columnar is not None else 1
        for entry in list(self.spool.entries.values()):
            if in_flight >= window:
                break
            if entry.columnar and self.columnar is None:
                columns_wait = True
                continue
            if entry.sent_at is None or now - entry.sent_at >= self.cfg.forward_resend_after:
                frames = self.spool.frames(entry)
                if frames is None:
                    continue
                if not self._send(frames):
                    break
                if entry.sent_at is not None:
                    self.metrics.forward_resent.inc()
                entry.sent_at = now
            in_flight += 1
        if columns_wait and not in_flight and (
                self.asked_at is None or now - self.asked_at >= self.cfg.forward_resend_after):
            if self._send(wire.encode(wire.Forward(PROBE_SEQ, self.source))):
                self.asked_at = now
        self.metrics.spool_age.set(self.spool.oldest_age())

    def _send(self, frames: list[bytes]) -> bool:
        try:
            self.socket.send_multipart(frames, zmq.NOBLOCK)
        except zmq.Again:
            return False
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
            if not isinstance(ack, wire.ForwardAck):
                continue
            self._heard(wire.COLUMNS in ack.capabilities)
            if self.spool.acknowledged(ack.ack):
                self.metrics.forward_acked.inc()
                self.metrics.forward_rejected.inc(ack.rejected)

    def _heard(self, columnar: bool) -> None:
        """What echod takes, from its ack. Batches of columns spooled for an echod that does
        not (one before 1.3, after a downgrade, refuses them) are made rows in their place."""
        if columnar == self.columnar:
            return
        self.columnar = columnar
        log.info("echod %s pushes of columns", "takes" if columnar else "does not take")
        for entry in [e for e in self.spool.entries.values() if e.columnar and not columnar]:
            frames = self.spool.frames(entry)
            if frames is not None:
                self.as_rows(entry, frames)

    def as_rows(self, entry, frames: list[bytes]) -> None:
        """A spooled batch of columns as rows in its place, for an echod that takes no
        columns; where its rows are past what one batch holds, as several batches."""
        as_rows = wire.decode(frames, sum(map(len, frames))).as_forward()
        encoded = wire.encode(as_rows)
        if sum(map(len, encoded)) <= self.cfg.forward_batch_bytes and \
                as_rows.row_count() <= wire.MAX_FORWARD_ROWS:
            self.spool.rewrite(entry, encoded)
            entry.sent_at = None
            return
        self.spool.discard(entry.seq)
        self.keep(entry.cls, [(name, row) for name in wire.Forward.SECTIONS
                              for row in getattr(as_rows, name)])

    def flush(self, timeout: float) -> int:
        """On stop: spool what is gathered and give echod ``timeout`` to take it all; returns
        how many batches it did not (a disk spool keeps them for the next start)."""
        self.commit()
        deadline = self.clock() + timeout
        while self.spool.entries and self.clock() < deadline:
            self.tick(self.clock())
            if self.socket.poll(100, zmq.POLLIN):
                self.receive()
        return len(self.spool.entries)

    def close(self) -> None:
        self.socket.close(linger=0)
