"""Entry lag: how late a rank enters the same collective as its peers.

Ranks call a communicator's collectives in the same order, so (communicator, sequence number)
names one collective instance across ranks without trusting clocks; entry times are compared
only after each node's clock offset is corrected.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .segments import segment_quantile, segments


@dataclass(frozen=True)
class LagStats:
    """Per (communicator's job, rank): entry-lag statistics in µs. ``comm`` is the index of one
    communicator of the rank's job (ranks are grouped by job, not by communicator)."""

    comm: np.ndarray
    rank: np.ndarray
    samples: np.ndarray
    lag_p50: np.ndarray
    lag_p95: np.ndarray
    lag_max: np.ndarray
    lag_p99: np.ndarray
    last_arrivals: np.ndarray
    idle_caused: np.ndarray      # µs its peers waited at the instances it entered last
    waited: np.ndarray           # µs it waited for the last rank itself
    instances: int


def entry_lags(comm: np.ndarray, seq: np.ndarray, rank: np.ndarray, t: np.ndarray,
               job_of: np.ndarray | None = None,
               nranks: np.ndarray | None = None) -> LagStats | None:
    """Entry lags from entries (communicator index, seq, rank, entry time in µs): an instance
    is one (communicator, seq) with at least 2 entries, and with all ``nranks[comm]`` of them
    when that is given (an instance some rank's entry has not reached yet is not judged: not
    observed is not late); a rank's lag there is its time minus the median entry of its peers
    at that instance (see ``peer_lag``); ranks are grouped by ``job_of[comm]`` (default: by
    communicator)."""
    order = np.lexsort((t, seq, comm))
    comm, seq, rank, t = comm[order], seq[order], rank[order], t[order]
    starts, counts = segments(comm, seq)
    row_instance = np.repeat(np.arange(len(starts)), counts)
    lag = t - median_of_others(t, starts, counts)
    last = t[starts + counts - 1][row_instance]
    idle = counts * t[starts + counts - 1] - np.add.reduceat(t, starts) \
        if len(starts) else np.zeros(0, np.int64)
    whole = counts >= 2
    if nranks is not None and len(starts):
        whole &= counts >= nranks[comm[starts]]
    keep = whole[row_instance]
    if not keep.any():
        return None
    job = (job_of[comm] if job_of is not None else comm)[keep]
    rank, lag, is_last = rank[keep], lag[keep], (t == last)[keep]
    caused = np.where(is_last, idle[row_instance][keep], 0)
    waited = (last - t)[keep]
    by_rank = np.lexsort((lag, rank, job))
    job, rank, lag = job[by_rank], rank[by_rank], lag[by_rank]
    firsts, sizes = segments(job, rank)
    return LagStats(comm[keep][by_rank][firsts], rank[firsts], sizes,
                    segment_quantile(lag, firsts, sizes, 0.5),
                    segment_quantile(lag, firsts, sizes, 0.95), lag[firsts + sizes - 1],
                    segment_quantile(lag, firsts, sizes, 0.99),
                    np.add.reduceat(is_last[by_rank].astype(np.int64), firsts),
                    np.add.reduceat(caused[by_rank], firsts),
                    np.add.reduceat(waited[by_rank], firsts), int(whole.sum()))


def median_of_others(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """For each value, the median of the other values of its segment (values sorted within
    each segment); NaN where it is alone. One rank's peers' median, for every rank at once."""
    segment = np.repeat(np.arange(len(starts)), sizes)
    first, size = starts[segment], sizes[segment]
    position = np.arange(len(values)) - first
    others = size - 1
    half = others // 2

    def other(j: np.ndarray) -> np.ndarray:
        """The j-th smallest of the others: skip the value's own place."""
        return values[np.minimum(first + np.where(j < position, j, j + 1), first + size - 1)]

    upper = other(half)
    lower = other(np.maximum(half - 1, 0))
    median = np.where(others % 2 == 1, upper, (lower + upper) / 2)
    return np.where(others >= 1, median, np.nan)


def peer_lag(entries: np.ndarray) -> np.ndarray:
    """Each rank's entry into a collective minus the median entry of its peers (the other ranks
    at the same collective): the one definition of lag.

    ``entries`` is (collectives × ranks) of clock-corrected entry times, NaN where a rank has not
    (yet) entered; its lag is NaN there, and where it has no peer. A rank that arrives late has a
    positive lag at the collectives it delays, its peers a lag near zero (or negative, against
    it alone in a job of two). The median of the others, not the mean and not the earliest: a late
    rank does not move the reference its peers are measured against, and one early rank does not
    make everyone late.
    """
    entries = np.atleast_2d(np.asarray(entries, dtype=float))
    order = np.argsort(entries, axis=1, kind="stable")          # NaNs sort last
    ordered = np.take_along_axis(entries, order, axis=1)
    valid = np.isfinite(ordered)
    sizes = valid.sum(axis=1)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    lag = np.full(entries.shape, np.nan)
    rows, places = np.nonzero(valid)
    others = median_of_others(ordered[valid], starts, sizes)
    lag[rows, order[rows, places]] = ordered[valid] - others
    return lag
