"""Rank verdicts as fleetd issues them: what kind, since when, how bad, cleared when; and
each node's clock offset with its scores.

fleetd names a rank a straggler, updates the verdict while it lasts and clears it when it
stops; every change is a new revision of the same verdict (``vid``, fleetd's id for it). The
store keeps the newest revision: a replayed or older one changes nothing. ``t`` is when the
verdict was first raised and ``lag_ns`` its median lag, as before. A health score carries its
node's clock offset from fleetd's clock (seconds, node minus fleetd) and its uncertainty, so
that the tools can put every node's times on one clock.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)
COLUMNS = (
    ("vid", sa.Text()), ("revision", sa.Integer()), ("kind", sa.Text()),
    ("confidence", sa.Text()), ("severity", sa.Text()), ("fix", sa.Text()),
    ("step", sa.BigInteger()), ("onset", TIME), ("last_seen", TIME), ("cleared", TIME),
    ("lag_p99_ns", sa.BigInteger()), ("last_share", sa.Float()), ("period", sa.Integer()),
    ("occurrences", sa.Integer()), ("cost_usd", sa.Float()),
)
CLOCK = ("clock_offset", "clock_uncertainty")


def upgrade() -> None:
    for name, kind in COLUMNS:
        op.add_column("straggler_verdicts", sa.Column(name, kind, nullable=True))
    op.create_unique_constraint("uq_straggler_verdicts_cluster_vid", "straggler_verdicts",
                                ["cluster", "vid"])
    for name in CLOCK:
        op.add_column("health_scores", sa.Column(name, sa.Float(), nullable=True))


def downgrade() -> None:
    for name in CLOCK:
        op.drop_column("health_scores", name)
    op.drop_constraint("uq_straggler_verdicts_cluster_vid", "straggler_verdicts")
    for name, _ in reversed(COLUMNS):
        op.drop_column("straggler_verdicts", name)
