"""The database: engine and sessions, schema migrations, and the day partitions of ``events``.

Migrations are Alembic's, configured here in code (no alembic.ini): ``upgrade`` runs at start,
each migration in a transaction of its own (those that build indexes concurrently leave it for
the build: ``echod.migrations.concurrently``), all under one advisory lock held by the session
so that two echod processes starting together migrate once, and refuses a database that a
newer echod has migrated (``SchemaTooNew``). Partitions are named
``events_YYYYMMDD`` and cover one UTC day each; the writer makes them on demand, retention
(``echod.store.retention``) thins and drops them.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import URL, Connection, Engine, create_engine, make_url, text
from sqlalchemy.exc import DBAPIError

from ..errors import SchemaTooNew, StorageError

MIGRATIONS = Path(__file__).resolve().parent.parent / "migrations"
MIGRATION_LOCK = 0x6563686F01      # advisory lock keys: "echo" + a number
PARTITION_LOCK = 0x6563686F02
RETENTION_LOCK = 0x6563686F03
MIGRATION_LOCK_POLL_S = 0.5
PARTITION_NAME = re.compile(r"^events_(\d{8})$")
DAY = timedelta(days=1)


# -- engine and sessions -----------------------------------------------------------------------

def make_engine(dsn: str | URL, **options) -> Engine:
    """An engine for a PostgreSQL DSN, through psycopg 3 whatever driver the DSN names."""
    url = make_url(dsn)
    if url.get_backend_name() != "postgresql":
        raise StorageError(f"echod stores into PostgreSQL only, not {url.get_backend_name()}")
    url = url.set(drivername="postgresql+psycopg")
    options.setdefault("pool_pre_ping", True)
    return create_engine(url, **options)


# -- migrations --------------------------------------------------------------------------------

def alembic_config(connection: Connection | None = None) -> Config:
    """Alembic's configuration for echod's migrations, optionally bound to an open connection."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(connection: Connection) -> str | None:
    heads = MigrationContext.configure(connection).get_current_heads()
    return heads[0] if heads else None


def refuse_newer(connection: Connection) -> None:
    """Raise ``SchemaTooNew`` when the database is at a revision this echod does not know."""
    current = current_revision(connection)
    if current is None:
        return
    try:
        ScriptDirectory.from_config(alembic_config()).get_revision(current)
    except CommandError:
        raise SchemaTooNew(current, head_revision()) from None


def upgrade(engine: Engine, poll_s: float = MIGRATION_LOCK_POLL_S) -> str:
    """Bring the schema to this echod's head revision (a no-op when it is there); return it."""
    with engine.connect() as connection, migration_lock(connection, poll_s):
        refuse_newer(connection)
        connection.commit()             # Alembic begins and commits each migration's own
        command.upgrade(alembic_config(connection), "head")
    return head_revision()


@contextmanager
def migration_lock(connection: Connection,
                   poll_s: float = MIGRATION_LOCK_POLL_S) -> Iterator[None]:
    """Hold ``MIGRATION_LOCK`` in ``connection``'s session, across the commits of the migrations.
    It is asked for every ``poll_s`` seconds outside any transaction, never waited for in a
    statement: a statement waiting for it holds a snapshot, which the holder's CREATE INDEX
    CONCURRENTLY would wait for in turn (a deadlock, which PostgreSQL breaks by failing one)."""
    connection.execution_options(isolation_level="AUTOCOMMIT")
    while not connection.scalar(text("SELECT pg_try_advisory_lock(:key)"),
                                {"key": MIGRATION_LOCK}):
        time.sleep(poll_s)
    connection.commit()
    connection.execution_options(isolation_level=connection.default_isolation_level)
    try:
        yield
    finally:
        release_migration_lock(connection)


def release_migration_lock(connection: Connection) -> None:
    """Let ``MIGRATION_LOCK`` go, unless the session went first (a connection lost, or closed
    here when the unlock fails): the lock ended with it."""
    if connection.invalidated:
        return
    try:
        connection.rollback()
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
        connection.commit()
    except DBAPIError:
        connection.invalidate()


def status(engine: Engine) -> tuple[str | None, str]:
    """(the database's revision, None when unmigrated; this echod's head revision)."""
    with engine.connect() as connection:
        return current_revision(connection), head_revision()


# -- day partitions of events ------------------------------------------------------------------

def partition_name(day: date) -> str:
    """A day's partition of ``event_rows``."""
    return f"events_{day:%Y%m%d}"


def chunk_partition_name(day: date) -> str:
    """The same day's partition of ``event_chunks``."""
    return f"event_chunks_{day:%Y%m%d}"


def day_bounds(day: date) -> tuple[datetime, datetime]:
    """The times a day's partition holds: from its midnight (UTC) to the next."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    return start, start + DAY


def partition_day(name: str) -> date | None:
    match = PARTITION_NAME.match(name)
    return datetime.strptime(match.group(1), "%Y%m%d").date() if match else None


def event_partitions(connection: Connection) -> dict[date, str]:
    """The day partitions that ``event_rows`` has now, by day (``event_chunks`` has the same
    days: they are made and dropped together)."""
    names = connection.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'event_rows'::regclass")).scalars()
    return {day: name for name in names if (day := partition_day(name)) is not None}


def ensure_partitions(connection: Connection, days: set[date]) -> list[str]:
    """Create the missing partitions for ``days`` in the caller's transaction; return them."""
    if days <= event_partitions(connection).keys():
        return []
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PARTITION_LOCK})
    missing = sorted(days - event_partitions(connection).keys())
    for day in missing:
        start, end = day_bounds(day)
        for name, table in ((partition_name(day), "event_rows"),
                            (chunk_partition_name(day), "event_chunks")):
            connection.execute(text(
                f"CREATE TABLE {name} PARTITION OF {table} "
                f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')"))
    return [partition_name(day) for day in missing]
