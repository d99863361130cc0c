"""Why a rank is late: the cause its evidence points at, how sure that is, and the fix to try.
Pure functions of the facts, so they are tested by feeding facts."""

from __future__ import annotations

from dataclasses import dataclass

from ingero.analysis import Bar, causes
from ingero.analysis.causes import Diagnosis

from .evidence import HostEvidence, NodeHealth, lowest_signal
from .lag import RankLag
from .selection import ms, num


@dataclass
class SyncWork:
    """Sync calls of one rank: self-work (its own kernels) and peer-wait (a collective)."""

    self_calls: int = 0
    self_ns: int = 0
    wait_calls: int = 0
    wait_ns: int = 0
    self_median_ns: float | None = None     # the median self-work sync, what job_report shows

    @property
    def self_ms(self) -> float | None:
        return self.self_ns / self.self_calls / 1e6 if self.self_calls else None

    @property
    def self_median_ms(self) -> float | None:
        return None if self.self_median_ns is None else self.self_median_ns / 1e6

    @property
    def wait_ms(self) -> float | None:
        return self.wait_ns / self.wait_calls / 1e6 if self.wait_calls else None


@dataclass
class Facts:
    """What explain weighs for one rank: the stored evidence, from which the rules' own facts
    (``causes.Facts``) are drawn (``stored_facts``)."""

    lag: RankLag | None
    bar: Bar | None
    host: HostEvidence
    health: NodeHealth
    sync: SyncWork
    peers_self_ms: float | None
    peers_wait_ms: float | None
    verdict: dict | None = None         # fleetd's latest verdict on the rank, as stored
    note: dict | None = None            # ... or, where it named none, its note on the rank
    judged: bool = False                # fleetd judged the rank's job: its word is final


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
        return Diagnosis("none", "high" if sure else "low", None, unnamed(facts) + findings)
    found = causes.diagnose_late(stored_facts(facts), facts.lag.node)
    return Diagnosis(found.cause, found.confidence, found.fix, findings + found.findings)


def unnamed(facts: Facts) -> list[str]:
    """Why a rank over its job's bar is no straggler: fleetd judged the job and did not name
    it (its note says why, where it wrote one)."""
    if facts.note is not None:
        return [f"fleetd did not name it ({facts.note['kind']}): "
                + " ".join(facts.note.get("findings", []))]
    if facts.judged and facts.lag is not None and facts.lag.over_bar:
        return ["fleetd judged the job and did not name it: its lateness did not last, or did "
                "not delay its peers"]
    return []


def from_verdict(facts: Facts) -> Diagnosis:
    v = facts.verdict
    what = f"every {v['period']} steps" if v.get("period") else v["kind"]
    state = f"cleared {v['cleared']}" if v.get("cleared") else "still live"
    findings = [f"fleetd named it a straggler ({what}, {v['cause']}) at {v['raised']}, "
                f"{state}", *v.get("findings", [])]
    if facts.lag is not None:
        findings += describe_facts(facts)
    return Diagnosis(v["cause"], v.get("confidence") or "medium", v.get("fix"), findings)


def stored_facts(facts: Facts) -> causes.Facts:
    """The rule's facts from the stored evidence: preemptions by command (the store keeps no
    pid per preemptor here) by those that took the rank clearly more than its job's other
    ranks on its node (``HostEvidence.beyond_peers``), block I/O, sync self-work and peer-wait
    against the peers', and its node's health signals."""
    host, sync = facts.host, facts.sync
    ms_to_s = (lambda value: None if value is None else value / 1e3)
    return causes.Facts(
        self_work_s=ms_to_s(sync.self_ms), peers_self_work_s=ms_to_s(facts.peers_self_ms),
        self_work_samples=sync.self_calls,
        lag_s=facts.lag.lag_median if facts.lag is not None else None,
        preemptions={(comm, None): count for comm, count in host.beyond_peers.items()},
        blockio_requests=host.blockio_requests, blockio_bytes=host.blockio_bytes,
        peer_wait_s=ms_to_s(sync.wait_ms), peers_peer_wait_s=ms_to_s(facts.peers_wait_ms),
        signals=dict(facts.health.signals))


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
