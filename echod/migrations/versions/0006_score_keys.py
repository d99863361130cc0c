"""A health score is keyed by the push that carried it (the agent's boot id and sequence
number), not only by when fleetd received it: a push sent again after fleetd restarts is
received at another time, and must not be stored twice.

The unique index is built concurrently while scores go on being written (the table grows with
every push), then made the constraint (``echod.migrations.concurrently``); a start killed
midway finds the columns added and finishes the index.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

from echod.migrations import concurrently

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    concurrently.add_missing_columns("health_scores", [
        sa.Column("boot_id", sa.Text(), nullable=True),
        sa.Column("seq", sa.BigInteger(), nullable=True)])
    concurrently.create_unique_constraint("uq_health_scores_push", "health_scores",
                                          ["cluster", "node", "boot_id", "seq"])


def downgrade() -> None:
    op.drop_constraint("uq_health_scores_push", "health_scores")
    op.drop_column("health_scores", "seq")
    op.drop_column("health_scores", "boot_id")
