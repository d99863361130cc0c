"""Each node's clock offset from fleetd's, estimated from the pushes' exchange times.

An agent puts the four times of its previous push/reply exchange on its next push; the samples
with the smallest round trips decide (``ingero.analysis.clock``). Nothing here reads a clock.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ingero.analysis.clock import Offset, best_offset, exchange

SAMPLES = 64            # exchanges remembered per node


class ClockBook:
    def __init__(self, samples: int = SAMPLES):
        self.samples: dict[str, deque[tuple[float, float]]] = {}
        self.size = samples
        self.offsets: dict[str, Offset] = {}

    def observe(self, node: str, times: list[float] | None) -> None:
        """One exchange of ``node``: (push sent, received, answered, reply received)."""
        if times is None:
            return
        kept = self.samples.setdefault(node, deque(maxlen=self.size))
        kept.append(exchange(*times))
        offsets, round_trips = np.array(kept).T
        self.offsets[node] = best_offset(offsets, round_trips)

    def offset(self, node: str) -> float:
        """Seconds to subtract from ``node``'s times to put them on fleetd's clock (0 until an
        exchange is known)."""
        known = self.offsets.get(node)
        return known.offset if known else 0.0

    def forget(self, node: str) -> None:
        self.samples.pop(node, None)
        self.offsets.pop(node, None)
