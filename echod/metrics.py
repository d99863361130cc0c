"""echod's Prometheus metrics, on a registry of its own."""

from prometheus_client import CollectorRegistry, Counter, Gauge

from ingero.runtime import build_info


class EchoMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()
        self.batches = Counter("ingero_echo_ingest_batches", "Batches committed", registry=r)
        self.rows = Counter("ingero_echo_ingest_rows", "Rows by outcome: stored, duplicate "
                            "(a replay) or rejected (malformed)", ["outcome"], registry=r)
        self.rejected_rows = Counter("ingero_echo_rows_rejected", "Rows refused, by the field "
                                     "at fault (attrs.bytes, t, id, ...): 'database' where "
                                     "PostgreSQL refused the row, 'batch' for a whole batch, "
                                     "'other' for anything else", ["reason"], registry=r)
        self.rejected_frames = Counter("ingero_echo_frames_rejected", "Frames dropped as "
                                       "malformed", ["reason"], registry=r)
        self.db_errors = Counter("ingero_echo_db_unavailable", "Batches left unacknowledged "
                                 "because PostgreSQL could not commit", registry=r)
        self.auth_refused = Counter("ingero_echo_auth_refused", "fleetd connections refused "
                                    "by CURVE authentication", registry=r)
        self.delay = Gauge("ingero_echo_ingest_delay_seconds", "Seconds from fleetd's receipt "
                           "of the oldest push in the last batch committed to its commit",
                           registry=r)
        self.last_commit = Gauge("ingero_echo_ingest_last_commit_timestamp_seconds", "When a "
                                 "batch was last committed (Unix time)", registry=r)
        self.slurm_lookups = Counter("ingero_echo_slurm_lookups", "Jobs echod asked Slurm "
                                     "about, by result: named (Slurm's id and how the run "
                                     "ended), known (its id; the run goes on), unknown (Slurm "
                                     "does not know it yet), unavailable (no sacct or scontrol "
                                     "answered; counted once a pass), error", ["result"],
                                     registry=r)
        self.build = build_info("ingero_echo", r)
