"""Whether a late rank costs its peers anything, and how much: the proofs fleetd weighs before
it names a rank late on its host, and the GPU time its lateness kept the others idle.

A rank whose host enters collectives late may still be ahead of its GPU queue, delaying no
collective; its peers then wait no longer at their syncs than before. So lateness is charged
only where the peers' waits grew at its onset (``waits_grew``), or, with no before to weigh,
where its lag stands out of its peers' swing (``stands_out``); and it costs what their waits
grew (``exposure``), not its host lag, part of which the GPU queues absorb. Pure functions of
waits and lags (no clock, no state): fleetd feeds them from what it keeps of each rank.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict

import numpy as np

from .robust import MAD_TO_SIGMA
from .stragglers import quiet

COST_ERRORS = 3.0      # a lag costs when its peers' waits grew by this many standard errors
ONSET_WAITS = 2        # syncs a peer since the onset before it is weighed
HARMLESS_SYNCS = 3     # syncs since the onset before a growth not shown is taken as none
LEVEL_SHARE = 0.5      # a lateness is at its level from where its lag reaches this share of
                       # its recent lag


def waits_grew(before: list[tuple], after: list[tuple], floor_s: float, later_s: float = 0.0,
               enough: int = ONSET_WAITS, per_step: float = 1.0) -> bool | None:
    """Whether the peers' syncs on collectives (their waits: (stratum, ns[, sync]), see
    ``growth``) grew at a rank's onset, on average (a host that syncs on a blocking read and
    at its step's end waits long at one and briefly at the other: a median of both flips
    between them): the proof that its lateness costs. A rank late on the host but still
    ahead of its GPU queue delays no collective, and its peers wait no longer than before.
    What a rank later than it (by ``later_s`` more) made them wait is not its own: the GPU
    queues absorbed that much less of the later rank's lag; nor is what made the rank itself
    wait longer too (``own_growth``, added to ``later_s``). The growth must pass the floor and
    stand out from the waits' own spread (``COST_ERRORS`` standard errors of the growth):
    waits at syncs every few steps vary by tens of ms under CPU contention, and a few ms more
    on average is what chance gives. It need not be any share of the rank's host lag: the
    GPU queues absorb part of that lag in every job, the work a host enqueued before it fell
    behind (a node's ranks 30 ms late on the host each 25 ms step, syncing every step, made
    their peers wait 14 ms more a step), and where the hosts run ahead of their GPUs the lag
    holds how far its peers' hosts ran ahead as well (CI: a host 30 ms a step slow, syncing
    every 10 steps, ramped to 270 ms behind while its peers waited 17 ms more a sync). What it
    costs is what the waits grew (``exposure``). Too few syncs before: it costs; fewer than
    ``enough`` since its onset, or their spread not told yet: None, not known yet. A growth
    that does not stand out yet is taken as none only from ``HARMLESS_SYNCS`` syncs since the
    onset: with one, its mean is that sync's alone, and the error of the growth is mostly its
    own (CI, beside a busy loop: a rank 144 ms behind its queue, whose peers waited 57 ms more
    at each sync, was shown harmless for good at the first sync since its onset). The answer
    is given once (a lateness shown harmless stays so, one shown to cost is named). The floor
    (``floor_s``, the least lag named) counts for each step the waits cover (the collectives
    each covers, ``covers`` of ``growth``, over the communicator's collectives a step,
    ``per_step``): where hosts sync every ten steps, a wait spans ten steps, and a few ms more
    there is a tenth of that a step (CI, eight ranks on two CPUs: a rank ahead of its GPU
    queue named on its peers' waits at one sync grown 2.4 ms ± 1.1 by chance, where a rank
    behind its queue grew them 50 to 58 ms)."""
    if len(before) < 3:
        return True
    if len(after) < max(2, enough):
        return None
    grew, error, covers = growth(before, after)
    if not math.isfinite(error):
        return None
    if grew / 1e9 - max(0.0, later_s) >= max(floor_s * max(1.0, covers / per_step),
                                             COST_ERRORS * error / 1e9):
        return True
    return False if syncs_in(after) >= HARMLESS_SYNCS else None


def syncs_in(waits: list[tuple]) -> int:
    """How many syncs the waits were taken at (the peers' at one sync are one; a wait whose
    sync is not known is one of its own)."""
    return len({w[2] if len(w) > 2 and w[2] is not None else ("wait", n)
                for n, w in enumerate(waits)})


def exposure(before: list[tuple], after: list[tuple], later_s: float = 0.0) -> float | None:
    """How much longer each collective instance kept the peers waiting since a rank's onset,
    in seconds: the growth of their waits (as ``waits_grew`` weighs it), each wait spread over
    the instances it covered, less what a later rank or the rank's own waits explain (in the
    same measure, ``later_s``). None where there is no before to weigh."""
    if len(before) < 3 or len(after) < 2:
        return None
    grew = growth(per_instance(before), per_instance(after))[0] / 1e9
    return max(0.0, grew - max(0.0, later_s))


def per_instance(waits: list[tuple]) -> list[tuple]:
    """Waits, each spread over the collectives it covered (``_spans``)."""
    return [(stratum, ns / _spans(stratum), *rest) for stratum, ns, *rest in waits]


def growth(before: list[tuple], after: list[tuple]) -> tuple[float, float, float]:
    """How much the waits grew from ``before`` to ``after`` (each a list of (stratum, ns) or
    (stratum, ns, sync)), the standard error of that, and how many collectives a wait covers
    (``covers``: 1 where not known): the growth of each stratum's mean, weighted by its
    share of the waits, and the strata's collectives alike. A stratum is the communicator and the number of its
    collectives a wait covered since the peer's wait before it: a host that syncs every ten
    steps, at a blocking read and at the tenth step's end, waits for nine steps of GPU work at
    one and for one at the other. Pooled, the waits' spread is that of the two kinds, and a
    growth of 50 ms stood out of it or not by chance (a rank behind its GPU queue was shown
    harmless); within a kind, the spread is the noise alone. The peers' waits at one sync
    (the same collective, ``sync``; None where not known) rise and fall together, a GPU late
    there keeps all of them waiting: they are one observation, not one a peer. The noise is
    the spread of the syncs' mean waits, pooled over both sides, and the error counts syncs
    (CI, eight ranks on two CPUs: a rank 10 ms late on the host, ahead of its GPU queue, named on
    its peers' waits grown 5 ms over two syncs, each of seven waits taken as its own). Strata seen
    at fewer than two syncs before or none since are left out, unless no stratum is seen so (then
    all are pooled as one); where the spread cannot be told yet, the error is infinite."""
    sides = []
    for waits in (before, after):
        kinds = defaultdict(lambda: defaultdict(list))
        for n, (stratum, ns, *sync) in enumerate(waits):
            kinds[stratum][sync[0] if sync and sync[0] is not None else n].append(ns)
        sides.append(kinds)
    common = [k for k, syncs in sides[0].items() if len(syncs) >= 2 and sides[1].get(k)]
    if common:
        strata = [(sides[0][k], sides[1][k]) for k in common]
        spans = [_spans(k) for k in common]
    else:
        strata = [tuple({(k, sync): ns for k, syncs in side.items() for sync, ns in syncs.items()}
                        for side in sides)]
        spans = [statistics.fmean(_spans(k) for side in (before, after) for k, *_ in side)]
    waits = [sum(len(ns) for side in pair for ns in side.values()) for pair in strata]
    grew = variance = covers = 0.0
    for (b, a), count, span in zip(strata, waits, spans):
        weight = count / sum(waits)
        covers += weight * span
        means = [[statistics.fmean(ns) for ns in side.values()] for side in (b, a)]
        grew += weight * (statistics.fmean(means[1]) - statistics.fmean(means[0]))
        free = len(means[0]) + len(means[1]) - 2
        if free < 1:
            return grew, math.inf, covers
        spread = sum(sum((m - statistics.fmean(side)) ** 2 for m in side)
                     for side in means) / free
        variance += weight ** 2 * spread * (1 / len(means[0]) + 1 / len(means[1]))
    return grew, math.sqrt(variance), covers


def _spans(stratum) -> int:
    """How many collectives a wait of this stratum covers: its second part, where it is a
    (communicator, collectives) pair and that is known; else 1."""
    covered = stratum[1] if isinstance(stratum, tuple) and len(stratum) == 2 else None
    return covered if isinstance(covered, int) and covered > 0 else 1


def stands_out(lag: np.ndarray, column: int, lag_s: float, k: float,
               late: frozenset[int] = frozenset()) -> bool:
    """Whether a rank's lag (``lag_s``, its late instances' median) is over ``k`` times the
    swing of its peers' lags from instance to instance (``swing``, at the instances judged:
    ``lag``, instances × columns). Hosts that enqueue several steps ahead of their GPUs and
    sync every few drift apart by milliseconds within each run of steps when their CPUs are
    busy; a rank a few ms late over a job's first instances is that swing, not a straggler
    (it is judged against the ranks' median lags only, whose spread is far smaller). Asked
    of a rank late from the start where the hosts run ahead (``runs_ahead``: where they sync
    every step, its lateness reaches its GPU), and of every lateness whose cost was shown:
    ranks that jitter drift by ms over a few steps now and then, whatever their syncs, and
    their peers' waits grow and shrink with whatever else delays the job."""
    spread = swing(lag, column, late)
    return True if spread is None else lag_s > k * spread


def swing(lag: np.ndarray, column: int, late: frozenset[int] = frozenset()) -> float | None:
    """How far the lags of a column's peers swing from instance to instance: 1.4826·MAD of
    each one's lag less its own median (how late each is on the whole, several of them late
    at once, is no swing); None where too few are known. The columns ``late`` with it (a
    node's ranks) are no peers of its: their onset is a swing of their own."""
    peers = np.delete(np.asarray(lag, float), sorted({column} | set(late)), axis=1)
    with quiet():
        spread = peers - np.nanmedian(peers, axis=0)
    spread = spread[np.isfinite(spread)]
    if len(spread) < 2:
        return None
    return MAD_TO_SIGMA * float(np.median(np.abs(spread)))


def level_onset(lag: np.ndarray, onset: int, recent: float) -> int:
    """Where a rank's lateness (``lag``: its lag at each instance judged, late from ``onset``)
    reached the level it is weighed at: the first instance since ``onset`` whose lag is at
    least ``LEVEL_SHARE`` of ``recent`` (its lag over the last instances). A lateness that
    grew is weighed from where it grew: a host a few ms late from drift (beside a busy loop,
    its GPU queue still ahead: its peers wait no longer) that then falls behind its queue by
    a hundred ms is one late run of instances, and with the drift's onset the syncs of the
    drift alone counted as since the onset, the peers' waits looked not to grow, and the
    rank was shown harmless for good (CI)."""
    if not math.isfinite(recent) or recent <= 0:
        return onset
    reached = np.flatnonzero(np.nan_to_num(np.asarray(lag[onset:], float), nan=-np.inf)
                             >= LEVEL_SHARE * recent)
    return onset + int(reached[0]) if len(reached) else onset


def excess(lag: np.ndarray, bar: float, nranks: int, exposed_s: float | None = None,
           together: int = 1) -> float:
    """GPU-seconds its lag over the bar kept its peers waiting, at these instances: at each,
    its lag over the bar, no more than the collective was delayed (``exposed_s``, see
    ``exposure``; None: not known, all of it), once for each peer on time. Where ``together``
    ranks are late at once (a node's), the collective waits for all of them: the on-time
    peers' wait is shared among them."""
    over = np.clip(np.asarray(lag, float) - (bar if np.isfinite(bar) else 0.0), 0.0, None)
    if exposed_s is not None:
        over = np.minimum(over, exposed_s)
    together = max(1, together)
    return float(np.nansum(over)) * max(nranks - together, 1) / together
