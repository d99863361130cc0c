"""Every echod setting, declared once: flags, echod.yaml, ECHOD_* variables and echod(8)."""

from ingero import settings, wire
from ingero.settings import (Setting, boolean, choice, integer, kind_days, listen_address, number,
                             optional, optional_text, path, text, zmq_endpoint)

from ingero.munge import DEFAULT_SOCKET

from .slurmjobs import MODES

DEFAULT_CONFIG = "/etc/ingero/echod.yaml"

SETTINGS = [
    Setting("ingest_bind", "tcp://0.0.0.0:7471", zmq_endpoint,
            "ZeroMQ endpoint fleetd forwards its batches to.", "ENDPOINT"),
    settings.secret_key("echod", "echod's"),
    settings.authorized_keys("/etc/ingero/authorized_fleetd", "fleetd instances'", "forward"),
    settings.insecure_plaintext_zmq(
        "Accept fleetd without CURVE: no encryption and no authentication of who writes."),
    Setting("dsn", None, optional_text,
            "PostgreSQL to use (postgresql://...) [default: a private cluster of echod's own "
            "under --state-dir].", "DSN"),
    Setting("state_dir", "/var/lib/ingero/echod", path,
            "Where the private PostgreSQL cluster lives when no --dsn is given.", "DIR"),
    Setting("retention_days", 30, integer(1, 36_500),
            "Days anything is kept: call summaries, peer lag, scores, verdicts and the raw "
            "events around verdicts; older day partitions are dropped, older rows deleted.",
            "DAYS"),
    Setting("raw_days", 7, integer(1, 36_500),
            "Days the raw events of the frequent call kinds (collective, sync, alloc, free, "
            "memcpy; their per-minute summaries stay) are kept whole; after that, only those "
            "within --evidence-window of a verdict.", "DAYS"),
    Setting("raw_days_by_kind", {}, kind_days,
            "Raw windows per event kind, instead of --raw-days (KIND=DAYS,..., e.g. "
            "collective=14,sync=2); the other kinds are kept whole for --retention-days unless "
            "named here.", "KIND=DAYS"),
    Setting("evidence_window", 600, number(0, 7 * 86_400),
            "Seconds before a verdict's onset and after it cleared in which its job's raw "
            "events are kept for --retention-days.", "SECONDS"),
    settings.metrics_addr(9472),
    settings.max_frame_bytes(wire.MAX_FRAME_BYTES, 256 * 1024 * 1024, "batch"),
    Setting("writers", 2, integer(1, 16),
            "Batches written at once, each on a database connection of its own.", "N"),
    settings.log_level_setting(),
    Setting("slurm_states", "auto", choice(*MODES),
            "How echod learns the id Slurm prints for each job (1234_7, 1234+1) and how each "
            "run ended (CANCELLED, TIMEOUT, REQUEUED, ...): sacct (needs slurmdbd), scontrol "
            "(the jobs slurmctld still holds), auto (sacct, else scontrol) or off (the "
            "epilog's view only: COMPLETED or FAILED).", "MODE"),
    Setting("slurm_interval", 10.0, number(1, 3600),
            "Seconds between echod's questions to Slurm (one sacct or scontrol call each, for "
            "every job not yet named).", "SECONDS"),
    # -- the HTTP API ------------------------------------------------------------------------
    Setting("api_bind", "0.0.0.0:7472", listen_address,
            "HOST:PORT the HTTP API (gunicorn) listens on, or none for ingest only.", "HOST:PORT"),
    Setting("tls_cert", None, optional(path),
            "PEM certificate (chain) the API serves; required unless --insecure-no-tls.", "FILE"),
    Setting("tls_key", None, optional(path), "PEM private key of --tls-cert.", "FILE"),
    Setting("insecure_no_tls", False, boolean,
            "Serve the API over plain HTTP: bearer tokens and results cross the network "
            "unencrypted.", is_flag=True),
    Setting("tokens_file", "/etc/ingero/echod-tokens.yaml", path,
            "The API's bearer tokens, stored hashed (manage it with 'echod token'); re-read on "
            "SIGHUP.", "FILE"),
    Setting("munge_socket", DEFAULT_SOCKET, text,
            "munged's socket, to decode the MUNGE credential with which the ingero command "
            "proves its Unix user (as Slurm's commands do): that user sees their own jobs with "
            "no token; 'none' accepts bearer tokens only.", "PATH"),
    Setting("munge_admin_group", None, optional_text,
            "Unix group whose members (and root), proving themselves with MUNGE, see every "
            "user's jobs, as Slurm operators do with sacct -a [default: none: root only].",
            "GROUP"),
    Setting("token_grace", 300.0, number(0, 7 * 86_400),
            "Seconds a token removed from --tokens-file keeps working after SIGHUP.", "SECONDS"),
    Setting("audit_log", "/var/log/ingero/echod-audit.jsonl", path,
            "JSON-lines audit log of API requests, refused ones included (token hashes, never "
            "tokens).", "FILE"),
    Setting("rate_limit", 30.0, number(0.1, 100_000),
            "Requests per second allowed to one token, on average.", "PER_SECOND"),
    Setting("rate_burst", 100, integer(1, 1_000_000),
            "Requests one token may make at once before --rate-limit applies.", "REQUESTS"),
    Setting("api_workers", 2, integer(1, 64), "gunicorn worker processes.", "N"),
    Setting("api_threads", 8, integer(1, 256), "Threads per gunicorn worker.", "N"),
    Setting("api_concurrency_per_token", 0, integer(0, 256),
            "Requests one token may have in flight at once in each worker; more get 429. "
            "0: half of --api-threads, at least 1.", "N"),
    Setting("api_answer_cap", 8 * 1024 * 1024, integer(1024, 1024 * 1024 * 1024),
            "Most bytes of one tool or SQL answer; a larger one is refused with 422.", "BYTES"),
    Setting("drain_seconds", 5.0, number(0, 600),
            "On SIGTERM, seconds the API answers 503 with Retry-After before it stops.",
            "SECONDS"),
    Setting("sql_timeout", 60.0, number(0.1, 3600),
            "Statement timeout of the SQL sandbox and the tools, in seconds.", "SECONDS"),
    Setting("sql_row_cap", 10_000, integer(1, 1_000_000),
            "Most rows one SQL query returns; the answer says when it was cut.", "ROWS"),
    Setting("sql_scoped_without_closed_catalog", False, boolean,
            "Serve SQL to tenant-scoped tokens even where echod's database role is no "
            "superuser and so cannot close the catalog to tenants: a tenant who gets past the "
            "lexical check could then count other tenants' rows and sessions. Off, such tokens "
            "get 403 from the SQL endpoint there (the tools still answer them).",
            is_flag=True),
    Setting("sql_role", "ingero_sql", text,
            "PostgreSQL role the SQL sandbox and the tools read as (echod creates it; its "
            "password is kept under --state-dir).", "ROLE"),
]
