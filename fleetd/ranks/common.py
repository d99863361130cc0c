"""What fleetd's rank analysis weighs beside the rules: its limits and the words of its notes,
which preemptions are another program's, a rank's waits at syncs around an onset, whether the
job's hosts run ahead of their GPUs (and since when), and Send/Recv pairs as windows of their
own. Functions of fleetd's state (``fleetd.rankstate``), no clock, no socket.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from ingero.analysis.cost import ONSET_WAITS, growth
from ingero.analysis.stragglers import quiet

from ..rankstate import JobState, RankFacts

log = logging.getLogger("fleetd")


PAIR = ">"                           # comm>sender>receiver: a Send/Recv pair's window
HOST_FACTS_S = 30.0                  # preemptions and block I/O weighed, seconds back
HOST_SETTLE = 1                      # push intervals of them before slow kernels are named
MAX_UNRESOLVED = 65_536              # collectives held per split comm until it is resolved
NOTES = {    # what fleetd says once of a rank late on the host that it does not name
    "ahead": "enters collectives {lag:.1f} ms late on the host but its peers wait no longer at "
             "them since (its GPU queue is still ahead): no straggler, no cost",
    "passed_down": "enters collectives {lag:.1f} ms late because it waited on a peer elsewhere "
                   "first (a pipeline stage's send, another group's collective): not its own "
                   "lateness, no straggler"}
PASSED_DOWN = ("host_work", "network_or_peer")   # causes a lateness passed down may look like
UNSYNCED_INSTANCES = 16              # instances with no sync seen: a job ingerod sees none of
DRIFT_STRETCHES = 3                  # runs of instances between the peers' syncs, or
DRIFT_INSTANCES = 256                # this many instances, before a swing is known
HARMLESS_GROWTH = 1.5                # a lateness shown to cost nobody is weighed again once
                                     # its lag has grown this many times
WINDOW_IDLE_S = 60.0                 # a communicator unused this long is retired (and for
WINDOW_IDLE_INTERVALS = 10           # this many push intervals)
UNCOVERED_AFTER = 3                  # push intervals a communicator runs before a rank no
UNCOVERED_AFTER_S = 5.0              # agent told of is taken as uncovered (and this long)
RESUMED_AFTER = 2                    # push intervals without one: a node's next is a resumption
SERVE_EVERY_S = 0.001                # judging between two chances for fleetd to answer pushes


def foreign(preempted: dict, job: str | None) -> bool:
    """Whether a preemption was by another program than the job's: not the rank's own process
    tree (its data-loader workers are its own work) and not another process of its job."""
    other_job = preempted.get("preemptor_job")
    return not preempted.get("preemptor_own") and (other_job is None or other_job != job)


def waits_around(facts: RankFacts, onset: float,
                 placed: Callable[[RankFacts], np.ndarray]) -> tuple[list[tuple], list[tuple]]:
    """A rank's waits at its syncs on collectives, as (stratum, ns, sync) (see ``growth``),
    before and since ``onset`` (fleetd's clock; ``placed``: the waits' times on it, NaN where
    its node's clock is not known, and those waits are in neither)."""
    before, after, last = [], [], {}
    for t, ns, (comm, seq) in zip(placed(facts), facts.peer_wait_ns, facts.peer_wait_on):
        covered = seq - last[comm] if 0 <= last.get(comm, -1) < seq else None
        last[comm] = seq
        sync = (comm, seq) if comm and seq >= 0 else None      # None: its own
        if t == t:
            (after if t >= onset else before).append(((comm, covered), ns, sync))
    return before, after


def own_growth(facts: RankFacts | None, onset: float,
               placed: Callable[[RankFacts], np.ndarray]) -> float:
    """How much a late rank's own waits at its syncs grew since its onset, in seconds (0 when
    they shrank or too few are seen to tell). The rank its peers wait for comes last and
    waits least; a delay that made the rank itself wait longer too came from elsewhere (a
    third rank's GPU, every host slowed at once), and that much of its peers' growth is not
    its doing (CI, eight ranks on two CPUs: rank 2 of a host-ahead job 6 ms late on the host
    while everyone's waits at one sync grew, its own the most, 30 ms against 16; named)."""
    if facts is None:
        return 0.0
    before, after = waits_around(facts, onset, placed)
    if len(before) < 2 or len(after) < ONSET_WAITS:
        return 0.0
    return max(0.0, growth(before, after)[0] / 1e9)


def runs_ahead(job: JobState, ranks: list[int], column: int,
               entries: np.ndarray) -> bool | None:
    """Whether the job's hosts run ahead of their GPUs: its peers (of ``column``) sync with
    them less than every other instance (``entries``, on fleetd's clock; where a peer's
    syncs kept no longer reach back to the first, over those since the oldest one kept);
    None where none of them has synced yet."""
    with quiet():
        times = np.nanmedian(entries, axis=1)
    times = times[np.isfinite(times)]
    shares, synced = [], False
    for at, rank in enumerate(ranks):
        facts = job.facts.get(rank)
        if at == column or facts is None:
            continue
        ends = np.fromiter(facts.sync_end, float)
        synced |= len(ends) > 0
        since = times
        if len(ends) and len(ends) == facts.sync_end.maxlen:
            since = since[since >= ends.min()]
        if len(since) >= 2:
            shares.append(int(((ends >= since.min()) & (ends <= since.max())).sum())
                          / len(since))
    if not synced:
        return None
    return bool(shares) and float(np.median(shares)) < 0.5


def after_first_sync(job: JobState, ranks: list[int], column: int,
                     entries: np.ndarray) -> np.ndarray:
    """Which instances (rows of ``entries``, on fleetd's clock) came after the first sync of
    the peers of ``column`` returned (of those kept); all of them where no peer has synced in
    ``UNSYNCED_INSTANCES`` (a job whose syncs ingerod does not see), none before that."""
    ends = [min(facts.sync_end) for at, rank in enumerate(ranks)
            if at != column and (facts := job.facts.get(rank)) is not None and facts.sync_end]
    with quiet():
        times = np.nanmedian(entries, axis=1)
    if ends:
        return np.nan_to_num(times, nan=-np.inf) > min(ends)
    return np.full(len(entries), len(entries) >= UNSYNCED_INSTANCES)


def drift_seen(job: JobState, ranks: list[int], column: int, entries: np.ndarray) -> bool:
    """Whether the instances (rows of ``entries``, on fleetd's clock, those since the first
    sync) show how far hosts that run ahead drift: they reach over ``DRIFT_STRETCHES`` runs of
    two or more instances between syncs of the peers of ``column`` (their median), or over
    ``DRIFT_INSTANCES``; or no peer syncs at all. Each sync realigns the hosts, and between
    two they drift apart by however long each was kept off its CPU, each by about as much at
    every instance of the run: within one run every rank's lag is steady, so its swing about
    its own median is nil and any rank a few ms behind stands out of it (beside a busy loop,
    a rank 10 ms behind in the run after a job's first sync, of peers from 11 ms ahead to
    15 ms behind, named critical). Across runs a rank's place changes, and that is the swing."""
    with quiet():
        times = np.nanmedian(entries, axis=1)
    times = times[np.isfinite(times)]
    if len(times) >= DRIFT_INSTANCES:
        return True
    runs = []
    for at, rank in enumerate(ranks):
        facts = job.facts.get(rank)
        if at == column or facts is None or not facts.sync_end:
            continue
        after = np.searchsorted(np.sort(np.fromiter(facts.sync_end, float)), times)
        lengths = np.unique(after, return_counts=True)[1]  # instances between two syncs
        runs.append(int((lengths >= 2).sum()))
    return not runs or float(np.median(runs)) >= DRIFT_STRETCHES


def pair_of(comm: str, me: int, peer: int, op: str) -> tuple[str, int, int]:
    """Send/Recv between two ranks of ``comm`` as a communicator of their own: the pair (the
    sender's and the receiver's communicator ranks), its Send the first column and its Recv the
    second, in the pair's own sequence (Send/Recv match per peer pair, in order)."""
    sender, receiver = (me, peer) if op == "ncclSend" else (peer, me)
    return f"{comm}{PAIR}{sender}{PAIR}{receiver}", int(op != "ncclSend"), 2


def by_program(taken: dict[tuple[str, int], tuple[int, int]]) -> dict[str, int]:
    """ns a rank was kept off its CPU, per preempting program (its name, whatever its pid)."""
    total: dict[str, int] = defaultdict(int)
    for (comm, _pid), (_n, ns) in taken.items():
        total[comm] += ns
    return total
