"""Alembic migrations of the event store (run by ``echod.store.db.upgrade``)."""
