"""A push of columns into the rank analysis, whole arrays at a time.

The events that make up nearly all of a push (collectives on a known communicator, syncs,
allocations, frees, copies) are grouped with numpy, by run and then by communicator or rank, and
handed over as arrays: a Python step per group, never per event. The rest (an exit, a split, a
collective on a communicator the agent did not see made, a Send/Recv or an exchange,
preemption and block I/O evidence) are few, and go through the same per-event code as a push
of maps, first.
"""

from __future__ import annotations

import numpy as np

from ingero.analysis.segments import group_rows, grouped
from ingero.columns import EventColumns
from ingero.vocabulary import OWN_SEQUENCE, UNKNOWN_COMM

from .rankstate import RUN_TAGS, JobState

BULK = ("collective", "sync", "alloc", "free", "memcpy")


class ColumnIntake:
    """Takes a ``ColumnPush``'s columns into a ``RankAnalysis``."""

    def __init__(self, analysis):
        self.analysis = analysis

    def bulk(self, cols: EventColumns) -> np.ndarray:
        """Which events this takes (a boolean array); the per-event path takes the rest."""
        kind_bulk = np.isin(cols.kind, [cols.kinds.index(k) for k in BULK if k in cols.kinds])
        comm, comms = cols.codes("comm_hash")
        unknown = [k for k, c in enumerate(comms) if c == UNKNOWN_COMM]
        op, ops = cols.codes("op")
        own = [k for k, name in enumerate(ops) if name in OWN_SEQUENCE]
        placed = (comm >= 0) & ~np.isin(comm, unknown) & (cols.ints("nranks") >= 1) \
            & (cols.ints("comm_rank") >= 0) & ~np.isin(op, own)
        return kind_bulk & (placed | ~cols.of_kind("collective"))

    def runs(self, push, cols: EventColumns, now: float,
             taken: np.ndarray) -> tuple[list[JobState | None], np.ndarray]:
        """Each event's run (job, step, requeue, restart), as ``JobState``s and an index; a
        run only of events not ``taken`` (refused) has none, and none is made for it."""
        coded = [cols.coded(name) for name in ("job", *RUN_TAGS)]   # of any type each
        unique, group = group_rows(*(codes for codes, _values in coded))
        wanted = np.zeros(len(unique), bool)
        wanted[group[taken]] = True
        states = []
        for key, want in zip(unique.tolist(), wanted.tolist()):
            job, *run = (values[k] if k >= 0 else None
                         for k, (_codes, values) in zip(key, coded))
            states.append(self.analysis.job_state(push.cluster, job or push.job, tuple(run), now)
                          if want else None)
        return states, group

    def take(self, push, cols: EventColumns, offset: float, chunks: dict, now: float,
             bulk: np.ndarray) -> None:
        """The ``bulk`` events: facts per rank (times less ``offset``),
        collectives per communicator into ``chunks`` ((job, comm, nranks) → list of (seq,
        column, t, op) arrays, t as the node timed it)."""
        states, run = self.runs(push, cols, now, bulk)
        rank = cols.ints("rank")
        t = cols.t - offset
        collective = bulk & cols.of_kind("collective")
        self._collectives(push.node, cols, states, run, rank, t, collective, chunks)
        ranked = bulk & ~collective & (rank >= 0)
        self._facts(push.node, cols, states, run, rank, t, ranked)

    def _collectives(self, node: str, cols: EventColumns, states: list[JobState],
                     run: np.ndarray, rank: np.ndarray, t: np.ndarray, which: np.ndarray,
                     chunks: dict) -> None:
        at = np.flatnonzero(which)
        if not len(at):
            return
        comm, comms = cols.codes("comm_hash")
        op, ops = cols.codes("op")
        op_code = np.array([self.analysis.ops.code(name) for name in ops] + [
            self.analysis.ops.code("?")], np.int64)[np.where(op >= 0, op, len(ops))]
        nranks, column = cols.ints("nranks"), cols.ints("comm_rank")
        seq, pid = cols.ints("seq"), cols.ints("pid")
        who = np.where(rank >= 0, rank, column)
        for (r, c, size), part in grouped(run[at], comm[at], nranks[at]):
            mine = at[part]
            job = states[r]
            chunks[(job, comms[c], size)].append(   # as the node timed them
                (seq[mine], column[mine], cols.t[mine], op_code[mine]))
            job.columns.setdefault(comms[c], {}).update(   # communicator rank → job rank
                group_rows(column[mine], who[mine])[0].tolist())
        self._processes(node, states, run[at], who[at], pid[at], t[at])

    @staticmethod
    def _processes(node: str, states: list[JobState], run: np.ndarray, who: np.ndarray,
                   pid: np.ndarray, t: np.ndarray) -> None:
        """Each rank's node and process, from its collectives: a new process of a rank clears
        what the last one's end said (an exit after the new one's first call stands)."""
        for (r, rank), mine in grouped(run, who):
            facts = states[r].facts[rank]
            pids = pid[mine]
            before = np.concatenate([[-1 if facts.pid is None else facts.pid], pids[:-1]])
            new = np.flatnonzero((pids >= 0) & (before >= 0) & (pids != before))
            if len(new) and (facts.exited_at is None or facts.exited_at < t[mine][new[0]]):
                facts.exited_at = facts.crashed = facts.aborted_at = None
            facts.node = node
            last = int(pids[-1])
            facts.pid = None if last < 0 else last

    @staticmethod
    def _facts(node: str, cols: EventColumns, states: list[JobState], run: np.ndarray,
               rank: np.ndarray, t: np.ndarray, which: np.ndarray) -> None:
        """Syncs and allocations, per rank; every bulk event says where its rank runs."""
        at = np.flatnonzero(which)
        if not len(at):
            return
        for r, rk in group_rows(run[at], rank[at])[0].tolist():
            states[r].facts[rk].node = node
        duration = cols.ints("duration_ns")
        timed = which & (duration >= 0)
        comm, comms = cols.codes("comm_hash")
        names = np.array(list(comms) + [None], dtype=object)
        peer_wait, seq = cols.flags("peer_wait"), cols.ints("seq")
        for facts, mine in _per_rank(states, run, rank, timed & cols.of_kind("sync")):
            waited, spent, when = peer_wait[mine], duration[mine], t[mine]
            on = names[np.where(waited & (comm[mine] >= 0), comm[mine], len(comms))]
            facts.sync_end.extend((when + spent / 1e9).tolist())
            facts.sync_on.extend(on.tolist())
            facts.peer_wait_ns.extend(spent[waited].tolist())
            facts.peer_wait_t.extend(cols.t[mine][waited].tolist())    # as its node timed it
            facts.peer_wait_on.extend(zip(on[waited].tolist(), seq[mine][waited].tolist()))
            facts.self_work_ns.extend(spent[~waited].tolist())
        for facts, mine in _per_rank(states, run, rank, timed & cols.of_kind("alloc")):
            facts.allocation_ns.extend(duration[mine].tolist())


def _per_rank(states: list[JobState], run: np.ndarray, rank: np.ndarray, which: np.ndarray):
    """Each rank's facts with the positions of its events among ``which``."""
    at = np.flatnonzero(which)
    if len(at):
        for (r, rk), part in grouped(run[at], rank[at]):
            yield states[r].facts[rk], at[part]
