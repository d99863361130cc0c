"""echod on a PostgreSQL server of the operator's own (``--dsn``), not its private cluster.

The server is set up as an operator would set one up for echod: PostgreSQL 15's initdb in a
directory of its own, run as the postgres user (PostgreSQL refuses root), a unix socket for the
superuser and TCP on 127.0.0.1 for everyone else, password logins (scram-sha-256) only, and a
login role ``ingero`` that owns the database ``ingero`` and holds CREATEROLE, the one
attribute echod needs there (for the SQL sandbox's roles), and nothing more. PUBLIC may not
even connect to that database: echod grants CONNECT to the roles it makes. Then echod's
``db`` commands migrate it, and a sim job goes through the real stack (ingerod, fleetd, echod)
into it; echod, stopped, leaves the server running and its rows in place.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

import sim
from echod.store.db import head_revision
from stack.launch import free_port, wait_for
from stack.local import Stack
from ingero.command.words import verdict_summary
from sim import scenario as scenarios
from sim.cluster import Cluster

from .pg import state_dir
from .support import needs_ebpf, why

pytestmark = pytest.mark.slow

BINDIR = Path("/usr/lib/postgresql/15/bin")
SUPERUSER = "postgres"
ROLE = DATABASE = "ingero"
# Only the superuser over the socket; echod's role and the roles it makes over TCP, to its
# database only.
PG_HBA = f"""\
# TYPE  DATABASE     USER         ADDRESS        METHOD
local   all          {SUPERUSER}                 scram-sha-256
host    {DATABASE}   all          127.0.0.1/32   scram-sha-256
"""
FAST_BUT_UNSAFE = "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
LATE_RANK, DELAY_MS = 5, 290


class ExternalPostgres:
    """A PostgreSQL 15 server under ``root`` (``data/``, ``socket/``, ``postgres.log``),
    listening on 127.0.0.1:``port``, with echod's role and database made in it."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.data, self.socket, self.log = root / "data", root / "socket", root / "postgres.log"
        self.superuser_password = secrets.token_urlsafe(24)
        self.password = secrets.token_urlsafe(24)
        self.dsn = f"postgresql://{ROLE}:{self.password}@127.0.0.1:{self.port}/{DATABASE}"

    def start(self) -> None:
        """initdb, the settings and pg_hba.conf, pg_ctl start, then echod's role and database."""
        password_file = self.root / "superuser.password"
        password_file.write_text(self.superuser_password + "\n")
        self.socket.mkdir()
        self._hand_to_postgres(self.root, self.socket, password_file)
        self._run(BINDIR / "initdb", "-D", self.data, "-U", SUPERUSER,
                  f"--pwfile={password_file}", "--auth=scram-sha-256", "--encoding=UTF8",
                  "--no-locale", "--no-sync", "--no-instructions")
        password_file.unlink()
        (self.data / "pg_hba.conf").write_text(PG_HBA)
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"listen_addresses = '127.0.0.1'\nport = {self.port}\n"
                       f"unix_socket_directories = '{self.socket}'\n{FAST_BUT_UNSAFE}")
        self._run(BINDIR / "pg_ctl", "start", "-D", self.data, "-w", "-l", self.log)
        self._provision()

    def _provision(self) -> None:
        with self.connect_as_superuser() as db:
            db.execute(sql.SQL("CREATE ROLE {} LOGIN CREATEROLE PASSWORD {}").format(
                sql.Identifier(ROLE), sql.Literal(self.password)))
            db.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(DATABASE), sql.Identifier(ROLE)))
            db.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(
                sql.Identifier(DATABASE)))

    def stop(self) -> None:
        if self.running():
            self._run(BINDIR / "pg_ctl", "stop", "-D", self.data, "-w", "-m", "fast")

    def running(self) -> bool:
        return self._run(BINDIR / "pg_ctl", "status", "-D", self.data,
                         check=False).returncode == 0

    def connect(self) -> psycopg.Connection:
        """As echod's role, over TCP with its password, as echod connects."""
        return psycopg.connect(self.dsn, autocommit=True)

    def connect_as_superuser(self) -> psycopg.Connection:
        return psycopg.connect(host=str(self.socket), port=self.port, user=SUPERUSER,
                               password=self.superuser_password, dbname="postgres",
                               autocommit=True)

    def _hand_to_postgres(self, *paths: Path) -> None:
        if os.geteuid() == 0:
            account = pwd.getpwnam(SUPERUSER)
            for path in paths:
                os.chown(path, account.pw_uid, account.pw_gid)

    def _run(self, *argv, check: bool = True) -> subprocess.CompletedProcess:
        """A server program, as the postgres user when we are root (PostgreSQL refuses root)."""
        argv = [str(a) for a in argv]
        if os.geteuid() == 0:
            argv = [shutil.which("runuser") or "runuser", "-u", SUPERUSER, "--", *argv]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=self.root)
        if check and done.returncode != 0:
            log = self.log.read_text(errors="replace") if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr or done.stdout}\n{log[-3000:]}")
        return done


@pytest.fixture
def server():
    """A fresh server per test, stopped and removed whatever the test did."""
    external = ExternalPostgres(state_dir())
    try:
        external.start()
        yield external
    finally:
        external.stop()
        shutil.rmtree(external.root, ignore_errors=True)


def echod(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "echod", "--dsn", dsn, *args],
                          capture_output=True, text=True, timeout=120)


def count(server: ExternalPostgres, table: str) -> int:
    with server.connect() as db:
        return db.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(table))).fetchone()[0]


def test_db_upgrade_migrates_the_external_database_and_status_says_so(server):
    head = head_revision()
    said = [echod(server.dsn, "db", *command) for command in (("status",), ("upgrade",),
                                                                 ("status",))]
    assert [done.returncode for done in said] == [0, 0, 0], [done.stderr for done in said]
    assert [done.stdout for done in said] == [
        f"current none\nhead    {head}\nneeds 'echod db upgrade'\n", f"schema at {head}\n",
        f"current {head}\nhead    {head}\nup to date\n"]
    with server.connect() as db:
        owner = db.execute("SELECT tableowner FROM pg_tables WHERE tablename = 'event_rows'")
        assert owner.fetchone() == (ROLE,)


def test_echod_whose_role_lacks_createrole_says_so_and_exits_1(server, tmp_path):
    with server.connect_as_superuser() as db:
        db.execute(sql.SQL("ALTER ROLE {} NOCREATEROLE").format(sql.Identifier(ROLE)))
    done = echod(server.dsn, "--state-dir", str(tmp_path), "--api-bind",
                 f"127.0.0.1:{free_port()}", "--insecure-no-tls", "--tokens-file",
                 str(tmp_path / "tokens.yaml"), "--audit-log", str(tmp_path / "audit.jsonl"),
                 "--ingest-bind", f"tcp://127.0.0.1:{free_port()}", "--insecure-plaintext-zmq",
                 "--metrics-addr", "none")
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"Error: echod's database role {ROLE} may not set up the SQL sandbox's roles "
        "(permission denied to create role): it needs the CREATEROLE attribute and the right "
        "to grant CONNECT on its database (as its owner)")


def late_rank_job(job_id: str) -> scenarios.Scenario:
    return scenarios.parse({"name": f"job-{job_id}", "stragglers": [
        {"rank": LATE_RANK, "kind": "host_delay", "delay_ms": DELAY_MS, "from_step": 8}],
        "job": {"nodes": 2, "ranks_per_node": 4, "steps": 24, "step_ms": 20,
                "allreduce_bytes": 1 << 20, "timeout_s": 30, "job_id": job_id}})


@needs_ebpf
def test_a_job_through_echod_on_the_external_server_is_stored_there_and_outlives_echod(
        server, tmp_path):
    sim.build()
    stack = Stack(tmp_path, 2, echod_flags=("--dsn", server.dsn))
    try:
        with Cluster(late_rank_job("5001"), tmp_path / "job-5001") as cluster:
            assert cluster.wait().ok
        verdicts = wait_for_verdicts(stack, "5001")
        said = [verdict_summary(v) for v in verdicts]
        assert {v["rank"] for v in verdicts} == {LATE_RANK}, why(said, stack.logs())
        assert all(line.startswith(f"rank {LATE_RANK} on node1: ") for line in said), said
        assert not (stack.echod.root / "state" / "postgres").exists(), \
            "echod started a private cluster although it was given --dsn"
        stored = count(server, "events")
        assert stored > 0
    finally:
        statuses = stack.stop()
    assert statuses == [0, 0, 0, 0], stack.logs()
    assert server.running(), "echod stopped a server it did not start"
    assert count(server, "events") >= stored
    assert count(server, "straggler_verdicts") >= len(verdicts)
    with server.connect() as db:
        gate = db.execute("SELECT rolsuper, rolcreaterole FROM pg_roles "
                          "WHERE rolname = 'ingero_sql'").fetchone()
    assert gate == (False, False), "echod's sandbox gate role is missing or privileged"


def wait_for_verdicts(stack: Stack, job: str) -> list[dict]:
    """fleetd's verdicts on the job once echod has them (they follow the job by a push or two)."""
    return wait_for(lambda: stack.tool("find_stragglers", job=job)["verdicts"], 15, 0.5) or []
