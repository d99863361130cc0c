"""Tenants kept apart by PostgreSQL itself, not only by the lexical check.

Tenant beta holds a long statement open in a thread while tenant alpha, from a transaction of
the sandbox with the lexical check skipped (``Sandbox.reading``: what a gap in the check's word
lists would let through), tries to read beta's query text, count its sessions or rows, and
cancel or terminate it. PostgreSQL must refuse each attempt or show alpha's rows only, and
beta's statement must still be running afterwards. Each attempt is also sent through the
check (``Sandbox.run``), which must refuse it or answer the same.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass

import pytest
import sqlalchemy.exc
from sqlalchemy import text

from echod.store.db import make_engine
from echod.registry import Scope
from echod.sandbox import Sandbox, prepare, sandbox_url
from echod.sandbox.roles import TENANT_FUNCTION, tenant_credentials
from echod.sandbox.check import SCOPED_EXPLAIN, SqlRefused

from .test_echod_sql import seeded_database

ROLE = "ingero_sql_tenancy"
PASSWORD = "tenancy-test-password"
EVERY = Scope(None)
ALPHA = Scope(frozenset({"alpha"}))
BETA = Scope(frozenset({"beta"}))
DENIED = "42501"                          # insufficient_privilege
CANCELLED = "57014"                       # query_canceled
MARKER = "beta-secret-7f3a"
BUSY_SQL = f"select pg_sleep(100), '{MARKER}' as marker"


@pytest.fixture(scope="module")
def seeded(migrated_proc):
    with seeded_database(migrated_proc, "echod_tenancy_tests") as engine:
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE")      # statistics there to be stolen
        yield engine


def open_sandbox(engine, **options) -> Sandbox:
    key = prepare(engine, ROLE, PASSWORD)
    return Sandbox(sandbox_url(engine.url, ROLE, PASSWORD), key, **options)


@pytest.fixture(scope="module")
def sandbox(seeded):
    box = open_sandbox(seeded, timeout_ms=120_000, pool_size=2)
    yield box
    box.dispose()


@dataclass
class Busy:
    """Tenant beta's statement, running in its own thread and backend."""

    owner: object
    pid: int
    role: str
    started: object
    outcome: list

    def alive(self) -> bool:
        with self.owner.connect() as connection:
            return connection.scalar(text(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid AND state = 'active' "
                "AND query_start = :started AND query LIKE '%' || :marker || '%'"),
                {"pid": self.pid, "started": self.started, "marker": MARKER}) == 1


def wait_for_statement(owner, role: str, outcome: list) -> tuple[int, str, object]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not outcome:
        with owner.connect() as connection:
            found = connection.execute(text(
                "SELECT pid, usename, query_start FROM pg_stat_activity "
                "WHERE state = 'active' AND usename = :role"), {"role": role}).all()
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"beta's statement did not start: {outcome}")


@pytest.fixture(scope="module")
def busy(seeded, sandbox):
    outcome: list = []

    def beta():
        """As a tool reads (the API's SQL shows only FETCH from its cursor): the statement's
        text, with its secret, is what pg_stat_activity would show."""
        try:
            with sandbox.reading(BETA) as connection:
                outcome.append(connection.exec_driver_sql(BUSY_SQL).all())
        except sqlalchemy.exc.DBAPIError as exc:   # kept for the teardown's assertion
            outcome.append(exc.orig.sqlstate)

    thread = threading.Thread(target=beta, daemon=True)
    thread.start()
    beta_role, _ = tenant_credentials(ROLE, sandbox.key, BETA)
    held = Busy(seeded, *wait_for_statement(seeded, beta_role, outcome), outcome)
    yield held
    with seeded.connect() as connection:
        connection.execute(text("SELECT pg_cancel_backend(:pid)"), {"pid": held.pid})
    thread.join(10)
    assert outcome == [CANCELLED]


def as_tenant(sandbox: Sandbox, statement: str, scope: Scope = ALPHA):
    """What PostgreSQL does with ``statement`` as ``scope``'s tenant, the check skipped: the
    SQLSTATE of its refusal, or the rows."""
    with sandbox.reading(scope) as connection:
        try:
            result = connection.exec_driver_sql(statement.replace("%", "%%"))
        except sqlalchemy.exc.DBAPIError as exc:
            return exc.orig.sqlstate
        return [tuple(row) for row in result.all()] if result.returns_rows else []


# -- escape attempts ---------------------------------------------------------------------------

# (id, statement with {pid} and {role} of beta's session, what PostgreSQL answers tenant alpha:
# the SQLSTATE of its refusal or the rows)
ATTACKS = [
    # beta's sessions: their query text, their number, cancelling and terminating them
    ("activity-query", "select query from pg_stat_activity where pid = {pid}", DENIED),
    ("activity-count", "select count(*) from pg_stat_activity where usename <> current_user",
     DENIED),
    ("activity-qualified", "select query from pg_catalog.pg_stat_activity", DENIED),
    ("get-activity", "select query from pg_stat_get_activity({pid})", DENIED),
    ("get-activity-all", "select count(*) from pg_stat_get_activity(null)", DENIED),
    ("backend-idset", "select count(*) from pg_stat_get_backend_idset()", DENIED),
    ("backend-activity", "select pg_stat_get_backend_activity(b) "
                         "from pg_stat_get_backend_idset() b", DENIED),
    ("backend-pid", "select pg_stat_get_backend_pid(1)", DENIED),
    ("backend-userid", "select pg_stat_get_backend_userid(1)::regrole", DENIED),
    ("database-backends", "select numbackends from pg_stat_database", DENIED),
    ("database-backends-fn", "select pg_stat_get_db_numbackends(oid) from pg_database", DENIED),
    ("cancel", "select pg_cancel_backend({pid})", DENIED),
    ("terminate", "select pg_terminate_backend({pid})", DENIED),
    ("terminate-with-timeout", "select pg_terminate_backend({pid}, 100)", DENIED),
    ("quoted-terminate", 'select pg_catalog."pg_terminate_backend"({pid})', DENIED),
    ("cancel-in-query-to-xml",
     "select query_to_xml('select pg_cancel_backend({pid})', true, false, '')", DENIED),
    ("terminate-in-ts-stat",
     "select ts_stat('select to_tsvector(pg_terminate_backend({pid})::text)')", DENIED),
    ("activity-in-xml-and-schema", "select query_to_xml_and_xmlschema("
     "'select query from pg_stat_activity', true, false, '')", DENIED),
    ("activity-in-ts-rewrite", "select ts_rewrite('a'::tsquery, 'select to_tsquery(''simple'', "
     "''a''), plainto_tsquery(''simple'', query) from pg_stat_activity')", DENIED),
    ("activity-in-xpath", "select xpath('//query/text()', query_to_xml("
     "'select query from pg_stat_activity', true, false, ''))", DENIED),
    ("cursor-to-xml", "select cursor_to_xml('c', 1, true, false, '')", DENIED),
    ("locks", "select pid, relation from pg_locks", DENIED),
    ("lock-status", "select count(*) from pg_lock_status()", DENIED),
    ("blocking-pids", "select pg_blocking_pids({pid})", DENIED),
    ("set-role-to-beta", "set role {role}", DENIED),
    ("set-config-role-to-beta", "select set_config('role', '{role}', true)", DENIED),
    ("session-authorization-beta", "set session authorization {role}", DENIED),
    ("progress", "select count(*) from pg_stat_progress_vacuum", DENIED),
    ("ssl", "select pid from pg_stat_ssl", DENIED),
    ("notify-beta", "select pg_notify('beta', 'x')", DENIED),
    ("advisory-probe", "select pg_try_advisory_lock(1)", DENIED),
    # beta's rows: their number, sizes and statistics
    ("count", "select count(*) from events", [(3,)]),
    ("count-beta", "select count(*) from events where cluster = 'beta'", [(0,)]),
    ("or-true", "select array_agg(distinct cluster) from health_scores "
                "where cluster = 'beta' or true", [(["alpha"],)]),
    ("reltuples", "select reltuples from pg_class where relname = 'events'", DENIED),
    ("relpages", "select relpages, relallvisible from pg_catalog.pg_class", DENIED),
    ("pg-class-star", "select * from pg_class where relname = 'health_scores'", DENIED),
    ("relation-size", "select pg_relation_size('events')", DENIED),
    ("total-relation-size", "select pg_total_relation_size('health_scores')", DENIED),
    ("table-size", "select pg_table_size('thresholds')", DENIED),
    ("indexes-size", "select pg_indexes_size('events')", DENIED),
    ("database-size", "select pg_database_size(current_database())", DENIED),
    ("live-tuples", "select n_live_tup from pg_stat_user_tables "
                    "where relname = 'health_scores'", DENIED),
    ("inserted", "select n_tup_ins from pg_stat_all_tables", DENIED),
    ("inserted-in-transaction", "select n_tup_ins from pg_stat_xact_user_tables", DENIED),
    ("blocks", "select heap_blks_read from pg_statio_user_tables", DENIED),
    ("index-reads", "select idx_tup_read from pg_stat_user_indexes", DENIED),
    ("live-tuples-fn", "select pg_stat_get_live_tuples('health_scores'::regclass)", DENIED),
    ("inserted-fn", "select pg_stat_get_tuples_inserted('events'::regclass)", DENIED),
    ("inserted-in-transaction-fn",
     "select pg_stat_get_xact_tuples_inserted('events'::regclass)", DENIED),
    ("scans-fn", "select pg_stat_get_numscans('events'::regclass)", DENIED),
    ("column-statistics", "select most_common_vals::text from pg_stats "
                          "where tablename = 'health_scores'", []),
    ("extended-statistics", "select count(*) from pg_stats_ext", [(0,)]),
    ("statistic-catalog", "select count(*) from pg_statistic", DENIED),
    ("extended-statistic-data", "select count(*) from pg_statistic_ext_data", DENIED),
    ("table-to-xml", "select table_to_xml('health_scores', true, false, '')", DENIED),
    ("schema-to-xml", "select schema_to_xml('public', true, false, '')", DENIED),
    ("database-to-xml", "select database_to_xml(true, false, '')", DENIED),
    ("ts-stat-clusters", "select * from ts_stat('select to_tsvector(cluster) from events')",
     DENIED),
    ("explain-in-query-to-xml",
     "select query_to_xml('explain select * from events', true, false, '')", DENIED),
]


@pytest.mark.parametrize("statement, answer",
                         [pytest.param(*case[1:], id=case[0]) for case in ATTACKS])
def test_a_tenant_cannot_reach_another_tenants_sessions_or_rows(sandbox, busy, statement,
                                                                answer):
    attack = statement.format(pid=busy.pid, role=busy.role)
    assert as_tenant(sandbox, attack) == answer
    try:
        checked = sandbox.run(attack, ALPHA).rows
    except SqlRefused:
        checked = answer
    assert checked == [list(row) for row in answer] or checked == answer
    assert busy.alive(), "beta's statement was cancelled or terminated"


def test_the_attacks_are_many():
    assert len(ATTACKS) >= 40


def test_tenants_are_apart_even_where_execute_is_granted(seeded, sandbox, busy):
    """Role separation alone: alpha's role given back what the catalog took from PUBLIC still
    sees no query text of beta's and may signal none of its backends."""
    alpha, _ = tenant_credentials(ROLE, sandbox.key, ALPHA)
    grants = ("EXECUTE ON FUNCTION pg_cancel_backend(integer)",
              "EXECUTE ON FUNCTION pg_terminate_backend(integer, bigint)",
              "EXECUTE ON FUNCTION pg_stat_get_activity(integer)",
              "EXECUTE ON FUNCTION query_to_xml(text, boolean, boolean, text)",
              "SELECT ON pg_stat_activity")
    with seeded.begin() as connection:
        for grant in grants:
            connection.exec_driver_sql(f"GRANT {grant} TO {alpha}")
    try:
        seen = as_tenant(sandbox, f"select usename, query, state, query_start "
                                  f"from pg_stat_activity where pid = {busy.pid}")
        assert seen == [(busy.role, "<insufficient privilege>", None, None)]
        assert as_tenant(sandbox, f"select pg_cancel_backend({busy.pid})") == DENIED
        assert as_tenant(sandbox, f"select pg_terminate_backend({busy.pid})") == DENIED
        assert as_tenant(sandbox, "select query_to_xml('explain select * from events', "
                                  "true, false, '')") == "0A000"   # SQL text runs no EXPLAIN
        assert MARKER not in str(as_tenant(sandbox, "select query_to_xml("
                                                    "'select query from pg_stat_activity', "
                                                    "true, false, '')"))
    finally:
        with seeded.begin() as connection:
            for grant in grants:
                connection.exec_driver_sql(f"REVOKE {grant} FROM {alpha}")
    assert busy.alive()


def test_each_scope_is_a_role_of_its_own_that_belongs_to_none(seeded, sandbox, busy):
    names = {scope: tenant_credentials(ROLE, sandbox.key, scope)[0]
             for scope in (ALPHA, BETA, EVERY, Scope(frozenset({"alpha", "beta"})),
                           Scope(None, user="alice"), Scope(None, user="bob"))}
    assert busy.role == names[BETA]
    assert len(set(names.values())) == 6, "each MUNGE user a role of their own"
    assert all(re.fullmatch(f"{ROLE}_[0-9a-f]{{16}}", name) for name in names.values())
    assert tenant_credentials(ROLE, "another key", BETA)[0] != names[BETA]
    for scope in names:
        sandbox.tenant(scope)
    with seeded.connect() as connection:
        members = connection.scalar(text(
            "SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
            "WHERE r.rolname = ANY(:names)"), {"names": list(names.values())})
    assert members == 0
    assert as_tenant(sandbox, "select current_user") == [(names[ALPHA],)]


def test_explain_is_refused_for_a_scoped_token_only(sandbox):
    for statement in ("explain select * from events", "EXPLAIN (analyze) select 1",
                      "/* plan */ explain select count(*) from health_scores"):
        with pytest.raises(SqlRefused, match=re.escape(SCOPED_EXPLAIN)):
            sandbox.run(statement, ALPHA)
    plan = sandbox.run("explain select * from events", EVERY).rows
    assert "Scan" in "\n".join(row[0] for row in plan)


def test_the_gate_reads_nothing_and_makes_only_tenant_roles(seeded, sandbox):
    gate = make_engine(sandbox.url)
    verifier = "SCRAM-SHA-256$4096:c2FsdA==$a:b"
    try:
        with gate.connect() as connection:
            for statement in ("select count(*) from events", "select count(*) from nodes"):
                with pytest.raises(sqlalchemy.exc.ProgrammingError, match="permission denied"):
                    with connection.begin_nested():
                        connection.exec_driver_sql(statement)
            connection.rollback()
            connection.exec_driver_sql("SET TRANSACTION READ WRITE")
            for role in ("postgres", ROLE, f"{ROLE}_0123", "x_0123456789abcdef"):
                with pytest.raises(sqlalchemy.exc.ProgrammingError, match="not a sandbox"):
                    with connection.begin_nested():
                        connection.execute(text(f"SELECT {TENANT_FUNCTION}(:r, :v)"),
                                           {"r": role, "v": verifier})
    finally:
        gate.dispose()
    assert as_tenant(sandbox, f"select {TENANT_FUNCTION}('{ROLE}_0123456789abcdef', "
                              f"'{verifier}')") == DENIED


def test_the_harmless_catalog_stays_readable(sandbox):
    assert as_tenant(sandbox, "select relname from pg_class where relname = 'events'") == [
        ("events",)]
    assert sandbox.run("select table_name from information_schema.tables "
                       "where table_name = 'nodes'", ALPHA).rows == [["nodes"]]
