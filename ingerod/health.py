"""The node's health score: four signals in [0, 1], weighted, with a floor penalty.

    score = (0.40·throughput + 0.25·compute + 0.20·memory headroom + 0.15·CPU availability)
            × floor_penalty(lowest signal)

The floor penalty halves the score when any signal has collapsed (≤ 0.25), easing linearly back
to ×1 at 0.35, so one dead signal cannot hide behind three healthy ones. Raw measurements become
signals against an EMA baseline of their own (``EmaBaseline``). A node is *calibrating* for its
first ``warmup`` samples with a job, *active* after, and *idle* while no job runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WEIGHTS = {"throughput": 0.40, "compute": 0.25, "memory": 0.20, "cpu": 0.15}
FLOOR_LOW, FLOOR_HIGH, FLOOR_FACTOR = 0.25, 0.35, 0.5


def clamp(value: float, lo: float = 0.0, hi: float = 1.0) -> float:
    return max(lo, min(hi, value))


def floor_penalty(lowest: float) -> float:
    if lowest <= FLOOR_LOW:
        return FLOOR_FACTOR
    if lowest >= FLOOR_HIGH:
        return 1.0
    return FLOOR_FACTOR + (1.0 - FLOOR_FACTOR) * (lowest - FLOOR_LOW) / (FLOOR_HIGH - FLOOR_LOW)


def health_score(signals: dict[str, float]) -> float:
    weighted = sum(WEIGHTS[name] * clamp(signals[name]) for name in WEIGHTS)
    return clamp(weighted * floor_penalty(min(clamp(v) for v in signals.values())))


class EmaBaseline:
    """Normalises a raw rate (higher is better) against its own moving average.

    The baseline learns only from samples within ``freeze_below`` of it, so a sustained drop
    stays visible instead of becoming the new normal.
    """

    def __init__(self, alpha: float = 0.1, freeze_below: float = 0.7):
        self.alpha = alpha
        self.freeze_below = freeze_below
        self.value: float | None = None

    def signal(self, raw: float) -> float:
        if self.value is None or self.value <= 0:
            self.value = raw if raw > 0 else None
            return 1.0
        ratio = raw / self.value
        if ratio >= self.freeze_below:
            self.value += self.alpha * (raw - self.value)
        return clamp(ratio)


@dataclass
class Sample:
    """What a signal source saw over one interval."""

    signals: dict[str, float]
    busy: bool = True
    events: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Assessment:
    score: float
    signals: dict[str, float]
    state: str


class HealthModel:
    def __init__(self, warmup: int):
        self.warmup = warmup
        self.busy_samples = 0

    def assess(self, sample: Sample) -> Assessment:
        signals = {name: clamp(sample.signals[name]) for name in WEIGHTS}
        if not sample.busy:
            self.busy_samples = 0
            return Assessment(1.0, signals, "idle")
        self.busy_samples += 1
        state = "active" if self.busy_samples > self.warmup else "calibrating"
        return Assessment(health_score(signals), signals, state)
