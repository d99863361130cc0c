"""A receiver's notices, in order, each until the receiver took it: a directory under fleetd's
spool, one file a notice, written whole (``ingero.framefile``) and fsynced before fleetd goes
on, removed once delivered. A receiver that fails is tried again with a growing pause (1 s
doubling to 30 s), its notices kept in order, and across a restart of fleetd. A notice older
than ``--on-verdict-expiry`` is dropped unsent (counted ``expired``), so a receiver that keeps
failing holds the ones after it up for that long at most; past ``--on-verdict-max-pending``
waiting, the oldest is dropped (``dropped``).

What a receiver's ``deliver`` answers: ``DELIVERED``, ``RETRY`` (later, in order) or
``REFUSED`` (dropped, counted). Imports only ``ingero``: the receivers (``fleetd.notify``,
``fleetd.slurmactions``) stand above it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Callable

from ingero.framefile import decode, encode, write_file
from ingero.runtime import RateLimitedLog

log = logging.getLogger("fleetd")

RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0
NAME = re.compile(r"^(\d{12})\.notice$")

DELIVERED, RETRY, REFUSED = "delivered", "retry", "refused"


class Outbox:
    """One receiver's notices, in order: kept in ``directory`` (or memory, with None) until
    ``deliver`` takes each, ``max_pending`` at most (the oldest dropped), each until it is
    ``expiry_s`` old; a thread of its own delivers them."""

    def __init__(self, name: str, directory: Path | None, deliver: Callable[[dict], str],
                 metrics, on_start: Callable[[], object] | None = None,
                 max_pending: int = 10_000, expiry_s: float | None = None, clock=time.time):
        self.name, self.directory, self.deliver = name, directory, deliver
        self.on_start = on_start
        self.max_pending, self.expiry_s, self.clock = max_pending, expiry_s, clock
        self.metrics = metrics
        self.queue: deque[tuple[int, dict]] = deque()
        self.lock = threading.Condition()
        self.next_seq = 0
        self.stopping = False
        self.complaints = RateLimitedLog(log, 60.0)
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._recover()
        self.thread = threading.Thread(target=self._run, name=f"notify-{name}", daemon=True)

    def _recover(self) -> None:
        for path in sorted(self.directory.iterdir()):
            match = NAME.match(path.name)
            if match is None:
                if path.name.endswith(".tmp"):
                    path.unlink(missing_ok=True)
                continue
            try:
                payload = json.loads(decode(path.read_bytes())[0])
            except (OSError, ValueError) as exc:
                log.warning("notices for %s: %s does not read back (%s); dropped", self.name,
                            path, exc)
                path.unlink(missing_ok=True)
                self.metrics.notices.labels(self.name, "corrupt").inc()
                continue
            self.queue.append((int(match[1]), payload))
            self.next_seq = int(match[1]) + 1
        if self.queue:
            log.info("notices for %s: %d kept from the last run, to be sent", self.name,
                     len(self.queue))
        self._publish()

    def start(self) -> "Outbox":
        self.thread.start()
        return self

    def put(self, payload: dict) -> None:
        """Keep a notice (on disk first: none is lost if fleetd stops), then wake the thread."""
        with self.lock:
            seq, self.next_seq = self.next_seq, self.next_seq + 1
            if self.directory is not None:
                try:
                    write_file(self.directory / f"{seq:012d}.notice",
                               encode([json.dumps(payload).encode()]), sync=True)
                except OSError as exc:
                    self.complaints.warning("write", "notices for %s: cannot keep one on "
                                            "disk (%s); it is kept in memory only", self.name,
                                            exc.strerror)
            self.queue.append((seq, payload))
            while len(self.queue) > self.max_pending:
                self._drop("dropped")
            self._publish()
            self.lock.notify()

    def _drop(self, outcome: str) -> None:
        """The oldest notice, unsent (the lock held)."""
        seq, payload = self.queue.popleft()
        if self.directory is not None:
            (self.directory / f"{seq:012d}.notice").unlink(missing_ok=True)
        self.metrics.notices.labels(self.name, outcome).inc()
        self.complaints.warning(outcome, "notices for %s: %s %s unsent (%s)", self.name,
                                outcome, payload.get("id"),
                                f"older than {self.expiry_s:.0f} s" if outcome == "expired"
                                else f"over {self.max_pending} waiting")

    def _expired(self, payload: dict) -> bool:
        if self.expiry_s is None or not isinstance(payload.get("at"), str):
            return False
        try:
            at = datetime.fromisoformat(payload["at"].replace("Z", "+00:00")).timestamp()
        except ValueError:
            return False
        return self.clock() - at > self.expiry_s

    def _run(self) -> None:
        if self.on_start is not None:
            try:
                self.on_start()
            except Exception:
                log.exception("notices for %s: starting failed", self.name)
        pause = RETRY_FIRST_S
        while True:
            with self.lock:
                while not self.queue and not self.stopping:
                    self.lock.wait()
                if self.stopping:
                    return
                seq, payload = self.queue[0]
                if self._expired(payload):
                    self._drop("expired")
                    self._publish()
                    pause = RETRY_FIRST_S
                    continue
            try:
                outcome = self.deliver(payload)
            except Exception:   # a bug in a sink must not end its thread
                log.exception("notices for %s: delivering %s failed", self.name, payload["id"])
                outcome = RETRY
            self.metrics.notices.labels(self.name, outcome).inc()
            if outcome == RETRY:
                with self.lock:
                    self.lock.wait_for(lambda: self.stopping, pause)
                pause = min(RETRY_MAX_S, pause * 2)
                continue
            pause = RETRY_FIRST_S
            with self.lock:
                if self.queue and self.queue[0][0] == seq:   # not dropped meanwhile by put
                    self.queue.popleft()
                if self.directory is not None:
                    (self.directory / f"{seq:012d}.notice").unlink(missing_ok=True)
                self._publish()

    def _publish(self) -> None:
        self.metrics.notices_pending.labels(self.name).set(len(self.queue))

    def close(self, timeout: float = 2.0) -> int:
        """Stop the thread; what it has not delivered stays on disk for the next run."""
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        if self.thread.is_alive():
            self.thread.join(timeout)
        return len(self.queue)
