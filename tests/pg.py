"""PostgreSQL for the tests: one real server per session, a fresh database per test.

PostgreSQL refuses to run as root, and pytest-postgresql's ``postgresql_proc`` runs pg_ctl as
the current user, so the session's server is echod's own embedded cluster (run as the
``postgres`` system user when the tests run as root). pytest-postgresql's ``postgresql_noproc``
and ``postgresql`` fixtures then give each test a fresh database cloned from a template: a blank
one (``blank_engine``) for migration tests, a migrated one (``engine``) for the rest.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from pytest_postgresql import factories
from pytest_postgresql.executors import NoopExecutor
from sqlalchemy import URL

from echod.store.db import make_engine, upgrade
from echod.embedded import EmbeddedPostgres

FAST_BUT_UNSAFE = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


def state_dir() -> Path:
    """A private directory right under /tmp, which the postgres user can reach once it owns it
    (pytest's tmp_path sits under a root-only directory)."""
    return Path(tempfile.mkdtemp(prefix="echod-test-"))


def url_of(server: NoopExecutor) -> URL:
    return URL.create("postgresql+psycopg", username=server.user, password=server.password,
                      database=server.dbname, query={"host": server.host, "port": str(server.port)})


def migrate(host, port, user, dbname, password, **_) -> None:
    """pytest-postgresql loader: bring the template database to the head revision."""
    engine = make_engine(url_of(NoopExecutor(host, port, user, "", dbname, password)))
    upgrade(engine)
    engine.dispose()


@pytest.fixture(scope="session")
def echod_server():
    """The session's PostgreSQL; the noproc fixtures clone their templates from its empty
    database ``echod_tests_tmpl``."""
    where = state_dir()
    cluster = EmbeddedPostgres(where, dbname="echod_tests_tmpl", settings=FAST_BUT_UNSAFE)
    try:
        cluster.start()
        yield NoopExecutor(host=str(cluster.socket_dir), port=cluster.port, user="postgres",
                           options="", dbname="echod_tests", password=cluster.password)
    finally:
        cluster.stop()
        shutil.rmtree(where, ignore_errors=True)


blank_proc = factories.postgresql_noproc(dbname="echod_blank", depends_on="echod_server")
migrated_proc = factories.postgresql_noproc(dbname="echod_migrated", depends_on="echod_server",
                                            load=[migrate])
blank_db = factories.postgresql("blank_proc")
migrated_db = factories.postgresql("migrated_proc")


@pytest.fixture
def blank_engine(blank_db, blank_proc):
    engine = make_engine(url_of(blank_proc))
    yield engine
    engine.dispose()


@pytest.fixture
def engine(migrated_db, migrated_proc):
    engine = make_engine(url_of(migrated_proc))
    yield engine
    engine.dispose()
