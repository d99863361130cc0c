"""Why a rank is late: the cause its evidence points at, how sure that is, and the fix to try.
Pure functions of the facts, so they are tested by feeding facts."""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analysis import Bar

from .evidence import PREEMPTION_BURST, HostEvidence, NodeHealth, lowest_signal
from .lag import RankLag
from .selection import ms, num

LOW_SIGNAL = {"cpu": 0.75, "compute": 0.6, "memory": 0.5}

FIXES = {
    "host_preemption": "pin the training processes with taskset (or a cpuset) or keep {comm} "
                       "off their cores",
    "io": "take blocking I/O off the training path: stage the data on local disk, use more "
          "data-loader workers, write checkpoints asynchronously",
    "slow_gpu": "check the GPU on {node} (nvidia-smi -q: clocks, throttling, XID errors; DCGM "
                "diagnostics) and drain the node if it stays slow",
    "memory_pressure": "lower the GPU memory this rank needs (smaller micro-batch, activation "
                       "checkpointing) and look for leaks with memory_hotspots",
    "network_or_peer": "look at what this rank waits for: collective_stats of its other "
                       "communicators, NCCL_DEBUG=INFO for its links, its node's clock offset",
    "unknown": "look at event_history of this rank around its late collectives",
}


@dataclass
class SyncWork:
    """Sync calls of one rank: self-work (its own kernels) and peer-wait (a collective)."""

    self_calls: int = 0
    self_ns: int = 0
    wait_calls: int = 0
    wait_ns: int = 0

    @property
    def self_ms(self) -> float | None:
        return self.self_ns / self.self_calls / 1e6 if self.self_calls else None

    @property
    def wait_ms(self) -> float | None:
        return self.wait_ns / self.wait_calls / 1e6 if self.wait_calls else None


@dataclass
class Facts:
    """What explain weighs for one rank."""

    lag: RankLag | None
    bar: Bar | None
    host: HostEvidence
    health: NodeHealth
    sync: SyncWork
    peers_self_ms: float | None
    peers_wait_ms: float | None
    verdict: dict | None = None         # fleetd's latest verdict on the rank, as stored


@dataclass
class Diagnosis:
    cause: str
    confidence: str
    fix: str | None
    findings: list[str]


def diagnose(facts: Facts) -> Diagnosis:
    """The cause of a rank's lateness: fleetd's verdict when there is one (it judged with every
    node's clock corrected, and saw the rank hang or die), else from the stored evidence;
    ``none`` when it is not late."""
    if facts.verdict is not None:
        return from_verdict(facts)
    if facts.lag is None:
        return Diagnosis("unknown", "low", None,
                         ["no collective of this rank could be compared with its peers"])
    findings = describe_facts(facts)
    if not facts.lag.straggler:
        sure = facts.lag.samples >= 10
        return Diagnosis("none", "high" if sure else "low", None, findings)
    cause, confidence = blame(facts)
    fix = FIXES.get(cause)
    comm = facts.host.top_preemptor or "the competing processes"
    return Diagnosis(cause, confidence,
                     fix.format(comm=comm, node=facts.lag.node or "its node") if fix else None,
                     findings)


def from_verdict(facts: Facts) -> Diagnosis:
    v = facts.verdict
    what = f"every {v['period']} steps" if v.get("period") else v["kind"]
    state = f"cleared {v['cleared']}" if v.get("cleared") else "still live"
    findings = [f"fleetd named it a straggler ({what}, {v['cause']}) at {v['raised']}, "
                f"{state}", *v.get("findings", [])]
    if facts.lag is not None:
        findings += describe_facts(facts)
    return Diagnosis(v["cause"], v.get("confidence") or "medium", v.get("fix"), findings)


def blame(facts: Facts) -> tuple[str, str]:
    """(cause, confidence) for a rank known to be late, strongest evidence first."""
    signals, host = facts.health.signals, facts.host
    cpu_low = below(signals.get("cpu"), LOW_SIGNAL["cpu"])
    mostly_last = facts.lag.last_arrivals >= 0.5 * facts.lag.samples
    if host.preemptions >= PREEMPTION_BURST:
        return "host_preemption", "high" if cpu_low or mostly_last else "medium"
    if host.heavy_blockio:
        return "io", "medium"
    if cpu_low:
        return "host_preemption", "medium"
    if below(signals.get("memory"), LOW_SIGNAL["memory"]):
        return "memory_pressure", "medium"
    slow_kernels = ratio_above(facts.sync.self_ms, facts.peers_self_ms, 1.5)
    if below(signals.get("compute"), LOW_SIGNAL["compute"]) or slow_kernels:
        both = slow_kernels and below(signals.get("compute"), LOW_SIGNAL["compute"])
        return "slow_gpu", "high" if both else "medium"
    if ratio_above(facts.sync.wait_ms, facts.peers_wait_ms, 1.5):
        return "network_or_peer", "low"
    return "unknown", "low"


def below(value: float | None, bar: float) -> bool:
    return value is not None and value < bar


def ratio_above(mine: float | None, peers: float | None, factor: float) -> bool:
    return mine is not None and peers is not None and peers > 0 and mine >= factor * peers


def describe_facts(facts: Facts) -> list[str]:
    lag, host, health = facts.lag, facts.host, facts.health
    lines = [f"enters collectives {ms(lag.lag_median)} ms after its peers' median (median of "
             f"{lag.samples}; peers' median {ms(facts.bar.median) if facts.bar else None} ms, "
             f"bar {ms(facts.bar.bar) if facts.bar else None} ms); last to arrive "
             f"{lag.last_arrivals} times"]
    if host.preemptions:
        lines.append(f"preempted {host.preemptions} times, mostly by {host.top_preemptor}")
    if host.blockio_requests or host.blockio_bytes:
        lines.append(f"block I/O: {host.blockio_requests} requests, "
                     f"{host.blockio_bytes / 2**20:.1f} MiB")
    signal, value = lowest_signal(health.signals)
    if signal is not None:
        lines.append(f"lowest health signal of {lag.node}: {signal} {value:.2f} "
                     f"(score avg {health.score_avg})")
    if facts.sync.self_ms is not None:
        lines.append(f"sync self-work {facts.sync.self_ms:.3f} ms per call "
                     f"(peers' median {num(facts.peers_self_ms, 3)} ms)")
    return lines
