"""Each node's clock offset from fleetd's, estimated from the pushes' exchange times.

An agent puts the four times of its previous push/reply exchange on its next push; the best of
them, over the last few minutes, give the node's offset and drift (``ingero.analysis.clock``).
Until a node's first exchange its offset is not known (not zero). A new boot of its host, or a
sample that no longer fits the line (the clock was stepped: NTP, a reboot), starts the node's
estimate afresh. Nothing here reads a clock.
"""

from __future__ import annotations

import logging
from collections import deque

from ingero.analysis.clock import Offset, exchange, fit_offset

log = logging.getLogger("fleetd")

SAMPLES = 256           # exchanges remembered per node (about four minutes at one a second)
STEP_MARGIN_S = 0.001   # a sample further than this past what the line allows: a stepped clock


class ClockBook:
    def __init__(self, samples: int = SAMPLES):
        self.samples: dict[str, deque[tuple[float, float, float]]] = {}
        self.size = samples
        self.offsets: dict[str, Offset] = {}
        self.boots: dict[str, str] = {}
        self.resets = 0

    def observe(self, node: str, times: list[float] | None, host_boot: str | None = None
                ) -> None:
        """One exchange of ``node``: (push sent, received, answered, reply received)."""
        if host_boot is not None and self.boots.setdefault(node, host_boot) != host_boot:
            self.boots[node] = host_boot
            self.restart(node, "its host booted again")
        if times is None:
            return
        offset, round_trip = exchange(*times)
        known = self.offsets.get(node)
        if known is not None and abs(offset - known.offset_at(times[1])) > \
                known.uncertainty_at(times[1]) + round_trip / 2 + STEP_MARGIN_S:
            self.restart(node, f"its clock moved by {(offset - known.offset) * 1e3:+.1f} ms")
        kept = self.samples.setdefault(node, deque(maxlen=self.size))
        kept.append((times[1], offset, round_trip))
        self.offsets[node] = fit_offset(*zip(*kept))

    def restart(self, node: str, why: str) -> None:
        if self.samples.pop(node, None):
            self.resets += 1
            log.info("clock of node %s estimated afresh: %s", node, why)
        self.offsets.pop(node, None)

    def at(self, node: str) -> Offset | None:
        """The node's offset line; None until an exchange is known."""
        return self.offsets.get(node)

    def offset(self, node: str) -> float:
        """Seconds to subtract from ``node``'s latest times to put them on fleetd's clock (0
        until an exchange is known: for what is weighed in seconds, not compared across
        nodes)."""
        known = self.offsets.get(node)
        return known.offset if known else 0.0

    def forget(self, node: str) -> None:
        self.samples.pop(node, None)
        self.offsets.pop(node, None)
        self.boots.pop(node, None)
