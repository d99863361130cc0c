"""Which ranks are stragglers, and of what kind: rules over an aligned lag matrix.

The input is one communicator's recent collective instances, aligned by sequence number:
``entries`` is (instances × ranks) of clock-corrected entry times in seconds, oldest first, NaN
where a rank has not entered. Lag is ``peer_lag``: entry minus the peers' median entry. The job's
ranks are the cohort: a rank is compared with its peers, never with its own past, so a rank
slow from the first step stands out as much as one that turns slow later.

Kinds:
    persistent  late at most recent instances: its median lag over them is over the bar; once
                named, it stays named while it is late at a quarter of them (hysteresis, so a
                rank late most of the time does not flap)
    periodic    late at regularly spaced instances only (a stall every K steps), by at least
                ``min_lag_of_step`` of the K steps it recurs over (a stall of 10 ms every
                10 steps of 100 ms costs 1%: the noise of a job whose every rank stalls at its
                epoch boundaries, one of them a little more, is no straggler)
Each comes with an onset (the instance where its late run began), its lag p50 and p99 over the
instances it was late at, the fraction of instances it entered last, and the GPU time its peers
spent waiting for it (``idle_caused``).
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .lag import peer_lag
from .robust import MAD_TO_SIGMA, Bar, median_mad, upper_bar


@dataclass(frozen=True)
class LagPolicy:
    """How far and how often a rank must be late to be named."""

    k: float = 3.0                    # bar = median + k·1.4826·MAD of the ranks' median lags
    mad_floor_s: float = 0.001        # so ranks a hair apart flag nothing
    min_lag_s: float = 0.002          # never name a rank for less than this
    min_lag_of_step: float = 0.05     # ... nor for less than this part of a step
    recent: int = 16                  # instances a persistent verdict looks at, at most
    recent_s: float = 1.5             # ... or those of the last seconds, when steps are slow
    min_recent: int = 4               # ... but never fewer than this
    keep_share: float = 0.25          # of them still late, for a rank already named persistent
    min_instances: int = 8            # before anything is judged
    min_occurrences: int = 4          # late instances before a period is named (three can
                                      # line up by chance in a short window)
    regular_share: float = 0.75       # of a period's instances late, and of the late ones
                                      # on its grid
    stall_over_bar: float = 2.0       # a periodic stall stands well clear of the bar
    warm_up: int = 8                  # a communicator's first instances, where no period is
                                      # sought: any job's first steps are irregular (NCCL
                                      # connects at the first collective, allocators and
                                      # autotuners warm up), and a rank late at three of them
                                      # by chance lines up with a fourth


@dataclass(frozen=True)
class RankFinding:
    """One rank named a straggler by one rule."""

    column: int                       # the rank's column in the matrix (its communicator rank)
    kind: str                         # persistent or periodic
    lag_p50_s: float
    lag_p99_s: float
    last_share: float                 # of the instances, the share it entered last
    onset: int                        # instance index (in the matrix) where its late run began
    period: int | None                # periodic: every this many instances
    occurrences: int                  # late instances in the matrix (a period: its stalls)


@dataclass(frozen=True)
class Judgement:
    """What the rules saw in one matrix, findings or not."""

    findings: list[RankFinding]
    bar_s: float
    step_s: float | None


@contextmanager
def quiet():
    """numpy's complaints about all-NaN slices: a column whose node's clock is not known yet,
    or an instance not every rank entered, is NaN on purpose."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


def step_interval(entries: np.ndarray) -> float | None:
    """The median time between consecutive instances, over every rank: a step when the
    communicator runs one collective per step."""
    if len(entries) < 2:
        return None
    gaps = np.diff(entries, axis=0)
    gaps = gaps[np.isfinite(gaps)]
    return float(np.median(gaps)) if gaps.size else None


def idle_caused(entries: np.ndarray) -> np.ndarray:
    """Per column: the time its peers waited for it, summed over the instances it entered last
    (each rank that arrived earlier waits ``t_last − t_rank``, one GPU per rank)."""
    return arrivals(entries)[1]


def arrivals(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column, over the instances at least 2 ranks entered: how many it entered last, the
    time its peers waited for it there (``idle_caused``), and the time it waited for the last
    rank itself."""
    entries = np.atleast_2d(entries)
    last_count, caused, waited = (np.zeros(entries.shape[1]) for _ in range(3))
    complete = np.isfinite(entries).sum(axis=1) >= 2
    if not complete.any():
        return last_count, caused, waited
    rows = entries[complete]
    last = np.nanmax(rows, axis=1)
    behind = last[:, None] - rows
    latest = np.nanargmax(rows, axis=1)
    np.add.at(caused, latest, np.nansum(behind, axis=1))
    np.add.at(last_count, latest, 1)
    return last_count, caused, np.nansum(behind, axis=0)


def last_share(entries: np.ndarray) -> np.ndarray:
    """Per column: the share of complete instances it entered last."""
    rows = entries[np.isfinite(entries).sum(axis=1) >= 2]
    if not len(rows):
        return np.zeros(entries.shape[1])
    return np.bincount(np.nanargmax(rows, axis=1), minlength=entries.shape[1]) / len(rows)


def onset(late: np.ndarray) -> int:
    """Where the late run that lasts to the end began: the index that maximises late minus
    on-time instances from it to the end (a change point in a yes/no series)."""
    score = np.cumsum(np.where(late, 1, -1)[::-1])[::-1]
    return int(np.argmax(score))


def period(late: np.ndarray, policy: LagPolicy,
           lag: np.ndarray | None = None) -> tuple[int, int] | None:
    """(K, first) of a stall that recurs every K ≥ 2 instances from instance ``first`` on: the
    least K, and the phase, at which the rank is late at ``regular_share`` of every K-th
    instance from its first late one there, those being at least ``min_occurrences`` and
    ``regular_share`` of all its late instances. With ``lag`` (the rank's, per instance), a
    late instance off that grid counts against it only if it is a stall too, half the median
    of those on it: beside a busy loop, an 80 ms stall every 5 steps came with lags of 9 ms at
    two of the steps after it (gaps 5, 1, 4, 1, 4, 5, ...). Lates at random fall on no grid:
    on a K-grid, about one in K of them."""
    where = np.flatnonzero(late)
    if len(where) < policy.min_occurrences:
        return None
    # the period spans at most two late instances off the grid between two on it
    spans = {int(b - a) for i, a in enumerate(where) for b in where[i + 1:i + 4]}
    for every in sorted(k for k in spans if k >= 2):
        for phase in np.unique(where % every):
            due = late[phase::every]
            first = int(np.argmax(due))
            hits = int(due.sum())
            off = late.copy()
            off[phase::every] = False
            if lag is not None:
                off &= lag >= np.median(lag[phase::every][due]) / 2
            if hits >= max(policy.min_occurrences, policy.regular_share * (hits + off.sum())) \
                    and due[first:].mean() >= policy.regular_share:
                return every, int(phase) + first * every
    return None


def judge(entries: np.ndarray, policy: LagPolicy = LagPolicy(),
          named: frozenset[int] = frozenset(), slack: np.ndarray | None = None,
          warming: int = 0) -> Judgement:
    """Every straggler among the columns of ``entries``, by the rules above; ``named`` are the
    columns already under a persistent verdict. ``slack`` (seconds, per column) is how far a
    column's times may be off, its node's clock uncertainty: an instance counts as late only
    when its least lag the clocks allow (``least_lag``) is over the bar, so a lag the clocks
    could explain, its own or its peers', names no one. The first ``warming`` rows are the
    communicator's warm-up (``LagPolicy.warm_up``): they count for a persistent verdict and its
    onset (a rank slow from the first step is late from there), never towards a period."""
    entries = np.atleast_2d(np.asarray(entries, float))
    lag = peer_lag(entries)
    step = step_interval(entries)
    columns = entries.shape[1]
    with quiet():
        median_lag = np.nanmedian(np.where(np.isfinite(lag), lag, np.nan), axis=0) \
            if len(lag) else np.full(columns, np.nan)
    known = np.isfinite(median_lag)
    if len(entries) < policy.min_instances or known.sum() < 2:
        return Judgement([], np.inf, step)
    bar = lag_bar(median_lag, step, policy).bar
    late = (lag if slack is None else least_lag(entries, slack)) > bar
    last = last_share(entries)
    recent = recent_instances(entries, policy)
    findings = []
    for column in range(columns):
        finding = _judge_rank(lag[-recent:, column], lag[:, column], late[:, column], bar,
                              policy, policy.keep_share if column in named else 0.5, step,
                              warming)
        if finding is not None:
            kind, start, every = finding
            counted = slice(start, None, every) if every else slice(None)  # a period: its stalls
            late_lags = lag[counted, column][late[counted, column]]
            findings.append(RankFinding(
                column, kind, float(np.median(late_lags)), float(np.quantile(late_lags, 0.99)),
                float(last[column]), start, every, len(late_lags)))
    return Judgement(findings, float(bar), step)


def least_lag(entries: np.ndarray, slack: np.ndarray) -> np.ndarray:
    """The least lag each entry may have when each column's times may be off by its ``slack``
    either way: its own clock ahead by all of it, each peer's behind by all of its (the peers'
    median is then the latest it can be). A node whose clock is known only loosely so makes
    neither its own ranks nor the ranks it is compared with late."""
    slack = np.asarray(slack, float)
    return peer_lag(entries + slack) - 2 * slack


def lag_bar(median_lag: np.ndarray, step_s: float | None,
            policy: LagPolicy = LagPolicy()) -> Bar:
    """The bar a rank's lag must pass to be late, from the median lags of its job's ranks (NaN
    where unmeasured): never under the floor (``min_lag_s``, and ``min_lag_of_step`` of a
    step); from three ranks on, the MAD bar of the median lags, or the start of a late group
    where they split in two (``group_bar``), whichever is lower. Two ranks are each other's
    only peer: their lags mirror (+d, −d) and the MAD is the gap itself, so only the floor can
    tell the late one. fleetd judges each instance against it; echod its stored medians."""
    known = np.asarray(median_lag, float)
    known = known[np.isfinite(known)]
    floor = max(policy.min_lag_s, policy.min_lag_of_step * (step_s or 0.0))
    if not len(known):
        return Bar(np.nan, np.nan, floor)
    spread = upper_bar(known, policy.k, policy.mad_floor_s)
    bar = min(spread.bar, group_bar(known, policy)) if len(known) > 2 else -np.inf
    return Bar(spread.median, spread.mad, max(bar, floor))


def group_bar(median_lag: np.ndarray, policy: LagPolicy) -> float:
    """Where a late group begins: the middle of the widest gap between the ranks' sorted median
    lags that leaves at most half of them above it, when that gap is wider than k·1.4826 times
    the spread (MAD) within either side; +inf when there is none.

    Half a job late (a node of two, its four ranks 100 ms late every step) drags the MAD bar
    with it: each rank's peers' median falls between the two halves, the median lags sit at
    ±d, the MAD is d and the bar 4.4·d names nobody. Yet the ranks still fall into two tight
    groups a wide gap apart, and the later one is the one the others wait for. Only a group of
    at most half is taken as late: a majority behind a minority means the minority is early,
    which costs only the minority's own idle time."""
    values = np.sort(np.asarray(median_lag, float))
    if len(values) < 3:
        return np.inf
    first = (len(values) + 1) // 2 - 1            # the first split leaving at most half above
    gaps = np.diff(values)
    split = first + int(np.argmax(gaps[first:]))
    lower, upper = values[:split + 1], values[split + 1:]
    within = max(median_mad(lower)[1], median_mad(upper)[1], policy.mad_floor_s)
    if gaps[split] <= policy.k * MAD_TO_SIGMA * within:
        return np.inf
    return float((values[split] + values[split + 1]) / 2)


def recent_instances(entries: np.ndarray, policy: LagPolicy) -> int:
    """How many of the last instances a persistent verdict weighs: ``recent``, or fewer when
    steps are slow (those of the last ``recent_s`` seconds), never under ``min_recent``; so a
    rank 300 ms late every step is named within a second or so, not after 9 of its steps."""
    with quiet():
        t = np.nanmedian(entries, axis=1)
    within = int((t >= t[-1] - policy.recent_s).sum()) if np.isfinite(t[-1]) else policy.recent
    return min(policy.recent, max(policy.min_recent, within))


def _judge_rank(recent_lag: np.ndarray, lag: np.ndarray, late: np.ndarray, bar: float,
                policy: LagPolicy, share: float, step: float | None, warming: int = 0
                ) -> tuple[str, int, int | None] | None:
    """(kind, onset, period) for one rank, or None when it is not a straggler: persistent
    when more than ``share`` of its recent instances are late; periodic by ``period`` over the
    rows after the first ``warming``."""
    recent = late[-len(recent_lag):][np.isfinite(recent_lag)]
    if recent.size and recent.sum() > share * recent.size:
        return "persistent", onset(late), None
    found = period(late[warming:], policy, lag[warming:])
    if found is None:
        return None
    every, first = found[0], found[1] + warming
    on_grid = late[first::every]
    stall = float(np.median(lag[first::every][on_grid]))
    if stall >= policy.stall_over_bar * bar and stall >= policy.min_lag_of_step * every * (
            step or 0.0):
        return "periodic", first, every
    return None


def missing_ranks(entered: np.ndarray, furthest: np.ndarray, seq) -> np.ndarray:
    """Which columns never entered instance ``seq`` (``entered``: its entry times, NaN where
    none) and have entered nothing later (``furthest``: each column's latest instance): hung,
    or dead, there. A column that went on to a later instance passed this one too, ranks
    keeping the same order: its entry was lost on the way, it is not missing. A mask; for
    several instances at once, ``entered`` has a row and ``seq`` a number for each."""
    return ~np.isfinite(entered) & (furthest < np.asarray(seq)[..., None])


WORK_MAD_FLOOR = 0.02   # of the median self-work: kernels a hair apart flag nothing


def slow_workers(self_work: np.ndarray, policy: LagPolicy = LagPolicy(),
                 ratio: float = 1.3) -> np.ndarray:
    """Columns whose self-work (syncs on their own kernels only) stands out: over the
    robust bar of their peers' and at least ``ratio`` times the median. NaN where unmeasured."""
    self_work = np.asarray(self_work, float)
    known = np.isfinite(self_work)
    if known.sum() < 2:
        return np.zeros(len(self_work), bool)
    median = float(np.median(self_work[known]))
    bar = upper_bar(self_work[known], policy.k, WORK_MAD_FLOOR * median)
    return known & (self_work > bar.bar) & (self_work >= ratio * bar.median)
