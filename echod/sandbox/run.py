"""The SQL sandbox: one read-only statement from a caller, run so that it can read the ingero
tables of the caller's clusters and nothing else.

Three walls, so that what gets past one meets the next:

1. ``check_sql`` (``echod.sandbox.check``) tokenizes the text as PostgreSQL does (comments, nested
   comments, every kind of quoting) and refuses anything but one SELECT, WITH, VALUES, TABLE or
   EXPLAIN statement (no EXPLAIN for a token scoped to clusters: its estimates count every
   cluster's rows), any word that writes, changes the schema or the session, and functions
   that reach files, large objects, the network, locks, sequences, other sessions, table
   statistics or run SQL given as a string.
2. The statement runs as its tenant's LOGIN role (``echod.sandbox.roles``): one per set of
   clusters, no superuser, a member of no role, allowed to SELECT the ingero tables only,
   inside a READ ONLY transaction with a statement timeout, and always rolled back. PostgreSQL
   itself keeps a tenant from another's sessions (their query text, cancelling, terminating)
   and, where echod's role is a superuser, from the functions and views that run SQL text or
   count every cluster's rows. Since the role is the session user, ``SET ROLE`` and
   ``SET SESSION AUTHORIZATION`` lead nowhere.
3. Row-level security (migration 0002) shows only the rows of the clusters that echod signed
   into the transaction's ``ingero.scope``; a value made by anyone without the key, or made for
   another backend or transaction, shows no rows at all.

The pool discards each session's leftovers (DISCARD ALL) before the next caller of the same
tenant gets it.

Errors are ``echod.sandbox.check``'s SqlError family (400). A lost connection is not the caller's
doing: it leaves as SQLAlchemy's ``OperationalError``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from datetime import time as clock
from decimal import Decimal
from itertools import islice

import psycopg
import sqlalchemy.exc
from sqlalchemy import URL, Connection, Engine, event, make_url, text

from ..errors import StorageError
from ..registry import Scope
from ..store.db import make_engine
from .check import (SqlFailed, SqlRefused, SqlScopedUnavailable, SqlTimeout, SqlTooLarge,
                    check_sql, tokens)
from .roles import (DEFAULT_ROLE, DEFAULT_TIMEOUT_MS, READABLE_TABLES, catalog_closed,
                    ensure_tenant, prepare, sandbox_url, tenant_credentials)

__all__ = ["DEFAULT_ROLE", "DEFAULT_ROW_CAP", "DEFAULT_TIMEOUT_MS", "READABLE_TABLES", "Sandbox",
           "SqlResult", "catalog_closed", "json_ready", "prepare", "sandbox_url"]

log = logging.getLogger("echod.sandbox")

DEFAULT_ROW_CAP = 10_000
FETCH_ROWS = 200                # rows per fetch from the server-side cursor
# Tenants whose engines (one idle connection each) a Sandbox keeps; the least recently used
# is let go past this.
TENANT_ENGINES = 16
CONNECT_ARGS = {"application_name": "echod-sql", "client_encoding": "utf8",  # as check_sql lexes
                "prepare_threshold": None}


# -- the sandbox -------------------------------------------------------------------------------

@dataclass
class SqlResult:
    """An answer: column names, rows of JSON-ready values, whether the row cap cut it short."""

    columns: list[str]
    rows: list[list]
    truncated: bool
    elapsed_ms: float


class Sandbox:
    """Read-only transactions as the tenant role of a caller's clusters, scoped to them.

    ``url`` names the gate role that ``prepare`` made; each tenant gets an engine of its own
    (one idle connection, up to ``pool_size`` at once), made on first use."""

    def __init__(self, url: str | URL, key: str, *, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                 row_cap: int = DEFAULT_ROW_CAP, pool_size: int = 4,
                 byte_cap: int | None = None, scoped: bool = True):
        """``scoped``: whether tenant-scoped callers may run SQL at all (off where the catalog
        stays open to tenants, see ``roles.catalog_closed``)."""
        self.url = make_url(url)
        self.key = key
        self.timeout_ms = timeout_ms
        self.row_cap = row_cap
        self.byte_cap = byte_cap
        self.scoped = scoped
        self.pool_size = pool_size
        self.gate = make_engine(self.url, pool_size=1, max_overflow=0,
                                connect_args=CONNECT_ARGS)
        self._tenants: OrderedDict[str, Engine] = OrderedDict()
        self._lock = threading.Lock()

    def tenant(self, scope: Scope) -> Engine:
        """The engine that logs in as ``scope``'s tenant role, made (with the role) if new."""
        name, password = tenant_credentials(self.url.username, self.key, scope)
        with self._lock:
            if name in self._tenants:
                self._tenants.move_to_end(name)
                return self._tenants[name]
            self._ensure(name, password)
            engine = make_engine(self.url.set(username=name, password=password), pool_size=1,
                                 max_overflow=max(0, self.pool_size - 1),
                                 connect_args=CONNECT_ARGS)
            event.listen(engine, "connect", _refuse_unscoped_login)
            event.listen(engine, "reset", _discard_session)
            self._tenants[name] = engine
            while len(self._tenants) > TENANT_ENGINES:
                self._tenants.popitem(last=False)[1].dispose()
            return engine

    def _ensure(self, name: str, password: str) -> None:
        with self.gate.connect() as gate:
            try:
                ensure_tenant(gate, name, password)
            except sqlalchemy.exc.ProgrammingError as exc:      # no such function, or refused
                raise StorageError(f"the SQL sandbox cannot make the tenant role {name} as "
                                   f"{self.url.username}: has prepare() made this role the "
                                   f"sandbox's? ({exc.orig})") from exc

    @contextlib.contextmanager
    def reading(self, scope: Scope, timeout_ms: int | None = None) -> Iterator[Connection]:
        """A READ ONLY transaction as ``scope``'s tenant role with ``scope`` signed in and the
        timeouts set (as parameters: no statement text shows the scope); always rolled back.
        REPEATABLE READ: its statements read one snapshot, so a tool's answer, read in
        several, says one thing (read committed, a verdict stored between find_stragglers'
        read of the ranks fleetd named and its read of the verdicts was listed with its rank
        no straggler). A read-only transaction there never fails to serialize."""
        if scope.clusters is not None and "*" in scope.clusters:
            raise ValueError("'*' is not a cluster name")
        limit = str(min(timeout_ms or self.timeout_ms, self.timeout_ms))
        with self.tenant(scope).connect() as connection:
            try:
                connection.exec_driver_sql(
                    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
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
        """``<signature>.<json>`` as ingero_claim() checks it (migrations 0002, 0012)."""
        body = json.dumps({"clusters": scope.describe(), "pid": pid, "t": started,
                           **({"user": scope.user} if scope.user else {})},
                          separators=(",", ":"))
        signature = hashlib.sha256(f"{self.key}.{body}".encode()).hexdigest()
        return f"{signature}.{body}"

    def run(self, sql: str, scope: Scope, *, timeout_ms: int | None = None,
            row_cap: int | None = None) -> SqlResult:
        """Check ``sql``, run it in ``scope`` and return at most ``row_cap`` rows. A caller may
        ask for less than the operator's row cap and timeout, never more."""
        if scope.restricted and not self.scoped:
            raise SqlScopedUnavailable(
                "SQL is not served to tenant-scoped tokens here: echod's database role is no "
                "superuser, so the catalog stays open to tenants (an operator may accept that "
                "with --sql-scoped-without-closed-catalog); the tools still answer")
        statement = check_sql(sql, scoped=scope.restricted)
        cap = min(row_cap or self.row_cap, self.row_cap)
        limit = min(timeout_ms or self.timeout_ms, self.timeout_ms)
        started = time.perf_counter()
        with self.reading(scope, limit) as connection:
            columns, rows = _fetch(connection, statement, cap + 1, limit, self.byte_cap)
        return SqlResult(columns, [[json_ready(v) for v in row] for row in rows[:cap]],
                         len(rows) > cap, round((time.perf_counter() - started) * 1000, 3))

    def dispose(self) -> None:
        with self._lock:
            for engine in self._tenants.values():
                engine.dispose()
            self._tenants.clear()
        self.gate.dispose()


def _fetch(connection: Connection, statement: str, most: int, limit_ms: int,
           byte_cap: int | None = None) -> tuple[list[str], list[tuple]]:
    """At most ``most`` rows of ``statement``, sent by the extended protocol (one statement only;
    ``%`` and ``:`` left alone). A query runs in a server-side cursor, so no more rows than
    fetched are made or sent; EXPLAIN, which no cursor takes, is streamed. Rows come
    ``FETCH_ROWS`` at a time, and past ``byte_cap`` (as text) the fetching stops with
    SqlTooLarge: a worker never holds much more than the answer it may send."""
    driver = connection.connection.driver_connection
    explain = next(tokens(statement)).name == "explain"
    cursor = driver.cursor() if explain else driver.cursor(name="ingero_sql_result")
    try:
        if explain:
            with contextlib.closing(cursor.stream(statement)) as stream:
                rows = list(islice(stream, most))
        else:
            cursor.execute(statement)
            rows, size = [], 0
            while len(rows) < most:
                wanted = min(FETCH_ROWS, most - len(rows))
                batch = cursor.fetchmany(wanted)
                rows += batch
                size += sum(_text_size(v) for row in batch for v in row)
                if byte_cap is not None and size > byte_cap:
                    raise SqlTooLarge(f"the answer is over {byte_cap} bytes (the server's "
                                      "answer cap): ask for fewer rows or columns")
                if len(batch) < wanted:
                    break
        return [column.name for column in cursor.description or ()], rows
    except psycopg.Error as exc:
        raise _translate(connection, statement, exc, limit_ms) from exc
    finally:
        if not connection.invalidated:
            cursor.close()


def _text_size(value) -> int:
    return len(value) if isinstance(value, (str, bytes)) else len(str(value))


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
        "SELECT current_user, row_security_active('event_rows')").fetchone()
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
