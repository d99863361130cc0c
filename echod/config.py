"""Every echod setting, declared once: flags, echod.yaml, ECHOD_* variables and echod(8)."""

from ingero import wire
from ingero.settings import (Setting, boolean, integer, listen_address, log_level,
                             optional_text, path, zmq_endpoint)

DEFAULT_CONFIG = "/etc/ingero/echod.yaml"

SETTINGS = [
    Setting("ingest_bind", "tcp://0.0.0.0:7471", zmq_endpoint,
            "ZeroMQ endpoint fleetd forwards its batches to.", "ENDPOINT"),
    Setting("secret_key", "/etc/ingero/keys/echod.key_secret", path,
            "echod's CURVE secret key file (create it with 'echod keygen').", "FILE"),
    Setting("authorized_keys", "/etc/ingero/authorized_fleetd", path,
            "Directory of the public key files (*.key) of the fleetd instances that may "
            "forward; re-read on SIGHUP.", "DIR"),
    Setting("insecure_plaintext_zmq", False, boolean,
            "Accept fleetd without CURVE: no encryption and no authentication of who writes.",
            is_flag=True),
    Setting("dsn", None, optional_text,
            "PostgreSQL to use (postgresql://...) [default: a private cluster of echod's own "
            "under --state-dir].", "DSN"),
    Setting("state_dir", "/var/lib/ingero/echod", path,
            "Where the private PostgreSQL cluster lives when no --dsn is given.", "DIR"),
    Setting("retention_days", 30, integer(1, 36_500),
            "Days of events kept; older day partitions are dropped.", "DAYS"),
    Setting("metrics_addr", "127.0.0.1:9472", listen_address,
            "HOST:PORT for the Prometheus /metrics endpoint, or none.", "HOST:PORT"),
    Setting("max_frame_bytes", wire.MAX_FRAME_BYTES, integer(1024, 256 * 1024 * 1024),
            "Largest batch accepted; larger ones are dropped and counted.", "BYTES"),
    Setting("log_level", "info", log_level, "debug, info, warning or error.", "LEVEL"),
]
