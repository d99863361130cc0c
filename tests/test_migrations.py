"""Migrations that index large tables build concurrently, against a real PostgreSQL: the writes
go on during the build, a start killed midway is finished by the next, and two echods started
together migrate once (``echod.migrations.concurrently``, ``echod.store.db.upgrade``).

The store comes with rows in three day partitions, taken back to 0006, so that upgrading builds
0007's index on ``events`` again (and 0011's on ``jobs``). The tests stop the build at a known
point instead of racing it: a transaction holds ROW EXCLUSIVE on the middle day's partition, as
an insert in flight there does, and CREATE INDEX CONCURRENTLY on that partition waits for it to
end (or, where the migration alters the table first, a transaction holds a snapshot, which the
build waits for before it makes the index valid). While it waits, what the migrator holds is
read from pg_locks, other writes are made, or its backend is ended as a killed echod's would be.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from echod.store.db import (MIGRATION_LOCK, alembic_config, ensure_partitions,
                            event_partitions, head_revision, make_engine, partition_name, status,
                            upgrade)
from echod.store.models import FAILED_CALL
from echod.store.writer import write_batch
from stack.launch import wait_for

BEFORE = "0006"                     # the revision before 0007 builds INDEX
INDEX = "ix_events_failed_calls"
# The lock modes an INSERT's ROW EXCLUSIVE waits for.
BLOCKS_INSERTS = {"ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"}
WAIT_S = 60

NOON = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0)
DAYS = [(NOON - timedelta(days=back)).date() for back in (3, 2, 1)]

ATTACHED = text("""
    SELECT t.relname AS partition, x.indexrelid AS oid, x.indisvalid AS valid
    FROM pg_inherits h JOIN pg_index x ON x.indexrelid = h.inhrelid
    JOIN pg_class t ON t.oid = x.indrelid
    WHERE h.inhparent = CAST(:index AS regclass) ORDER BY 1""")
PARTITIONS = text("""
    SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = CAST(:table AS regclass) ORDER BY 1""")
VALID = text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:index)")
INVALID = text("""
    SELECT c.relname, t.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
    JOIN pg_class t ON t.oid = x.indrelid WHERE NOT x.indisvalid ORDER BY 1""")
INSERT_0006 = text("INSERT INTO events (t, id, cluster, node, kind, attrs) "
                   "VALUES (:t, :id, 'alpha', 'n1', 'sync', CAST(:attrs AS jsonb))")
LOG_DDL = """
    CREATE SCHEMA audit;
    CREATE TABLE audit.ddl (pid integer, tag text, object text);
    CREATE FUNCTION audit.log_ddl() RETURNS event_trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO audit.ddl SELECT pg_backend_pid(), command_tag, object_identity
        FROM pg_event_trigger_ddl_commands();
    END $$;
    CREATE EVENT TRIGGER log_ddl ON ddl_command_end EXECUTE FUNCTION audit.log_ddl();"""


def calls(day, count: int, prefix: str) -> list[dict]:
    """Syncs on ``day``, every third one failed (CUDA error 700)."""
    return [{"id": f"n1:boot:{prefix}{i}", "kind": "sync", "cluster": "alpha", "node": "n1",
             "job": "77", "rank": 0, "t": (datetime(day.year, day.month, day.day, 12, tzinfo=UTC)
                                          + timedelta(seconds=i)).timestamp(),
             "attrs": {"result": 700 if i % 3 == 0 else 0, "duration_ns": 1000 + i}}
            for i in range(count)]


def failed_calls(connection) -> int:
    return connection.scalar(text(f"SELECT count(*) FROM event_rows WHERE {FAILED_CALL}"))


@pytest.fixture
def store(engine):
    """A store with syncs in three day partitions (a third of them failed), at 0006."""
    for day in DAYS:
        assert write_batch(engine, {"events": calls(day, 300, "before")}).stored == 300
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), BEFORE)
        assert connection.scalars(PARTITIONS, {"table": "events"}).all() == [
            partition_name(day) for day in DAYS]
        assert connection.scalar(VALID, {"index": INDEX}) is None
    return engine


@pytest.fixture
def watch(engine):
    """A connection outside any transaction, so that each look at pg_stat_activity and pg_locks
    is a fresh one."""
    with engine.connect() as connection:
        yield connection.execution_options(isolation_level="AUTOCOMMIT")


class Migrator(threading.Thread):
    """``echod.store.db.upgrade`` as an echod starting would run it: its own engine and thread, its
    backend named ``name`` in pg_stat_activity."""

    def __init__(self, engine, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.engine = make_engine(engine.url, connect_args={"application_name": name})
        self.revision: str | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.revision = upgrade(self.engine, poll_s=0.05)
        except Exception as exc:            # the test reads it
            self.error = exc
        finally:
            self.engine.dispose()

    def finish(self) -> None:
        self.join(WAIT_S)
        assert not self.is_alive(), f"{self.name} still migrating after {WAIT_S} s"


@contextmanager
def write_in_flight(engine, partition: str):
    """A transaction holding what an insert into ``partition`` holds until it commits (ROW
    EXCLUSIVE on the partition only): a concurrent build on that partition waits for it."""
    with engine.connect() as connection:
        connection.execute(text(f"LOCK TABLE {partition} IN ROW EXCLUSIVE MODE"))
        yield
        connection.commit()


@contextmanager
def snapshot_in_flight(engine):
    """A transaction holding a snapshot: a concurrent build, once it has built the index, waits
    for it to end before it makes the index valid."""
    with engine.connect() as connection:
        connection.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        connection.execute(text("SELECT count(*) FROM pg_class"))
        yield
        connection.rollback()


def waiting(watch, migrator: Migrator, statement: str):
    """The migrator's backend and statement once it waits for a lock in a statement that
    holds ``statement``. A concurrent build waits a moment, too, for whatever snapshot
    another backend holds as it goes (the watcher's own query, on a busy machine): a wait in
    another statement is passed by, not taken for the stop."""
    found = watch.execute(text(
        "SELECT pid, query FROM pg_stat_activity "
        "WHERE application_name = :name AND wait_event_type = 'Lock'"),
        {"name": migrator.name}).first()
    return found if found is not None and statement in found.query else None


def stopped_in_build(watch, migrator: Migrator, partition: str) -> int:
    """The migrator's backend, stopped by ``write_in_flight(partition)`` in the concurrent build
    there (the only statement of a concurrent migration that waits for that write)."""
    stopped = wait_for(lambda: waiting(watch, migrator, f"CREATE INDEX CONCURRENTLY ON "
                                                        f"{partition} "), WAIT_S)
    assert stopped, (f"the migration never waited for the write in {partition}", migrator.error)
    return stopped.pid


def locks_held(watch, pid: int) -> set[tuple[str, str]]:
    return set(watch.execute(text(
        "SELECT l.relation::regclass::text, l.mode FROM pg_locks l "
        "WHERE l.pid = :pid AND l.granted AND l.locktype = 'relation'"), {"pid": pid}).all())


def assert_index_whole(connection) -> dict[str, int]:
    """The parent's index valid, a valid index attached on every partition of event_rows and
    holding every row it should (amcheck reads the heap against it), no invalid index left
    anywhere; return the partitions' index oids."""
    assert connection.scalar(VALID, {"index": INDEX}) is True
    attached = connection.execute(ATTACHED, {"index": INDEX}).all()
    assert [row.partition for row in attached] == sorted(event_partitions(connection).values())
    assert all(row.valid for row in attached), attached
    assert connection.execute(INVALID).all() == []
    connection.execute(text("CREATE EXTENSION IF NOT EXISTS amcheck"))
    for row in attached:
        connection.execute(text("SELECT bt_index_check(CAST(:oid AS oid)::regclass, true)"),
                           {"oid": row.oid})
    return {row.partition: row.oid for row in attached}


# -- the writes go on --------------------------------------------------------------------------

def test_inserts_go_on_while_the_index_is_built(store, watch):
    """Stopped in the middle day's build: the migrator holds no lock an insert waits for, and
    inserts into every day, and into a day partition made meanwhile, commit before the build
    ends (each under a lock_timeout, so that a wait fails the test instead of hanging it). The
    finished index holds them, and a partition made after it gets it from PostgreSQL."""
    middle, new_day = partition_name(DAYS[1]), (NOON + timedelta(days=1)).date()
    with write_in_flight(store, middle):
        migrator = Migrator(store, "echod-migrating")
        migrator.start()
        pid = stopped_in_build(watch, migrator, middle)
        held = locks_held(watch, pid)
        assert not {mode for _, mode in held} & BLOCKS_INSERTS, held
        with store.connect() as writer:
            writer.execute(text("SET LOCAL lock_timeout = '5s'"))
            writer.execute(text(
                f"CREATE TABLE {partition_name(new_day)} PARTITION OF events "
                f"FOR VALUES FROM ('{new_day}') TO ('{new_day + timedelta(days=1)}')"))
            writer.execute(INSERT_0006, [
                {"t": datetime(day.year, day.month, day.day, 18, i, tzinfo=UTC),
                 "id": f"n1:boot:during{day}:{i}", "attrs": '{"result": 2}'}
                for day in (*DAYS, new_day) for i in range(5)])
            writer.commit()
        assert migrator.is_alive() and watch.scalar(VALID, {"index": INDEX}) is False
    migrator.finish()
    assert (migrator.error, migrator.revision) == (None, head_revision())
    with store.begin() as connection:
        assert partition_name(new_day) in event_partitions(connection).values()
        assert failed_calls(connection) == 3 * 100 + 4 * 5
        assert_index_whole(connection)
    later = NOON.date()             # no partition yet: the writer makes it
    assert write_batch(store, {"events": calls(later, 6, "after")}).stored == 6
    with store.begin() as connection:
        assert partition_name(later) in assert_index_whole(connection)
        assert failed_calls(connection) == 3 * 100 + 4 * 5 + 2


def test_a_write_open_on_the_parent_holds_up_the_index_but_not_the_other_writes(store, watch):
    """A write transaction is open on events when the migration begins its index there: ON
    ONLY waits for it, but a second at a time, so the writes that come meanwhile are not queued
    behind it for long; one commits under a 3 s lock_timeout while the transaction is still
    open (it would wait for that transaction, and fail, behind a request that did not give
    up). The index is built once the transaction ends."""
    with write_in_flight(store, "events"):
        migrator = Migrator(store, "echod-migrating")
        migrator.start()
        stopped = wait_for(lambda: waiting(watch, migrator, f"{INDEX} ON ONLY events "),
                           WAIT_S)
        assert stopped, ("the migration never waited for the write in events", migrator.error)
        began = time.monotonic()
        with store.connect() as writer:
            writer.execute(text("SET LOCAL lock_timeout = '3s'"))
            writer.execute(INSERT_0006, [
                {"t": datetime(day.year, day.month, day.day, 18, i, tzinfo=UTC),
                 "id": f"n1:boot:queued{day}:{i}", "attrs": '{"result": 2}'}
                for day in DAYS for i in range(2)])
            writer.commit()
        assert migrator.is_alive() and watch.scalar(VALID, {"index": INDEX}) is None, \
            (time.monotonic() - began, migrator.error)
    migrator.finish()
    assert (migrator.error, migrator.revision) == (None, head_revision())
    with store.begin() as connection:
        assert failed_calls(connection) == 3 * 100 + 3 * 2
        assert_index_whole(connection)


# -- a start killed midway ---------------------------------------------------------------------

def test_a_build_killed_midway_is_finished_by_the_next_start(store, watch):
    """The migrator's backend ends in the middle day's build, as it does when echod is killed
    there: the first day's index is built and attached, the middle day's is left INVALID, the
    schema still at 0006. The next upgrade drops the leftover, builds it again, keeps the first
    day's and attaches all."""
    first, middle = partition_name(DAYS[0]), partition_name(DAYS[1])
    with write_in_flight(store, middle):
        migrator = Migrator(store, "echod-killed")
        migrator.start()
        pid = stopped_in_build(watch, migrator, middle)
        kept = {row.partition: row.oid for row in watch.execute(ATTACHED, {"index": INDEX})}
        assert list(kept) == [first]
        assert watch.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        migrator.finish()
    assert isinstance(migrator.error, DBAPIError), migrator.error
    assert status(store)[0] == BEFORE
    with store.connect() as connection:
        assert connection.scalar(VALID, {"index": INDEX}) is False
        assert sorted(table for _, table in connection.execute(INVALID)) == ["events", middle]
    assert upgrade(store) == head_revision()
    with store.begin() as connection:
        built = assert_index_whole(connection)
        assert failed_calls(connection) == 3 * 100
    assert built[first] == kept[first]
    assert upgrade(store) == head_revision()        # and once more changes nothing
    with store.begin() as connection:
        assert assert_index_whole(connection) == built


def test_a_parent_index_left_invalid_by_a_dropped_partition_is_made_valid(store, watch):
    """Killed after the first day's index was attached; the days without one are then dropped
    (by retention, say): every partition left has its index attached but the parent's is still
    invalid, and the next start makes it valid."""
    first, middle = partition_name(DAYS[0]), partition_name(DAYS[1])
    with write_in_flight(store, middle):
        migrator = Migrator(store, "echod-killed")
        migrator.start()
        watch.execute(text("SELECT pg_terminate_backend(:pid)"),
                      {"pid": stopped_in_build(watch, migrator, middle)})
        migrator.finish()
    with store.begin() as connection:
        connection.execute(text(f"DROP TABLE {middle}, {partition_name(DAYS[2])}"))
        assert [row.partition for row in connection.execute(ATTACHED, {"index": INDEX})] == [
            first]
        assert connection.scalar(VALID, {"index": INDEX}) is False
    assert upgrade(store) == head_revision()
    with store.begin() as connection:
        assert list(assert_index_whole(connection)) == [first]


def test_a_unique_constraint_killed_midway_is_finished_by_the_next_start(engine, watch):
    """0006 adds two columns, builds the unique index concurrently and makes it the constraint.
    Killed in the build (stopped where it waits for older snapshots), it has committed the
    columns (the schema still at 0005) and left the index INVALID: the next start adds no
    column twice, builds the index again and makes it the constraint."""
    scores = [{"t": NOON.timestamp() - 86400 + i, "cluster": "alpha", "node": f"n{i % 4}",
               "job": "77", "score": 0.9, "state": "active", "boot_id": "boot", "seq": i,
               "signals": {"throughput": 0.9, "compute": 0.8, "memory": 0.7, "cpu": 0.6}}
              for i in range(40)]
    assert write_batch(engine, {"scores": scores}).stored == 40
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0005")
    with snapshot_in_flight(engine):    # not a write: adding the columns would wait for it
        migrator = Migrator(engine, "echod-killed")
        migrator.start()
        stopped = wait_for(lambda: waiting(watch, migrator, "CREATE UNIQUE INDEX CONCURRENTLY "
                                                            "uq_health_scores_push ON "
                                                            "health_scores "), WAIT_S)
        assert stopped, ("the migration never waited for the snapshot", migrator.error)
        watch.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": stopped.pid})
        migrator.finish()
    assert status(engine)[0] == "0005"
    with engine.connect() as connection:
        assert connection.execute(INVALID).all() == [("uq_health_scores_push", "health_scores")]
    assert upgrade(engine) == head_revision()
    with engine.connect() as connection:
        assert connection.execute(INVALID).all() == []
        assert connection.scalar(text(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint "
            "WHERE conname = 'uq_health_scores_push'")) == "UNIQUE (cluster, node, boot_id, seq)"
        assert connection.scalar(text("SELECT count(*) FROM health_scores")) == 40


# -- two echods at once ------------------------------------------------------------------------

def test_two_echods_starting_together_migrate_once(store, watch):
    """Both wait while the test holds the migration lock; let go, one migrates and the other,
    polling the lock meanwhile (a statement waiting for it would hold a snapshot that the
    concurrent builds wait for: a deadlock), finds the schema at head. Every DDL statement,
    logged by an event trigger, came from one backend, each partition's index built once."""
    watch.execute(text(LOG_DDL))
    migrators = [Migrator(store, f"echod-{n}") for n in ("a", "b")]
    with store.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
        holder.commit()
        for migrator in migrators:
            migrator.start()
        assert wait_for(lambda: watch.scalar(text(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'echod-_' "
            "AND query LIKE '%pg_try_advisory_lock%'")) == 2, WAIT_S)
        assert status(store)[0] == BEFORE
        holder.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
        holder.commit()
    for migrator in migrators:
        migrator.finish()
    assert [(m.error, m.revision) for m in migrators] == [(None, head_revision())] * 2
    with store.begin() as connection:
        assert connection.scalar(text("SELECT count(DISTINCT pid) FROM audit.ddl")) == 1
        built = connection.execute(text(
            "SELECT object FROM audit.ddl WHERE tag = 'CREATE INDEX' AND object LIKE :like "
            "ORDER BY 1"), {"like": "public.events_%_cluster_t_idx"}).scalars().all()
        assert built == [f"public.{partition_name(day)}_cluster_t_idx" for day in DAYS]
        assert_index_whole(connection)


def test_a_fresh_store_migrates_and_a_day_made_later_gets_every_index(blank_engine):
    """No partition yet: each index ON ONLY the parent is valid at once, and PostgreSQL gives it
    to the partitions the writer makes."""
    assert upgrade(blank_engine) == head_revision()
    with blank_engine.begin() as connection:
        ensure_partitions(connection, set(DAYS))
    with blank_engine.begin() as connection:
        assert_index_whole(connection)
        indexes = connection.execute(text(
            "SELECT count(*), bool_and(x.indisvalid) FROM pg_index x "
            "JOIN pg_class c ON c.oid = x.indrelid WHERE c.relname = :name"),
            {"name": partition_name(DAYS[0])}).one()
        parents = connection.execute(text(
            "SELECT count(*), bool_and(x.indisvalid) FROM pg_index x "
            "WHERE x.indrelid = CAST('event_rows' AS regclass)")).one()
    assert indexes == parents and parents[1] is True

