"""fleetd's Prometheus metrics, on a registry of its own.

What is labelled by job lives only as long as what it tells of: a verdict's series while the
verdict is live, a job's cohort while the cohort has nodes. Counters are not labelled by job.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ingero.runtime import build_info

from .cohorts import CohortState

# A live verdict's labels. "job_id", not "job": Prometheus gives every scraped series the
# target's "job" label and would rename ours to "exported_job".
VERDICT_LABELS = ("cluster", "job_id", "user", "node", "rank", "kind", "cause", "severity")


class FleetMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        by_cohort = ["cohort"]
        self.threshold = Gauge("ingero_fleet_threshold", "Smoothed straggler threshold",
                               by_cohort, registry=r)
        self.median = Gauge("ingero_fleet_median", "Median health score of active nodes",
                            by_cohort, registry=r)
        self.mad = Gauge("ingero_fleet_mad", "Median absolute deviation of active nodes' scores",
                         by_cohort, registry=r)
        self.active = Gauge("ingero_fleet_active_nodes", "Active nodes in the cohort",
                            by_cohort, registry=r)
        self.expected = Gauge("ingero_fleet_expected_nodes", "Expected nodes in the cohort",
                              by_cohort, registry=r)
        self.coverage_low = Gauge("ingero_fleet_coverage_low",
                                  "1 when active nodes fall short of the expected count",
                                  by_cohort, registry=r)
        self.quorum = Gauge("ingero_fleet_quorum_met", "1 when the cohort has a quorum",
                            by_cohort, registry=r)
        self.panic = Gauge("ingero_fleet_panic", "1 when most of the cohort is under the bar",
                           by_cohort, registry=r)
        self.stragglers = Gauge("ingero_fleet_stragglers", "Nodes flagged as stragglers",
                                by_cohort, registry=r)
        self.frames = Counter("ingero_fleet_frames_received", "Messages received", registry=r)
        self.messages = Counter("ingero_fleet_messages", "Well-formed messages handled, by type",
                                ["type"], registry=r)
        self.rejected = Counter("ingero_fleet_frames_rejected", "Messages dropped as malformed",
                                ["reason"], registry=r)
        self.resent = Counter("ingero_fleet_batches_resent",
                              "Pushes recognised as resends and not counted again", registry=r)
        self.misrouted = Counter("ingero_fleet_misrouted_pushes", "Pushes holding events of a "
                                 "job another fleetd shard owns", registry=r)
        self.batches = Counter("ingero_fleet_batches_accepted", "Pushes accepted", registry=r)
        self.events = Counter("ingero_fleet_events_accepted", "Events accepted", registry=r)
        self.auth_refused = Counter("ingero_fleet_auth_refused",
                                    "Connections refused by CURVE authentication", registry=r)
        self.flagged = Counter("ingero_fleet_straggler_flags", "Nodes flagged under their "
                               "cohort's threshold (node verdicts), by cluster", ["cluster"],
                               registry=r)
        self.forward_acked = Counter("ingero_fleet_forward_acked", "Batches echod committed",
                                     registry=r)
        self.forward_resent = Counter("ingero_fleet_forward_resent", "Batches sent to echod "
                                      "again for want of an acknowledgement", registry=r)
        self.spool_batches = Gauge("ingero_fleet_spool_batches", "Batches in the spool, kept "
                                   "until echod acknowledges them", registry=r)
        self.spool_bytes = Gauge("ingero_fleet_spool_bytes", "Bytes in the spool", registry=r)
        self.spool_age = Gauge("ingero_fleet_spool_oldest_seconds", "Age of the oldest batch "
                               "that echod has not acknowledged", registry=r)
        self.spool_dropped = Counter("ingero_fleet_spool_dropped_rows", "Rows dropped from the "
                                     "spool, by class (events, health, verdicts) and reason "
                                     "(full, disk_full, write_error, corrupt)",
                                     ["class", "reason"], registry=r)
        self.spool_corrupt = Counter("ingero_fleet_spool_corrupt_files", "Spooled files found "
                                     "not whole at start, dropped (their rows are unknown)",
                                     registry=r)
        self.forward_rejected = Counter("ingero_fleet_forward_rejected", "Rows echod refused "
                                        "as malformed", registry=r)
        self.clock_offset = Gauge("ingero_fleet_clock_offset_seconds", "A node's clock minus "
                                  "fleetd's, as estimated from push/reply times", ["node"],
                                  registry=r)
        self.clock_uncertainty = Gauge("ingero_fleet_clock_uncertainty_seconds", "Half the "
                                       "best round trip behind a node's clock offset", ["node"],
                                       registry=r)
        self.rank_verdicts = Gauge("ingero_fleet_rank_verdicts", "Ranks under a live straggler "
                                   "verdict", registry=r)
        self.verdict = Gauge("ingero_fleet_verdict", "1 while a rank verdict is live; the series "
                             "goes when it clears (or changes kind, cause or severity)",
                             VERDICT_LABELS, registry=r)
        self.verdict_lag = Gauge("ingero_fleet_verdict_lag_seconds", "A live verdict's median "
                                 "lag behind its peers (hangs and deaths have none)",
                                 VERDICT_LABELS, registry=r)
        self.verdict_cost = Gauge("ingero_fleet_verdict_cost_gpu_seconds", "GPU time the job's "
                                  "other ranks spent waiting for the rank so far",
                                  VERDICT_LABELS, registry=r)
        self.idle_gpu = Counter("ingero_fleet_idle_gpu_seconds", "GPU time ranks spent waiting "
                                "for stragglers, by cluster and cause", ["cluster", "cause"],
                                registry=r)
        self.jobs = Gauge("ingero_fleet_jobs", "Job runs the rank analysis tracks", registry=r)
        self.reply_seconds = Histogram(
            "ingero_fleet_reply_duration_seconds", "Time from a push's arrival to its reply "
            "(the spool's write and any recompute in between included)",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=r)
        self.rank_verdicts_raised = Counter("ingero_fleet_rank_verdicts_raised", "Rank straggler "
                                            "verdicts raised, by kind and cause",
                                            ["kind", "cause"], registry=r)
        self.recompute_seconds = Histogram(
            "ingero_fleet_recompute_seconds", "Time of one recompute (cohort thresholds and the "
            "rank analysis's tick over every job), during which no push is answered",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=r)
        self.unaligned = Counter("ingero_fleet_unaligned_collectives", "Collectives on "
                                 "communicators their agent did not see created (kept out of "
                                 "alignment)", registry=r)
        self._unaligned = 0
        self.refused_events = Counter("ingero_fleet_events_refused", "Events refused at "
                                      "intake (neither judged nor stored), by reason: "
                                      "too_many_ranks (a communicator larger than --max-ranks), "
                                      "bad_rank (a rank out of range), foreign_uid (a process "
                                      "of another user than the job's)", ["reason"],
                                      registry=r)
        for reason in ("too_many_ranks", "bad_rank", "foreign_uid"):
            self.refused_events.labels(reason)
        self.nodes_untraced = Gauge("ingero_fleet_nodes_untraced", "Nodes whose agent said it "
                                    "cannot trace (no kernel headers, no bcc …): their ranks "
                                    "are not judged", registry=r)
        self.incomplete = Gauge("ingero_fleet_incomplete_collectives", "Collective instances "
                                "dropped because an entry never arrived though its rank went on "
                                "(an event lost on the way)", registry=r)
        self.analysis_errors = Counter("ingero_fleet_analysis_errors", "Ticks of one job's "
                                       "rank analysis (or recomputes) that failed on a bug; the "
                                       "other jobs were judged", registry=r)
        self.notices = Counter("ingero_fleet_notices", "Verdict notices handed to a receiver "
                               "(a webhook, or a Slurm action), by outcome: delivered, retry "
                               "(it failed and is tried again), refused (dropped), expired "
                               "and dropped (unsent: too old, too many waiting), corrupt "
                               "(a kept one that did not read back)", ["sink", "outcome"],
                               registry=r)
        self.notices_pending = Gauge("ingero_fleet_notices_pending", "Verdict notices waiting "
                                     "for their receiver", ["sink"], registry=r)
        self.notices_suppressed = Counter("ingero_fleet_notices_suppressed", "Raised verdicts "
                                          "not told, over --on-verdict-job-rate, -node-rate or "
                                          "-cluster-rate", registry=r)
        self.drains = Counter("ingero_fleet_node_drains", "Nodes node reputation drained "
                              "(drained), or would have but for --drain-max-fraction (cap) or "
                              "for evidence of jobs Slurm did not run there (unconfirmed)",
                              ["outcome"], registry=r)
        self.build = build_info("ingero_fleet", r)
        self._cohorts: set[str] = set()
        self._verdicts: dict[str, tuple] = {}      # vid → the labels its series carry
        self._costs: dict[str, float] = {}         # vid → cost counted so far
        self._nodes: list[str] = []                # nodes with a clock series

    def publish(self, cohorts: dict[str, CohortState], coverage_alert: float) -> None:
        gauges = (self.threshold, self.median, self.mad, self.active, self.expected,
                  self.coverage_low, self.quorum, self.panic, self.stragglers)
        for gone in self._cohorts - set(cohorts):
            for gauge in gauges:
                try:
                    gauge.remove(gone)
                except KeyError:
                    pass
        for name, c in cohorts.items():
            for gauge, value in ((self.threshold, c.threshold), (self.median, c.median),
                                 (self.mad, c.mad), (self.expected, c.expected)):
                if value is not None:
                    gauge.labels(name).set(value)
            self.active.labels(name).set(c.active)
            coverage = c.coverage
            self.coverage_low.labels(name).set(coverage is not None and coverage < coverage_alert)
            self.quorum.labels(name).set(c.quorum_met)
            self.panic.labels(name).set(c.panic)
            self.stragglers.labels(name).set(len(c.stragglers))
        self._cohorts = set(cohorts)

    def publish_ranks(self, ranks, clocks, changed) -> None:
        """The rank analysis: live verdicts, those just raised, clock offsets."""
        active = ranks.active()
        self.rank_verdicts.set(len(active))
        self.jobs.set(len(ranks.jobs))
        self.unaligned.inc(ranks.unaligned - self._unaligned)
        self._unaligned = ranks.unaligned
        for reason, count in ranks.take_refused().items():
            self.refused_events.labels(reason).inc(count)
        self.incomplete.set(ranks.incomplete)
        self.nodes_untraced.set(len(ranks.untraced))
        for verdict in changed:
            if verdict.revision == 0:
                self.rank_verdicts_raised.labels(verdict.kind, verdict.cause).inc()
            self._count_cost(verdict)
        self._publish_verdicts(active, ranks.user_of)
        for node, offset in clocks.offsets.items():
            self.clock_offset.labels(node).set(offset.offset)
            self.clock_uncertainty.labels(node).set(offset.uncertainty)
        for gone in set(self._nodes) - set(clocks.offsets):
            for gauge in (self.clock_offset, self.clock_uncertainty):
                gauge.remove(gone)
        self._nodes = list(clocks.offsets)

    def _count_cost(self, verdict) -> None:
        """The verdict's cost grew (or it cleared): the growth, into the cluster's counter."""
        counted = self._costs.get(verdict.vid, 0.0)
        if verdict.cost_gpu_s > counted:
            self.idle_gpu.labels(verdict.cluster, verdict.cause).inc(verdict.cost_gpu_s - counted)
            self._costs[verdict.vid] = verdict.cost_gpu_s
        if verdict.cleared is not None:
            self._costs.pop(verdict.vid, None)

    def _publish_verdicts(self, active, user_of) -> None:
        """One series per live verdict (notes are said once and never live); a verdict whose
        labels changed (escalated, a new cause) moves to its new series."""
        gauges = (self.verdict, self.verdict_lag, self.verdict_cost)
        now: dict[str, tuple] = {}
        for v in active:
            labels = (v.cluster, v.job or "", user_of(v.cluster, v.job) or "", v.node,
                      str(v.rank), v.kind, v.cause, v.severity)
            now[v.vid] = labels
            self.verdict.labels(*labels).set(1)
            if v.lag_p50_s is not None:
                self.verdict_lag.labels(*labels).set(v.lag_p50_s)
            self.verdict_cost.labels(*labels).set(v.cost_gpu_s)
        for vid, labels in self._verdicts.items():
            if now.get(vid) != labels:
                for gauge in gauges:
                    try:
                        gauge.remove(*labels)
                    except KeyError:
                        pass
        self._verdicts = now
