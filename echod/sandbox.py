"""The SQL sandbox: one read-only statement from a caller, run so that it can read the ingero
tables of the caller's clusters and nothing else.

Three walls, so that what gets past one meets the next:

1. ``check_sql`` (``echod.sqlcheck``) tokenizes the text as PostgreSQL does (comments, nested comments, every kind of
   quoting) and refuses anything but one SELECT, WITH, VALUES, TABLE or EXPLAIN statement, any
   word that writes, changes the schema or the session, and functions that reach files, large
   objects, the network, locks, sequences, other sessions or run SQL given as a string.
2. The statement runs as its own LOGIN role (``prepare`` makes it), which is no superuser,
   belongs to no role and may only SELECT the ingero tables, inside a READ ONLY transaction with
   a statement timeout, and is always rolled back. Since the role is the session user,
   ``SET ROLE`` and ``SET SESSION AUTHORIZATION`` lead nowhere.
3. Row-level security (migration 0002) shows only the rows of the clusters that echod signed
   into the transaction's ``ingero.scope``; a value made by anyone without the key, or made for
   another backend or transaction, shows no rows at all.

The first wall alone stops what PostgreSQL lets any role do: end or cancel the sandbox role's
other sessions (other callers' statements), hold session advisory locks, burn transaction ids.
The pool discards each session's leftovers (DISCARD ALL) before the next caller gets it.

Errors are ``echod.sqlcheck``'s SqlError family (400). A lost connection is not the caller's doing: it leaves as SQLAlchemy's ``OperationalError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as clock
from decimal import Decimal
from itertools import islice

import psycopg
import sqlalchemy.exc
from sqlalchemy import URL, Connection, Engine, event, make_url, text

from .db import make_engine
from .errors import StorageError
from .registry import Scope
from .sqlcheck import SqlFailed, SqlRefused, SqlTimeout, check_sql, tokens

log = logging.getLogger("echod.sandbox")

DEFAULT_ROLE = "ingero_sql"
DEFAULT_TIMEOUT_MS = 60_000
DEFAULT_ROW_CAP = 10_000
READABLE_TABLES = ("events", "health_scores", "thresholds", "peer_lag", "straggler_verdicts",
                   "jobs", "nodes")
ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# Backstops for a session that somehow skips ``Sandbox.reading``; an owner that may not set one
# (temp_file_limit needs a superuser) leaves it out.
ROLE_DEFAULTS = {"default_transaction_read_only": "on",
                 "statement_timeout": str(DEFAULT_TIMEOUT_MS),
                 "idle_in_transaction_session_timeout": str(DEFAULT_TIMEOUT_MS),
                 "temp_file_limit": "1GB", "work_mem": "16MB"}


# -- the role ----------------------------------------------------------------------------------

def prepare(owner_engine: Engine, role: str, password: str) -> str:
    """Make (or bring up to date) the sandbox's login role with ``password``, let it read the
    ingero tables of this database and nothing else, and return the key that signs scopes."""
    if not ROLE_NAME.match(role):
        raise StorageError(f"the SQL sandbox role must be a plain lower-case name, not {role!r}")
    if not password:
        raise StorageError("the SQL sandbox role needs a password")
    with owner_engine.begin() as connection:
        if connection.scalar(text("SELECT to_regclass('sandbox_key')")) is None:
            raise StorageError("the database has no sandbox key: migrate it first")
        if connection.scalar(text("SELECT current_user")) == role:
            raise StorageError(f"the SQL sandbox role {role} cannot be echod's own role")
        _create_role(connection, role, password)
        _refuse_privileged(connection, role)
        _grant_reading(connection, role)
        _set_role_defaults(connection, role)
        return connection.scalar(text("SELECT key FROM sandbox_key"))


def _create_role(connection: Connection, role: str, password: str) -> None:
    """CREATE ROLE unless it exists (roles are shared by the whole server, so another database
    may have made it), then set its password, hashed here so no log shows it."""
    try:
        with connection.begin_nested():
            connection.exec_driver_sql(
                f'CREATE ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION '
                "NOBYPASSRLS NOINHERIT")
    except sqlalchemy.exc.DBAPIError as exc:
        if _sqlstate(exc) not in ("42710", "23505"):     # duplicate_object, unique_violation
            raise
    pgconn = connection.connection.driver_connection.pgconn
    hashed = pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256")
    connection.exec_driver_sql(
        _format(connection, "ALTER ROLE %I LOGIN PASSWORD %L", role, hashed.decode()))


def _refuse_privileged(connection: Connection, role: str) -> None:
    """A role that someone else made may hold more than the sandbox may: refuse to use it."""
    privileged, member, owner = connection.execute(text(
        "SELECT r.rolsuper OR r.rolcreatedb OR r.rolcreaterole OR r.rolreplication "
        "OR r.rolbypassrls, "
        "EXISTS (SELECT 1 FROM pg_auth_members m WHERE m.member = r.oid), "
        "EXISTS (SELECT 1 FROM pg_shdepend d WHERE d.refclassid = 'pg_authid'::regclass "
        "AND d.refobjid = r.oid AND d.deptype = 'o') "
        "FROM pg_roles r WHERE r.rolname = :role"), {"role": role}).one()
    why = [what for what, bad in (("has role attributes beyond LOGIN", privileged),
                                  ("is a member of other roles", member),
                                  ("owns objects", owner)) if bad]
    if why:
        raise StorageError(f"the SQL sandbox role {role} {' and '.join(why)}; "
                           "drop it or configure another role name")


def _grant_reading(connection: Connection, role: str) -> None:
    """SELECT on exactly the ingero tables: not alembic_version, not sandbox_key, not the day
    partitions of events, which bypass its row-level security when read directly."""
    database = connection.scalar(text("SELECT current_database()"))
    for statement in (
            f'REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "{role}"',
            f'REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM "{role}"',
            _format(connection, "GRANT CONNECT ON DATABASE %I TO %I", database, role),
            f'GRANT USAGE ON SCHEMA public TO "{role}"',
            f'GRANT SELECT ON {", ".join(READABLE_TABLES)} TO "{role}"'):
        connection.exec_driver_sql(statement)


def _set_role_defaults(connection: Connection, role: str) -> None:
    for name, value in ROLE_DEFAULTS.items():
        try:
            with connection.begin_nested():
                connection.exec_driver_sql(f"ALTER ROLE \"{role}\" SET {name} = '{value}'")
        except sqlalchemy.exc.DBAPIError as exc:
            if _sqlstate(exc) != "42501":                # insufficient_privilege
                raise
            log.info("the SQL sandbox role keeps the server's %s: echod may not set it", name)


def _format(connection: Connection, template: str, *values: str) -> str:
    """A statement made by the server's format(), which quotes %I names and %L literals."""
    names = [f"v{i}" for i in range(len(values))]
    return connection.scalar(
        text(f"SELECT format(:template, {', '.join(f'CAST(:{n} AS text)' for n in names)})"),
        {"template": template, **dict(zip(names, values))})


def sandbox_url(owner_url: str | URL, role: str, password: str) -> URL:
    """echod's database URL with the sandbox role's credentials (same host, socket, database)."""
    return make_url(owner_url).set(username=role, password=password)


def _sqlstate(exc: sqlalchemy.exc.DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlstate", None)


# -- the sandbox -------------------------------------------------------------------------------

@dataclass
class SqlResult:
    """An answer: column names, rows of JSON-ready values, whether the row cap cut it short."""

    columns: list[str]
    rows: list[list]
    truncated: bool
    elapsed_ms: float


class Sandbox:
    """Read-only transactions as the sandbox role, scoped to a caller's clusters."""

    def __init__(self, url: str | URL, key: str, *, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 row_cap: int = DEFAULT_ROW_CAP, pool_size: int = 4):
        self.key = key
        self.timeout_ms = timeout_ms
        self.row_cap = row_cap
        self.engine = make_engine(url, pool_size=pool_size, max_overflow=0, connect_args={
            "application_name": "echod-sql", "client_encoding": "utf8",  # as check_sql lexes
            "prepare_threshold": None})
        event.listen(self.engine, "connect", _refuse_unscoped_login)
        event.listen(self.engine, "reset", _discard_session)

    @contextlib.contextmanager
    def reading(self, scope: Scope, timeout_ms: int | None = None) -> Iterator[Connection]:
        """A READ ONLY transaction as the sandbox role with ``scope`` signed in and the timeouts
        set (as parameters: no statement text shows the scope); always rolled back."""
        if scope.clusters is not None and "*" in scope.clusters:
            raise ValueError("'*' is not a cluster name")
        limit = str(min(timeout_ms or self.timeout_ms, self.timeout_ms))
        with self.engine.connect() as connection:
            try:
                connection.exec_driver_sql("SET TRANSACTION READ ONLY")
                pid, started = connection.execute(
                    text("SELECT pg_backend_pid(), now()::text")).one()
                connection.execute(text(
                    "SELECT set_config('statement_timeout', :limit, true), "
                    "set_config('idle_in_transaction_session_timeout', :limit, true), "
                    "set_config('standard_conforming_strings', 'on', true), "
                    "set_config('ingero.scope', :scope, true)"),
                    {"limit": limit, "scope": self._sign(scope, pid, started)})
                yield connection
            finally:
                if not connection.invalidated:
                    connection.rollback()

    def _sign(self, scope: Scope, pid: int, started: str) -> str:
        """``<signature>.<json>`` as ingero_scope() checks it (migration 0002)."""
        body = json.dumps({"clusters": scope.describe(), "pid": pid, "t": started},
                          separators=(",", ":"))
        signature = hashlib.sha256(f"{self.key}.{body}".encode()).hexdigest()
        return f"{signature}.{body}"

    def run(self, sql: str, scope: Scope, *, timeout_ms: int | None = None,
            row_cap: int | None = None) -> SqlResult:
        """Check ``sql``, run it in ``scope`` and return at most ``row_cap`` rows. A caller may
        ask for less than the operator's row cap and timeout, never more."""
        statement = check_sql(sql)
        cap = min(row_cap or self.row_cap, self.row_cap)
        limit = min(timeout_ms or self.timeout_ms, self.timeout_ms)
        started = time.perf_counter()
        with self.reading(scope, limit) as connection:
            columns, rows = _fetch(connection, statement, cap + 1, limit)
        return SqlResult(columns, [[json_ready(v) for v in row] for row in rows[:cap]],
                         len(rows) > cap, round((time.perf_counter() - started) * 1000, 3))

    def dispose(self) -> None:
        self.engine.dispose()


def _fetch(connection: Connection, statement: str, most: int,
           limit_ms: int) -> tuple[list[str], list[tuple]]:
    """At most ``most`` rows of ``statement``, sent by the extended protocol (one statement only;
    ``%`` and ``:`` left alone). A query runs in a server-side cursor, so no more rows than
    fetched are made or sent; EXPLAIN, which no cursor takes, is streamed."""
    driver = connection.connection.driver_connection
    explain = next(tokens(statement)).name == "explain"
    cursor = driver.cursor() if explain else driver.cursor(name="ingero_sql_result")
    try:
        if explain:
            with contextlib.closing(cursor.stream(statement)) as stream:
                rows = list(islice(stream, most))
        else:
            cursor.execute(statement)
            rows = cursor.fetchmany(most)
        return [column.name for column in cursor.description or ()], rows
    except psycopg.Error as exc:
        raise _translate(connection, statement, exc, limit_ms) from exc
    finally:
        if not connection.invalidated:
            cursor.close()


def _translate(connection: Connection, statement: str, exc: psycopg.Error,
               limit_ms: int) -> Exception:
    state = exc.sqlstate
    message = (exc.diag.message_primary or str(exc) or type(exc).__name__).splitlines()[0]
    if state in ("42501", "25006"):        # insufficient_privilege, read_only_sql_transaction
        return SqlRefused(message)
    if state == "57014":                   # query_canceled
        return SqlTimeout(f"statement ran past the {_duration(limit_ms)} limit")
    if state is None or state.startswith("08") or state.startswith("57P") \
            or isinstance(exc, psycopg.InterfaceError):
        connection.invalidate(exc)
        return sqlalchemy.exc.DBAPIError.instance(statement, None, exc, psycopg.Error)
    return SqlFailed(message)


def _duration(ms: int) -> str:
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms} ms"


def _refuse_unscoped_login(dbapi_connection, _record) -> None:
    """Refuse to run the sandbox as a role that row-level security does not bind: a superuser,
    a BYPASSRLS role or the tables' owner (or on an unmigrated database)."""
    user, bound = dbapi_connection.execute(
        "SELECT current_user, row_security_active('events')").fetchone()
    dbapi_connection.rollback()
    if not bound:
        raise StorageError(f"the SQL sandbox cannot run as {user}: row-level security does not "
                           "apply to it (superuser, BYPASSRLS, the tables' owner, or the "
                           "database is not migrated)")


def _discard_session(dbapi_connection, _record, reset_state) -> None:
    """Forget whatever a statement left in the session (advisory locks, prepared statements,
    cursors) before the next caller, perhaps another tenant, gets the pooled connection."""
    if reset_state.terminate_only:
        return
    dbapi_connection.rollback()
    dbapi_connection.autocommit = True
    try:
        dbapi_connection.execute("DISCARD ALL")
    finally:
        dbapi_connection.autocommit = False


# -- values ------------------------------------------------------------------------------------

NON_FINITE = {"nan": "NaN", "inf": "Infinity", "-inf": "-Infinity"}


def json_ready(value):
    """``value`` as JSON can carry it: times in ISO 8601, intervals in seconds, numerics as
    numbers, bytes in hex, NaN and infinities as PostgreSQL spells them, the rest as text."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else NON_FINITE[str(value)]
    if isinstance(value, Decimal):
        return _decimal(value)
    if isinstance(value, (datetime, date, clock)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [json_ready(item) for item in value]
    if isinstance(value, dict):
        return {str(key): json_ready(item) for key, item in value.items()}
    return str(value)


def _decimal(value: Decimal) -> int | float | str:
    if not value.is_finite():
        return str(value)                  # NaN, Infinity, -Infinity
    return int(value) if value == value.to_integral_value() else float(value)
