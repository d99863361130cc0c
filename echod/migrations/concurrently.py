"""Indexes that migrations build beside the writers, on tables that may be large.

A plain ``CREATE INDEX`` holds a SHARE lock on its table until the index is built, so every
insert waits meanwhile: on a large store a long stop at echod's start, which systemd may kill
halfway. ``CREATE INDEX CONCURRENTLY`` lets the writes go on, but it runs only outside a
transaction block and not on a partitioned table. So ``create_index`` leaves the migration's
transaction (Alembic's autocommit block, which commits what the migration did before: that must
bear being done again, as ``add_missing_columns`` does) and, on a partitioned table, does what
PostgreSQL documents for one:

1. ``CREATE INDEX name ON ONLY parent``: the catalog only. The index is invalid while a
   partition lacks its own (valid at once where there is no partition); a partition made from
   then on gets its own from PostgreSQL.
2. On each partition ``CREATE INDEX CONCURRENTLY`` (named by PostgreSQL, as its recursion from
   the parent would have named it), then ``ALTER INDEX name ATTACH PARTITION``; the last attach
   makes the parent's index valid.

Every step can be done again, so a run killed midway is finished by the next: an INVALID index
that a killed build left is dropped and built again, what was built is kept, what is not yet
attached is attached. Writes wait for none of it but ``ON ONLY``, which takes the parent's
SHARE lock for an instant, once the write transactions in flight there have ended; the writes
that come meanwhile queue behind it. So it asks for the lock for at most ON_ONLY_WAIT_S at a
time, letting the queue go between two tries, for up to ON_ONLY_PATIENCE_S: a long write
transaction holds up the migration, not every writer. An attach locks only the partition's new
index, and a unique constraint is made from its finished index (``create_unique_constraint``)
under an instant ACCESS EXCLUSIVE lock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import NamedTuple

import sqlalchemy as sa
from alembic import op
from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError, OperationalError, PendingRollbackError

from echod.errors import StorageError

log = logging.getLogger("echod")

ON_ONLY_WAIT_S = 1.0          # how long one try of ON ONLY may keep the writes queued
ON_ONLY_PAUSE_S = 0.5         # between two tries: the queued writes go on
ON_ONLY_PATIENCE_S = 600.0    # all tries together, before the migration gives up
LOCK_NOT_AVAILABLE = "55P03"  # lock_timeout ran out

# The indexes of a partition that can stand for the parent's index ``:parent``: the same
# definition after "USING" (method, keys, opclasses, INCLUDE, WHERE), as unique, and attached
# to it or to nothing; the one attached already first, then the valid ones.
EQUIVALENTS = text("""
    SELECT x.indexrelid::regclass::text AS name, x.indisvalid AS valid
    FROM pg_index x
    JOIN pg_index p ON p.indexrelid = CAST(:parent AS regclass)
    LEFT JOIN pg_inherits h ON h.inhrelid = x.indexrelid
    WHERE x.indrelid = CAST(:partition AS regclass) AND x.indisunique = p.indisunique
      AND coalesce(h.inhparent, p.indexrelid) = p.indexrelid
      AND substring(pg_get_indexdef(x.indexrelid) FROM ' USING .*')
          = substring(pg_get_indexdef(p.indexrelid) FROM ' USING .*')
    ORDER BY h.inhparent IS NULL, x.indisvalid DESC""")
PARTITIONS = text("""
    SELECT c.oid::regclass::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = CAST(:table AS regclass) ORDER BY c.relname""")
VALIDITY = text("SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:name)")
PARTITIONED = text("SELECT relkind = 'p' FROM pg_class WHERE oid = CAST(:table AS regclass)")


def create_index(name: str, table: str, columns: Sequence[str], *, unique: bool = False,
                 include: Sequence[str] = (), where: str | None = None) -> None:
    """The index ``op.create_index`` would make (same name, keys, INCLUDE and WHERE), built
    concurrently, on a partitioned table partition by partition; done again, it finishes what
    a killed run left."""
    context = op.get_context()
    if context.as_sql:              # offline SQL has no catalog to read: the plain statement
        op.create_index(name, table, list(columns), unique=unique,
                        postgresql_include=list(include),
                        postgresql_where=None if where is None else sa.text(where))
        return
    try:
        with context.autocommit_block():
            connection = op.get_bind()
            quote = connection.dialect.identifier_preparer.quote
            index = Index(quote(name), quote(table), key_clause(quote, columns, include, where),
                          "CREATE UNIQUE INDEX" if unique else "CREATE INDEX")
            if connection.scalar(PARTITIONED, {"table": table}):
                build_partitioned(connection, index)
            else:
                build_plain(connection, index)
    except PendingRollbackError as exc:
        # Alembic's block commits on its way out, after an error too: on a connection lost
        # (the server restarted, the backend ended) that fails as well, and would hide why.
        if isinstance(exc.__context__, DBAPIError):
            raise exc.__context__ from None
        raise


def create_unique_constraint(name: str, table: str, columns: Sequence[str]) -> None:
    """The constraint ``op.create_unique_constraint`` would make, its index built concurrently
    first and then made the constraint's (in the migration's transaction, catalog only)."""
    if op.get_context().as_sql:
        op.create_unique_constraint(name, table, list(columns))
        return
    create_index(name, table, columns, unique=True)
    op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE USING INDEX {name}")


def add_missing_columns(table: str, columns: Sequence[sa.Column]) -> None:
    """``op.add_column`` for each of ``columns`` that ``table`` lacks. A migration that builds an
    index concurrently after adding columns has committed them by then: a run after a kill
    finds them there."""
    context = op.get_context()
    have = set() if context.as_sql else {
        column["name"] for column in sa.inspect(op.get_bind()).get_columns(table)}
    for column in columns:
        if column.name not in have:
            op.add_column(table, column)


class Index(NamedTuple):
    """An index to build: its name and table (quoted), what follows ``ON table``, and the
    statement's verb (``CREATE [UNIQUE] INDEX``)."""

    name: str
    table: str
    keys: str
    create: str


def key_clause(quote, columns: Sequence[str], include: Sequence[str],
               where: str | None) -> str:
    """``(a, b) INCLUDE (c) WHERE …``: what follows ``ON table`` in CREATE INDEX."""
    clause = f"({', '.join(map(quote, columns))})"
    if include:
        clause += f" INCLUDE ({', '.join(map(quote, include))})"
    return clause if where is None else f"{clause} WHERE {where}"


def build_plain(connection: Connection, index: Index) -> None:
    """On a table that is not partitioned: build the index unless a valid one is there,
    dropping the INVALID one a killed build left."""
    valid = connection.scalar(VALIDITY, {"name": index.name})
    if valid:
        return
    if valid is not None:
        connection.execute(text(f"DROP INDEX CONCURRENTLY {index.name}"))
    connection.execute(text(
        f"{index.create} CONCURRENTLY {index.name} ON {index.table} {index.keys}"))


def build_partitioned(connection: Connection, index: Index) -> None:
    """The parent's index ON ONLY the parent, each partition's built concurrently and attached;
    the parent's is valid once all are."""
    create_on_only(connection, index)
    if connection.scalar(VALIDITY, {"name": index.name}):
        return
    for partition in connection.scalars(PARTITIONS, {"table": index.table}).all():
        built = partition_index(connection, index, partition)
        # Attached already, it is attached again: nothing changes but the parent's validity,
        # which PostgreSQL checks then (a partition dropped since the last run leaves it
        # invalid with every partition attached).
        connection.execute(text(f"ALTER INDEX {index.name} ATTACH PARTITION {built}"))
    if not connection.scalar(VALIDITY, {"name": index.name}):
        raise StorageError(f"index {index.name} on {index.table} is still invalid with an index "
                           "attached on every partition; drop it and start echod again")


def create_on_only(connection: Connection, index: Index, wait_s: float = ON_ONLY_WAIT_S,
                   pause_s: float = ON_ONLY_PAUSE_S,
                   patience_s: float = ON_ONLY_PATIENCE_S) -> None:
    """``CREATE INDEX … ON ONLY`` the parent, its SHARE lock asked for ``wait_s`` at a time
    (the writes queued behind the request go on when it gives up), until ``patience_s`` ran
    out."""
    statement = text(f"{index.create} IF NOT EXISTS {index.name} ON ONLY {index.table} "
                     f"{index.keys}")
    deadline = time.monotonic() + patience_s
    connection.execute(text(f"SET lock_timeout = '{round(wait_s * 1000)}ms'"))
    try:
        while True:
            try:
                connection.execute(statement)
                return
            except OperationalError as exc:
                if getattr(exc.orig, "sqlstate", None) != LOCK_NOT_AVAILABLE:
                    raise
                if time.monotonic() >= deadline:
                    raise StorageError(
                        f"index {index.name}: {index.table} had write transactions in flight "
                        f"for {patience_s:.0f} s, and its index cannot begin until they end; "
                        "end them and start echod again") from None
                log.info("index %s waits for the write transactions in flight on %s",
                         index.name, index.table)
                time.sleep(pause_s)
    finally:
        connection.execute(text("RESET lock_timeout"))


def partition_index(connection: Connection, index: Index, partition: str) -> str:
    """A valid index of ``partition`` that stands for the parent's: the one attached already,
    or one built before, or one built now; INVALID leftovers of a killed build dropped."""
    found = connection.execute(EQUIVALENTS, {"parent": index.name, "partition": partition}).all()
    for leftover in [name for name, valid in found if not valid]:
        connection.execute(text(f"DROP INDEX CONCURRENTLY {leftover}"))
    built = [name for name, valid in found if valid]
    if built:
        return built[0]
    connection.execute(text(f"{index.create} CONCURRENTLY ON {partition} {index.keys}"))
    return connection.execute(EQUIVALENTS, {"parent": index.name,
                                            "partition": partition}).first().name
