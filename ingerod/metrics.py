"""ingerod's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile
from prometheus_client.core import Metric

from ingero.runtime import build_info

from .detection import MODES
from .health import WEIGHTS

REFUSALS = ("bad_variable", "library_cap", "loop_error")

log = logging.getLogger("ingerod")


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
        self.events_lost = Counter("ingero_agent_events_lost", "Traced events lost: ring "
                                   "buffer full in the kernel, or user-space buffer full",
                                   registry=r)
        self.launches = Counter("ingero_agent_kernel_launches", "Kernel launches of the traced "
                                "processes, each counted once whichever of cudaLaunchKernel, "
                                "cudaLaunchKernelExC, cuLaunchKernel and cuLaunchKernelEx it "
                                "entered, while the launch counters were attached", registry=r)
        self._totals: dict[Counter, float] = {}
        self.tracing = Gauge("ingero_agent_tracing", "1 while the agent traces this node's "
                             "jobs with eBPF; 0 with why not (no_kernel_headers, no_bcc, "
                             "not_permitted, load_failed …, or synthetic: a test source)",
                             ["reason"], registry=r)
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
        self.refused = Counter("ingero_agent_refused", "What the agent would not take from "
                               "the node's processes, by reason: bad_variable (an identity "
                               "variable that does not parse), library_cap (a user's library "
                               "file past libraries_per_user), loop_error (an error in one pass "
                               "of the loop, which goes on)", ["reason"], registry=r)
        self.control_rejected = Counter("ingero_agent_control_rejected", "Bad requests on the "
                                        "control socket", registry=r)
        self.build = build_info("ingero_agent", r)
        for name in WEIGHTS:
            self.signal.labels(name)
        for reason in REFUSALS:
            self.refused.labels(reason)
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

    def follow(self, counter: Counter, total: float) -> None:
        """A running total the source keeps (events lost, launches), into its counter."""
        before = self._totals.get(counter, 0)
        if total > before:
            counter.inc(total - before)
            self._totals[counter] = total

    def show_tracing(self, source: str, reason: str | None) -> None:
        if source == "ebpf":
            self.tracing.labels("none").set(1)
        else:
            self.tracing.labels(reason or source).set(0)

    def show_mode(self, mode: str) -> None:
        for m in MODES:
            self.mode.labels(m).set(m == mode)


class Labelled:
    """A registry's metrics with labels of their own added to every series (a collector)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]):
        self.registry, self.labels = registry, labels

    def collect(self):
        for family in self.registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labelled.add_sample(sample.name, {**sample.labels, **self.labels}, sample.value,
                                    sample.timestamp, sample.exemplar)
            yield labelled


class Textfile:
    """The metrics as a file for node_exporter's textfile collector: per-job agents share a
    node and serve no port, so each writes its own file, its series labelled with its job
    (two agents' files must not hold the same series). Written whole each time (a temporary
    file renamed over it), removed when the agent stops: a finished job's series go with it."""

    def __init__(self, path: Path, registry: CollectorRegistry, job: str | None):
        self.path = path
        self.registry = registry
        if job is not None:
            self.registry = CollectorRegistry(auto_describe=False)
            self.registry.register(Labelled(registry, {"job_id": job}))
        self.failed = False

    def write(self) -> None:
        try:
            write_to_textfile(str(self.path), self.registry)
        except OSError as exc:
            if not self.failed:      # said once: the directory is the site's to make
                log.warning("cannot write the metrics file %s: %s", self.path, exc.strerror)
            self.failed = True
        else:
            self.failed = False

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("cannot remove the metrics file %s: %s", self.path, exc.strerror)
