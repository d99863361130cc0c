"""Robust bars: the median and the MAD, which a minority of outliers cannot drag.

The median and the median absolute deviation have a 50% breakdown point: fewer than half of the
values, however extreme, cannot move them far, so a slow rank (or several) cannot shift the bar
it is held to. The factor 1.4826 makes the MAD estimate the standard deviation of normally
distributed values. One function builds the bar for either side: ``side=-1`` for values that are
bad when low (health scores), ``side=+1`` for values that are bad when high (lag, self-work).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True)
class Bar:
    median: float
    mad: float
    bar: float


def median_mad(values: np.ndarray) -> tuple[float, float]:
    """The median and the (unscaled) median absolute deviation of a non-empty array."""
    values = np.asarray(values, dtype=float)
    median = float(np.median(values))
    return median, float(np.median(np.abs(values - median)))


def robust_bar(values: np.ndarray, k: float, mad_floor: float = 0.0, side: int = -1) -> Bar:
    """``median + side·k·1.4826·max(MAD, mad_floor)``.

    The floor keeps values that are all alike (MAD = 0) from flagging noise a hair away from the
    median.
    """
    median, mad = median_mad(values)
    return Bar(median, mad, median + side * k * MAD_TO_SIGMA * max(mad, mad_floor))


def upper_bar(values: np.ndarray, k: float, mad_floor: float = 0.0) -> Bar:
    """The bar above which values are outliers on the high side."""
    return robust_bar(values, k, mad_floor, side=+1)


def lower_bar(values: np.ndarray, k: float, mad_floor: float = 0.0) -> Bar:
    """The bar below which values are outliers on the low side."""
    return robust_bar(values, k, mad_floor, side=-1)


def mad_threshold(scores: np.ndarray, k: float = 2.0, mad_floor: float = 0.0) -> float:
    """fleetd's health-score threshold: ``median − k·1.4826·max(MAD, mad_floor)``."""
    return lower_bar(scores, k, mad_floor).bar


def ema(previous: float | None, value: float, alpha: float) -> float:
    """Exponential moving average; the first value starts it."""
    return value if previous is None else alpha * value + (1.0 - alpha) * previous


def under_bar(scores: np.ndarray, threshold: float) -> np.ndarray:
    """Boolean mask of the scores strictly below the threshold."""
    return np.asarray(scores, dtype=float) < threshold
