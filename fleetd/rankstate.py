"""What fleetd keeps per job for its rank analysis: each rank's recent facts, the verdicts,
and, once per tick, every rank's medians for weighing one against its peers."""

from __future__ import annotations

import statistics
import uuid
from collections import defaultdict, deque
from dataclasses import dataclass, field

import numpy as np

from ingero.analysis.causes import verdict_line

from .alignment import CommKey, CommWindow

FACTS_KEPT = 64                      # sync and allocation durations kept per rank


@dataclass
class RankFacts:
    """What one rank's node said about it lately, besides its collectives."""

    node: str = ""
    pid: int | None = None
    self_work_ns: deque = field(default_factory=lambda: deque(maxlen=FACTS_KEPT))
    peer_wait_ns: deque = field(default_factory=lambda: deque(maxlen=FACTS_KEPT))
    peer_wait_t: deque = field(default_factory=lambda: deque(maxlen=FACTS_KEPT))   # when, as
    # its node timed it (placed on fleetd's clock when weighed: ``RankAnalysis._waits_placed``)
    # and the collective each covered: (communicator, sequence number), -1 where not known
    peer_wait_on: deque = field(default_factory=lambda: deque(maxlen=FACTS_KEPT))
    sync_end: deque = field(default_factory=lambda: deque(maxlen=2 * FACTS_KEPT))  # ends (the
    # return, less the thread's wait for a CPU once woken: ingerod's duration) and what each
    sync_on: deque = field(default_factory=lambda: deque(maxlen=2 * FACTS_KEPT))
    # waited on: the communicator of the collective it covered (None: its own kernels)
    allocation_ns: deque = field(default_factory=lambda: deque(maxlen=FACTS_KEPT))
    # (t, comm, pid, count, the preemptor's process, ns it kept the rank off its CPU)
    preemptions: deque = field(default_factory=lambda: deque(maxlen=4096))
    blockio: deque = field(default_factory=lambda: deque(maxlen=4096))      # (t, req, bytes)
    exited_at: float | None = None
    crashed: bool | None = None         # it exited failing (a signal, a non-zero status); None:
                                        # how it ended is not known (seen gone at a rescan)
    aborted_at: float | None = None     # it aborted its communicator: NCCL failed in it
    blind_since: float | None = None    # its agent no longer knows its communicators (the
                                        # agent restarted): its collectives cannot be placed

    def let_go(self, before: float) -> None:
        """Forget the preemptions and block I/O from before ``before`` (the host facts'
        window)."""
        for kept in (self.preemptions, self.blockio):
            while kept and kept[0][0] < before:
                kept.popleft()

    def gave_up_at(self) -> float | None:
        """When it stopped waiting on its collectives: it aborted its communicator (NCCL failed,
        or timed out), or exited failing."""
        times = [self.aborted_at, self.exited_at if self.crashed else None]
        return min((t for t in times if t is not None), default=None)

    def self_work_rate(self) -> float:
        """Syncs on its own kernels per second, over those kept (0 where fewer than two)."""
        ends = [t for t, on in zip(self.sync_end, self.sync_on) if on is None]
        return (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 and \
            ends[-1] > ends[0] else 0.0

    @staticmethod
    def median(values: deque) -> float | None:
        """Seconds, from durations in ns (a few dozen: Python's median beats numpy's here)."""
        return statistics.median(values) / 1e9 if values else None


@dataclass
class Verdict:
    """One rank named a straggler; updated while it lasts, cleared when it stops."""

    cluster: str
    job: str | None
    rank: int
    node: str
    kind: str
    cause: str
    vid: str = field(default_factory=lambda: uuid.uuid4().hex)
    confidence: str = "medium"
    severity: str = "major"
    fix: str | None = None
    findings: list[str] = field(default_factory=list)
    op: str | None = None
    comm_hash: str | None = None
    step: int | None = None             # onset, in instances of the communicator's main op
    onset: float | None = None
    first_seen: float = 0.0
    last_seen: float = 0.0
    cleared: float | None = None
    lag_p50_s: float | None = None
    lag_p99_s: float | None = None
    last_share: float | None = None
    period: int | None = None
    occurrences: int = 0
    cost_gpu_s: float = 0.0
    cost_usd: float | None = None
    evidence: dict = field(default_factory=dict)
    revision: int = 0
    misses: int = 0
    exposed_s: float | None = None      # how much longer each instance kept its peers
    # waiting (None: not known; its lag over the bar is charged)
    together: int = 1                   # ranks late at once on its communicator, sharing it

    def row(self) -> dict:
        """The verdict as echod stores it."""
        return {k: getattr(self, k) for k in (
            "vid", "revision", "cluster", "job", "rank", "node", "kind", "cause", "confidence",
            "severity", "fix", "findings", "op", "comm_hash", "step", "onset", "first_seen",
            "last_seen", "cleared", "lag_p50_s", "lag_p99_s", "last_share", "period",
            "occurrences", "cost_gpu_s", "cost_usd", "evidence")}

    def describe(self) -> str:
        lag_ms = None if self.lag_p50_s is None else self.lag_p50_s * 1e3
        return f"job {self.job} " + verdict_line(self.rank, self.node, self.kind, self.period,
                                                 lag_ms, self.op, self.cause)


@dataclass
class PeerFacts:
    """Per rank of a job (in ``ranks`` order): its median self-work (syncs on its own kernels),
    allocation and peer-wait (seconds, NaN where unmeasured), who else took its CPU, and its
    recent block I/O (bytes)."""

    ranks: list[int]
    work: np.ndarray
    alloc: np.ndarray
    wait: np.ndarray
    preemptions: list[dict]
    io: np.ndarray
    alike: list[np.ndarray] | None = None   # per rank, the indices of the ranks doing its
                                            # work (its stage's); None: every other rank

    def like(self, at: int) -> np.ndarray:
        """The indices of the ranks its work is compared with."""
        if self.alike is not None and len(self.alike[at]):
            return self.alike[at]
        return np.delete(np.arange(len(self.ranks)), at)

    def own_and_others(self, values: np.ndarray, at: int) -> tuple[float | None, float | None]:
        """The rank's value and the median of its peers' (None where unmeasured)."""
        others = values[self.like(at)]
        others = others[np.isfinite(others)]
        own = values[at]
        return (float(own) if np.isfinite(own) else None,
                float(np.median(others)) if others.size else None)


@dataclass(eq=False)
class JobState:
    """One run of a job: its Slurm step, requeue and elastic restart (or, without a job id,
    its world communicator) tell runs of one job id apart."""

    cluster: str
    job: str | None
    run: tuple = (None, None, None)     # (step, requeue, restart) as its processes say
    comms: dict[CommKey, CommWindow] = field(default_factory=dict)
    columns: dict[CommKey, dict[int, int]] = field(default_factory=dict)  # → column → rank
    facts: dict[int, RankFacts] = field(default_factory=lambda: defaultdict(RankFacts))
    verdicts: dict[tuple[int, str], Verdict] = field(default_factory=dict)
    uncovered: set[int] = field(default_factory=set)   # ranks no agent has ever told of
    noted: set[int] = field(default_factory=set)       # ranks fleetd sent a note of, once
    harmless: dict[tuple[str, int], float] = field(default_factory=dict)   # (comm, rank) →
    # the lag its lateness was shown to cost nobody at, while it stays late
    exposure: dict[tuple, float | None] = field(default_factory=dict)     # (comm, rank) →
    # how much longer each instance kept its peers waiting since its onset (cost.exposure)
    unclocked: set[str] = field(default_factory=set)   # nodes left out until their clock is known
    # ncclCommSplit: (parent, split) → parent rank → (colour, key, new comm, rank); once every
    # rank of the parent has split, each new comm's rank → (comm rank, size)
    splits: dict[tuple[str, int], dict[int, tuple]] = field(default_factory=dict)
    split_comms: dict[str, dict[int, tuple[int, int]]] = field(default_factory=dict)
    unresolved: dict[str, list] = field(default_factory=dict)   # comm → collectives waiting
    peers: PeerFacts | None = None      # this tick's, built when first needed
    started: float = 0.0
    last_event: float = 0.0
    changed: bool = True                # events arrived since its last judgement

    def run_json(self) -> dict:
        """The run as verdicts carry it: what is known of step, requeue and restart."""
        return {name: value for name, value in zip(RUN_TAGS, self.run) if value is not None}


RUN_TAGS = ("step", "requeue", "restart")
