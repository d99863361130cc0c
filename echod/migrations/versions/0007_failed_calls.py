"""A partial index over failed calls: syncs, allocations and frees whose result is a number
other than 0. The anomalies tool lists them; without it, it reads every sync, allocation and
free of the window to find the few that failed (a second over a 10-million-event job here).
Almost no call fails, so the index stays tiny and costs a row's insert one predicate check.

The predicate compares jsonb with jsonb (numbers compare by value, so 0.0 is 0), never casting
text to a number, so no stored value can make it fail an insert. Built concurrently on every
day partition of events, one after the other, while writes go on
(``echod.migrations.concurrently``); a start killed midway is finished by the next.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

from alembic import op

from echod.migrations import concurrently

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

INDEX = "ix_events_failed_calls"
FAILED = ("kind IN ('sync', 'alloc', 'free') AND jsonb_typeof(attrs -> 'result') = 'number' "
          "AND attrs -> 'result' <> '0'::jsonb")


def upgrade() -> None:
    concurrently.create_index(INDEX, "events", ["cluster", "t"], where=FAILED)


def downgrade() -> None:
    op.drop_index(INDEX, table_name="events")
