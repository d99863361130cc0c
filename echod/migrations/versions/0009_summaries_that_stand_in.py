"""Summaries that can stand in for the raw events, so that retention can thin those.

``peer_lag`` gains, per rank and run of collectives fleetd settled, the lag's 99th percentile,
how many instances the rank entered last, the wait it caused its peers there and its own wait
(NULL in rows from a fleetd before this): the lag survey (find_stragglers, job_report,
get_cost, explain) answers from them where the raw collectives are thinned or too many.

``call_stats`` gains what the memory and copy tools need: failed calls apart (``failed``,
in the key), copies by direction (``detail``), the bytes of the calls with a duration, the
largest call's bytes, the calls under 1 MiB, and the first call's time. Its rows are made
again from the events stored (a long statement on a large store, run once), as the current
echod writes them.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

from echod.store.summaries import SUMMARIZE

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

PEER_LAG = ("lag_p99_ns", "last_arrivals", "idle_caused_ns", "waited_ns")
CALL_STATS = (
    sa.Column("failed", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("detail", sa.Text),
    sa.Column("timed_bytes", sa.BigInteger),
    sa.Column("max_bytes", sa.BigInteger),
    sa.Column("small_calls", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("first_t", sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    for name in PEER_LAG:
        op.add_column("peer_lag", sa.Column(name, sa.BigInteger))
    for column in CALL_STATS:
        op.add_column("call_stats", column)
    op.execute("DELETE FROM call_stats")
    op.execute(f"WITH moved AS (SELECT * FROM events), {SUMMARIZE} SELECT count(*) FROM moved")


def downgrade() -> None:
    for name in PEER_LAG:
        op.drop_column("peer_lag", name)
    for column in CALL_STATS:
        op.drop_column("call_stats", column.name)
