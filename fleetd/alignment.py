"""The same collective across ranks: one communicator's entries, aligned by sequence number.

Ranks call a communicator's collectives in the same order, so (communicator, sequence) names one
instance on every rank without trusting clocks. Entries arrive in pushes, from several nodes, in
any order; they are written into a ring of open instances (a row per sequence number, a column
per communicator rank) with numpy indexing, never a Python loop per event. The ring starts
small and doubles, up to its capacity, only when an instance would take a row still open: a
job keeps a few instances open at once, and memory goes with what is used, not with the
number of ranks an event claims. An instance that all ranks entered moves to the history the
rules read; one that some ranks never enter stays open, and after the hang timeout its missing
ranks are named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ingero.analysis.stragglers import missing_ranks

OPEN_CAPACITY = 1024     # instances a communicator may have open at once
OPEN_FIRST = 8           # rows of a new communicator's ring
HISTORY = 256            # complete instances kept for the rules


class Pair(NamedTuple):
    """A Send/Recv pair's window, beside its communicator's: the communicator, and the
    sender's and the receiver's ranks in it."""

    comm: str
    sender: int
    receiver: int

    def __str__(self) -> str:
        return f"{self.comm}>{self.sender}>{self.receiver}"

    def words(self) -> str:
        return f"communicator {self.comm} (the Send/Recv of its ranks {self.sender} to " \
            f"{self.receiver})"


class Exchange(NamedTuple):
    """The all-to-alls a communicator's ranks make of grouped Send/Recv (``EXCHANGE``), as a
    window beside its communicator's: they keep a sequence of their own."""

    comm: str

    def __str__(self) -> str:
        return f"{self.comm}>all"

    def words(self) -> str:
        return f"communicator {self.comm} (its ranks' grouped Send/Recv with every peer)"


# A window's key: its communicator's hash, a Send/Recv pair in it, or its exchanges.
CommKey = str | Pair | Exchange


def comm_of(key: CommKey) -> str:
    """The hash of the communicator a window is on."""
    return key if isinstance(key, str) else key.comm


def words_of(key: CommKey) -> str:
    """The window, in words."""
    return f"communicator {key}" if isinstance(key, str) else key.words()


@dataclass(frozen=True)
class Entries:
    """Collective entries of one push on one communicator, as arrays."""

    seq: np.ndarray          # int64
    column: np.ndarray       # communicator rank
    t: np.ndarray            # clock-corrected entry time, seconds
    op: np.ndarray           # op code (see ``OpCodes``)


class OpCodes:
    """Small integers for op names, so a history row carries its op as a number."""

    def __init__(self):
        self.codes: dict[str, int] = {}
        self.names: list[str] = []

    def code(self, name: str) -> int:
        if name not in self.codes:
            self.codes[name] = len(self.names)
            self.names.append(name)
        return self.codes[name]


class CommWindow:
    """Open and recent instances of one communicator."""

    def __init__(self, comm_hash: str, nranks: int, capacity: int = OPEN_CAPACITY,
                 history: int = HISTORY, created: float = 0.0):
        self.comm_hash = comm_hash
        self.nranks = nranks
        self.created = created    # when fleetd first heard of it (its clock)
        self.bar = np.inf         # the lag bar of its last judgement
        self.last_added = created # when entries last came (fleetd's clock)
        self.destroyed = False    # the job destroyed it (ncclCommDestroy)
        self.capacity = capacity
        rows = min(capacity, OPEN_FIRST)
        self.open = np.full((rows, nranks), np.nan)
        self.open_seq = np.full(rows, -1, np.int64)
        self.open_op = np.full(rows, -1, np.int64)
        self.history_size = history
        self.entries = np.empty((0, nranks))
        self.seq = np.empty(0, np.int64)
        self.op = np.empty(0, np.int64)
        self.step = np.empty(0, np.int64)     # the instance's ordinal among its op's
        self.op_counts: dict[int, int] = {}
        self.overwritten = 0      # open instances pushed out of the ring unfinished
        self.latest = np.full(nranks, -1, np.int64)   # the furthest instance each rank entered
        self.first_seq = -1       # the first instance any entry came for (-1: none yet)
        self.incomplete = 0       # instances dropped because an entry never came (lost)
        self.too_late = 0         # entries for instances the ring no longer holds

    def add(self, batch: Entries) -> int:
        """Write entries into their open instances; returns how many were out of range. An
        entry for an instance older than the ring holds (it arrived too late: a backlog) is
        dropped and counted, never written over a newer open instance's row."""
        good = (batch.column >= 0) & (batch.column < self.nranks) & (batch.seq >= 0)
        newest = max(int(self.latest.max()), int(batch.seq[good].max(initial=-1)))
        stale = good & (batch.seq <= newest - self.capacity)
        self._grow(np.unique(batch.seq[good & ~stale]))
        self.too_late += int(stale.sum())
        good &= ~stale
        seq, column = batch.seq[good], batch.column[good]
        rows = seq % len(self.open_seq)
        older = self.open_seq[rows] > seq             # its row holds a newer instance by now
        if older.any():
            self.too_late += int(older.sum())
            keep = ~older
            seq, column, rows = seq[keep], column[keep], rows[keep]
            good[np.flatnonzero(good)[older]] = False
        fresh = self.open_seq[rows] != seq
        if fresh.any():
            claimed = rows[fresh]
            self.overwritten += int((self.open_seq[np.unique(claimed)] >= 0).sum())
            self.open[claimed] = np.nan
            self.open_seq[claimed] = seq[fresh]
            self.open_op[claimed] = batch.op[good][fresh]
        self.open[rows, column] = batch.t[good]
        np.maximum.at(self.latest, column, seq)
        if len(seq) and (self.first_seq < 0 or seq.min() < self.first_seq):
            self.first_seq = int(seq.min())
        return int((~good).sum())

    def _grow(self, seq: np.ndarray) -> None:
        """Double the ring (up to its capacity) while one of ``seq`` (distinct) would take a
        row that another instance holds open, or one another of them takes. Open instances
        sit in distinct rows, so they do in a ring twice as long too."""
        while len(self.open_seq) < self.capacity:
            rows = seq % len(self.open_seq)
            held = self.open_seq[rows]
            if not ((held >= 0) & (held != seq)).any() and len(np.unique(rows)) == len(seq):
                return
            rows = min(2 * len(self.open_seq), self.capacity)
            used = np.flatnonzero(self.open_seq >= 0)
            at = self.open_seq[used] % rows
            grown = np.full((rows, self.nranks), np.nan)
            grown[at] = self.open[used]
            open_seq, open_op = np.full(rows, -1, np.int64), np.full(rows, -1, np.int64)
            open_seq[at], open_op[at] = self.open_seq[used], self.open_op[used]
            self.open, self.open_seq, self.open_op = grown, open_seq, open_op

    def settle(self, unseen: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
        """Move the instances every rank entered to the history, in sequence order; returns
        the newly complete (seq, op, entries). ``unseen`` columns (no agent can tell where
        their ranks are) are not waited for: they stay NaN, and the others are judged."""
        entered = np.isfinite(self.open)
        if unseen is not None and unseen.any():
            entered |= unseen
        done = (self.open_seq >= 0) & entered.all(axis=1) & \
            (np.isfinite(self.open).sum(axis=1) >= 2)
        rows = np.flatnonzero(done)
        rows = rows[np.argsort(self.open_seq[rows], kind="stable")]
        seq, op, entries = self.open_seq[rows].copy(), self.open_op[rows].copy(), \
            self.open[rows].copy()
        self.open_seq[rows] = -1
        step = np.empty(len(op), np.int64)
        for code in np.unique(op):
            mine = op == code
            first = self.op_counts.get(int(code), 0)
            step[mine] = first + np.arange(mine.sum())
            self.op_counts[int(code)] = first + int(mine.sum())
        keep = self.history_size
        self.entries = np.vstack([self.entries, entries])[-keep:]
        self.seq = np.concatenate([self.seq, seq])[-keep:]
        self.op = np.concatenate([self.op, op])[-keep:]
        self.step = np.concatenate([self.step, step])[-keep:]
        return seq, op, entries

    def stalled(self, now: float, timeout: float) -> list[tuple[int, int, np.ndarray]]:
        """Open instances some rank entered more than ``timeout`` seconds ago that others have
        not: (seq, op, missing columns), oldest first. A rank that has entered a later instance
        passed this one too (ranks keep the same order): its entry was lost on the way, it is
        not missing; an instance missing only such entries is dropped and counted."""
        used = np.flatnonzero(self.open_seq >= 0)
        if not len(used):
            return []
        first = np.nanmin(self.open[used], axis=1)
        old = used[first < now - timeout]
        old = old[np.argsort(self.open_seq[old])]
        behind = missing_ranks(self.open[old], self.latest, self.open_seq[old])
        missing = behind.any(axis=1)
        self.open_seq[old[~missing]] = -1
        self.incomplete += int((~missing).sum())
        rows, columns = np.nonzero(behind[missing])
        each = np.split(columns, np.flatnonzero(np.diff(rows)) + 1) if len(rows) else []
        return list(zip(self.open_seq[old[missing]].tolist(),
                        self.open_op[old[missing]].tolist(), each))

    def dominant(self) -> tuple[int | None, np.ndarray]:
        """The op this communicator runs most (the per-step collective) and its history
        rows' mask."""
        if not len(self.op):
            return None, np.zeros(0, bool)
        ops, counts = np.unique(self.op, return_counts=True)
        op = int(ops[np.argmax(counts)])
        return op, self.op == op
