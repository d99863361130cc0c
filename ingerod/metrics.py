"""ingerod's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from .detection import MODES
from .health import WEIGHTS


class AgentMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.score = Gauge("ingero_agent_score", "Health score of this node", registry=r)
        self.signal = Gauge("ingero_agent_signal", "Health signal in [0, 1]", ["signal"],
                            registry=r)
        self.mode = Gauge("ingero_agent_detection_mode", "1 for the detection mode in use",
                          ["mode"], registry=r)
        self.threshold = Gauge("ingero_agent_threshold", "The bar this node is held to",
                               registry=r)
        self.straggler = Gauge("ingero_agent_straggler", "1 while this node counts itself a "
                               "straggler", registry=r)
        self.straggler_ranks = Gauge("ingero_agent_straggler_ranks", "Ranks on this node that "
                                     "fleetd names stragglers", registry=r)
        self.reachable = Gauge("ingero_agent_fleet_reachable", "1 while fleetd answers",
                               registry=r)
        self.queue_depth = Gauge("ingero_agent_queue_depth", "Batches awaiting fleetd's ack",
                                 registry=r)
        self.dropped = Counter("ingero_agent_batches_dropped", "Unacked batches dropped: the "
                               "queue was full, or the last run's did not read back", registry=r)
        self.restored = Counter("ingero_agent_batches_restored", "Unacked batches of the last "
                                "run read back from the queue at start, to be sent again",
                                registry=r)
        self.resent = Counter("ingero_agent_batches_resent", "Batches sent again after a "
                              "reconnect", registry=r)
        self.pushed = Counter("ingero_agent_batches_pushed", "Batches pushed", registry=r)
        self.events_dropped = Counter("ingero_agent_events_dropped", "Events dropped because "
                                      "the pending buffer was full", registry=r)
        self.events_lost = Gauge("ingero_agent_events_lost", "Traced events lost: ring buffer "
                                 "full in the kernel, or user-space buffer full", registry=r)
        self.rejected = Counter("ingero_agent_frames_rejected", "Bad frames from fleetd",
                                registry=r)
        self.reconnects = Counter("ingero_agent_reconnects", "Fresh sockets opened after "
                                  "fleetd went silent", registry=r)
        self.auth_failures = Counter("ingero_agent_handshake_failures", "CURVE handshakes "
                                     "fleetd refused or that failed", registry=r)
        self.job_records_sent = Counter("ingero_agent_job_records_sent", "Slurm job start/end "
                                        "records fleetd acknowledged", registry=r)
        self.job_records_rejected = Counter("ingero_agent_job_records_rejected", "Unreadable "
                                            "files in the job spool", registry=r)
        self.control_rejected = Counter("ingero_agent_control_rejected", "Bad requests on the "
                                        "control socket", registry=r)
        for name in WEIGHTS:
            self.signal.labels(name)
        for mode in MODES:
            self.mode.labels(mode)

    def show(self, score: float, signals: dict[str, float], mode: str, bar: float | None,
             straggler: bool, reachable: bool) -> None:
        self.score.set(score)
        for name, value in signals.items():
            self.signal.labels(name).set(value)
        self.show_mode(mode)
        self.threshold.set(bar if bar is not None else float("nan"))
        self.straggler.set(straggler)
        self.reachable.set(reachable)

    def show_mode(self, mode: str) -> None:
        for m in MODES:
            self.mode.labels(m).set(m == mode)
