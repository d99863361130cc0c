"""Per-rank, per-minute summaries of the calls that take time: for each cluster, job, node,
rank, minute, kind, op, communicator and whether a sync waited on peers, how many calls, their
summed duration and bytes, the last one's time, and their durations as a histogram (log
buckets, 32 an octave, each with its count and sum: ``echod.summaries``). Written in the transaction that stores the
events, from the rows it stores (a batch sent again adds nothing). The tools read their
counts, sums and quantiles here instead of walking every raw event; the SQL sandbox's tenants
read their own clusters' rows, as in the other tables. The events already stored are
summarized by 0009, which gives the rows the shape the current echod writes.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

import importlib

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql


sandbox = importlib.import_module("echod.migrations.versions.0002_sandbox")

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "call_stats",
        sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("cluster", sa.Text, nullable=False),
        sa.Column("job", sa.Text),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("rank", sa.Integer),
        sa.Column("t", sa.DateTime(timezone=True), nullable=False),     # the minute
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("op", sa.Text),
        sa.Column("comm_hash", sa.Text),
        sa.Column("peer_wait", sa.Boolean, nullable=False),
        sa.Column("calls", sa.BigInteger, nullable=False),
        sa.Column("timed", sa.BigInteger, nullable=False),       # calls with a duration
        sa.Column("duration_ns", sa.BigInteger),
        sa.Column("bytes", sa.BigInteger),
        sa.Column("last_t", sa.DateTime(timezone=True), nullable=False),
        sa.Column("buckets", postgresql.ARRAY(sa.SmallInteger), nullable=False),
        sa.Column("counts", postgresql.ARRAY(sa.Integer), nullable=False),
        sa.Column("sums", postgresql.ARRAY(sa.BigInteger), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_call_stats"))
    op.create_index("ix_call_stats_cluster_job_t", "call_stats", ["cluster", "job", "t"])
    op.create_index("ix_call_stats_cluster_node_t", "call_stats", ["cluster", "node", "t"])
    op.execute("ALTER TABLE call_stats ENABLE ROW LEVEL SECURITY")    # a tenant reads its own
    op.execute(f"CREATE POLICY {sandbox.POLICY} ON call_stats FOR SELECT TO PUBLIC "
               f"USING ({sandbox.POLICY_USING})")


def downgrade() -> None:
    op.drop_table("call_stats")
