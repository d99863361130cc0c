"""What the Slurm hooks record about a job besides who, where and when: its account, its
partition, how many tasks, how it ended (state, and the exit status as exit:signal).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

COLUMNS = (("account", sa.Text()), ("partition", sa.Text()), ("ntasks", sa.Integer()),
           ("state", sa.Text()), ("exit_code", sa.Text()))


def upgrade() -> None:
    for name, kind in COLUMNS:
        op.add_column("jobs", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(COLUMNS):
        op.drop_column("jobs", name)
