"""The first schema: events (partitioned by day), scores, thresholds, peer lag, verdicts, jobs,
nodes.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    create_events()
    create_health_scores()
    create_thresholds()
    create_peer_lag()
    create_straggler_verdicts()
    create_jobs()
    create_nodes()


def create_events() -> None:
    """Range-partitioned by ``t``; partitions, one per UTC day, are made by the writer."""
    op.create_table(
        "events",
        sa.Column("t", TS, nullable=False),
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("cluster", sa.Text, nullable=False),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("job", sa.Text),
        sa.Column("rank", sa.Integer),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("op", sa.Text),
        sa.Column("comm_hash", sa.Text),
        sa.Column("seq", sa.BigInteger),
        sa.Column("bytes", sa.BigInteger),
        sa.Column("duration_ns", sa.BigInteger),
        sa.Column("attrs", JSONB, nullable=False),
        sa.PrimaryKeyConstraint("t", "id", name="pk_events"),
        postgresql_partition_by="RANGE (t)",
    )
    op.create_index("ix_events_cluster_job_t", "events", ["cluster", "job", "t"])
    op.create_index("ix_events_cluster_node_t", "events", ["cluster", "node", "t"])
    op.create_index("ix_events_kind_t", "events", ["kind", "t"])


def create_health_scores() -> None:
    op.create_table(
        "health_scores",
        sa.Column("cluster", sa.Text, nullable=False),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("t", TS, nullable=False),
        sa.Column("job", sa.Text),
        sa.Column("score", sa.Float, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("throughput", sa.Float),
        sa.Column("compute", sa.Float),
        sa.Column("memory", sa.Float),
        sa.Column("cpu", sa.Float),
        sa.PrimaryKeyConstraint("cluster", "node", "t", name="pk_health_scores"),
    )


def create_thresholds() -> None:
    op.create_table(
        "thresholds",
        sa.Column("cluster", sa.Text, nullable=False),
        sa.Column("cohort", sa.Text, nullable=False),
        sa.Column("t", TS, nullable=False),
        sa.Column("threshold", sa.Float),
        sa.Column("median", sa.Float),
        sa.Column("mad", sa.Float),
        sa.Column("active", sa.Integer, nullable=False),
        sa.Column("quorum_met", sa.Boolean, nullable=False),
        sa.Column("panic", sa.Boolean, nullable=False),
        sa.Column("stragglers", ARRAY(sa.Text), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "cohort", "t", name="pk_thresholds"),
    )


def create_peer_lag() -> None:
    op.create_table(
        "peer_lag",
        sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("t", TS, nullable=False),
        sa.Column("cluster", sa.Text, nullable=False),
        sa.Column("job", sa.Text),
        sa.Column("comm_hash", sa.Text, nullable=False),
        sa.Column("seq_first", sa.BigInteger, nullable=False),
        sa.Column("seq_last", sa.BigInteger, nullable=False),
        sa.Column("rank", sa.Integer, nullable=False),
        sa.Column("node", sa.Text),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("lag_median_ns", sa.BigInteger),
        sa.Column("lag_p95_ns", sa.BigInteger),
        sa.Column("lag_max_ns", sa.BigInteger),
        sa.PrimaryKeyConstraint("id", name="pk_peer_lag"),
        sa.UniqueConstraint("cluster", "job", "comm_hash", "rank", "seq_first",
                            name="uq_peer_lag_cluster_job_comm_hash_rank_seq_first"),
    )


def create_straggler_verdicts() -> None:
    op.create_table(
        "straggler_verdicts",
        sa.Column("id", sa.BigInteger, sa.Identity(), nullable=False),
        sa.Column("t", TS, nullable=False),
        sa.Column("cluster", sa.Text, nullable=False),
        sa.Column("job", sa.Text),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("rank", sa.Integer),
        sa.Column("op", sa.Text),
        sa.Column("comm_hash", sa.Text),
        sa.Column("lag_ns", sa.BigInteger),
        sa.Column("cause", sa.Text, nullable=False),
        sa.Column("evidence", JSONB, nullable=False),
        sa.Column("cost_gpu_seconds", sa.Float),
        sa.PrimaryKeyConstraint("id", name="pk_straggler_verdicts"),
    )
    op.create_index("ix_straggler_verdicts_cluster_job", "straggler_verdicts", ["cluster", "job"])


def create_jobs() -> None:
    op.create_table(
        "jobs",
        sa.Column("cluster", sa.Text, nullable=False),
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("user", sa.Text),
        sa.Column("nodes", ARRAY(sa.Text), nullable=False),
        sa.Column("gpus", sa.Integer),
        sa.Column("start", TS),
        sa.Column("end", TS),
        sa.PrimaryKeyConstraint("cluster", "id", name="pk_jobs"),
    )


def create_nodes() -> None:
    op.create_table(
        "nodes",
        sa.Column("cluster", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("first_seen", TS, nullable=False),
        sa.Column("last_seen", TS, nullable=False),
        sa.Column("boot_id", sa.Text),
        sa.PrimaryKeyConstraint("cluster", "name", name="pk_nodes"),
    )


def downgrade() -> None:
    for table in ("nodes", "jobs", "straggler_verdicts", "peer_lag", "thresholds",
                  "health_scores", "events"):
        op.drop_table(table)
