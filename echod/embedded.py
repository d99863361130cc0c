"""echod's private PostgreSQL cluster: the default when no DSN is configured.

Everything lives under one state directory that the cluster owns::

    <state>/data/              the cluster (initdb), with echod.conf included by postgresql.conf
    <state>/socket/            the only way in: a unix socket (listen_addresses = '')
    <state>/superuser.password random, mode 0600; local logins need it (scram-sha-256)
    <state>/postgres.log       the server's log; its tail goes into every error

PostgreSQL refuses to run as root, so when echod runs as root the cluster runs as the
``postgres`` system user (``runuser``), which then owns the state directory; every directory
above it must let that user through.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import subprocess
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy import URL

from .errors import EmbeddedDatabaseError

BINDIR_PATTERN = "/usr/lib/postgresql/*/bin"
SERVER_PROGRAMS = ("initdb", "pg_ctl", "postgres")
SUPERUSER = "postgres"
SOCKET_PATH_MAX = 107           # sun_path holds 108 bytes, NUL included
LOG_TAIL_LINES = 25
COMMAND_TIMEOUT_S = 120


def find_bindir(pattern: str = BINDIR_PATTERN) -> Path:
    """The newest PostgreSQL server binary directory that has every program echod runs."""
    candidates = [Path(p) for p in glob.glob(pattern)
                  if all((Path(p) / prog).is_file() for prog in SERVER_PROGRAMS)]
    if not candidates:
        raise EmbeddedDatabaseError(
            f"no PostgreSQL server programs ({', '.join(SERVER_PROGRAMS)}) in {pattern}: install "
            "PostgreSQL (Debian: postgresql) or configure a database DSN")
    return max(candidates, key=lambda p: _version_key(p.parent.name))


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) for part in name.split(".") if part.isdigit())


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no server log)"


class EmbeddedPostgres:
    """A PostgreSQL cluster under ``state_dir``, reachable only by its unix socket.

    ``start()`` initialises it on first use, starts it, creates ``dbname`` and returns a DSN;
    ``stop()`` stops it (fast shutdown). As a context manager it starts and stops around the
    block. ``settings`` are extra server settings (name → value) written into echod.conf.
    """

    def __init__(self, state_dir: str | Path, *, bindir: str | Path | None = None,
                 dbname: str = "echod", port: int = 5432, settings: dict[str, str] | None = None,
                 run_as: str | None = None):
        self.state_dir = Path(state_dir).absolute()
        self.bindir = Path(bindir) if bindir is not None else None
        self.dbname = dbname
        self.port = port
        self.settings = dict(settings or {})
        self.run_as = run_as if run_as is not None else (SUPERUSER if os.geteuid() == 0 else None)
        self.data_dir = self.state_dir / "data"
        self.socket_dir = self.state_dir / "socket"
        self.password_file = self.state_dir / "superuser.password"
        self.log_file = self.state_dir / "postgres.log"

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> str:
        """Initialise (first time), start (unless running) and return the DSN."""
        self.bindir = self.bindir or self._cluster_bindir() or find_bindir()
        self._prepare_state_dir()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb()
        self._write_settings()
        if not self.running():
            self._pg_ctl("start", "-w", "-t", str(COMMAND_TIMEOUT_S), "-l", str(self.log_file))
        self._create_database()
        return self.dsn

    def stop(self) -> None:
        """Stop the server (fast shutdown: sessions are cut, nothing committed is lost)."""
        if self.running():
            self._pg_ctl("stop", "-w", "-m", "fast")

    def running(self) -> bool:
        if not (self.data_dir / "PG_VERSION").exists():
            return False
        self.bindir = self.bindir or self._cluster_bindir() or find_bindir()
        return self._run([self.bindir / "pg_ctl", "status", "-D", str(self.data_dir)],
                         check=False).returncode == 0

    def _cluster_bindir(self) -> Path | None:
        """The programs of the major version that made the cluster, when they are installed:
        a newer server cannot start an older cluster."""
        try:
            version = (self.data_dir / "PG_VERSION").read_text().strip()
        except OSError:
            return None
        candidate = Path(BINDIR_PATTERN.replace("*", version))
        return candidate if all((candidate / p).is_file() for p in SERVER_PROGRAMS) else None

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # -- connecting ----------------------------------------------------------------------------

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    @property
    def dsn(self) -> str:
        """postgresql+psycopg://postgres:…@/<dbname>?host=<socket dir>&port=<port>"""
        return self.url(self.dbname).render_as_string(hide_password=False)

    def url(self, dbname: str) -> URL:
        return URL.create("postgresql+psycopg", username=SUPERUSER, password=self.password,
                          database=dbname,
                          query={"host": str(self.socket_dir), "port": str(self.port)})

    def connect(self, dbname: str = "postgres") -> psycopg.Connection:
        """A plain psycopg connection (autocommit) to one database of the cluster."""
        return psycopg.connect(host=str(self.socket_dir), port=self.port, user=SUPERUSER,
                               password=self.password, dbname=dbname, autocommit=True)

    # -- steps ---------------------------------------------------------------------------------

    def _prepare_state_dir(self) -> None:
        socket_path = self.socket_dir / f".s.PGSQL.{self.port}"
        if len(str(socket_path)) > SOCKET_PATH_MAX:
            raise EmbeddedDatabaseError(f"state directory path too long for a unix socket: "
                                        f"{socket_path} exceeds {SOCKET_PATH_MAX} bytes")
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.socket_dir.mkdir(mode=0o700, exist_ok=True)
        if not self.password_file.exists():
            self._write_password()
        if self.run_as is not None:
            self._hand_over_state_dir()

    def _write_password(self) -> None:
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(32) + "\n")

    def _hand_over_state_dir(self) -> None:
        """Let the ``run_as`` user own the state directory, and check that it can reach it."""
        try:
            account = pwd.getpwnam(self.run_as)
        except KeyError:
            raise EmbeddedDatabaseError(
                f"no system user {self.run_as!r} to run PostgreSQL as (it refuses root); "
                "install Debian's postgresql package, which creates it") from None
        for path in (self.state_dir, self.socket_dir, self.password_file):
            os.chown(path, account.pw_uid, account.pw_gid)
        if self._run(["test", "-w", str(self.state_dir) + "/"], check=False).returncode != 0:
            raise EmbeddedDatabaseError(
                f"the {self.run_as} user cannot reach {self.state_dir}: every directory above "
                f"it must be searchable by {self.run_as} (choose e.g. /var/lib/echod)")

    def _initdb(self) -> None:
        if self.data_dir.exists() and any(self.data_dir.iterdir()):
            raise EmbeddedDatabaseError(f"{self.data_dir} is not empty and holds no cluster")
        self._run([self.bindir / "initdb", "-D", str(self.data_dir), "-U", SUPERUSER,
                   f"--pwfile={self.password_file}", "--auth-local=scram-sha-256",
                   "--auth-host=reject", "--encoding=UTF8", "--no-locale", "--no-instructions"],
                  what="initdb")
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# echod's settings for its embedded cluster\ninclude 'echod.conf'\n")

    def _write_settings(self) -> None:
        """Unix socket only, inside the state directory; then the caller's settings."""
        settings = {"listen_addresses": "", "unix_socket_directories": str(self.socket_dir),
                    "port": str(self.port), "timezone": "UTC", **self.settings}
        lines = [f"{name} = '{str(value).replace(chr(39), chr(39) * 2)}'"
                 for name, value in settings.items()]
        path = self.data_dir / "echod.conf"
        path.write_text("\n".join(lines) + "\n")
        if self.run_as is not None:
            account = pwd.getpwnam(self.run_as)
            os.chown(path, account.pw_uid, account.pw_gid)

    def _create_database(self) -> None:
        try:
            with self.connect() as connection:
                exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                                            (self.dbname,)).fetchone()
                if not exists:
                    connection.execute(sql.SQL("CREATE DATABASE {}").format(
                        sql.Identifier(self.dbname)))
        except psycopg.Error as exc:
            raise EmbeddedDatabaseError(f"cannot create database {self.dbname}: {exc}\n"
                                        f"{log_tail(self.log_file)}") from exc

    def _pg_ctl(self, action: str, *args: str) -> None:
        self._run([self.bindir / "pg_ctl", action, "-D", str(self.data_dir), *args],
                  what=f"pg_ctl {action}")

    def _run(self, argv: list, check: bool = True, what: str = "") -> subprocess.CompletedProcess:
        """Run a PostgreSQL program, as ``run_as`` when set; on failure raise with the log tail."""
        argv = [str(a) for a in argv]
        if self.run_as is not None:
            argv = [shutil.which("runuser") or "runuser", "-u", self.run_as, "--", *argv]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, cwd=self.state_dir,
                                    timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EmbeddedDatabaseError(f"{what or argv[0]} failed: {exc}") from exc
        if check and result.returncode != 0:
            raise EmbeddedDatabaseError(
                f"{what or argv[0]} failed (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()}\n"
                f"server log {self.log_file}:\n{log_tail(self.log_file)}")
        return result
