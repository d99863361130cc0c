"""The index the lag tools read collectives through: (cluster, job, comm_hash, seq), carrying
rank and t, on collective events only.

Ranks call a communicator's collectives in the same order, so one collective instance is one
(cluster, job, comm_hash, seq) key here, its ranks side by side. echod.tools finds the
communicators by skip scans of this index and reads sampled instances by index-only lookups,
so find_stragglers, explain, get_cost and job_report never scan a job's collectives. Partial
(kind = 'collective') to stay small: a collective event is most of what is stored.

Built concurrently on every day partition of events, one after the other, while writes go on
(``echod.migrations.concurrently``); a start killed midway is finished by the next.

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from alembic import op

from echod.migrations import concurrently

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEX = "ix_events_collective_seq"


def upgrade() -> None:
    concurrently.create_index(INDEX, "events", ["cluster", "job", "comm_hash", "seq"],
                              include=["rank", "t"], where="kind = 'collective'")


def downgrade() -> None:
    op.drop_index(INDEX, table_name="events")
