"""fleetd's spool: every sealed batch is on disk before the agents whose rows it holds hear back.

A batch is one file, ``<seq>.<class>.batch``: written whole under a temporary name, fsynced and
renamed, so that a file under its final name is complete (a checksum catches what the disk got
wrong); the directory is fsynced once per commit, and fleetd answers the agents only after the
commit. A batch leaves the spool when echod acknowledges it, which echod does once its rows
are committed. At start, what the last run left is read back and sent again; echod's keys make
a replay change nothing.

The spool is bounded in bytes. When a batch does not fit, under the bound or because the
filesystem is full, room is made by dropping the oldest batches of the lowest class first: raw
events, then health (scores, thresholds, peer lag), verdicts last; a batch for which no room can
be made is dropped itself. Every drop is counted by class and reason, and logged.

With no directory the spool lives in memory: the same bound and order, but nothing outlives
the process.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ingero import wire
from ingero.errors import FrameError
from ingero.framefile import decode, encode, write_file
from ingero.runtime import RateLimitedLog

log = logging.getLogger("fleetd")

CLASSES = ("events", "health", "verdicts")          # dropped in this order
EVENTS, HEALTH, VERDICTS = range(len(CLASSES))
NAME = re.compile(r"^(\d{12})\.([0-2])\.batch$")
NO_ROOM = (errno.ENOSPC, errno.EDQUOT)


def _columnar(frames: list[bytes]) -> bool:
    return len(frames[0]) == wire.HEADER_SIZE and frames[0][6] == wire.ForwardColumns.TYPE


class SpoolFull(Exception):
    """No room for a batch, whatever is dropped."""


@dataclass
class Entry:
    seq: int
    cls: int
    rows: int
    size: int
    created: float                      # wall-clock time, for the age gauge
    frames: list[bytes] | None = None   # kept in memory only by a memory spool
    sent_at: float | None = None        # monotonic, when last sent to echod
    columnar: bool = False              # a ForwardColumns (pushes of columns, since 1.3)

    @property
    def name(self) -> str:
        return f"{self.seq:012d}.{self.cls}.batch"


class Spool:
    def __init__(self, directory: Path | None, max_bytes: int, metrics, clock=time.time):
        self.directory = directory
        self.max_bytes = max_bytes
        self.metrics = metrics
        self.clock = clock
        self.entries: dict[int, Entry] = {}   # by seq, in seq order
        self.bytes = 0
        self.next_seq = 0
        self.dirty = False
        self.complaints = RateLimitedLog(log, 30.0)

    # -- start -------------------------------------------------------------------------------

    def recover(self) -> int:
        """Take back what a previous run left; returns how many batches wait for echod."""
        if self.directory is None:
            return 0
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        found = []
        for path in self.directory.iterdir():
            match = NAME.match(path.name)
            if match is None:
                if path.name.endswith(".tmp"):    # a write the last run did not finish
                    path.unlink(missing_ok=True)
                continue
            found.append((int(match.group(1)), int(match.group(2)), path))
        for seq, cls, path in sorted(found):
            try:
                frames = decode(path.read_bytes())
                rows = self._rows(frames)
            except (OSError, ValueError, FrameError) as exc:
                log.warning("spool: dropped unreadable batch %s: %s", path.name, exc)
                self.metrics.spool_corrupt.inc()      # how many rows it held is unknown
                path.unlink(missing_ok=True)
                continue
            entry = Entry(seq, cls, rows, path.stat().st_size, path.stat().st_mtime,
                          columnar=_columnar(frames))
            self.entries[seq] = entry
            self.bytes += entry.size
        self.next_seq = max(self.entries, default=-1) + 1
        self._publish()
        if self.entries:
            log.info("spool: %d batch(es), %d rows, %d bytes left by the last run; sending them "
                     "to echod again", len(self.entries),
                     sum(e.rows for e in self.entries.values()), self.bytes)
        return len(self.entries)

    @staticmethod
    def _rows(frames: list[bytes]) -> int:
        """Its rows, however large the batch (an older fleetd's may be past today's bound)."""
        return wire.decode(frames, sum(map(len, frames))).row_count()

    # -- batches in --------------------------------------------------------------------------

    def take_seq(self) -> int:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        return seq

    def add(self, seq: int, cls: int, frames: list[bytes], rows: int) -> Entry | None:
        """Keep a batch, making room by class; None when it was dropped itself."""
        data = encode(frames)
        entry = Entry(seq, cls, rows, len(data), self.clock(), columnar=_columnar(frames))
        try:
            for victim in self._victims(entry):
                if self.bytes + entry.size <= self.max_bytes:
                    break
                self.drop(victim.seq, "full")
            if self.bytes + entry.size > self.max_bytes:
                raise SpoolFull("full")
            while True:
                try:
                    self._write(entry, data, frames)
                    break
                except OSError as exc:
                    if exc.errno not in NO_ROOM:
                        raise
                    victims = self._victims(entry)
                    if not victims:
                        raise SpoolFull("disk_full") from None
                    self.drop(victims[0].seq, "disk_full")   # then try again
        except SpoolFull as exc:
            self._count_drop(entry, str(exc))
            self._publish()
            return None
        except OSError as exc:
            self._count_drop(entry, "write_error")
            self.complaints.warning("write", "spool: cannot write %s: %s", entry.name, exc)
            self._publish()
            return None
        self.entries[entry.seq] = entry
        self.bytes += entry.size
        self._publish()
        return entry

    def _victims(self, entry: Entry) -> list[Entry]:
        """What may go to make room for ``entry``: batches of its class or lower, the lowest
        class and the oldest first."""
        return sorted((e for e in self.entries.values() if e.cls <= entry.cls),
                      key=lambda e: (e.cls, e.seq))

    def _write(self, entry: Entry, data: bytes, frames: list[bytes]) -> None:
        if self.directory is None:
            entry.frames = frames
            return
        write_file(self.directory / entry.name, data, sync=True)
        self.dirty = True

    def drop(self, seq: int, reason: str) -> None:
        entry = self.entries.pop(seq)
        self.bytes -= entry.size
        self._unlink(entry)
        self._count_drop(entry, reason)

    def _count_drop(self, entry: Entry, reason: str) -> None:
        self.metrics.spool_dropped.labels(CLASSES[entry.cls], reason).inc(entry.rows)
        self.complaints.warning(f"{reason}:{entry.cls}",
                                "spool %s: dropped a batch of %d %s rows (%d batches, %d bytes "
                                "kept)", reason.replace("_", " "), entry.rows, CLASSES[entry.cls],
                                len(self.entries), self.bytes)

    def commit(self) -> None:
        """Make the batches added since the last commit durable (their names included)."""
        if not self.dirty:
            return
        fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.dirty = False

    # -- batches out -------------------------------------------------------------------------

    def frames(self, entry: Entry) -> list[bytes] | None:
        """The batch as sent; None (and the batch dropped) when its file went bad."""
        if entry.frames is not None:
            return entry.frames
        try:
            return decode((self.directory / entry.name).read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("spool: dropped unreadable batch %s: %s", entry.name, exc)
            self.drop(entry.seq, "corrupt")
            self._publish()
            return None

    def rewrite(self, entry: Entry, frames: list[bytes]) -> None:
        """The same batch in another form (as rows, for an older echod), in its place."""
        data = encode(frames)
        self._write(entry, data, frames)
        self.bytes += len(data) - entry.size
        entry.size, entry.columnar = len(data), _columnar(frames)
        self._publish()

    def acknowledged(self, seq: int) -> bool:
        return self.discard(seq)

    def discard(self, seq: int) -> bool:
        """Forget a batch (stored, or spooled again in another form); False if unknown."""
        entry = self.entries.pop(seq, None)
        if entry is None:
            return False
        self.bytes -= entry.size
        self._unlink(entry)
        self._publish()
        return True

    def _unlink(self, entry: Entry) -> None:
        if self.directory is not None:
            try:
                (self.directory / entry.name).unlink(missing_ok=True)
            except OSError as exc:
                self.complaints.warning("unlink", "spool: cannot remove %s: %s", entry.name, exc)

    def _publish(self) -> None:
        self.metrics.spool_batches.set(len(self.entries))
        self.metrics.spool_bytes.set(self.bytes)

    def oldest_age(self) -> float:
        oldest = next(iter(self.entries.values()), None)
        return 0.0 if oldest is None else max(0.0, self.clock() - oldest.created)
