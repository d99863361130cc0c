"""Runs of equal keys in sorted arrays, and quantiles per run: the group-by of the analysis."""

from __future__ import annotations

import numpy as np


def segments(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths of the runs of equal keys in sorted arrays."""
    size = len(keys[0])
    if size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    new = np.zeros(size, bool)
    new[0] = True
    for key in keys:
        new[1:] |= key[1:] != key[:-1]
    starts = np.flatnonzero(new)
    return starts, np.diff(np.append(starts, size))


def segment_quantile(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                     q: float) -> np.ndarray:
    """The q-quantile of each sorted segment, interpolated as percentile_cont and numpy do."""
    position = q * (sizes - 1)
    below = np.floor(position).astype(np.int64)
    above = np.minimum(below + 1, sizes - 1)
    low, high = values[starts + below], values[starts + above]
    return low + (position - below) * (high - low)
