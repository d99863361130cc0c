"""The tables of the event store, in SQLAlchemy 2.0 declarative form.

Every table that holds cluster data has a ``cluster`` column that leads its indexes: tenancy
(row-level security per cluster) keys on it. The raw events are ``event_rows`` (an event a row)
and ``event_chunks`` (a push's frequent calls, per job, rank and kind, as arrays), both shown
as one row an event by the view ``events`` (migration 0010); both are range-partitioned by
their time ``t``, one partition per UTC day (see ``echod.store.db``), and their key
``(t, id)`` makes a replay change nothing.
The Alembic migrations in ``echod/migrations`` create these tables; this module describes them
for queries.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (BigInteger, Boolean, CheckConstraint, DateTime, Float, Identity, Index,
                        Integer, MetaData, SmallInteger, Text, UniqueConstraint, false, text,
                        true)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}

Timestamp = DateTime(timezone=True)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {datetime: Timestamp, dict[str, Any]: JSONB, list[str]: ARRAY(Text)}


# The calls that failed (a number other than 0 returned), as the partial index over them has it.
FAILED_CALL = ("kind IN ('sync', 'alloc', 'free') AND jsonb_typeof(attrs -> 'result') = 'number' "
               "AND attrs -> 'result' <> '0'::jsonb")


class Event(Base):
    """One traced event; the columns queries filter on are lifted out of ``attrs``."""

    __tablename__ = "event_rows"
    __table_args__ = (
        Index(None, "cluster", "job", "t"),
        Index(None, "cluster", "node", "t"),
        Index(None, "kind", "t"),
        Index("ix_events_collective_seq", "cluster", "job", "comm_hash", "seq",
              postgresql_include=["rank", "t"], postgresql_where=text("kind = 'collective'")),
        Index("ix_events_failed_calls", "cluster", "t", postgresql_where=text(FAILED_CALL)),
        {"postgresql_partition_by": "RANGE (t)"},
    )

    t: Mapped[datetime] = mapped_column(primary_key=True)
    id: Mapped[str] = mapped_column(Text, primary_key=True)
    cluster: Mapped[str] = mapped_column(Text)
    node: Mapped[str] = mapped_column(Text)
    job: Mapped[str | None] = mapped_column(Text)
    rank: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(Text)
    op: Mapped[str | None] = mapped_column(Text)
    comm_hash: Mapped[str | None] = mapped_column(Text)
    seq: Mapped[int | None] = mapped_column(BigInteger)
    nbytes: Mapped[int | None] = mapped_column("bytes", BigInteger)
    duration_ns: Mapped[int | None] = mapped_column(BigInteger)
    attrs: Mapped[dict[str, Any]] = mapped_column(default=dict)


class EventChunk(Base):
    """Events of one push, job, rank and kind, a column each (``events`` shows them as rows)."""

    __tablename__ = "event_chunks"
    __table_args__ = (
        Index(None, "cluster", "job", "t"),
        Index(None, "cluster", "node", "t"),
        Index(None, "kind", "t"),
        CheckConstraint("kind IN ('sync', 'alloc', 'free', 'memcpy')",
                        name="ck_event_chunks_kinds"),
        {"postgresql_partition_by": "RANGE (t)"},
    )

    t: Mapped[datetime] = mapped_column(primary_key=True)       # the first event's
    id: Mapped[str] = mapped_column(Text, primary_key=True)     # the first event's
    t_last: Mapped[datetime]
    cluster: Mapped[str] = mapped_column(Text)
    node: Mapped[str] = mapped_column(Text)
    job: Mapped[str | None] = mapped_column(Text)
    rank: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(Text)
    id_prefix: Mapped[str] = mapped_column(Text)
    numbers: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    ts: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))
    op: Mapped[list[str] | None] = mapped_column(ARRAY(Text))   # NULL: no event has it
    comm_hash: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    seq: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    nbytes: Mapped[list[int] | None] = mapped_column("bytes", ARRAY(BigInteger))
    duration_ns: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    common: Mapped[dict[str, Any] | None]       # the attributes its events have alike
    attrs: Mapped[list[str] | None] = mapped_column(ARRAY(Text))     # and each one's others


class HealthScore(Base):
    """A node's health score as fleetd received it, with the signals it is made of."""

    __tablename__ = "health_scores"
    __table_args__ = (UniqueConstraint("cluster", "node", "boot_id", "seq",
                                       name="uq_health_scores_push"),)

    cluster: Mapped[str] = mapped_column(Text, primary_key=True)
    node: Mapped[str] = mapped_column(Text, primary_key=True)
    t: Mapped[datetime] = mapped_column(primary_key=True)
    job: Mapped[str | None] = mapped_column(Text)
    score: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(Text)
    throughput: Mapped[float | None] = mapped_column(Float)
    compute: Mapped[float | None] = mapped_column(Float)
    memory: Mapped[float | None] = mapped_column(Float)
    cpu: Mapped[float | None] = mapped_column(Float)
    clock_offset: Mapped[float | None] = mapped_column(Float)       # s, node − fleetd
    clock_uncertainty: Mapped[float | None] = mapped_column(Float)
    boot_id: Mapped[str | None] = mapped_column(Text)     # the push that carried it:
    seq: Mapped[int | None] = mapped_column(BigInteger)   # a resent push is stored once


class Threshold(Base):
    """A cohort's straggler threshold (median − k·1.4826·MAD) at one recompute."""

    __tablename__ = "thresholds"

    cluster: Mapped[str] = mapped_column(Text, primary_key=True)
    cohort: Mapped[str] = mapped_column(Text, primary_key=True)
    t: Mapped[datetime] = mapped_column(primary_key=True)
    threshold: Mapped[float | None] = mapped_column(Float)
    median: Mapped[float | None] = mapped_column(Float)
    mad: Mapped[float | None] = mapped_column(Float)
    active: Mapped[int] = mapped_column(Integer)
    quorum_met: Mapped[bool] = mapped_column(Boolean)
    panic: Mapped[bool] = mapped_column(Boolean)
    stragglers: Mapped[list[str]] = mapped_column(default=list)


class PeerLag(Base):
    """How late one rank entered a run of the same collectives (communicator, seq range)."""

    __tablename__ = "peer_lag"
    __table_args__ = (
        UniqueConstraint("cluster", "job", "comm_hash", "rank", "seq_first"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    t: Mapped[datetime]
    cluster: Mapped[str] = mapped_column(Text)
    job: Mapped[str | None] = mapped_column(Text)
    comm_hash: Mapped[str] = mapped_column(Text)
    seq_first: Mapped[int] = mapped_column(BigInteger)
    seq_last: Mapped[int] = mapped_column(BigInteger)
    rank: Mapped[int] = mapped_column(Integer)
    node: Mapped[str | None] = mapped_column(Text)
    samples: Mapped[int] = mapped_column(Integer)
    lag_median_ns: Mapped[int | None] = mapped_column(BigInteger)
    lag_p95_ns: Mapped[int | None] = mapped_column(BigInteger)
    lag_max_ns: Mapped[int | None] = mapped_column(BigInteger)
    lag_p99_ns: Mapped[int | None] = mapped_column(BigInteger)
    last_arrivals: Mapped[int | None] = mapped_column(BigInteger)
    idle_caused_ns: Mapped[int | None] = mapped_column(BigInteger)
    waited_ns: Mapped[int | None] = mapped_column(BigInteger)
    step: Mapped[str | None] = mapped_column(Text)      # the Slurm step of the run judged


class CallStats(Base):
    """One minute of one rank's calls of a kind, op and communicator (syncs apart by whether
    they waited on peers, failed calls apart, copies by direction): counts, sums and a
    histogram of durations (``echod.store.summaries``)."""

    __tablename__ = "call_stats"
    __table_args__ = (
        Index(None, "cluster", "job", "t"),
        Index(None, "cluster", "node", "t"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    cluster: Mapped[str] = mapped_column(Text)
    job: Mapped[str | None] = mapped_column(Text)
    node: Mapped[str] = mapped_column(Text)
    rank: Mapped[int | None] = mapped_column(Integer)
    t: Mapped[datetime]
    kind: Mapped[str] = mapped_column(Text)
    op: Mapped[str | None] = mapped_column(Text)
    comm_hash: Mapped[str | None] = mapped_column(Text)
    peer_wait: Mapped[bool] = mapped_column(Boolean)
    failed: Mapped[bool] = mapped_column(Boolean, server_default=false())
    detail: Mapped[str | None] = mapped_column(Text)
    calls: Mapped[int] = mapped_column(BigInteger)
    timed: Mapped[int] = mapped_column(BigInteger)
    duration_ns: Mapped[int | None] = mapped_column(BigInteger)
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    timed_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_bytes: Mapped[int | None] = mapped_column(BigInteger)
    small_calls: Mapped[int] = mapped_column(BigInteger, server_default="0")
    first_t: Mapped[datetime | None]
    last_t: Mapped[datetime]
    buckets: Mapped[list[int]] = mapped_column(ARRAY(SmallInteger))
    counts: Mapped[list[int]] = mapped_column(ARRAY(Integer))
    sums: Mapped[list[int]] = mapped_column(ARRAY(BigInteger))


class StragglerVerdict(Base):
    """fleetd's finding that a rank is the straggler, why, with evidence and what it cost."""

    __tablename__ = "straggler_verdicts"
    __table_args__ = (Index(None, "cluster", "job"), UniqueConstraint("cluster", "vid"))

    id: Mapped[int] = mapped_column(BigInteger, Identity(), primary_key=True)
    t: Mapped[datetime]
    cluster: Mapped[str] = mapped_column(Text)
    job: Mapped[str | None] = mapped_column(Text)
    node: Mapped[str] = mapped_column(Text)
    rank: Mapped[int | None] = mapped_column(Integer)
    op: Mapped[str | None] = mapped_column(Text)
    comm_hash: Mapped[str | None] = mapped_column(Text)
    lag_ns: Mapped[int | None] = mapped_column(BigInteger)
    cause: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(default=dict)
    cost_gpu_seconds: Mapped[float | None] = mapped_column(Float)
    vid: Mapped[str | None] = mapped_column(Text)
    revision: Mapped[int | None] = mapped_column(Integer)
    kind: Mapped[str | None] = mapped_column(Text)
    confidence: Mapped[str | None] = mapped_column(Text)
    severity: Mapped[str | None] = mapped_column(Text)
    fix: Mapped[str | None] = mapped_column(Text)
    step: Mapped[int | None] = mapped_column(BigInteger)
    onset: Mapped[datetime | None]
    last_seen: Mapped[datetime | None]
    cleared: Mapped[datetime | None]
    lag_p99_ns: Mapped[int | None] = mapped_column(BigInteger)
    last_share: Mapped[float | None] = mapped_column(Float)
    period: Mapped[int | None] = mapped_column(Integer)
    occurrences: Mapped[int | None] = mapped_column(Integer)
    cost_usd: Mapped[float | None] = mapped_column(Float)


class Job(Base):
    """A Slurm (or bare-metal) job: who ran it, where, on how many GPUs, when."""

    __tablename__ = "jobs"

    cluster: Mapped[str] = mapped_column(Text, primary_key=True)
    id: Mapped[str] = mapped_column(Text, primary_key=True)
    user: Mapped[str | None] = mapped_column(Text)
    nodes: Mapped[list[str]] = mapped_column(default=list)
    gpus: Mapped[int | None] = mapped_column(Integer)
    start: Mapped[datetime | None]
    end: Mapped[datetime | None]
    account: Mapped[str | None] = mapped_column(Text)
    partition: Mapped[str | None] = mapped_column(Text)
    ntasks: Mapped[int | None] = mapped_column(Integer)
    state: Mapped[str | None] = mapped_column(Text)
    exit_code: Mapped[str | None] = mapped_column(Text)
    restarts: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    slurm_cluster: Mapped[str | None] = mapped_column(Text)
    slurm_id: Mapped[str | None] = mapped_column(Text)
    slurm_state: Mapped[str | None] = mapped_column(Text)
    slurm_exit_code: Mapped[str | None] = mapped_column(Text)
    slurm_checked: Mapped[datetime | None]
    slurm_tries: Mapped[int] = mapped_column(Integer, server_default=text("0"))

    __table_args__ = (Index("jobs_slurm_id", "cluster", "slurm_id"),)


class Node(Base):
    """A node that has reported, with the boot it last reported from."""

    __tablename__ = "nodes"

    cluster: Mapped[str] = mapped_column(Text, primary_key=True)
    name: Mapped[str] = mapped_column(Text, primary_key=True)
    first_seen: Mapped[datetime]
    last_seen: Mapped[datetime]
    boot_id: Mapped[str | None] = mapped_column(Text)


class SandboxKey(Base):
    """The one secret that signs the SQL sandbox's scopes (``echod.sandbox``); no role but the
    owner may read it."""

    __tablename__ = "sandbox_key"

    id: Mapped[bool] = mapped_column(Boolean, primary_key=True, server_default=true())
    key: Mapped[str] = mapped_column(Text)
