"""What fleetd's rank analysis weighs beside the rules: its limits and the words of its notes,
which preemptions are another program's, a rank's waits at syncs around an onset, its syncs
as the propagation rules read them, and Send/Recv pairs as windows of their
own. Functions of fleetd's state (``fleetd.rankstate``), no clock, no socket; the rules they
feed are ``ingero.analysis``'s.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from ingero.analysis.cost import ONSET_WAITS, growth, per_instance as spread_over
from ingero.analysis.propagation import Syncs

from ..alignment import Pair
from ..rankstate import JobState, RankFacts

log = logging.getLogger("fleetd")


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


class Onset(NamedTuple):
    """Where a rank's lateness begins on the communicator it is judged on: the instance's
    ``seq`` there, and ``heard``, the latest seq every peer weighed has reported a wait
    through (its waits past that are some peers' only: a node's push still on its way)."""
    comm: str
    seq: int
    heard: int


def waits_around(facts: RankFacts, onset: float, placed: Callable[[RankFacts], np.ndarray],
                 at: Onset | None = None) -> tuple[list[tuple], list[tuple]]:
    """A rank's waits at its syncs on collectives, as (stratum, ns, sync) (see ``growth``),
    before and since ``onset`` (fleetd's clock; ``placed``: the waits' times on it, NaN where
    its node's clock is not known, and those waits are in neither). A wait on the
    communicator of ``at`` is placed by its collective instead: since the onset if it covers
    the onset's instance or a later one, whatever the clocks say, and not yet weighed past
    what every peer has reported (``at.heard``). Placed by time, the waits at the sync just
    after an onset a few ms into a run of steps fell on both sides of it, one before and six
    since, and the one carried a delay into the waits before: a host 30 ms a step behind its
    GPU queue was weighed on waits grown 41 ms ± 18 where they grew 57 ± 1; and two syncs'
    waits, one of them from one node only, grew 4 ms ± 1.4 by chance for a rank ahead of its
    GPU queue (CI: named)."""
    before, after, last = [], [], {}
    for t, ns, (comm, seq) in zip(placed(facts), facts.peer_wait_ns, facts.peer_wait_on):
        covered = seq - last[comm] if 0 <= last.get(comm, -1) < seq else None
        last[comm] = seq
        sync = (comm, seq) if comm and seq >= 0 else None      # None: its own
        wait = ((comm, covered), ns, sync)
        if at is not None and sync is not None and comm == at.comm:
            if seq <= at.heard:
                (after if seq >= at.seq else before).append(wait)
        elif t == t:
            (after if t >= onset else before).append(wait)
    return before, after


def heard_through(peers: list[RankFacts], comm: str) -> int:
    """The latest seq on ``comm`` that each of ``peers`` has reported a wait at or past (-1
    where one has none there)."""
    return min((max((seq for on, seq in facts.peer_wait_on if on == comm), default=-1)
                for facts in peers), default=-1)


def own_growth(facts: RankFacts | None, onset: float,
               placed: Callable[[RankFacts], np.ndarray], per_instance: bool = False,
               at: Onset | None = None) -> float:
    """How much a late rank's own waits at its syncs grew since its onset, in seconds (0 when
    they shrank or too few are seen to tell). The rank its peers wait for comes last and
    waits least; a delay that made the rank itself wait longer too came from elsewhere (a
    third rank's GPU, every host slowed at once), and that much of its peers' growth is not
    its doing (CI, eight ranks on two CPUs: rank 2 of a host-ahead job 6 ms late on the host
    while everyone's waits at one sync grew, its own the most, 30 ms against 16; named).
    ``per_instance``: each wait spread over the collectives it covered (``exposure``'s measure)."""
    if facts is None:
        return 0.0
    before, after = waits_around(facts, onset, placed, at)
    if len(before) < 2 or len(after) < ONSET_WAITS:
        return 0.0
    if per_instance:
        before, after = spread_over(before), spread_over(after)
    return max(0.0, growth(before, after)[0] / 1e9)


def syncs_of(facts: RankFacts | None) -> Syncs | None:
    """A rank's syncs as the propagation rules read them (``ingero.analysis.propagation``)."""
    if facts is None:
        return None
    ends = np.fromiter(facts.sync_end, float)
    return Syncs(ends, facts.sync_on, len(ends) < facts.sync_end.maxlen)


class RankSyncs(Sequence):
    """The syncs of ``ranks`` (a communicator's, by column) as ``syncs_of`` reads them, each
    read when first asked for: a rule that decides on one rank's reads no other (the passed-
    down rule, at 2,048 ranks, had read every rank's syncs into arrays first)."""

    def __init__(self, job: JobState, ranks: list[int]):
        self._job, self._ranks, self._read = job, ranks, {}

    def __len__(self) -> int:
        return len(self._ranks)

    def __getitem__(self, column: int) -> Syncs | None:
        if column not in self._read:
            self._read[column] = syncs_of(self._job.facts.get(self._ranks[column]))
        return self._read[column]


def peer_syncs(job: JobState, ranks: list[int], column: int) -> list[Syncs]:
    """The syncs of the peers of ``column`` (of ``ranks``, the communicator's), those known."""
    return [syncs_of(job.facts[rank]) for at, rank in enumerate(ranks)
            if at != column and rank in job.facts]


def pair_of(comm: str, me: int, peer: int, op: str) -> tuple[Pair, int, int]:
    """Send/Recv between two ranks of ``comm`` as a communicator of their own: the pair (the
    sender's and the receiver's communicator ranks), its Send the first column and its Recv the
    second, in the pair's own sequence (Send/Recv match per peer pair, in order)."""
    sender, receiver = (me, peer) if op == "ncclSend" else (peer, me)
    return Pair(comm, sender, receiver), int(op != "ncclSend"), 2


def by_program(taken: dict[tuple[str, int], tuple[int, int]]) -> dict[str, int]:
    """ns a rank was kept off its CPU, per preempting program (its name, whatever its pid)."""
    total: dict[str, int] = defaultdict(int)
    for (comm, _pid), (_n, ns) in taken.items():
        total[comm] += ns
    return total
