"""Alembic environment for echod. ``echod.store.db.upgrade`` hands in an open connection (in
``config.attributes["connection"]``), outside any transaction, in a session that holds the
migration lock; the ``alembic`` command line, given ``sqlalchemy.url``, gets a connection of its
own and takes the lock there. Each migration runs in a transaction of its own, which a
concurrent index build leaves and commits (``echod.migrations.concurrently``). A connection
handed in inside a transaction (a test's downgrade) keeps it: its migrations must not leave it."""

from alembic import context
from sqlalchemy import create_engine, pool

from echod.store.db import migration_lock
from echod.store.models import Base


def run_on(connection) -> None:
    context.configure(connection=connection, target_metadata=Base.metadata,
                      transactional_ddl=True, transaction_per_migration=True,
                      compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        run_on(connection)
        return
    engine = create_engine(context.config.get_main_option("sqlalchemy.url"),
                           poolclass=pool.NullPool)
    with engine.connect() as own, migration_lock(own):
        run_on(own)


if context.is_offline_mode():
    context.configure(url=context.config.get_main_option("sqlalchemy.url"),
                      target_metadata=Base.metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
else:
    run_online()
