"""Robust statistics for the straggler threshold: pure numpy functions of arrays.

The threshold is ``median − k·1.4826·MAD``. The median and the median absolute deviation have a
50% breakdown point: fewer than half of the scores, however bad, cannot move them far, so a slow
rank (or several) cannot drag the bar down to hide itself. The factor 1.4826 makes the MAD
estimate the standard deviation of normally distributed scores. ``mean_sigma_threshold`` is the
non-robust bar, kept for comparison in tests and documentation.
"""

from __future__ import annotations

import numpy as np

MAD_TO_SIGMA = 1.4826


def median_mad(scores: np.ndarray) -> tuple[float, float]:
    """The median and the (unscaled) median absolute deviation of a non-empty array."""
    scores = np.asarray(scores, dtype=float)
    median = float(np.median(scores))
    return median, float(np.median(np.abs(scores - median)))


def mad_threshold(scores: np.ndarray, k: float = 2.0, mad_floor: float = 0.0) -> float:
    """``median − k·1.4826·max(MAD, mad_floor)``.

    The floor keeps a cohort of identical scores (MAD = 0) from flagging a node for noise a
    hair below the median.
    """
    median, mad = median_mad(scores)
    return median - k * MAD_TO_SIGMA * max(mad, mad_floor)


def mean_sigma_threshold(scores: np.ndarray, k: float = 2.0) -> float:
    """``mean − k·σ``: what a non-robust detector would use; one bad score drags it."""
    scores = np.asarray(scores, dtype=float)
    return float(scores.mean() - k * scores.std())


def ema(previous: float | None, value: float, alpha: float) -> float:
    """Exponential moving average; the first value starts it."""
    return value if previous is None else alpha * value + (1.0 - alpha) * previous


def under_bar(scores: np.ndarray, threshold: float) -> np.ndarray:
    """Boolean mask of the scores strictly below the threshold."""
    return np.asarray(scores, dtype=float) < threshold


def peer_lag(entries: np.ndarray) -> np.ndarray:
    """Each rank's entry into the same collective minus the median entry of all its ranks.

    ``entries`` is (collectives × ranks) of clock-corrected entry times; a rank that arrives
    late has a positive lag on the collectives it delays. The median, not the mean, so that a
    late rank does not move the reference it is measured against.
    """
    entries = np.asarray(entries, dtype=float)
    return entries - np.median(entries, axis=-1, keepdims=True)
