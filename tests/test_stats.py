"""Property tests: the MAD threshold holds against fewer than half bad scores; mean−2σ does not."""

import math

import numpy as np
from hypothesis import assume, given, settings, strategies as st

from ingero import analysis as stats

K = 2.0
healthy_scores = st.lists(st.floats(0.85, 0.95), min_size=3, max_size=200)


def mean_sigma_threshold(scores: np.ndarray, k: float = 2.0) -> float:
    """``mean − k·σ``: what a non-robust detector would use; one bad score drags it."""
    scores = np.asarray(scores, dtype=float)
    return float(scores.mean() - k * scores.std())


@settings(max_examples=400, deadline=None)
@given(healthy_scores, st.data())
def test_mad_threshold_stays_near_the_healthy_median(healthy, data):
    """However bad the minority is, the bar stays within a bound of the healthy median."""
    bad = data.draw(st.lists(st.floats(0.0, 1.0), max_size=(len(healthy) - 1)))
    scores = np.array(healthy + bad)
    spread = max(healthy) - min(healthy)
    bound = spread + K * stats.MAD_TO_SIGMA * spread
    healthy_median = float(np.median(healthy))
    assert abs(stats.mad_threshold(scores, K) - healthy_median) <= bound + 1e-12


@settings(max_examples=400, deadline=None)
@given(st.integers(10, 200), st.floats(0.25, 0.49), st.floats(0.3, 0.6), st.randoms())
def test_mean_sigma_is_dragged_below_the_stragglers_that_mad_flags(n, fraction, drop, rnd):
    """A quarter or more of slow nodes drags mean−2σ under them all; the MAD bar flags them."""
    n_bad = min(math.ceil(n * fraction), (n - 1) // 2)
    assume(n_bad / n >= 0.25)
    healthy = [0.9 + rnd.uniform(-0.01, 0.01) for _ in range(n - n_bad)]
    slow = 0.9 - drop
    scores = np.array(healthy + [slow] * n_bad)
    assert n_bad < n / 2
    assert mean_sigma_threshold(scores, K) < slow  # the stragglers hide
    mad_bar = stats.mad_threshold(scores, K, mad_floor=0.01)
    assert slow < mad_bar < min(healthy)  # they are flagged, and no healthy node is
    assert stats.under_bar(scores, mad_bar).sum() == n_bad


def test_one_bad_score_drags_mean_sigma_past_a_healthy_node():
    """One collapsed node widens σ so much that a genuinely slow healthy-looking node passes."""
    scores = np.array([0.90, 0.91, 0.89, 0.90, 0.92, 0.90, 0.91, 0.80, 0.0])
    mean_bar = mean_sigma_threshold(scores, K)
    mad_bar = stats.mad_threshold(scores, K, mad_floor=0.01)
    assert mean_bar < 0.80 < mad_bar


def test_median_mad_and_floor():
    median, mad = stats.median_mad(np.array([1.0, 2.0, 3.0, 4.0, 100.0]))
    assert (median, mad) == (3.0, 1.0)
    same = np.full(10, 0.9)
    assert stats.mad_threshold(same, K) == 0.9
    assert abs(stats.mad_threshold(same, K, mad_floor=0.01) - (0.9 - 2 * 1.4826 * 0.01)) < 1e-12


def test_ema():
    assert stats.ema(None, 0.5, 0.2) == 0.5
    assert abs(stats.ema(1.0, 0.0, 0.2) - 0.8) < 1e-12
