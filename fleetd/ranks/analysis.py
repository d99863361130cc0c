"""The face of fleetd's rank analysis: ``RankAnalysis.observe(push, now)`` takes a push in,
``tick(now)`` judges every job and returns the verdicts that changed, ``take_rows()`` hands
what is to be stored to the forwarder. Its parts: ``observing`` (intake), ``settling``,
``judging`` (the rules) and ``verdicts`` (the verdict book), over ``common``.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from types import SimpleNamespace

from ingero.analysis.stragglers import LagPolicy
from ingero.runtime import RateLimitedLog

from ..alignment import OpCodes
from ..clocks import ClockBook
from ..intake import ColumnIntake
from ..rankstate import JobState, Verdict
from .common import RESUMED_AFTER, SERVE_EVERY_S
from .judging import Judging
from .observing import Observing
from .settling import Settling
from .verdicts import VerdictBook

log = logging.getLogger("fleetd")


class RankAnalysis(Observing, Settling, Judging, VerdictBook):
    """Every job's aligned collectives, rank facts and verdicts."""

    def __init__(self, cfg: SimpleNamespace, rate_usd_per_gpu_hour: float | None = None,
                 clocks: ClockBook | None = None):
        self.policy = LagPolicy(k=cfg.lag_k, min_lag_s=cfg.min_lag)
        self.hang_timeout = cfg.hang_timeout
        self.clear_ticks = cfg.clear_ticks
        self.job_ttl = cfg.job_ttl
        self.rate = rate_usd_per_gpu_hour
        self.clocks = clocks or ClockBook()
        self.jobs: dict[tuple, JobState] = {}       # (cluster, job, run) → its state
        self.ops = OpCodes()
        self.intake = ColumnIntake(self)
        self.unaligned = 0            # collectives on communicators never seen created
        self.heard: dict[str, tuple[float, float]] = {}   # node → (last push, its interval)
        self.resumed: dict[str, float] = {}  # node → its first push after a silence, when
        self.pending_rows: list[dict] = []
        self.pending_lag: list[dict] = []
        self.live_by_node: dict[str | None, set[tuple]] = {}  # node → (job, rank) named
        self.failed = 0               # a job's tick that raised (a bug): counted, logged, skipped
        self.failures = RateLimitedLog(log, 60.0)
        self.interval_s = 1.0         # the longest push interval of the job being judged
        self.users: dict[tuple, tuple[str, float]] = {}   # (cluster, job) → (user, when said)
        self.max_ranks = cfg.max_ranks
        self.max_jobs_per_node = cfg.max_jobs_per_node
        self.node_jobs: dict[tuple, dict[str, float]] = {}   # (cluster, node) → job → when
        self.owners: dict[tuple, tuple[int, float]] = {}  # (cluster, job) → (its uid, when)
        self.refused: Counter[str] = Counter()    # events refused at intake, by reason
        self.untraced: dict[str, str] = {}    # node → why its agent cannot trace, as it said

    def tick(self, now: float, between: Callable[[], None] | None = None,
             every_s: float = SERVE_EVERY_S) -> list[Verdict]:
        """Settle, judge every job, expire idle ones; returns the verdicts that changed.
        ``between`` is called between two jobs once ``every_s`` of judging has passed since
        it last ran: fleetd answers the pushes waiting meanwhile, so a tick over thousands of
        jobs does not hold every reply up (a push it handles then may add to a job already
        judged, or not yet: either way it is judged next tick)."""
        changed: list[Verdict] = []
        served = time.perf_counter()
        for key, job in list(self.jobs.items()):
            if between is not None and time.perf_counter() - served >= every_s:
                between()
                served = time.perf_counter()
            try:
                self.interval_s = self._interval(job)
                changed += self._judge_job(job, now)
            except Exception:
                self.failed += 1
                self.failures.warning(f"{key}", "the rank analysis of job %s/%s failed; the "
                                      "other jobs are judged, and this one again next tick",
                                      job.cluster, job.job, exc_info=True)
            if now - job.last_event > self.job_ttl:
                changed += self._close_all(job, now)
                del self.jobs[key]
        changed = list({id(v): v for v in changed}.values())   # a verdict once, as it is now
        self.heard = {node: said for node, said in self.heard.items()
                      if now - said[0] <= max(self.job_ttl, RESUMED_AFTER * said[1])}
        tracked = self.tracked_jobs()
        self.users = {key: said for key, said in self.users.items()
                      if key in tracked or now - said[1] <= self.job_ttl}
        self.owners = {key: said for key, said in self.owners.items()
                       if key in tracked or now - said[1] <= self.job_ttl}
        for (cluster, node), jobs in list(self.node_jobs.items()):
            for job in [j for j, seen in jobs.items()
                        if (cluster, j) not in tracked and now - seen > self.job_ttl]:
                del jobs[job]
            if not jobs:
                del self.node_jobs[(cluster, node)]
        self.pending_rows += [v.row() for v in changed]
        self.live_by_node = defaultdict(set)
        for verdict in self.active():
            self.live_by_node[verdict.node].add((verdict.job, verdict.rank))
        return changed

    def tracked_jobs(self) -> set[tuple[str, str | None]]:
        """(cluster, job) of every job run the analysis holds."""
        return {(job.cluster, job.job) for job in self.jobs.values()}

    def take_refused(self) -> Counter[str]:
        """The events refused at intake since the last call, by reason."""
        refused, self.refused = self.refused, Counter()
        return refused

    @property
    def incomplete(self) -> int:
        """Instances dropped for a lost entry, in the jobs still tracked."""
        return sum(w.incomplete for job in self.jobs.values() for w in job.comms.values())

    def straggler_ranks(self, node: str) -> list[tuple[str | None, int]]:
        """(job, rank) of the ranks on ``node`` under a live verdict as of the last tick, for
        the push reply (asked once a push: an index, not a walk over every job's verdicts)."""
        return sorted(self.live_by_node.get(node, ()), key=lambda jr: (str(jr[0]), jr[1]))

    def user_of(self, cluster: str, job: str | None) -> str | None:
        """The job's user, as its Slurm prolog recorded it (None without one)."""
        said = self.users.get((cluster, job))
        return None if said is None else said[0]

    def active(self) -> list[Verdict]:
        return [v for job in self.jobs.values() for v in job.verdicts.values()
                if v.cleared is None]

    def take_rows(self) -> tuple[list[dict], list[dict]]:
        """Verdict rows and peer-lag rows gathered since the last call, for echod."""
        rows, lag = self.pending_rows, self.pending_lag
        self.pending_rows, self.pending_lag = [], []
        return rows, lag
