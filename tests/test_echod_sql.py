"""The SQL sandbox against a real PostgreSQL: escape attempts refused by the lexical check and,
with the check skipped, refused or contained by PostgreSQL; tenancy by row-level security with a
signed scope that cannot be forged or replayed; timeouts, the row cap and JSON-ready values.

The database (tests/pg.py) holds rows of two clusters, alpha and beta. Most tests share one
such database, since they only read; those that migrate or prepare get their own. Roles are
shared by the whole server, so this module prepares a role of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import secrets
import time
from collections.abc import Iterator

import pytest
import sqlalchemy.exc
from alembic import command
from pytest_postgresql.janitor import DatabaseJanitor
from sqlalchemy import Engine, select, text

from echod.store.db import alembic_config, make_engine, upgrade
from echod.errors import StorageError
from echod.store.models import Base, Event
from echod.registry import Scope
from echod.sandbox import READABLE_TABLES, Sandbox, catalog_closed, prepare, sandbox_url
from echod.sandbox.roles import READABLE_VIEWS, tenant_credentials
from echod.sandbox.check import (MAX_SQL_CHARS, SqlFailed, SqlRefused, SqlScopedUnavailable,
                             SqlTimeout, SqlTooLarge, check_sql)
from echod.store.writer import write_batch

from .pg import url_of

EVERY = Scope(None)
ALPHA = Scope(frozenset({"alpha"}))
BETA = Scope(frozenset({"beta"}))
NONE = Scope(frozenset())
READ_ONLY = "25006"              # read_only_sql_transaction
DENIED = "42501"                 # insufficient_privilege
NO_SUCH_FUNCTION = "42883"
RUNS = "runs"                    # PostgreSQL runs the statement when the check is skipped
ROLE = "ingero_sql_test"        # roles are server-wide: this module's own, whoever else prepares
PASSWORD = secrets.token_urlsafe(24)


# -- fixtures and helpers ----------------------------------------------------------------------

def rows_of(cluster: str, now: float) -> dict:
    node = f"{cluster}-node01"
    events = [{"id": f"{node}:boot-{node}:{i}", "t": now - 60 + i, "kind": "collective",
               "node": node, "cluster": cluster, "boot_id": f"boot-{node}", "job": "4242",
               "attrs": {"op": "ncclAllReduce", "seq": 100 + i, "bytes": 4096 * (i + 1),
                         "duration_ns": 1500 + 100 * i, "rank": i, "stream": f"s{i}"}}
              for i in range(3)]
    scores = [{"t": now - 5, "cluster": cluster, "node": node, "job": "4242", "score": 0.9,
               "state": "active",
               "signals": {"throughput": 0.9, "compute": 0.8, "memory": 0.7, "cpu": 0.6}}]
    thresholds = [{"t": now - 5, "cluster": cluster, "cohort": "job:4242", "threshold": 0.61,
                   "median": 0.9, "mad": 0.05, "active": 8, "quorum_met": True,
                   "panic": False, "stragglers": [node]}]
    return {"events": events, "scores": scores, "thresholds": thresholds}


def seed(engine) -> None:
    now = time.time()
    for cluster in ("alpha", "beta"):
        assert write_batch(engine, rows_of(cluster, now)).stored == 5


def open_sandbox(engine, password: str = PASSWORD, **options) -> Sandbox:
    key = prepare(engine, ROLE, password)
    return Sandbox(sandbox_url(engine.url, ROLE, password), key, **options)


@contextlib.contextmanager
def seeded_database(migrated_proc, name: str) -> Iterator[Engine]:
    """A migrated database ``name`` with the two clusters' rows, dropped on leaving."""
    url = url_of(migrated_proc).set(database=name)
    with DatabaseJanitor(user=migrated_proc.user, host=migrated_proc.host,
                         port=migrated_proc.port, password=migrated_proc.password,
                         dbname=url.database, template_dbname=migrated_proc.template_dbname):
        engine = make_engine(url)
        seed(engine)
        yield engine
        engine.dispose()


@pytest.fixture(scope="module")
def seeded(migrated_proc):
    """One seeded database shared by the tests that only read (each escape attempt still
    checks that it changed nothing): a fresh database for each of them would cost most of
    this module's time."""
    with seeded_database(migrated_proc, "echod_sql_tests") as engine:
        yield engine


@pytest.fixture(scope="module")
def sandbox(seeded):
    box = open_sandbox(seeded, timeout_ms=5_000, row_cap=100, pool_size=2)
    yield box
    box.dispose()


def tenant_url(sandbox: Sandbox, scope: Scope):
    """The login of ``scope``'s tenant role, which the sandbox makes on first use."""
    sandbox.tenant(scope)
    return sandbox.url.set(**dict(zip(("username", "password"),
                                      tenant_credentials(ROLE, sandbox.key, scope))))


@pytest.fixture
def role_engine(sandbox):
    """A plain connection as the unscoped tenant's role, without the Sandbox's transaction
    set-up: an attacker who got past the lexical check and echod's own code."""
    raw = make_engine(tenant_url(sandbox, EVERY))
    yield raw
    raw.dispose()


def server_answer(sandbox: Sandbox, statement: str, scope: Scope = EVERY):
    """What PostgreSQL does with ``statement`` in the sandbox's transaction when the lexical
    check is skipped: the SQLSTATE of its refusal, or the rows."""
    with sandbox.reading(scope) as connection:
        try:
            result = connection.exec_driver_sql(statement)
        except sqlalchemy.exc.DBAPIError as exc:
            return exc.orig.sqlstate
        return result.all() if result.returns_rows else []


def fingerprint(engine) -> dict:
    """What an escape could change, as the owner sees it."""
    with engine.connect() as connection:
        state = {table: connection.scalar(text(
                     f"SELECT count(*) || ' ' || md5(coalesce(string_agg(r::text, ',' "
                     f"ORDER BY r::text), '')) FROM {table} AS r"))
                 for table in READABLE_TABLES}
        for name, query in {
                "relations": "SELECT array_agg(relname ORDER BY relname) FROM pg_class "
                             "WHERE relnamespace = 'public'::regnamespace",
                "row security": "SELECT array_agg(relname ORDER BY relname) FROM pg_class "
                                "WHERE relrowsecurity",
                "large objects": "SELECT count(*) FROM pg_largeobject_metadata",
                "advisory locks": "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'",
                "role": "SELECT row(rolsuper, rolcreatedb, rolcreaterole, rolbypassrls)::text "
                        f"FROM pg_roles WHERE rolname = '{ROLE}'"}.items():
            state[name] = connection.scalar(text(query))
    return state


# -- escape attempts ---------------------------------------------------------------------------

HUGE = "select 1 " + " " * MAX_SQL_CHARS

# (id, statement, the lexical check's reason, what PostgreSQL does with the check skipped: the
# SQLSTATE of its refusal, or RUNS where it runs the statement, and then the fingerprint shows
# that the rollback or the session reset after it contained it; tests/test_sandbox_tenancy.py
# shows that what runs cannot reach another tenant)
ESCAPES = [
    ("insert", "insert into event_rows (t, id, cluster, node, kind, attrs) "
               "values (now(), 'x', 'beta', 'n', 'k', '{}')",
     "writes are not allowed: INSERT", READ_ONLY),
    ("update", "update event_rows set node = 'evil'", "writes are not allowed: UPDATE", READ_ONLY),
    ("delete", "delete from event_rows", "writes are not allowed: DELETE", READ_ONLY),
    ("merge", "merge into nodes n using nodes m on n.name = m.name when matched then delete",
     "writes are not allowed: MERGE", READ_ONLY),
    ("truncate", "truncate event_rows", "writes are not allowed: TRUNCATE", READ_ONLY),
    ("create-table", "create table stolen (x int)", "schema changes are not allowed: CREATE",
     READ_ONLY),
    ("create-temp-table", "create temp table stolen (x int)",
     "schema changes are not allowed: CREATE", READ_ONLY),
    ("create-function", "create function f() returns int language sql as 'select 1'",
     "schema changes are not allowed: CREATE", READ_ONLY),
    ("create-extension", "create extension dblink", "schema changes are not allowed: CREATE",
     READ_ONLY),
    ("drop", "drop table event_rows", "schema changes are not allowed: DROP", READ_ONLY),
    ("alter-rls", "alter table event_rows disable row level security",
     "schema changes are not allowed: ALTER", READ_ONLY),
    ("grant", "grant select on sandbox_key to public", "schema changes are not allowed: GRANT",
     READ_ONLY),
    ("copy-to-file", "copy event_rows to '/tmp/stolen'", "writes are not allowed: COPY", DENIED),
    ("copy-from-file", "copy event_rows from '/etc/passwd'", "writes are not allowed: COPY", DENIED),
    ("copy-program", "copy (select 1) to program 'id'", "writes are not allowed: COPY", DENIED),
    ("read-file", "select pg_read_file('/etc/passwd')",
     "file access is not allowed: pg_read_file", DENIED),
    ("read-binary-file", "select pg_read_binary_file('/etc/passwd')",
     "file access is not allowed: pg_read_binary_file", DENIED),
    ("list-dir", "select pg_ls_dir('.')", "file access is not allowed: pg_ls_dir", DENIED),
    ("stat-file", "select pg_stat_file('/etc/passwd')",
     "file access is not allowed: pg_stat_file", DENIED),
    ("lo-import", "select lo_import('/etc/passwd')",
     "large objects are not allowed: lo_import", DENIED),
    ("lo-get", "select lo_get(1)", "large objects are not allowed: lo_get", DENIED),
    ("lo-open", "select lo_open(1, 262144)", "large objects are not allowed: lo_open", DENIED),
    ("lo-from-bytea", "select lo_from_bytea(0, 'x')",
     "large objects are not allowed: lo_from_bytea", DENIED),
    ("dblink", "select * from dblink('host=203.0.113.1', 'select 1') as t(x int)",
     "network access is not allowed: dblink", NO_SUCH_FUNCTION),
    ("two-statements", "select 1; delete from event_rows", "only one statement", READ_ONLY),
    ("statement-after-comment", "select 1 /* done */; delete from event_rows",
     "only one statement", READ_ONLY),
    ("payload-after-line-comment", "select 1 -- harmless\n, pg_read_file('/etc/passwd')",
     "file access is not allowed: pg_read_file", DENIED),
    ("line-comment-ends-at-cr", "select 1 -- harmless\r, pg_read_file('/etc/passwd')",
     "file access is not allowed: pg_read_file", DENIED),
    ("payload-after-nested-comment", "select 1 /* a /* b */ c */ ; delete from event_rows",
     "only one statement", READ_ONLY),
    ("string-then-statement", "select 'it''s'; delete from event_rows", "only one statement",
     READ_ONLY),
    ("backslash-ends-standard-string", "select '\\'; delete from event_rows; --'",
     "only one statement", READ_ONLY),
    ("escape-string-continued", "select E'a'\n'\\' ', pg_read_file('/etc/passwd') --'",
     "file access is not allowed: pg_read_file", DENIED),
    ("dollar-quote-closed-early", "select $a$x$a$, pg_read_file('/etc/passwd') --$a$",
     "file access is not allowed: pg_read_file", DENIED),
    ("quoted-set-config", "select \"set_config\"('role', 'postgres', false)",
     "settings may not be changed: set_config", DENIED),
    ("qualified-quoted-read-file", "select pg_catalog.\"pg_read_file\"('/etc/passwd')",
     "file access is not allowed: pg_read_file", DENIED),
    ("unicode-escaped-name", "select U&\"\\0073et_config\"('role', 'postgres', false)",
     "Unicode escapes", DENIED),
    ("unicode-escaped-string", "select U&'\\0027'", "Unicode escapes", RUNS),
    ("data-modifying-cte", "with d as (delete from event_rows returning *) select count(*) from d",
     "writes are not allowed: DELETE", READ_ONLY),
    ("select-into", "select * into stolen from event_rows", "writes are not allowed: INTO",
     READ_ONLY),
    ("for-update", "select * from event_rows for update", "row locks are not allowed: FOR UPDATE",
     READ_ONLY),
    ("for-key-share", "select * from nodes for key share", "row locks are not allowed: FOR KEY",
     READ_ONLY),
    ("set-role", "set role postgres", "not allowed: SET", DENIED),
    ("set-session-authorization", "set session authorization postgres", "not allowed: SET",
     DENIED),
    ("set-config-role", "select set_config('role', 'postgres', false)",
     "settings may not be changed: set_config", DENIED),
    ("set-config-scope", "select set_config('ingero.scope', 'forged', true)",
     "settings may not be changed: set_config", RUNS),
    ("read-write-again", "set transaction read write", "not allowed: SET", "25001"),
    ("reset-role", "reset role", "not allowed: RESET", RUNS),
    ("advisory-lock", "select pg_advisory_lock(42)", "locks are not allowed: pg_advisory_lock",
     DENIED),
    ("nextval", "select nextval('peer_lag_id_seq')", "sequences are not allowed: nextval",
     DENIED),
    ("explain-analyze-delete", "explain analyze delete from event_rows",
     "writes are not allowed: DELETE", READ_ONLY),
    ("sql-in-a-string", "select query_to_xml('delete from event_rows', true, false, '')",
     "SQL inside strings is not allowed: query_to_xml", DENIED),
    ("notify", "select pg_notify('ingero', 'x')",
     "other sessions are out of reach: pg_notify", DENIED),
    ("other-sessions", "select query from pg_stat_activity",
     "other sessions are out of reach: pg_stat_activity", DENIED),
    ("terminate", "select pg_terminate_backend(1)",
     "other sessions are out of reach: pg_terminate_backend", DENIED),
    ("do-block", "do $$ begin delete from event_rows; end $$", "not allowed: DO", READ_ONLY),
    ("prepare", "prepare p as select 1", "not allowed: PREPARE", RUNS),
    ("vacuum", "vacuum event_rows", "maintenance commands are not allowed: VACUUM", "25001"),
    ("analyze", "analyze event_rows", "must begin with SELECT", RUNS),
    ("number-glued-to-keyword", "select 1delete from event_rows",
     "writes are not allowed: DELETE", "42601"),
    ("huge", HUGE, f"longer than {MAX_SQL_CHARS} characters", RUNS),
    ("unterminated-string", "select 'abc", "unterminated string", "42601"),
    ("unterminated-comment", "select 1 /* /* */", "unterminated /* comment", "42601"),
    ("unterminated-dollar-quote", "select $x$ abc $y$", "unterminated dollar-quoted string",
     "42601"),
    ("unbalanced-close", "select 1) union (select 2", "unbalanced parentheses", "42601"),
    ("stray-backslash", "select 1 \\g", "unexpected character", "42601"),
]


@pytest.mark.parametrize("statement, reason, server",
                         [pytest.param(*case[1:], id=case[0]) for case in ESCAPES])
def test_escape_is_refused_by_the_check_and_refused_or_contained_by_postgresql(
        sandbox, seeded, statement, reason, server):
    before = fingerprint(seeded)
    with pytest.raises(SqlRefused, match=re.escape(reason)):
        sandbox.run(statement, EVERY)
    answer = server_answer(sandbox, statement)
    if server == RUNS:
        assert isinstance(answer, list)
    else:
        assert answer == server
    assert fingerprint(seeded) == before


def test_the_escape_list_is_long_enough():
    assert len(ESCAPES) >= 40


@pytest.mark.parametrize("statement, expected", [
    ("select 1 -- delete from events", [[1]]),
    ("select 1 /* drop table events; */", [[1]]),
    ("select 1 /* outer /* inner */ delete from events; */", [[1]]),
    ("select 'a;b', 'DROP TABLE events'", [["a;b", "DROP TABLE events"]]),
    ("select $$; delete from events$$", [["; delete from events"]]),
    ("select $a$ $$ delete $$ $a$", [[" $$ delete $$ "]]),
    ("select E'it\\'s; delete'", [["it's; delete"]]),
    ("select 'x'\n'y'", [["xy"]]),
    ("select 1 as \"delete\";", [[1]]),
    ("select 1; -- trailing", [[1]]),
    ("(select 1) union (select 2) order by 1", [[1], [2]]),
    ("select 5 % 3, 'a:b'::text, x'1F'::int", [[2, "a:b", 31]]),
], ids=lambda value: value if isinstance(value, str) else "")
def test_harmless_text_that_looks_dangerous_passes(sandbox, statement, expected):
    assert sandbox.run(statement, EVERY).rows == expected


def test_partitions_the_version_table_and_the_key_are_not_readable(sandbox, seeded):
    with seeded.connect() as connection:
        partition = connection.scalar(text(
            "SELECT min(c.relname) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'event_rows'::regclass"))
    for table in (partition, "alembic_version", "sandbox_key"):
        assert check_sql(f"select * from {table}") == f"select * from {table}"
        with pytest.raises(SqlRefused, match=f"permission denied for table {table}"):
            sandbox.run(f"select * from {table}", EVERY)


def test_large_objects_of_the_owner_are_unreadable_past_the_check(sandbox, seeded):
    with seeded.begin() as connection:
        oid = connection.scalar(text("SELECT lo_from_bytea(0, 'secret')"))
    try:
        assert server_answer(sandbox, f"select lo_get({oid})") == DENIED
        assert server_answer(sandbox, f"select lo_open({oid}, 262144)") == DENIED
    finally:
        with seeded.begin() as connection:
            connection.execute(text("SELECT lo_unlink(:oid)"), {"oid": oid})


def test_settings_of_the_server_are_refused_by_postgresql(sandbox):
    with pytest.raises(SqlRefused, match="pg_read_all_settings"):
        sandbox.run("select current_setting('data_directory')", EVERY)


def test_external_xml_entities_read_no_file(sandbox):
    result = sandbox.run("select xmlparse(document '<!DOCTYPE x SYSTEM \"/etc/passwd\">"
                         "<x>&x;</x>')::text", EVERY)
    assert "root:" not in json.dumps(result.rows)


def test_column_statistics_of_other_tenants_stay_hidden(sandbox, seeded):
    with seeded.begin() as connection:
        connection.exec_driver_sql("ANALYZE events, health_scores")
        assert connection.scalar(text(
            "SELECT count(*) FROM pg_stats WHERE tablename = 'health_scores'")) > 0
    assert sandbox.run("select attname, most_common_vals::text from pg_stats "
                       "where tablename in ('events', 'health_scores')", ALPHA).rows == []


def test_a_long_sleep_is_cut_at_the_timeout(sandbox):
    started = time.monotonic()
    with pytest.raises(SqlTimeout, match="ran past the 500 ms limit"):
        sandbox.run("select pg_sleep(5)", EVERY, timeout_ms=500)
    assert time.monotonic() - started < 1.5
    assert sandbox.run("select 1", EVERY).rows == [[1]]      # the pooled connection is fine


def test_rows_past_the_cap_are_cut_and_marked(sandbox):
    result = sandbox.run("select generate_series(1, 1000000)", EVERY)
    assert result.truncated is True
    assert len(result.rows) == 100 and result.rows[-1] == [100]
    assert sandbox.run("select generate_series(1, 100)", EVERY).truncated is False


def test_fetching_stops_at_the_byte_cap_not_after_the_row_cap(seeded):
    """10,000 rows of 10 kB are 100 MB; with a 1 MB cap the sandbox stops after the fetch that
    passes it, having fetched a few hundred rows, and says why (the API answers 422)."""
    box = open_sandbox(seeded, row_cap=10_000, pool_size=1, byte_cap=1 << 20)
    try:
        with pytest.raises(SqlTooLarge, match="over 1048576 bytes"):
            box.run("select repeat('x', 10000) from generate_series(1, 10000)", EVERY)
        done = box.run("select repeat('x', 1000) from generate_series(1, 500)", EVERY)
        assert len(done.rows) == 500 and not done.truncated
    finally:
        box.dispose()


def test_where_the_catalog_stays_open_scoped_sql_is_refused_and_unscoped_runs(seeded):
    """A non-superuser echod role cannot close the catalog; by default the sandbox then serves
    no SQL to scoped tokens (403), only to unscoped ones."""
    with seeded.begin() as c:
        c.exec_driver_sql("DROP ROLE IF EXISTS echod_plain")
        c.exec_driver_sql("CREATE ROLE echod_plain LOGIN PASSWORD 'plain'")
    plain = make_engine(seeded.url.set(username="echod_plain", password="plain"))
    try:
        assert catalog_closed(seeded) and not catalog_closed(plain)
    finally:
        plain.dispose()
        with seeded.begin() as c:
            c.exec_driver_sql("DROP ROLE echod_plain")
    box = open_sandbox(seeded, pool_size=1, scoped=False)
    try:
        with pytest.raises(SqlScopedUnavailable, match="sql-scoped-without-closed-catalog"):
            box.run("select 1", ALPHA)
        assert box.run("select 1", EVERY).rows == [[1]]
    finally:
        box.dispose()


def test_a_caller_may_lower_the_operators_limits_but_not_raise_them(sandbox):
    assert len(sandbox.run("select generate_series(1, 1000)", EVERY, row_cap=40).rows) == 40
    assert len(sandbox.run("select generate_series(1, 1000)", EVERY, row_cap=10**6).rows) == 100
    with sandbox.reading(EVERY, timeout_ms=60_000) as connection:
        assert connection.scalar(text("SHOW statement_timeout")) == "5s"


def test_what_a_statement_leaves_in_the_session_is_gone_for_the_next_caller(seeded):
    single = open_sandbox(seeded, pool_size=1)
    try:
        with single.reading(BETA) as connection:
            pid = connection.scalar(text("SELECT pg_backend_pid()"))
            connection.exec_driver_sql("PREPARE leftover AS SELECT 1")
            connection.exec_driver_sql("SELECT set_config('work_mem', '1MB', false)")
        with single.reading(BETA) as connection:        # the next caller of the same tenant
            assert connection.scalar(text("SELECT pg_backend_pid()")) == pid
            assert connection.scalar(text("SELECT count(*) FROM pg_prepared_statements")) == 0
            assert connection.scalar(text("SHOW work_mem")) == "16MB"
    finally:
        single.dispose()


# -- the role ----------------------------------------------------------------------------------

def test_the_tenant_role_is_nobody_special(sandbox):
    tenant, _ = tenant_credentials(ROLE, sandbox.key, EVERY)
    who = sandbox.run(
        "select current_user, session_user, r.rolsuper, r.rolbypassrls, r.rolcreaterole, "
        "(select count(*) from pg_auth_members m where m.member = r.oid), "
        "pg_has_role(current_user, 'pg_read_server_files', 'member'), "
        "pg_has_role(current_user, 'pg_execute_server_program', 'member'), "
        "pg_has_role(current_user, 'pg_read_all_stats', 'member'), "
        "pg_has_role(current_user, 'pg_signal_backend', 'member') "
        "from pg_roles r where r.rolname = current_user", EVERY)
    assert who.rows == [[tenant, tenant, False, False, False, 0, False, False, False, False]]
    with sandbox.reading(EVERY) as connection:
        connection.exec_driver_sql("RESET ROLE")
        assert connection.scalar(text("SELECT current_user")) == tenant


def test_tenants_may_select_the_ingero_tables_and_the_gate_nothing(sandbox, seeded):
    tenants = [tenant_credentials(ROLE, sandbox.key, scope)[0] for scope in (ALPHA, EVERY)]
    for scope in (ALPHA, EVERY):
        sandbox.tenant(scope)
    with seeded.connect() as connection:
        granted = connection.execute(text(
            "SELECT grantee, table_name, privilege_type FROM information_schema.role_table_grants "
            "WHERE grantee = ANY(:roles) ORDER BY 1, 2"), {"roles": [ROLE, *tenants]}).all()
        callers = connection.scalar(text(
            "SELECT array_agg(a.grantee::regrole::text ORDER BY 1) FROM pg_proc p, "
            "aclexplode(p.proacl) a WHERE p.proname = 'ingero_sandbox_tenant' "
            "AND a.grantee <> p.proowner"))
    assert granted == [(tenant, table, "SELECT") for tenant in sorted(tenants)
                       for table in sorted(READABLE_TABLES + READABLE_VIEWS)]
    assert callers == [ROLE]


def test_the_transaction_is_read_only_with_the_timeout_set(sandbox):
    with sandbox.reading(ALPHA, timeout_ms=1234) as connection:
        assert connection.scalar(text("SHOW transaction_read_only")) == "on"
        assert connection.scalar(text("SHOW statement_timeout")) == "1234ms"
        assert connection.scalar(text("SHOW idle_in_transaction_session_timeout")) == "1234ms"


def test_a_reading_sees_one_snapshot_whatever_is_stored_meanwhile(migrated_proc):
    """Every statement of a tool's answer reads the store as it was when the first ran: a
    verdict stored between find_stragglers' read of the ranks fleetd named and its read of
    the verdicts listed the verdict in the answer and left its rank no straggler (bench
    quality, late-node, poll 1: four ranks)."""
    with seeded_database(migrated_proc, "echod_sql_snapshot") as engine:
        sandbox = open_sandbox(engine)
        count = text("SELECT count(*) FROM health_scores")
        try:
            with sandbox.reading(EVERY) as connection:
                before = connection.scalar(count)
                assert write_batch(engine, {"scores": rows_of("alpha", time.time())[
                    "scores"]}).stored == 1
                assert connection.scalar(count) == before
                assert connection.scalar(text("SHOW transaction_isolation")) == \
                    "repeatable read"
            with sandbox.reading(EVERY) as connection:
                assert connection.scalar(count) == before + 1
        finally:
            sandbox.dispose()


def test_prepare_again_changes_only_the_password(engine):
    first = open_sandbox(engine)
    new_password = secrets.token_urlsafe(24)
    try:
        assert first.run("select 1", EVERY).rows == [[1]]
        first.dispose()
        key = prepare(engine, ROLE, new_password)
        assert key == first.key
        stale = Sandbox(sandbox_url(engine.url, ROLE, PASSWORD), key)
        fresh = Sandbox(sandbox_url(engine.url, ROLE, new_password), key)
        with pytest.raises(sqlalchemy.exc.OperationalError, match="password authentication"):
            stale.run("select 1", EVERY)
        assert fresh.run("select 1", EVERY).rows == [[1]]
        stale.dispose()
        fresh.dispose()
    finally:
        prepare(engine, ROLE, PASSWORD)
    with engine.connect() as connection:
        defaults = connection.scalar(text(
            "SELECT setconfig FROM pg_db_role_setting WHERE setrole = CAST(:r AS regrole) "
            "AND setdatabase = 0"), {"r": ROLE})
    assert "default_transaction_read_only=on" in defaults
    assert "temp_file_limit=1GB" in defaults


def test_prepare_refuses_odd_names_and_privileged_roles(engine):
    for name in ("Ingero", "ingero sql", 'x"; drop role postgres; --', "postgres"):
        with pytest.raises(StorageError):
            prepare(engine, name, PASSWORD)
    with engine.begin() as connection:
        connection.exec_driver_sql("DROP ROLE IF EXISTS ingero_sql_creator")
        connection.exec_driver_sql("CREATE ROLE ingero_sql_creator LOGIN CREATEDB")
    try:
        with pytest.raises(StorageError, match="has role attributes beyond LOGIN"):
            prepare(engine, "ingero_sql_creator", PASSWORD)
    finally:
        with engine.begin() as connection:
            connection.exec_driver_sql("DROP ROLE ingero_sql_creator")


def test_the_sandbox_refuses_the_owner_as_gate_and_tenants_that_bypass_rls(engine):
    box = open_sandbox(engine)
    owner = Sandbox(engine.url, box.key)
    tenant, _ = tenant_credentials(ROLE, box.key, EVERY)
    try:
        with pytest.raises(StorageError, match="cannot make the tenant role postgres_"):
            owner.run("select 1", EVERY)
        box.tenant(EVERY)
        with engine.begin() as connection:
            connection.exec_driver_sql(f"ALTER ROLE {tenant} BYPASSRLS")
        with pytest.raises(StorageError, match="row-level security does not apply"):
            box.run("select 1", EVERY)
        box.dispose()
        with pytest.raises(StorageError, match="holds more than it may"):
            box.run("select 1", EVERY)
    finally:
        with engine.begin() as connection:
            connection.exec_driver_sql(f"ALTER ROLE {tenant} NOBYPASSRLS")
        owner.dispose()
        box.dispose()


# -- tenancy -----------------------------------------------------------------------------------

@pytest.mark.parametrize("table", ["events", "health_scores", "thresholds", "nodes"])
def test_a_scoped_caller_sees_only_its_clusters_whatever_it_asks(sandbox, table):
    for where, seen in (("", [["alpha"]]), ("where cluster = 'beta'", []),
                        ("where cluster = 'beta' or true", [["alpha"]]),
                        ("where cluster <> 'alpha'", [])):
        query = f"select distinct cluster from {table} {where} order by 1"
        assert sandbox.run(query, ALPHA).rows == seen, query
    assert sandbox.run(f"select distinct cluster from {table} order by 1",
                       EVERY).rows == [["alpha"], ["beta"]]
    assert sandbox.run(f"select count(*) from {table}", NONE).rows == [[0]]


def test_tools_reading_through_the_sandbox_are_scoped_too(sandbox):
    with sandbox.reading(BETA) as connection:
        assert set(connection.scalars(select(Event.cluster))) == {"beta"}


def test_a_star_is_not_a_cluster_name(sandbox):
    with pytest.raises(ValueError):
        sandbox.run("select 1", Scope(frozenset({"*"})))


def test_the_policy_asks_for_the_scope_once_per_query(sandbox):
    # InitPlans run once per query; the user's jobs (migration 0012) are one hashed SubPlan,
    # made once, and only where the claim names a user (the OR stops at a token's NULL)
    for relation, tables in (("event_rows", 1), ("events", 2), ("nodes", 1), ("thresholds", 1)):
        plan = "\n".join(row[0] for row in server_answer(
            sandbox, f"explain select * from {relation}", ALPHA))
        filters = [line for line in plan.splitlines() if "Filter:" in line]
        assert plan.count("InitPlan") >= 2 * tables, plan
        assert all(line.count("SubPlan") == line.count("hashed SubPlan") for line in filters), \
            plan


def test_a_user_reads_no_row_of_a_job_not_theirs_nor_of_no_job(sandbox):
    assert server_answer(sandbox, "select count(*) from events", EVERY) == [(6,)]
    stranger = Scope(None, user="ingero-nobody")
    for table in (*READABLE_TABLES, "events"):
        assert server_answer(sandbox, f"select count(*) from {table}", stranger) == [(0,)], table


def test_every_table_with_a_cluster_column_is_under_row_level_security(seeded):
    tenant_tables = sorted(t.name for t in Base.metadata.tables.values() if "cluster" in t.c)
    assert tenant_tables == sorted(READABLE_TABLES)
    with seeded.connect() as connection:
        guarded = connection.execute(text(
            "SELECT c.relname FROM pg_class c JOIN pg_policies p ON p.tablename = c.relname "
            "WHERE c.relrowsecurity AND p.policyname = 'tenant_read' AND p.cmd = 'SELECT' "
            "ORDER BY 1")).scalars().all()
    assert guarded == tenant_tables
    with seeded.connect() as connection:
        owned = connection.execute(text(
            "SELECT tablename FROM pg_policies WHERE policyname = 'own_jobs' AND cmd = 'SELECT' "
            "AND permissive = 'RESTRICTIVE' ORDER BY 1")).scalars().all()
    assert owned == tenant_tables


def test_the_scope_never_shows_in_statement_text(sandbox, seeded):
    with sandbox.reading(ALPHA) as connection:
        with seeded.connect() as owner:
            seen = owner.execute(text(
                "SELECT query FROM pg_stat_activity WHERE application_name = 'echod-sql' "
                "AND state = 'idle in transaction'")).scalars().all()
        signed = connection.scalar(text("SELECT current_setting('ingero.scope')"))
    assert any("set_config('ingero.scope'" in query for query in seen)
    assert not any(signed.split(".")[0] in query for query in seen)


def scope_value(key: str, clusters, pid: int, started: str) -> str:
    body = json.dumps({"clusters": clusters, "pid": pid, "t": started}, separators=(",", ":"))
    return hashlib.sha256(f"{key}.{body}".encode()).hexdigest() + "." + body


def visible(connection) -> tuple[list, int]:
    return (connection.scalar(text("SELECT ingero_scope()")),
            connection.scalar(text("SELECT count(*) FROM events")))


def set_scope(connection, value: str) -> None:
    connection.execute(text("SELECT set_config('ingero.scope', :v, true)"), {"v": value})


def test_a_scope_signed_here_and_now_opens_its_clusters(role_engine, sandbox):
    with role_engine.connect() as connection:
        pid, started = connection.execute(text("SELECT pg_backend_pid(), now()::text")).one()
        set_scope(connection, scope_value(sandbox.key, ["alpha"], pid, started))
        assert visible(connection) == (["alpha"], 3)


def test_without_a_scope_the_role_sees_nothing(role_engine):
    with role_engine.connect() as connection:
        assert visible(connection) == ([], 0)


def test_a_forged_scope_opens_nothing(role_engine, sandbox):
    with role_engine.connect() as connection:
        pid, started = connection.execute(text("SELECT pg_backend_pid(), now()::text")).one()
        body = json.dumps({"clusters": ["*"], "pid": pid, "t": started})
        for forged in (f"{'0' * 64}.{body}", body, "*", "",
                       scope_value("not the key", ["*"], pid, started),
                       scope_value(sandbox.key, ["*"], pid, started) + " ",
                       scope_value(sandbox.key, ["*"], pid, started)[1:]):
            set_scope(connection, forged)
            assert visible(connection) == ([], 0), forged


def test_a_scope_replayed_from_another_backend_opens_nothing(role_engine, sandbox):
    with sandbox.reading(EVERY) as victim:
        stolen = victim.scalar(text("SELECT current_setting('ingero.scope')"))
        assert visible(victim) == (["*"], 6)
        with role_engine.connect() as attacker:
            set_scope(attacker, stolen)
            assert visible(attacker) == ([], 0)
    with sandbox.reading(ALPHA) as connection:        # even inside echod's own transaction
        set_scope(connection, stolen)
        assert visible(connection) == ([], 0)


def test_a_scope_replayed_in_a_later_transaction_opens_nothing(role_engine, sandbox):
    with role_engine.connect() as connection:
        pid, started = connection.execute(text("SELECT pg_backend_pid(), now()::text")).one()
        value = scope_value(sandbox.key, ["*"], pid, started)
        set_scope(connection, value)
        assert visible(connection) == (["*"], 6)
        connection.rollback()
        set_scope(connection, value)
        assert visible(connection) == ([], 0)


# -- errors and values -------------------------------------------------------------------------

def test_errors_in_the_statement_are_the_callers(sandbox):
    with pytest.raises(SqlFailed, match="division by zero"):
        sandbox.run("select 1 / 0", EVERY)
    with pytest.raises(SqlFailed, match="syntax error"):
        sandbox.run("select from where", EVERY)
    with pytest.raises(SqlFailed, match="does not exist"):
        sandbox.run("select * from no_such_table", EVERY)
    assert (SqlFailed.status, SqlFailed.code, SqlRefused.code, SqlTimeout.code) == (
        400, "sql_error", "sql_refused", "sql_timeout")


def test_a_database_that_cannot_be_reached_is_not_the_callers_fault(seeded, sandbox):
    wrong = Sandbox(sandbox_url(seeded.url, ROLE, "wrong password"), sandbox.key)
    try:
        with pytest.raises(sqlalchemy.exc.OperationalError):
            wrong.run("select 1", EVERY)
    finally:
        wrong.dispose()


def test_values_come_back_ready_for_json(sandbox):
    result = sandbox.run(
        "select timestamptz '2025-03-01 12:00:00+00' as t, date '2025-03-01' as d, "
        "1.5::numeric as half, 12345678901234567890::numeric as big, 'NaN'::float8 as nan, "
        "'\\x01ff'::bytea as raw, '00000000-0000-0000-0000-000000000001'::uuid as id, "
        "interval '90 seconds' as span, '{\"a\": [1, 2]}'::jsonb as doc, "
        "array['x', 'y'] as list, inet '10.0.0.1' as addr", EVERY)
    assert result.columns == ["t", "d", "half", "big", "nan", "raw", "id", "span", "doc",
                              "list", "addr"]
    assert result.rows == [["2025-03-01T12:00:00+00:00", "2025-03-01", 1.5,
                            12345678901234567890, "NaN", "01ff",
                            "00000000-0000-0000-0000-000000000001", 90.0, {"a": [1, 2]},
                            ["x", "y"], "10.0.0.1"]]
    json.dumps(result.rows, allow_nan=False)
    empty = sandbox.run("select cluster, node from events where false", EVERY)
    assert (empty.columns, empty.rows, empty.truncated) == (["cluster", "node"], [], False)
    assert empty.elapsed_ms > 0


ANALYSIS = """
-- how late each rank enters its collectives, per node
WITH calls AS (
    SELECT e.node, e.rank, e.t, e.duration_ns,
           e.attrs->>'stream' AS stream,
           (e.attrs->>'nranks')::int AS nranks,
           lag(e.t) OVER (PARTITION BY e.node ORDER BY e.seq) AS previous_t
    FROM events AS e
    WHERE e.kind = 'collective' AND e.op = 'ncclAllReduce'
      AND e.t > now() - interval '1 hour'
), per_node AS (
    SELECT node, count(*) AS calls,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ns) AS median_ns,
           max(extract(epoch FROM t - previous_t)) AS longest_gap_s
    FROM calls GROUP BY node
)
SELECT node, calls, median_ns, longest_gap_s,
       rank() OVER (ORDER BY median_ns DESC) AS slowest,
       coalesce((SELECT jsonb_agg(DISTINCT c.stream) FROM calls c
                 WHERE c.node = per_node.node), '[]'::jsonb) AS streams
FROM per_node
ORDER BY slowest
LIMIT 20;
"""


def test_a_realistic_analysis_query_passes_and_runs_in_scope(sandbox):
    assert check_sql(ANALYSIS) == ANALYSIS.strip().rstrip(";")
    result = sandbox.run(ANALYSIS, ALPHA)
    assert result.columns == ["node", "calls", "median_ns", "longest_gap_s", "slowest",
                              "streams"]
    assert [row[:3] for row in result.rows] == [["alpha-node01", 3, 1600.0]]
    assert result.rows[0][5] == ["s0", "s1", "s2"]


# -- the migration -----------------------------------------------------------------------------

def test_the_sandbox_migration_goes_down_and_up_again(engine):
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0001")
    with engine.connect() as connection:
        assert connection.scalar(text("SELECT to_regclass('sandbox_key')")) is None
        assert connection.scalar(text("SELECT count(*) FROM pg_class WHERE relrowsecurity")) == 0
        assert connection.scalar(text("SELECT to_regproc('ingero_scope')")) is None
    upgrade(engine)
    with engine.connect() as connection:
        assert len(connection.scalar(text("SELECT key FROM sandbox_key"))) == 64
        assert connection.scalar(text(
            "SELECT count(*) FROM pg_policies WHERE policyname = 'tenant_read'")) == len(
                READABLE_TABLES)
        assert connection.scalar(text(
            "SELECT p.proowner = c.relowner AND p.prosecdef FROM pg_proc p, pg_class c "
            "WHERE p.proname = 'ingero_scope' AND c.relname = 'sandbox_key'")) is True
