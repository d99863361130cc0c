"""fleetd's Prometheus metrics, on a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .cohorts import CohortState


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
        self.flagged = Counter("ingero_fleet_straggler_flags", "Straggler verdicts raised",
                               by_cohort, registry=r)
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
        self.rank_verdicts_raised = Counter("ingero_fleet_rank_verdicts_raised", "Rank straggler "
                                            "verdicts raised, by kind and cause",
                                            ["kind", "cause"], registry=r)
        self.recompute_seconds = Histogram(
            "ingero_fleet_recompute_seconds", "Time of one recompute (cohort thresholds and the "
            "rank analysis's tick over every job), during which no push is answered",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0),
            registry=r)
        self.unaligned = Gauge("ingero_fleet_unaligned_collectives", "Collectives on "
                               "communicators their agent did not see created (kept out of "
                               "alignment)", registry=r)
        self.incomplete = Gauge("ingero_fleet_incomplete_collectives", "Collective instances "
                                "dropped because an entry never arrived though its rank went on "
                                "(an event lost on the way)", registry=r)
        self.analysis_errors = Counter("ingero_fleet_analysis_errors", "Ticks of one job's "
                                       "rank analysis (or recomputes) that failed on a bug; the "
                                       "other jobs were judged", registry=r)
        self._cohorts: set[str] = set()

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
        self.rank_verdicts.set(len(ranks.active()))
        self.unaligned.set(ranks.unaligned)
        self.incomplete.set(ranks.incomplete)
        for verdict in changed:
            if verdict.revision == 0:
                self.rank_verdicts_raised.labels(verdict.kind, verdict.cause).inc()
        for node, offset in clocks.offsets.items():
            self.clock_offset.labels(node).set(offset.offset)
            self.clock_uncertainty.labels(node).set(offset.uncertainty)
