"""echod's main process runs the API as a gunicorn child and steers it.

Start: check TLS and the tokens file, make the sandbox role, hand the workers their settings
(``settings.ApiSettings``, a 0600 file in a private runtime directory), start gunicorn on a
unix socket there and wait until it answers, then put the front (``front``: TLS and whole
requests, so that slow clients hold no worker thread) on --api-bind. SIGHUP: rotate the tokens (the retired ones keep working for the grace window,
recorded in a file the new workers read) and HUP gunicorn, which replaces its workers
gracefully. SIGTERM: create the drain file (every request now gets 503 with Retry-After), wait
``--drain-seconds``, then stop gunicorn, which finishes the requests in flight.
"""

from __future__ import annotations

import http.client
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import Engine

from .. import sandbox
from ..access.tokens import TokenStore
from ..errors import EchodError
from . import FRONT
from .jsonio import DRAIN_LIMIT_BYTES, MAX_BODY_BYTES
from .front import Front, tls_context
from .settings import ENVIRONMENT, ApiSettings

log = logging.getLogger("echod")

START_TIMEOUT_S = 60.0
STOP_GRACE_S = 30.0


class ApiStartError(EchodError):
    """The API cannot be configured or started, or its gunicorn died."""


def check_tls(cfg) -> tuple[str, str] | None:
    """(certificate, key) to serve, None for plain HTTP; refuse a half or unreadable setup."""
    if cfg.insecure_no_tls:
        log.warning("serving the API without TLS (--insecure-no-tls): tokens and answers "
                    "cross the network in clear text")
        return None
    if cfg.tls_cert is None or cfg.tls_key is None:
        raise ApiStartError("the API needs --tls-cert and --tls-key (or --insecure-no-tls, which "
                       "sends tokens in clear text; or --api-bind none for no API)")
    for what, path in (("--tls-cert", cfg.tls_cert), ("--tls-key", cfg.tls_key)):
        try:
            path.open("rb").close()
        except OSError as exc:
            raise ApiStartError(f"{what} {path}: {exc.strerror}") from None
    return str(cfg.tls_cert), str(cfg.tls_key)


def role_password(state_dir: Path) -> str:
    """The sandbox role's password, made once and kept (0600) under the state directory."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / "sql-role.password"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32))
    return path.read_text().strip()


def concurrency_per_token(cfg) -> int:
    """--api-concurrency-per-token, where 0 means half of --api-threads (at least 1)."""
    return cfg.api_concurrency_per_token or max(1, cfg.api_threads // 2)


class ApiProcess:
    def __init__(self, cfg, tls: tuple[str, str] | None, engine: Engine, revision: str | None):
        """``tls``: (certificate, key) from ``check_tls``, or None for plain HTTP."""
        self.cfg = cfg
        self.tls = tls
        self.tokens = TokenStore(cfg.tokens_file, cfg.state_dir / "retired-tokens.json",
                                      cfg.token_grace)
        self.tokens.load()
        password = role_password(cfg.state_dir)
        key = sandbox.prepare(engine, cfg.sql_role, password)
        closed = sandbox.catalog_closed(engine)
        if not closed:
            log.warning("SQL for tenant-scoped tokens is %s: echod's database role is no "
                        "superuser, so the catalog stays open to tenants",
                        "served anyway (--sql-scoped-without-closed-catalog)"
                        if cfg.sql_scoped_without_closed_catalog else "refused (403)")
        url = sandbox.sandbox_url(engine.url, cfg.sql_role, password)
        self.runtime = Path(tempfile.mkdtemp(prefix="echod-api-"))
        (self.runtime / "metrics").mkdir()
        self.settings = ApiSettings(
            sandbox_url=url.render_as_string(hide_password=False), sandbox_key=key,
            tokens_file=str(cfg.tokens_file), retired_file=str(self.tokens.retired_file),
            token_grace=cfg.token_grace, audit_log=str(cfg.audit_log),
            rate_limit=cfg.rate_limit, rate_burst=cfg.rate_burst,
            drain_file=str(self.runtime / "draining"), drain_seconds=cfg.drain_seconds,
            sql_timeout_ms=int(cfg.sql_timeout * 1000), sql_row_cap=cfg.sql_row_cap,
            threads=cfg.api_threads, answer_cap=cfg.api_answer_cap,
            concurrency_per_token=concurrency_per_token(cfg), schema_revision=revision,
            sql_scoped=closed or cfg.sql_scoped_without_closed_catalog,
            munge_socket=cfg.munge_socket, munge_admin_group=cfg.munge_admin_group)
        self.settings.write(self.runtime / "api.json")
        self.process: subprocess.Popen | None = None
        self.front: Front | None = None

    @property
    def upstream(self) -> Path:
        """gunicorn's unix socket, behind the front: in the private runtime directory (0700)."""
        return self.runtime / "api.sock"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "gunicorn", "--config", "python:echod.api.gunicorn_hooks",
                "--bind", f"unix:{self.upstream}", "--workers", str(self.cfg.api_workers),
                "--threads", str(self.cfg.api_threads), "--worker-class", "gthread",
                "--graceful-timeout", str(int(STOP_GRACE_S)), "--log-level",
                self.cfg.log_level, "--error-logfile", "-", "--name", "echod-api",
                "--no-control-socket"]
        return [*argv, "echod.api:create_app()"]

    def start(self) -> None:
        # systemd hears from echod's main process only (NotifyAccess=main), not from gunicorn
        env = {**{k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"},
               ENVIRONMENT: str(self.runtime / "api.json"),
               "ECHOD_API_WORKERS": str(self.cfg.api_workers), "ECHOD_PID": str(os.getpid()),
               "PROMETHEUS_MULTIPROC_DIR": str(self.runtime / "metrics"), FRONT: "1"}
        # its own session: a Ctrl-C or a signal to echod's process group reaches echod only,
        # which drains before it stops gunicorn
        self.process = subprocess.Popen(self.argv(), env=env, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        host, port = self.cfg.api_bind
        deadline = time.monotonic() + START_TIMEOUT_S
        while not answering_unix(self.upstream):
            if self.process.poll() is not None:
                raise ApiStartError(f"the API (gunicorn) exited with status {self.process.returncode}"
                               f" while starting; its messages are above")
            if time.monotonic() >= deadline:
                raise ApiStartError(f"the API's gunicorn did not answer within "
                                    f"{START_TIMEOUT_S:.0f} s")
            time.sleep(0.1)
        self.front = Front(host, port, str(self.upstream),
                           tls_context(*self.tls) if self.tls else None,
                           MAX_BODY_BYTES, DRAIN_LIMIT_BYTES)
        try:
            self.front.start()
        except OSError as exc:
            raise ApiStartError(f"the API cannot listen on {host}:{port}: {exc.strerror or exc}") \
                from None
        log.info("API listening on %s:%d (%s)", host, port, "TLS" if self.tls else "plain HTTP")

    def check(self, _now: float = 0.0) -> None:
        """Called from the main loop: the API must still be running."""
        if self.process is not None and self.process.poll() is not None:
            raise ApiStartError(f"the API (gunicorn) exited with status {self.process.returncode}")
        if self.front is not None and not self.front.alive():
            raise ApiStartError("the API's front stopped")

    def reload(self) -> None:
        """SIGHUP: rotate the tokens, then let gunicorn replace its workers."""
        try:
            summary = self.tokens.rotate()
        except EchodError as exc:
            log.error("tokens not reloaded, the old ones stay in force: %s", exc)
            return
        log.info("tokens reloaded: %s", summary)
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGHUP)

    def stop(self, drain: bool = True) -> int | None:
        """Drain (503 + Retry-After for --drain-seconds), then stop gunicorn gracefully."""
        try:
            if self.process is None or self.process.poll() is not None:
                return self.process.returncode if self.process else None
            if drain and self.cfg.drain_seconds > 0:
                Path(self.settings.drain_file).touch()
                log.info("draining the API for %.0f s", self.cfg.drain_seconds)
                time.sleep(self.cfg.drain_seconds)
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(STOP_GRACE_S + 5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                return self.process.wait()
        finally:
            if self.front is not None:
                self.front.stop()
            shutil.rmtree(self.runtime, ignore_errors=True)


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path, timeout: float):
        super().__init__("localhost", timeout=timeout)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(str(self.path))


def answering_unix(path: Path) -> bool:
    """Whether gunicorn answers GET /api/versions on its unix socket."""
    connection = UnixHTTPConnection(path, 2)
    try:
        connection.request("GET", "/api/versions")
        return connection.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        connection.close()
