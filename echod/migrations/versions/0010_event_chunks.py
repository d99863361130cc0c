"""Raw events of the frequent call kinds kept as chunks: a row per push, job, rank and kind
holding its events as arrays, instead of a row and five index entries an event.

The table ``events`` becomes ``event_rows`` (collectives, the rare kinds, failed calls and
whatever came as maps are still a row each) and ``event_chunks`` holds the rest: per chunk its
first event's time and id (the key: a push sent again makes the same chunks, and adds nothing),
its last event's time, its node, job, rank and kind, and one array per column (the events'
times in µs since 2000-01-01 UTC, as PostgreSQL keeps a timestamptz; their ids as the chunk's
id prefix and a number each; op, communicator, sequence, bytes, duration, NULL where no event
of the chunk has it; the other attributes as JSON, those all its events have alike once, in
``common``, and each event's others as text in ``attrs``). ``events`` is now a view of both, one row an event as before, that
runs with the reader's rights (``security_invoker``): the SQL sandbox's tenants read their own
clusters' rows of each table through it. Its last column, ``chunk_t``, is the time of the
chunk an event is kept in (its own time where it is a row): a window on it as well as on
``t`` (from a minute earlier) lets PostgreSQL read only the chunks in the window, which it
cannot tell from ``t``, made from the arrays. A chunk holds syncs, allocations, frees or
copies only (a CHECK that lets PostgreSQL leave the chunks out of every plan that reads other
kinds) and its events lie within one minute (``echod.chunks.CHUNK_SPAN``), so that a reader
bounds the chunks by their first time. Both tables are partitioned by the same days.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27
"""

import importlib

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

sandbox = importlib.import_module("echod.migrations.versions.0002_sandbox")

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# The indexes named after the table (the two named for what they serve keep their names).
RENAMED = ("cluster_job_t", "cluster_node_t", "kind_t")
# The kinds kept in chunks (echod.chunks.CHUNKED when this was written): a CHECK that lets
# PostgreSQL leave the chunks out of every plan that reads other kinds.
CHUNKED = "'sync', 'alloc', 'free', 'memcpy'"
EPOCH = "timestamptz '2000-01-01 00:00:00+00'"
EVENTS_VIEW = f"""
CREATE VIEW events WITH (security_invoker = true) AS
SELECT r.t, r.id, r.cluster, r.node, r.job, r.rank, r.kind, r.op, r.comm_hash, r.seq, r.bytes,
       r.duration_ns, r.attrs, r.t AS chunk_t
FROM event_rows r
UNION ALL
SELECT {EPOCH} + u.ts * interval '1 microsecond', c.id_prefix || u.number, c.cluster, c.node,
       c.job, c.rank, c.kind, u.op, u.comm_hash, u.seq, u.bytes, u.duration_ns,
       coalesce(c.common, '{{}}') || coalesce(CAST(u.attrs AS jsonb), '{{}}'), c.t
FROM event_chunks c
CROSS JOIN LATERAL unnest(c.ts, c.numbers, c.op, c.comm_hash, c.seq, c.bytes, c.duration_ns,
                          c.attrs) AS u(ts, number, op, comm_hash, seq, bytes, duration_ns, attrs)
"""


def upgrade() -> None:
    op.execute("ALTER TABLE events RENAME TO event_rows")
    op.execute("ALTER TABLE event_rows RENAME CONSTRAINT pk_events TO pk_event_rows")
    for index in RENAMED:
        op.execute(f"ALTER INDEX ix_events_{index} RENAME TO ix_event_rows_{index}")
    op.create_table(
        "event_chunks",
        sa.Column("t", sa.DateTime(timezone=True), nullable=False),
        sa.Column("id", sa.Text, nullable=False),
        sa.Column("t_last", sa.DateTime(timezone=True), nullable=False),
        sa.Column("cluster", sa.Text, nullable=False),
        sa.Column("node", sa.Text, nullable=False),
        sa.Column("job", sa.Text),
        sa.Column("rank", sa.Integer),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("id_prefix", sa.Text, nullable=False),
        sa.Column("numbers", postgresql.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("ts", postgresql.ARRAY(sa.BigInteger), nullable=False),
        sa.Column("op", postgresql.ARRAY(sa.Text)),
        sa.Column("comm_hash", postgresql.ARRAY(sa.Text)),
        sa.Column("seq", postgresql.ARRAY(sa.BigInteger)),
        sa.Column("bytes", postgresql.ARRAY(sa.BigInteger)),
        sa.Column("duration_ns", postgresql.ARRAY(sa.BigInteger)),
        sa.Column("common", postgresql.JSONB),
        sa.Column("attrs", postgresql.ARRAY(sa.Text)),
        sa.PrimaryKeyConstraint("t", "id", name="pk_event_chunks"),
        sa.CheckConstraint(f"kind IN ({CHUNKED})", name="ck_event_chunks_kinds"),
        postgresql_partition_by="RANGE (t)")
    op.create_index("ix_event_chunks_cluster_job_t", "event_chunks", ["cluster", "job", "t"])
    op.create_index("ix_event_chunks_cluster_node_t", "event_chunks", ["cluster", "node", "t"])
    op.create_index("ix_event_chunks_kind_t", "event_chunks", ["kind", "t"])
    op.execute("ALTER TABLE event_chunks ENABLE ROW LEVEL SECURITY")
    op.execute(f"CREATE POLICY {sandbox.POLICY} ON event_chunks FOR SELECT TO PUBLIC "
               f"USING ({sandbox.POLICY_USING})")
    # A day partition of chunks beside each day of rows.
    op.execute("""
        DO $$
        DECLARE day record;
        BEGIN
            FOR day IN SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound
                       FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
                       WHERE i.inhparent = 'event_rows'::regclass AND c.relname ~ '^events_'
            LOOP
                EXECUTE format('CREATE TABLE %I PARTITION OF event_chunks %s',
                               'event_chunks_' || substr(day.relname, 8), day.bound);
            END LOOP;
        END $$""")
    op.execute(EVENTS_VIEW)


def downgrade() -> None:
    op.execute("INSERT INTO event_rows SELECT t, id, cluster, node, job, rank, kind, op, "
               "comm_hash, seq, bytes, duration_ns, attrs FROM events ON CONFLICT DO NOTHING")
    op.execute("DROP VIEW events")
    op.drop_table("event_chunks")
    for index in RENAMED:
        op.execute(f"ALTER INDEX ix_event_rows_{index} RENAME TO ix_events_{index}")
    op.execute("ALTER TABLE event_rows RENAME CONSTRAINT pk_event_rows TO pk_events")
    op.execute("ALTER TABLE event_rows RENAME TO events")
