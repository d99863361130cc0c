"""Signal sources: where a node's health signals and events come from.

Every source has ``sample(now) -> Sample`` once per push interval, ``poll(now)`` on every pass
of the agent's loop (to keep kernel buffers drained), ``lost_events()``, ``take_refused()``
(what it refused since, by reason) and ``close()``. ``synthetic`` reports scores it is told
(fixed, re-read from a file, or scripted over time) for tests and demos; ``ebpf`` traces the
training job's NCCL and CUDA calls and its host; ``untraced`` stands in where ``ebpf`` cannot
start (no kernel headers, no bcc, no privilege).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

from ingero.errors import ConfigError

from .health import WEIGHTS, Sample

log = logging.getLogger("ingerod")


def parse_script(script: str) -> list[tuple[float, float | None]]:
    """``"0:0.9,30:0.4,60:idle"`` → [(0, 0.9), (30, 0.4), (60, None)], sorted by time."""
    steps = []
    for item in script.split(","):
        at, _, value = item.strip().partition(":")
        try:
            seconds = float(at)
            score = None if value.strip() == "idle" else float(value)
        except ValueError:
            raise ConfigError(f"script step {item!r}: expected SECONDS:SCORE or SECONDS:idle") \
                from None
        if seconds < 0 or (score is not None and not 0.0 <= score <= 1.0):
            raise ConfigError(f"script step {item!r}: seconds must be >= 0, score in [0, 1]")
        steps.append((seconds, score))
    return sorted(steps)


class Untraceable:
    """A source that traces nothing: no kernel buffers to drain, nothing lost or refused."""

    def poll(self, now: float) -> None:
        pass

    def lost_events(self) -> int:
        return 0

    def launches_counted(self) -> int:
        return 0

    def take_refused(self) -> Counter:
        return Counter()

    def close(self) -> None:
        pass


class SyntheticSource(Untraceable):
    """Reports a score it is told, with all four signals at that value."""

    name = "synthetic"

    def __init__(self, score: float, score_file: Path | None = None, script: str | None = None,
                 started: float = 0.0):
        self.score = score
        self.score_file = score_file
        self.steps = parse_script(script) if script else []
        self.started = started

    def current(self, now: float) -> float | None:
        if self.score_file is not None:
            try:
                return float(self.score_file.read_text().strip())
            except (OSError, ValueError) as exc:
                log.debug("score file %s unusable (%s); keeping %.3f", self.score_file, exc,
                          self.score)
                return self.score
        score = self.score
        for at, value in self.steps:
            if now - self.started >= at:
                score = value
        return score

    def sample(self, now: float) -> Sample:
        score = self.current(now)
        if score is None:
            return Sample({name: 1.0 for name in WEIGHTS}, busy=False)
        self.score = min(1.0, max(0.0, score))
        return Sample({name: self.score for name in WEIGHTS})


class UntracedSource(Untraceable):
    """What an agent that cannot trace runs: no signals and no events, so its node reads idle
    and is never a straggler, while the agent keeps its control socket, its metrics and its
    link to fleetd. Its first sample tells fleetd once why (an ``agent_untraced`` event): the
    ranks of this node are then uncovered, not missing, and their peers judged without them.
    Restarting would not help (the kernel's headers do not appear by themselves), and a
    restart every few seconds would cost the node more than it tells."""

    name = "untraced"

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail
        self.told = False

    def sample(self, now: float) -> Sample:
        events = [] if self.told else [{"kind": "agent_untraced", "t": time.time(), "attrs": {
            "reason": self.reason, "detail": self.detail[:512]}}]
        self.told = True
        return Sample({name: 1.0 for name in WEIGHTS}, busy=False, events=events)


def open_source(cfg: SimpleNamespace, now: float):
    """The configured source; for ``ebpf`` on a node where tracing cannot start, the
    untraced one, after one line that says why and what to run."""
    if cfg.source == "synthetic":
        return SyntheticSource(cfg.score, cfg.score_file, cfg.script, now)
    from .check import checks, reason
    from .ebpf_source import EbpfSource
    from .errors import TracingError
    try:
        return EbpfSource(cfg, now)
    except TracingError as exc:
        try:
            why = reason(checks())
        except Exception:     # a check that fails must not take the agent down with it
            log.exception("could not tell why tracing cannot start")
            why = "load_failed"
        log.error("cannot trace (%s): %s. Running untraced: this node's ranks are not judged; "
                  "`ingerod check` says what the node lacks and how to fix it", why, exc)
        return UntracedSource(why, str(exc))
