"""What the API's worker processes need to know, handed over by echod's main process.

echod resolves its settings once (flags, YAML, environment), prepares the database, and writes
this to a private file (mode 0600) in its runtime directory; gunicorn's workers read it from
the path in ``ECHOD_API_SETTINGS``. The workers hold only the sandbox role's credentials, never
the database owner's.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

ENVIRONMENT = "ECHOD_API_SETTINGS"


@dataclass(frozen=True)
class ApiSettings:
    sandbox_url: str             # the sandbox role's DSN (password included)
    sandbox_key: str             # signs the row-level-security scope of each transaction
    tokens_file: str
    retired_file: str            # tokens rotated out on SIGHUP, kept for the grace window
    token_grace: float
    audit_log: str
    rate_limit: float            # per token and per worker: echod divides by the workers
    rate_burst: int
    drain_file: str              # exists while echod drains: every request gets 503
    drain_seconds: float
    sql_timeout_ms: int
    sql_row_cap: int
    threads: int
    answer_cap: int              # most bytes of a tool's answer
    concurrency_per_token: int   # most requests of one token in flight, per worker
    sql_scoped: bool = True      # scoped tokens may run SQL (the catalog is closed to them)
    schema_revision: str | None = None
    munge_socket: str = "none"   # munged's, to decode users' MUNGE credentials; none: off
    munge_admin_group: str | None = None   # its members see every user's jobs

    def write(self, path: Path) -> Path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(asdict(self), out)
        return path

    @classmethod
    def read(cls, path: str | Path) -> ApiSettings:
        return cls(**json.loads(Path(path).read_text()))

    @classmethod
    def from_environment(cls) -> ApiSettings:
        path = os.environ.get(ENVIRONMENT)
        if not path:
            raise RuntimeError(f"{ENVIRONMENT} is not set: the API runs under 'echod', which "
                               f"sets it")
        return cls.read(path)
