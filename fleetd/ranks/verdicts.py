"""Keeps the verdicts: raises, revises and clears them, and closes a job's."""

from __future__ import annotations

import logging

from ingero.rates import usd

from ..rankstate import JobState, Verdict

log = logging.getLogger("fleetd")


class VerdictBook:
    """The part of ``RankAnalysis`` (``fleetd.ranks.analysis``) that keeps the verdicts; it
    reads and keeps the state the face declares."""

    def _merge(self, job: JobState, found: dict, now: float, held: set = frozenset(),
               final: set = frozenset()) -> list[Verdict]:
        """Raise what is new, update what goes on, clear what was not found for
        ``clear_ticks`` judgements in a row (``held``: verdicts on communicators not judged
        this tick, which count neither way; ``final``: verdicts whose communicator was
        retired, stored with what they cost to its end)."""
        changed = []
        for key, fresh in found.items():
            if any(value is not None for value in job.run):
                fresh.evidence["run"] = job.run_json()
            current = job.verdicts.get(key)
            if current is None or current.cleared is not None:
                fresh.first_seen = fresh.last_seen = now
                fresh.cost_usd = self._usd(fresh.cost_gpu_s)
                job.verdicts[key] = fresh
                changed.append(fresh)
                log.log(logging.ERROR if fresh.severity == "critical" else logging.WARNING,
                        "straggler %s, %s", fresh.describe(), fresh.severity)
                continue
            if self._update(current, fresh, job, now):
                changed.append(current)
        for key in held | final:        # what it cost since (charged as instances settle)
            current = job.verdicts[key]
            if any(current is v for v in changed):
                continue
            current.cost_usd = self._usd(current.cost_gpu_s)
            if self._restamp(current, now, key in final):
                changed.append(current)
        for key, current in job.verdicts.items():
            if key not in found and key not in held and current.cleared is None:
                current.misses += 1
                if current.misses >= self.clear_ticks:
                    current.cleared = now
                    current.revision += 1
                    changed.append(current)
                    log.info("straggler cleared: %s", current.describe())
        return changed

    def _update(self, current: Verdict, fresh: Verdict, job: JobState, now: float) -> bool:
        """Carry the latest numbers; True when something worth storing changed."""
        material = (fresh.kind, fresh.cause, fresh.period) != (current.kind, current.cause,
                                                              current.period)
        for name in ("kind", "cause", "confidence", "severity", "fix", "findings", "op",
                     "lag_p50_s", "lag_p99_s", "last_share", "period", "occurrences",
                     "evidence", "exposed_s", "together"):
            setattr(current, name, getattr(fresh, name))
        current.misses = 0
        if fresh.kind in ("hang", "died"):      # the peers' wait so far
            current.cost_gpu_s = fresh.cost_gpu_s
        current.cost_usd = self._usd(current.cost_gpu_s)
        return self._restamp(current, now, material)

    @staticmethod
    def _restamp(current: Verdict, now: float, material: bool) -> bool:
        """A new revision to store when it changed materially, or 10 s after the last."""
        if material or now - current.last_seen >= 10.0:
            current.last_seen = now
            current.revision += 1
            return True
        return False

    def _close_all(self, job: JobState, now: float) -> list[Verdict]:
        closed = []
        for verdict in job.verdicts.values():
            if verdict.cleared is None:
                verdict.cleared, verdict.revision = now, verdict.revision + 1
                closed.append(verdict)
        return closed

    def _usd(self, gpu_s: float) -> float | None:
        return usd(gpu_s, self.rate)
