"""Alembic migrations of the event store (run by ``echod.db.upgrade``)."""
