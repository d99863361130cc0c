"""Jobs as Slurm names them: the run (how many times Slurm requeued the job before it), the
Slurm cluster, the id Slurm prints (``1234_7`` for an array task, ``1234+1`` for a
heterogeneous component; ``id`` stays the raw id every process of the job carries), and the
state and exit status slurmctld gave the run, asked of sacct or scontrol once the epilog has
told the end (``slurm_state``: it stands over the state the epilog read from its
environment). ``slurm_checked`` and ``slurm_tries`` pace those questions.

The index on the Slurm id is built concurrently, while jobs go on being recorded
(``echod.migrations.concurrently``); a start killed midway finds the columns added and finishes
the index.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

from echod.migrations import concurrently

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

COLUMNS = (("restarts", sa.Integer(), sa.text("0")), ("slurm_cluster", sa.Text(), None),
           ("slurm_id", sa.Text(), None),
           ("slurm_state", sa.Text(), None), ("slurm_exit_code", sa.Text(), None),
           ("slurm_checked", sa.DateTime(timezone=True), None),
           ("slurm_tries", sa.Integer(), sa.text("0")))


def upgrade() -> None:
    concurrently.add_missing_columns("jobs", [
        sa.Column(name, kind, nullable=default is None, server_default=default)
        for name, kind, default in COLUMNS])
    concurrently.create_index("jobs_slurm_id", "jobs", ["cluster", "slurm_id"])


def downgrade() -> None:
    op.drop_index("jobs_slurm_id", table_name="jobs")
    for name, _, _ in reversed(COLUMNS):
        op.drop_column("jobs", name)
