"""Clock offsets, NTP-style, from the four times of a push and its reply.

    t0  the agent sends a push          (agent's clock)
    t1  fleetd receives it              (fleetd's clock)
    t2  fleetd sends the reply          (fleetd's clock)
    t3  the agent receives the reply    (agent's clock)

The round trip net of fleetd's own time is ``(t3 − t0) − (t2 − t1)``; the agent's clock minus
fleetd's is ``((t0 − t1) + (t3 − t2)) / 2``, exact when the two legs take equally long and off
by at most half the round trip when they do not. So the samples with the smallest round trips
are trusted, and half the longest of those trusted is the estimate's uncertainty.

Clocks drift (tens of ppm without NTP: 20 ppm is 12 ms in ten minutes), so an offset is a
line in fleetd's time, fitted through the best exchange of each stretch of the samples kept.
The fitted drift is itself only as good as those exchanges (a few lopsided ones over half a
minute can tilt the line by hundreds of ppm), so what the line says of a time away from the
latest sample is looser by how far that drift may be off; and outside the span it was fitted
over, looser again by how far a clock may drift meanwhile (``DRIFT_BOUND``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DRIFT_BOUND = 50e-6          # how fast a clock may drift, s/s: an undisciplined crystal's
STRETCHES = 8                # the best exchange of each of these many stretches is fitted
LOOSE_STRETCH = 4.0          # ... unless its round trip is this many times the stretches' median
MIN_SPAN_S = 20.0            # a drift is fitted only over samples this far apart


@dataclass(frozen=True)
class Offset:
    """A node's clock minus the reference clock, in seconds, give or take ``uncertainty``, at
    reference time ``at``; drifting by ``drift`` seconds a second, give or take
    ``drift_uncertainty``, as fitted over the samples taken from ``first`` to ``at``."""

    offset: float
    uncertainty: float
    samples: int
    drift: float = 0.0
    at: float = 0.0
    first: float = 0.0
    drift_uncertainty: float = 0.0

    def offset_at(self, t):
        """The offset at reference time ``t`` (a number or an array)."""
        return self.offset + self.drift * (np.asarray(t, float) - self.at)

    def uncertainty_at(self, t):
        """How far ``offset_at(t)`` may be off: as at ``at``, looser by how far the fitted drift
        may be off over the distance from ``at``, and by the drift bound outside the span of
        the samples."""
        t = np.asarray(t, float)
        outside = np.maximum(self.first - t, 0.0) + np.maximum(t - self.at, 0.0)
        return (self.uncertainty + self.drift_uncertainty * np.abs(t - self.at)
                + DRIFT_BOUND * outside)


def exchange(t0: float, t1: float, t2: float, t3: float) -> tuple[float, float]:
    """(offset of the agent's clock, round trip) of one push/reply exchange."""
    return ((t0 - t1) + (t3 - t2)) / 2.0, max(0.0, (t3 - t0) - (t2 - t1))


def best_offset(offsets: np.ndarray, round_trips: np.ndarray, keep: int = 4) -> Offset | None:
    """The median offset of the samples with the smallest round trips: ``keep`` of them, but
    no more than an eighth of the samples (the single best while there are few).

    The median of a few of the best rather than the single best: one sample whose legs were
    unusually lopsided does not decide alone.
    """
    offsets, round_trips = np.asarray(offsets, float), np.asarray(round_trips, float)
    if len(offsets) == 0:
        return None
    best = np.argsort(round_trips, kind="stable")[:min(keep, max(1, len(offsets) // 8))]
    return Offset(float(np.median(offsets[best])), float(round_trips[best].max()) / 2.0,
                  len(offsets))


def fit_offset(times: np.ndarray, offsets: np.ndarray, round_trips: np.ndarray
               ) -> Offset | None:
    """The offset as a line through the samples (``times`` on the reference clock): the
    exchange with the smallest round trip of each of STRETCHES stretches, fitted by least
    squares weighted by how tight each is. Over less than MIN_SPAN_S, no drift can be told
    from noise: the offset is ``best_offset``'s, as loose as a clock may drift over the span.
    Each fitted exchange's offset is off by at most half its round trip, and the line is a
    weighted sum of those offsets: the uncertainty (at the latest sample) is half the longest
    round trip fitted, or the most those errors can move the line there where that is more,
    plus the fit's residual; the drift's uncertainty is the most they can tilt it, so that
    ``uncertainty_at`` widens with the distance from the latest sample (sixteen exchanges over half a minute, a few of them 10 ms lopsided, fit a drift of
    hundreds of ppm that is all noise, and extrapolated half a minute back it went 6 ms off
    where the uncertainty claimed ±5.8). A stretch whose best exchange took over
    LOOSE_STRETCH times the stretches' median (an agent starved of CPU for its half minute)
    is left out where three others remain: it weighs next to nothing in the line, and
    fitted, it set the uncertainty alone (beside a busy loop one such stretch kept a node's
    clock known to ±28 ms for the four minutes it was remembered, its other stretches' best
    exchanges 1 ms long, and the least-lag rule named no rank of the job 23 ms late)."""
    times, offsets, trips = (np.asarray(a, float) for a in (times, offsets, round_trips))
    if not len(times):
        return None
    order = np.argsort(times, kind="stable")
    times, offsets, trips = times[order], offsets[order], trips[order]
    first, last = float(times[0]), float(times[-1])
    best = np.array([c[np.argmin(trips[c])]
                     for c in np.array_split(np.arange(len(times)), min(STRETCHES, len(times)))])
    t, o, half = times[best], offsets[best], trips[best] / 2.0
    tight = half <= LOOSE_STRETCH * np.median(half)
    if tight.sum() >= 3:
        t, o, half = t[tight], o[tight], half[tight]
    if len(best) < 3 or t[-1] - t[0] < MIN_SPAN_S:
        flat = best_offset(offsets, trips)
        return Offset(flat.offset, flat.uncertainty + DRIFT_BOUND * (last - first),
                      len(times), 0.0, last, first)
    weight = 1.0 / (half + 1e-4) ** 2
    centre = float(np.average(t, weights=weight))
    mean = float(np.average(o, weights=weight))
    # the line at time x is sum((level + (x - centre) * tilt) * o): each sample's error, at
    # most its ``half``, moves it by at most that times the sample's coefficient there
    level = weight / np.sum(weight)
    tilt = weight * (t - centre) / np.sum(weight * (t - centre) ** 2)
    drift = float(np.sum(tilt * (o - mean)))
    residual = o - (mean + drift * (t - centre))
    moved = float(np.sum(np.abs(level + (last - centre) * tilt) * half))
    uncertainty = max(float(half.max()), moved) + float(
        np.sqrt(np.average(residual ** 2, weights=weight)))
    return Offset(mean + drift * (last - centre), uncertainty, len(times), drift, last, first,
                  float(np.sum(np.abs(tilt) * half)))
