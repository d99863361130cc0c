"""The threshold service's state: nodes, their cohorts, and each cohort's bar.

A cohort is the Slurm job a push names, else the node's cluster. Each push updates its node's
latest score; ``recompute(now)`` runs on a timer, expires silent nodes and recomputes every
cohort's threshold from its active nodes. Nothing here touches a socket or a clock: time is
passed in, so tests drive it.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ingero.wire import Push

from ingero import analysis as stats

log = logging.getLogger("fleetd")


@dataclass(frozen=True)
class ThresholdPolicy:
    k: float = 2.0
    ema_alpha: float = 0.2
    mad_floor: float = 0.01
    quorum: int = 5
    ttl_multiplier: float = 5.0
    panic_fraction: float = 0.5
    coverage_alert: float = 0.8


class SeqWindow:
    """Which sequence numbers of one agent boot were already accepted.

    Agents resend only their bounded queue of unacked batches, so remembering the last ``size``
    numbers is enough: anything older than the window is a replay too.
    """

    def __init__(self, size: int = 4096):
        self.size = size
        self.seen: set[int] = set()
        self.order: deque[int] = deque()
        self.last_seen = 0.0          # when its agent last pushed (fleetd's clock)
        self.interval = 1.0           # its agent's push interval

    def new(self, seq: int) -> bool:
        """Whether ``seq`` was not accepted yet (nothing is recorded)."""
        return seq not in self.seen and not (len(self.order) == self.size
                                             and seq < self.order[0])

    def accept(self, seq: int) -> bool:
        """True the first time ``seq`` is offered, False for a resend."""
        if not self.new(seq):
            return False
        self.seen.add(seq)
        self.order.append(seq)
        if len(self.order) > self.size:
            self.seen.discard(self.order.popleft())
        return True


@dataclass
class NodeState:
    node: str
    cluster: str
    boot_id: str
    cohort: str
    interval: float
    score: float = 1.0
    state: str = "calibrating"
    last_seen: float = 0.0
    latest_seq: int = -1
    expected_nodes: int | None = None


@dataclass
class CohortState:
    name: str
    cluster: str = ""
    threshold: float | None = None
    median: float | None = None
    mad: float | None = None
    active: int = 0
    under: int = 0
    expected: int | None = None
    quorum_met: bool = False
    panic: bool = False
    stragglers: set[str] = field(default_factory=set)
    computed: bool = False

    @property
    def coverage(self) -> float | None:
        return None if not self.expected else min(1.0, self.active / self.expected)


class Edge(NamedTuple):
    """A change of verdict: ``node`` flagged (raised) or cleared; ``node`` None for panic."""

    cohort: str
    node: str | None
    raised: bool


def cohort_of(push: Push) -> str:
    return f"job:{push.job}" if push.job else f"cluster:{push.cluster}"


class Fleet:
    """Every node's latest score and every cohort's threshold."""

    def __init__(self, policy: ThresholdPolicy, expected_nodes: dict[str, int] | None = None,
                 max_nodes: int = 10_000):
        self.policy = policy
        self.expected_nodes = expected_nodes or {}
        self.max_nodes = max_nodes
        self.nodes: dict[str, NodeState] = {}
        self.cohorts: dict[str, CohortState] = {}
        # (node, boot id) → the push numbers its agent sent: two agents of one node (per-job
        # ingerod@JOB units, each with a boot id of its own) keep a window each
        self.windows: dict[tuple[str, str], SeqWindow] = {}

    def full(self, node: str) -> bool:
        return node not in self.nodes and len(self.nodes) >= self.max_nodes

    def new(self, push: Push) -> bool:
        """Whether a push was not accepted yet: its number is recorded only by ``observe``,
        once it has been handled, so a push whose handling failed is handled again when the
        agent resends it, not acknowledged as a duplicate."""
        window = self.windows.get((push.node, push.boot_id))
        return window is None or window.new(push.seq)

    def observe(self, push: Push, now: float) -> tuple[bool, CohortState]:
        """Record a push; returns whether it is new (not a resend) and the node's cohort."""
        window = self.windows.setdefault((push.node, push.boot_id), SeqWindow())
        fresh = window.accept(push.seq)
        window.last_seen, window.interval = now, push.interval
        node = self.nodes.get(push.node)
        if node is None or node.boot_id != push.boot_id:
            node = NodeState(push.node, push.cluster, push.boot_id, cohort_of(push), push.interval)
            self.nodes[push.node] = node
        node.last_seen = now
        if push.seq > node.latest_seq:
            node.latest_seq = push.seq
            node.cohort = cohort_of(push)
            node.cluster = push.cluster
            node.score, node.state, node.interval = push.score, push.state, push.interval
            node.expected_nodes = push.job_nodes
        return fresh, self.cohorts.setdefault(node.cohort, CohortState(node.cohort))

    def expire(self, now: float) -> list[str]:
        gone = [n.node for n in self.nodes.values()
                if now - n.last_seen > n.interval * self.policy.ttl_multiplier]
        for name in gone:
            node = self.nodes.pop(name)
            log.info("node %s expired after %.1fs without a push", name, now - node.last_seen)
        for key in [k for k, w in self.windows.items()
                    if now - w.last_seen > w.interval * self.policy.ttl_multiplier]:
            del self.windows[key]          # that agent's stream has gone quiet
        return gone

    def recompute(self, now: float) -> list[Edge]:
        """Expire silent nodes and recompute every cohort; returns what changed."""
        self.expire(now)
        members: dict[str, list[NodeState]] = {}
        for node in self.nodes.values():
            members.setdefault(node.cohort, []).append(node)
        edges = []
        for name in list(self.cohorts):
            if name not in members:
                del self.cohorts[name]
                continue
            edges += self._recompute_cohort(self.cohorts[name], members[name])
        return edges

    def _recompute_cohort(self, cohort: CohortState, nodes: list[NodeState]):
        p = self.policy
        active = [n for n in nodes if n.state == "active"]
        cohort.cluster = nodes[0].cluster
        cohort.active = len(active)
        cohort.expected = self._expected(cohort.name, nodes)
        had_quorum, cohort.quorum_met = cohort.quorum_met, len(active) >= p.quorum
        flagged: set[str] = set()
        was_panic, cohort.panic = cohort.panic, False
        if active:
            scores = np.array([n.score for n in active])
            cohort.median, cohort.mad = stats.median_mad(scores)
            raw = stats.mad_threshold(scores, p.k, p.mad_floor)
            # Smooth only across quorum computations: a bar carried over from the first few
            # nodes to join would sit above the full cohort's and flag its lower members.
            smoothed = cohort.threshold if cohort.quorum_met and had_quorum else None
            cohort.threshold = stats.ema(smoothed, raw, p.ema_alpha)
            under = stats.under_bar(scores, cohort.threshold)
            cohort.under = int(under.sum())
            cohort.panic = cohort.quorum_met and cohort.under > p.panic_fraction * len(active)
            if cohort.quorum_met and not cohort.panic:
                flagged = {n.node for n, low in zip(active, under) if low}
        cohort.computed = True
        edges = [Edge(cohort.name, n, True) for n in sorted(flagged - cohort.stragglers)]
        edges += [Edge(cohort.name, n, False) for n in sorted(cohort.stragglers - flagged)]
        if cohort.panic != was_panic:
            edges.append(Edge(cohort.name, None, cohort.panic))
        cohort.stragglers = flagged
        return edges

    def _expected(self, cohort: str, nodes: list[NodeState]) -> int | None:
        if cohort.startswith("job:"):
            declared = [n.expected_nodes for n in nodes if n.expected_nodes]
            return max(declared) if declared else None
        return self.expected_nodes.get(cohort.removeprefix("cluster:"))
