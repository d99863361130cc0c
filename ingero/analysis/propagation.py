"""How lateness travels between ranks through their syncs: whether a job's hosts run ahead of
their GPUs (and since when that can be weighed), and whether a rank's lateness was passed down
to it by a peer elsewhere. Pure functions of the peers' sync ends and the aligned entries
(``entries``: instances × ranks, on one clock, NaN where a rank has not entered), as fleetd
keeps them; no clock, no state. Imports only ``ingero.analysis.stragglers``.

A sync is a rank's host waiting for its GPU (a ``.item()``, a stream or event sync). Where the
hosts sync less than every other collective, each host enqueues ahead of its GPU and a late
host costs nobody until its GPU queue runs dry; each sync realigns the hosts, and between two
they drift apart by however long each was kept off its CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .stragglers import quiet

UNSYNCED_INSTANCES = 16              # instances with no sync seen: a job ingerod sees none of
DRIFT_STRETCHES = 3                  # runs of instances between the peers' syncs, or
DRIFT_INSTANCES = 256                # this many instances, before a swing is known
PASSED_SHARE = 0.25                  # a lateness passed down came no later from its sync
                                     # than its peers did from theirs, by this share of it


@dataclass(frozen=True)
class Syncs:
    """One rank's syncs, as kept: when each ended, the communicator each waited on (None: its
    own kernels; absent where not known), and whether they are all it made (none let go for
    room: then they reach back to its first)."""

    ends: np.ndarray
    on: Sequence = ()
    whole: bool = True


def instance_times(entries: np.ndarray) -> np.ndarray:
    """Each instance's median entry (NaN where no rank entered)."""
    with quiet():
        return np.nanmedian(entries, axis=1)


def runs_ahead(peers: list[Syncs], entries: np.ndarray) -> bool | None:
    """Whether the job's hosts run ahead of their GPUs: its ``peers`` sync with them less than
    every other instance (where a peer's syncs kept no longer reach back to the first, over
    the instances since the oldest one kept); None where none of them has synced yet."""
    times = instance_times(entries)
    times = times[np.isfinite(times)]
    shares = []
    for peer in peers:
        since = times if peer.whole or not len(peer.ends) else times[times >= peer.ends.min()]
        if len(since) >= 2:
            shares.append(int(((peer.ends >= since.min()) & (peer.ends <= since.max())).sum())
                          / len(since))
    if not any(len(peer.ends) for peer in peers):
        return None
    return bool(shares) and float(np.median(shares)) < 0.5


def after_first_sync(peers: list[Syncs], entries: np.ndarray) -> np.ndarray:
    """Which instances (rows of ``entries``) came after the first sync of the ``peers``
    returned (of those kept); all of them where no peer has synced in
    ``UNSYNCED_INSTANCES`` (a job whose syncs ingerod does not see), none before that."""
    ends = [peer.ends.min() for peer in peers if len(peer.ends)]
    times = instance_times(entries)
    if ends:
        return np.nan_to_num(times, nan=-np.inf) > min(ends)
    return np.full(len(entries), len(entries) >= UNSYNCED_INSTANCES)


def drift_seen(peers: list[Syncs], entries: np.ndarray) -> bool:
    """Whether the instances (rows of ``entries``, those since the first sync) show how far
    hosts that run ahead drift: they reach over ``DRIFT_STRETCHES`` runs of two or more
    instances between syncs of the ``peers`` (their median), or over ``DRIFT_INSTANCES``; or
    no peer syncs at all. Each sync realigns the hosts, and between two they drift apart, each
    by about as much at every instance of the run: within one run every rank's lag is steady,
    so its swing about its own median is nil and any rank a few ms behind stands out of it
    (beside a busy loop, a rank 10 ms behind in the run after a job's first sync, of peers
    from 11 ms ahead to 15 ms behind, named critical). Across runs a rank's place changes, and
    that is the swing."""
    times = instance_times(entries)
    times = times[np.isfinite(times)]
    if len(times) >= DRIFT_INSTANCES:
        return True
    runs = []
    for peer in peers:
        if len(peer.ends):
            after = np.searchsorted(np.sort(peer.ends), times)
            lengths = np.unique(after, return_counts=True)[1]  # instances between two syncs
            runs.append(int((lengths >= 2).sum()))
    return not runs or float(np.median(runs)) >= DRIFT_STRETCHES


def inherited(syncs: Sequence[Syncs | None], entries: np.ndarray, column: int, comm: str,
              lag_s: float) -> bool:
    """Whether the lateness of ``column`` (``lag_s``, on ``comm``) was passed down to it. Its
    host came from a sync that waited on a collective of another communicator (a pipeline
    stage's send, another group's collective) at most of its entries (``entries``: those
    since its onset; ``syncs``: each column's, None where not known); and from that sync's end
    (its GPU done, its thread woken) to its entry it took no longer than its peers did from
    theirs, by a share of its lag (a host slow to get back its CPU is late on its own): its
    host came late only because its GPU was kept waiting elsewhere. The rank that held it up
    is judged where it was late."""
    mine = _came_from(syncs[column], entries[:, column])
    if mine is None:
        return False
    gap, on = mine
    if sum(c is not None and c != comm for c in on) * 2 <= len(on):
        return False       # asked first: most late entries are no sync's elsewhere, and the
        # peers' syncs need not be read at all (2,048 ranks: a tenth of a tick, read first)
    gaps = np.full(len(syncs), np.nan)
    gaps[column] = gap
    for at in range(len(syncs)):
        if at != column and (theirs := _came_from(syncs[at], entries[:, at])) is not None:
            gaps[at] = theirs[0]
    others = np.delete(gaps, column)
    if not np.isfinite(others).any():
        return False
    return gaps[column] - float(np.nanmedian(others)) < PASSED_SHARE * lag_s


def _came_from(syncs: Syncs | None, entered: np.ndarray) -> tuple[float, list] | None:
    """How long a rank took from the end of the sync before each of its entries
    (``entered``, NaN where it did not enter) to the entry, its median; and the
    communicator each of those syncs waited on. None where no entry follows a sync. Where a
    sync waited on a peer since the entry before, that one is the sync before: a loss read
    after it (on the rank's own kernels, its queue empty) does not hide that the step began
    late because the one before waited on a peer."""
    if syncs is None or not len(syncs.ends):
        return None
    order = np.argsort(syncs.ends, kind="stable")
    ends, entered = syncs.ends[order], entered[np.isfinite(entered)]
    on = [syncs.on[i] for i in order] if len(syncs.on) else [None] * len(order)
    at = np.searchsorted(ends, entered, side="right") - 1
    waited = np.flatnonzero([c is not None for c in on])
    if len(waited):
        last = np.searchsorted(ends[waited], entered, side="right") - 1
        peer = waited[np.maximum(last, 0)]
        before = np.concatenate([[-np.inf], entered[:-1]])
        at = np.where((last >= 0) & (ends[peer] > before), peer, at)
    entered, at = entered[at >= 0], at[at >= 0]
    if not len(at):
        return None
    return float(np.median(entered - ends[at])), [on[i] for i in at]