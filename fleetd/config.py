"""Every fleetd setting, declared once: flags, fleetd.yaml, FLEETD_* variables and fleetd(8)."""

from ingero import wire
from ingero.settings import (Setting, boolean, integer, listen_address, log_level, node_counts,
                             number, optional, path, zmq_endpoint)

DEFAULT_CONFIG = "/etc/ingero/fleetd.yaml"

SETTINGS = [
    Setting("bind", "tcp://0.0.0.0:7470", zmq_endpoint,
            "ZeroMQ endpoint the ROUTER socket binds; agents connect here.", "ENDPOINT"),
    Setting("secret_key", "/etc/ingero/keys/fleetd.key_secret", path,
            "fleetd's CURVE secret key file (create it with 'fleetd keygen').", "FILE"),
    Setting("authorized_keys", "/etc/ingero/authorized_agents", path,
            "Directory of the agents' public key files (*.key) that may connect; "
            "re-read on SIGHUP.", "DIR"),
    Setting("insecure_plaintext_zmq", False, boolean,
            "Accept agents without CURVE: no encryption and no authentication of who pushes.",
            is_flag=True),
    Setting("metrics_addr", "127.0.0.1:9470", listen_address,
            "HOST:PORT for the Prometheus /metrics endpoint, or none.", "HOST:PORT"),
    Setting("k", 2.0, number(0.1, 10.0),
            "Threshold width in robust standard deviations: median - k*1.4826*MAD.", "K"),
    Setting("ema_alpha", 0.2, number(0.01, 1.0),
            "Smoothing of the threshold between recomputes (1 = no smoothing).", "ALPHA"),
    Setting("mad_floor", 0.01, number(0.0, 0.5),
            "Smallest MAD used, so identical scores do not flag a node for noise.", "MAD"),
    Setting("quorum", 5, integer(1, 100_000),
            "Active nodes a cohort needs before it flags anyone.", "N"),
    Setting("ttl_multiplier", 5.0, number(1.0, 100.0),
            "A node expires after this many of its push intervals without a push.", "X"),
    Setting("panic_fraction", 0.5, number(0.0, 1.0),
            "Above this fraction of a cohort under the bar, raise one cohort alert "
            "(panic) instead of per-node verdicts.", "FRACTION"),
    Setting("coverage_alert", 0.8, number(0.0, 1.0),
            "Coverage (active over expected nodes) below which ingero_fleet_coverage_low is 1.",
            "FRACTION"),
    Setting("expected_nodes", {}, node_counts,
            "Expected node count per cluster, CLUSTER=N[,CLUSTER=N]; jobs declare their own.",
            "CLUSTER=N"),
    Setting("recompute_interval", 1.0, number(0.01, 60.0),
            "Seconds between threshold recomputes.", "SECONDS"),
    Setting("max_nodes", 10_000, integer(1, 1_000_000),
            "Most nodes tracked at once; pushes from further nodes are refused and counted.", "N"),
    Setting("max_frame_bytes", 4 * 1024 * 1024, integer(1024, 64 * 1024 * 1024),
            "Largest message accepted; larger ones are dropped and counted.", "BYTES"),
    Setting("echod", None, optional(zmq_endpoint),
            "echod's ingest endpoint; everything fleetd accepts is forwarded there and kept "
            "until echod acknowledges it [default: none, nothing is stored].", "ENDPOINT"),
    Setting("echod_public_key", "/etc/ingero/keys/echod.key", path,
            "echod's public key file (fleetd's own key pair authenticates it to echod).", "FILE"),
    Setting("forward_batch_rows", 2000, integer(1, wire.MAX_FORWARD_ROWS - wire.MAX_EVENTS - 1),
            "Rows gathered before a batch is sealed and sent to echod.", "N"),
    Setting("forward_interval", 0.2, number(0.01, 60.0),
            "Seconds after its first row that a batch is sealed, however small.", "SECONDS"),
    Setting("forward_window", 8, integer(1, 1000),
            "Batches in flight to echod before waiting for acknowledgements.", "N"),
    Setting("forward_resend_after", 5.0, number(0.1, 600.0),
            "Seconds without an acknowledgement before a batch is sent to echod again.",
            "SECONDS"),
    Setting("forward_max_batches", 10_000, integer(1, 10_000_000),
            "Batches kept for echod; beyond it the oldest is dropped and counted.", "N"),
    Setting("log_level", "info", log_level, "debug, info, warning or error.", "LEVEL"),
]
