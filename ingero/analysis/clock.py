"""Clock offsets, NTP-style, from the four times of a push and its reply.

    t0  the agent sends a push          (agent's clock)
    t1  fleetd receives it              (fleetd's clock)
    t2  fleetd sends the reply          (fleetd's clock)
    t3  the agent receives the reply    (agent's clock)

The round trip net of fleetd's own time is ``(t3 − t0) − (t2 − t1)``; the agent's clock minus
fleetd's is ``((t0 − t1) + (t3 − t2)) / 2``, exact when the two legs take equally long and off
by at most half the round trip when they do not. So the samples with the smallest round trips
are kept, and half the longest of those kept is the estimate's uncertainty.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Offset:
    """A node's clock minus the reference clock, in seconds, give or take ``uncertainty``."""

    offset: float
    uncertainty: float
    samples: int


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
