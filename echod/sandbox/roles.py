"""The SQL sandbox's PostgreSQL roles, made by echod's own role at every start (``prepare``).

The configured role (``--sql-role``, ``ingero_sql``) is only a gate: the API logs in with it
to ask ``ingero_sandbox_tenant()`` for a tenant's login role, and runs no caller's SQL with it.
Each set of clusters that a token may see is a tenant with a login role of its own,
``<role>_<16 hex digits>``, named and given its password by HMACs under the sandbox key, so
that only echod knows them. PostgreSQL shows a session's query text, and lets it be cancelled
or terminated, only to its own role, to members of that role and to members of
pg_read_all_stats or pg_signal_backend; a tenant role is a member of no role, so no tenant
sees or signals another's sessions, whatever function gets it there.

When echod's role is a superuser (the private cluster), ``prepare`` also takes from PUBLIC,
in echod's database only, what no tenant needs and what could reach past its rows: EXECUTE on
the functions that run SQL given as text, reach other sessions, files, large objects or
advisory locks, or measure tables (``CLOSED_FUNCTIONS``), SELECT on the statistics views and
pg_locks (``CLOSED_VIEWS``) and on pg_class's row and page counts. echod's own role, being the
superuser, does not need them back; another role of that database that is no superuser loses
them too. Any other role of echod's cannot change the catalog, and those walls are then the
lexical check alone (logged at start).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import logging
import re

import sqlalchemy.exc
from sqlalchemy import URL, Connection, Engine, make_url, text

from ..errors import StorageError
from ..registry import Scope

log = logging.getLogger("echod.sandbox")

DEFAULT_ROLE = "ingero_sql"
DEFAULT_TIMEOUT_MS = 60_000
READABLE_TABLES = ("event_rows", "event_chunks", "health_scores", "thresholds", "peer_lag",
                   "straggler_verdicts", "jobs", "nodes", "call_stats")
# Views over those, run with the reader's rights (security_invoker): the tables' row-level
# security holds in them.
READABLE_VIEWS = ("events",)
ROLE_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# Backstops for a session that somehow skips ``Sandbox.reading``; an owner that may not set one
# (temp_file_limit needs a superuser) leaves it out.
ROLE_DEFAULTS = {"default_transaction_read_only": "on",
                 "statement_timeout": str(DEFAULT_TIMEOUT_MS),
                 "idle_in_transaction_session_timeout": str(DEFAULT_TIMEOUT_MS),
                 "temp_file_limit": "1GB", "work_mem": "16MB"}
TENANT_FUNCTION = "ingero_sandbox_tenant"
TENANT_DIGITS = 16
TENANT_PREFIX = 63 - 1 - TENANT_DIGITS          # PostgreSQL names hold 63 bytes
# Of the role ``r`` (a pg_roles row): more than a tenant or the gate may hold.
PRIVILEGED = ("r.rolsuper OR r.rolcreatedb OR r.rolcreaterole OR r.rolreplication "
              "OR r.rolbypassrls")
MEMBER = "EXISTS (SELECT 1 FROM pg_auth_members m WHERE m.member = r.oid)"
OWNER = ("EXISTS (SELECT 1 FROM pg_shdepend d WHERE d.refclassid = 'pg_authid'::regclass "
         "AND d.refobjid = r.oid AND d.deptype = 'o')")

# pg_catalog functions (regular expressions over proname) that run SQL given as text, reach
# other sessions, files, large objects or advisory locks, or count rows of every cluster.
CLOSED_FUNCTIONS = (
    r"^(query|cursor|table|schema|database)_to_xml", r"^ts_(stat|rewrite)$",
    r"^pg_(cancel|terminate)_backend$", r"^pg_stat_get_", r"^pg_lock_status$",
    r"^pg_(safe_snapshot_)?blocking_pids$", r"^pg_notify$",
    r"^pg_(relation|table|indexes|total_relation|database|tablespace)_size$",
    r"^pg_(read_file|read_binary_file|stat_file|ls_)", r"^lo_", r"^lo(read|write)$",
    r"^pg_(try_)?advisory_")
# pg_catalog views (regular expressions over relname): sessions, locks, table statistics.
CLOSED_VIEWS = (r"^pg_stat(io)?_", r"^pg_locks$")
# pg_class columns that count a table's rows, all clusters' together.
COUNTING_COLUMNS = ("reltuples", "relpages", "relallvisible")

# A tenant's GRANTs rewrite the catalog rows of echod's database, the schema and each table,
# and PostgreSQL fails a GRANT whose row another transaction is rewriting ("tuple concurrently
# updated"): another tenant's setup (in another API worker), or the writer making the first
# partition of events, which holds events locked until it commits. So tenants are set up one
# at a time, each once it holds the tables locked against such changes: the lock waits for the
# writer to commit, and the GRANT then rewrites the rows the writer left.
TENANT_FUNCTION_SQL = """
CREATE OR REPLACE FUNCTION public.{function}(tenant text, verifier text) RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $body$
DECLARE
    setting text[];
BEGIN
    IF tenant !~ '^{prefix}_[0-9a-f]{{{digits}}}$' OR verifier !~ '^SCRAM-SHA-256\\$' THEN
        RAISE EXCEPTION 'not a sandbox tenant: %', tenant USING ERRCODE = '42501';
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('{function}'), 0);
    LOCK TABLE {only_tables} IN ACCESS SHARE MODE;
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = tenant) THEN
        EXECUTE format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE '
                       'NOREPLICATION NOBYPASSRLS NOINHERIT', tenant);
    ELSIF EXISTS (SELECT 1 FROM pg_roles r WHERE r.rolname = tenant
                  AND ({privileged} OR {member} OR {owner})) THEN
        RAISE EXCEPTION 'the sandbox tenant role % holds more than it may', tenant
            USING ERRCODE = '42501';
    END IF;
    EXECUTE format('ALTER ROLE %I LOGIN PASSWORD %L', tenant, verifier);
    EXECUTE format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), tenant);
    EXECUTE format('GRANT USAGE ON SCHEMA public TO %I', tenant);
    EXECUTE format('GRANT SELECT ON {tables} TO %I', tenant);
    FOREACH setting SLICE 1 IN ARRAY {defaults} LOOP
        BEGIN
            EXECUTE format('ALTER ROLE %I SET %s = %L', tenant, setting[1], setting[2]);
        EXCEPTION WHEN insufficient_privilege THEN
            NULL;
        END;
    END LOOP;
END
$body$
"""


# -- tenants -----------------------------------------------------------------------------------

def tenant_credentials(role: str, key: str, scope: Scope) -> tuple[str, str]:
    """The login role and password of ``scope``'s tenant under the gate ``role``: one per set
    of clusters, and one per user proven by MUNGE besides (each reads as a role of their own,
    row-level security keeping them to their jobs)."""
    said = scope.describe() if scope.user is None else [scope.describe(), scope.user]
    digest = _mac(key, "tenant", json.dumps(said))[:TENANT_DIGITS]
    name = f"{role[:TENANT_PREFIX]}_{digest}"
    return name, _mac(key, "password", name)


def _mac(key: str, purpose: str, message: str) -> str:
    return hmac.new(key.encode(), f"{purpose}.{message}".encode(), hashlib.sha256).hexdigest()


def ensure_tenant(gate: Connection, name: str, password: str) -> None:
    """Have ``ingero_sandbox_tenant()`` make (or bring up to date) the tenant role ``name``;
    the password goes over hashed here, so no log shows it. Commits."""
    gate.exec_driver_sql("SET TRANSACTION READ WRITE")       # the gate's default is read-only
    pgconn = gate.connection.driver_connection.pgconn
    verifier = pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256")
    gate.execute(text(f"SELECT {TENANT_FUNCTION}(:name, :verifier)"),
                 {"name": name, "verifier": verifier.decode()})
    gate.commit()


# -- the gate role -----------------------------------------------------------------------------

def prepare(owner_engine: Engine, role: str, password: str) -> str:
    """Make (or bring up to date) the sandbox's gate role with ``password`` and the function
    that makes tenant roles, close what tenants never need, and return the key that signs
    scopes (and names the tenants)."""
    if not ROLE_NAME.match(role):
        raise StorageError(f"the SQL sandbox role must be a plain lower-case name, not {role!r}")
    if not password:
        raise StorageError("the SQL sandbox role needs a password")
    with owner_engine.begin() as connection, _role_privileges_needed(owner_engine.url):
        if connection.scalar(text("SELECT to_regclass('sandbox_key')")) is None:
            raise StorageError("the database has no sandbox key: migrate it first")
        if connection.scalar(text("SELECT current_user")) == role:
            raise StorageError(f"the SQL sandbox role {role} cannot be echod's own role")
        _create_role(connection, role, password)
        _refuse_privileged(connection, role)
        _set_role_defaults(connection, role)
        _open_gate(connection, role)
        _close_catalog(connection)
        return connection.scalar(text("SELECT key FROM sandbox_key"))


@contextlib.contextmanager
def _role_privileges_needed(owner_url: URL):
    """PostgreSQL's refusal to let echod's role make the sandbox's roles, said as what that
    role lacks: on a server of the operator's (--dsn), CREATEROLE or the database's CONNECT."""
    try:
        yield
    except sqlalchemy.exc.DBAPIError as exc:
        if _sqlstate(exc) != "42501":                    # insufficient_privilege
            raise
        reason = str(exc.orig).strip().splitlines()[0]
        raise StorageError(
            f"echod's database role {owner_url.username} may not set up the SQL sandbox's "
            f"roles ({reason}): it needs the CREATEROLE attribute and the right to grant "
            "CONNECT on its database (as its owner)") from None


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
        f"SELECT {PRIVILEGED}, {MEMBER}, {OWNER} FROM pg_roles r WHERE r.rolname = :role"),
        {"role": role}).one()
    why = [what for what, bad in (("has role attributes beyond LOGIN", privileged),
                                  ("is a member of other roles", member),
                                  ("owns objects", owner)) if bad]
    if why:
        raise StorageError(f"the SQL sandbox role {role} {' and '.join(why)}; "
                           "drop it or configure another role name")


def _open_gate(connection: Connection, role: str) -> None:
    """The gate may connect and call the tenant function, and read no table: not the ingero
    tables (tenants do), not alembic_version, not sandbox_key, not the day partitions of
    events, which bypass its row-level security when read directly."""
    database = connection.scalar(text("SELECT current_database()"))
    function = f"public.{TENANT_FUNCTION}(text, text)"
    connection.exec_driver_sql(TENANT_FUNCTION_SQL.replace("%", "%%").format(
        function=TENANT_FUNCTION, prefix=role[:TENANT_PREFIX], digits=TENANT_DIGITS,
        privileged=PRIVILEGED, member=MEMBER, owner=OWNER,
        tables=", ".join(f"public.{table}" for table in READABLE_TABLES + READABLE_VIEWS),
        only_tables=", ".join(f"ONLY public.{table}" for table in READABLE_TABLES),
        defaults="ARRAY[" + ", ".join(f"['{name}', '{value}']"
                                      for name, value in ROLE_DEFAULTS.items()) + "]"))
    for statement in (
            f'REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "{role}"',
            f'REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM "{role}"',
            f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC",
            f'GRANT EXECUTE ON FUNCTION {function} TO "{role}"',
            _format(connection, "GRANT CONNECT ON DATABASE %I TO %I", database, role),
            f'GRANT USAGE ON SCHEMA public TO "{role}"'):
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


def catalog_closed(owner_engine: Engine) -> bool:
    """Whether ``prepare`` could close the catalog to tenants: echod's role is a superuser."""
    with owner_engine.connect() as connection:
        return bool(connection.scalar(text(
            "SELECT rolsuper FROM pg_roles WHERE rolname = current_user")))


def _close_catalog(connection: Connection) -> None:
    """Take ``CLOSED_FUNCTIONS``, ``CLOSED_VIEWS`` and pg_class's ``COUNTING_COLUMNS`` from
    PUBLIC in this database, where echod's role may (a superuser)."""
    if not connection.scalar(text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")):
        log.warning("echod's database role is no superuser: sandbox tenants keep PUBLIC's "
                    "EXECUTE on functions that run SQL text, reach sessions and count rows, "
                    "which only the lexical check then refuses")
        return
    closed = connection.execute(text(
        "SELECT 'FUNCTION ' || p.oid::regprocedure::text FROM pg_proc p "
        "WHERE p.pronamespace = 'pg_catalog'::regnamespace AND p.proname ~ ANY(:functions) "
        "UNION ALL SELECT 'TABLE pg_catalog.' || quote_ident(c.relname) FROM pg_class c "
        "WHERE c.relnamespace = 'pg_catalog'::regnamespace AND c.relkind = 'v' "
        "AND c.relname ~ ANY(:views) ORDER BY 1"),
        {"functions": list(CLOSED_FUNCTIONS), "views": list(CLOSED_VIEWS)}).scalars().all()
    for what in closed:
        privilege = "EXECUTE" if what.startswith("FUNCTION") else "SELECT"
        connection.exec_driver_sql(f"REVOKE {privilege} ON {what} FROM PUBLIC")
    columns = connection.scalar(text(
        "SELECT string_agg(quote_ident(attname), ', ' ORDER BY attnum) FROM pg_attribute "
        "WHERE attrelid = 'pg_catalog.pg_class'::regclass AND attnum > 0 "
        "AND NOT attisdropped AND attname <> ALL(:counting)"),
        {"counting": list(COUNTING_COLUMNS)})
    connection.exec_driver_sql("REVOKE SELECT ON pg_catalog.pg_class FROM PUBLIC")
    connection.exec_driver_sql(f"GRANT SELECT ({columns}) ON pg_catalog.pg_class TO PUBLIC")


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
