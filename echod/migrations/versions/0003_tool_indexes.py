"""The index the lag tools read collectives through: (cluster, job, comm_hash, seq), carrying
rank and t, on collective events only.

Ranks call a communicator's collectives in the same order, so one collective instance is one
(cluster, job, comm_hash, seq) key here, its ranks side by side. echod.tools finds the
communicators by skip scans of this index and reads sampled instances by index-only lookups,
so find_stragglers, explain, get_cost and job_report never scan a job's collectives. Partial
(kind = 'collective') to stay small: a collective event is most of what is stored.

Built on every day partition of events; on a large existing table this takes a while and
blocks writes meanwhile (a partitioned table has no CREATE INDEX CONCURRENTLY).

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

INDEX = "ix_events_collective_seq"


def upgrade() -> None:
    op.create_index(INDEX, "events", ["cluster", "job", "comm_hash", "seq"],
                    postgresql_include=["rank", "t"],
                    postgresql_where=sa.text("kind = 'collective'"))


def downgrade() -> None:
    op.drop_index(INDEX, table_name="events")
