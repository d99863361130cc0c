"""fleetd's lag summaries by Slurm step: ``peer_lag.step``, the step of the run fleetd judged
(NULL from a fleetd before it, or for a job run outside Slurm). Each srun step of a job runs
processes of its own, ranked from 0; without the step, echod's per-rank summaries merged step
0's rank 0 with step 1's. A nullable column: a catalog change, nothing is rewritten.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

from echod.migrations import concurrently

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    concurrently.add_missing_columns("peer_lag", [sa.Column("step", sa.Text())])


def downgrade() -> None:
    op.drop_column("peer_lag", "step")
