"""Which bar this node measures itself against, and whether it is under it.

Modes, tried in order:
    fleet          fleetd is reachable and sent a quorum threshold within ``fleet_fresh``
    fleet-cached   the last quorum threshold is younger than ``fleet_cached``
    local-baseline the node has warmed up: compare with a fixed local bar
    none           still calibrating, or idle
The straggler state flips only past the bar by ``hysteresis``, so noise at the bar does not
chatter; each flip yields one event (straggler on the way down, resolved on the way up).
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("fleet", "fleet-cached", "local-baseline", "none")


@dataclass
class FleetView:
    """The last usable word from fleetd."""

    threshold: float | None = None
    received_at: float | None = None
    cohort: str | None = None


@dataclass(frozen=True)
class Verdict:
    mode: str
    bar: float | None
    straggler: bool
    edge: str | None


class Detector:
    def __init__(self, hysteresis: float, fleet_fresh: float, fleet_cached: float,
                 local_threshold: float):
        self.hysteresis = hysteresis
        self.fleet_fresh = fleet_fresh
        self.fleet_cached = fleet_cached
        self.local_threshold = local_threshold
        self.fleet = FleetView()
        self.straggler = False

    def heard(self, threshold: float | None, quorum_met: bool, cohort: str, now: float) -> None:
        """A reply arrived; only a quorum threshold is worth keeping."""
        if threshold is not None and quorum_met:
            self.fleet = FleetView(threshold, now, cohort)

    def mode(self, state: str, reachable: bool, now: float) -> tuple[str, float | None]:
        age = None if self.fleet.received_at is None else now - self.fleet.received_at
        if age is not None and reachable and age <= self.fleet_fresh:
            return "fleet", self.fleet.threshold
        if age is not None and age <= self.fleet_cached:
            return "fleet-cached", self.fleet.threshold
        if state == "active":
            return "local-baseline", self.local_threshold
        return "none", None

    def judge(self, score: float, state: str, reachable: bool, now: float) -> Verdict:
        mode, bar = self.mode(state, reachable, now)
        was = self.straggler
        if bar is None or state != "active":
            self.straggler = False
        elif was and score > bar + self.hysteresis:
            self.straggler = False
        elif not was and score < bar - self.hysteresis:
            self.straggler = True
        edge = None if was == self.straggler else ("straggler" if self.straggler else "resolved")
        return Verdict(mode, bar, self.straggler, edge)
