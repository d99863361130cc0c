"""The ingero wire protocol between ingerod (a ZeroMQ DEALER) and fleetd (a ROUTER).

Every message is two frames: an 8-byte header and a msgpack body.

    header  = b"INGR" | major (u8) | minor (u8) | type (u8) | reserved (u8, 0)
    body    = msgpack map, checked field by field against the type's schema

A receiver checks, in order: frame count, total size, magic, major version, message type, that
the body unpacks within msgpack's own limits, and then every field: presence, type, finite
numbers, ranges and string lengths. Unknown fields are ignored so that a newer minor version can
add optional ones. Anything else raises a ``FrameError`` whose ``reason`` labels the counter of
rejected frames. The protocol is documented in ingero-wire(7).
"""

from __future__ import annotations

import struct
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import msgpack

from . import columns as columnar
from .errors import BadSchema, BadVersion, FrameError, FrameTooLarge
from .fields import (ATTR_TYPES, MAX_ATTRS, check_bool, check_float, check_int, check_list,
                     check_name, check_signals, check_text, fail as _fail,
                     event_list as _event_list, text_list as _text_list, state as _state,
                     optional as _optional, seconds as _seconds, interval as _interval,
                     unit as _unit, count as _count, clock_sample as _clock_sample, ranks as _ranks)
from .vocabulary import SIGNALS  # noqa: F401 (the signals a push carries, by their wire names)

MAGIC = b"INGR"
MAJOR = 1
MINOR = 3
_HEADER = struct.Struct("!4sBBBB")
HEADER_SIZE = _HEADER.size

MAX_FRAME_BYTES = 4 * 1024 * 1024
MAX_EVENTS = columnar.MAX_EVENTS    # a push's events, whichever form they take
# -- messages ----------------------------------------------------------------------------------

@dataclass
class Message:
    """Base of the message types; ``TYPE`` is the header's type byte, ``CHECKS`` the schema."""

    TYPE: ClassVar[int] = 0
    CHECKS: ClassVar[dict[str, Any]] = {}
    REQUIRED: ClassVar[tuple[str, ...]] = ()    # fields with a default a receiver still needs

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The body's keys, in order (``dataclasses.fields`` walks the class each call)."""
        names = cls.__dict__.get("_field_names")
        if names is None:
            names = tuple(f.name for f in fields(cls))
            cls._field_names = names
        return names


@dataclass
class Hello(Message):
    """ingerod introduces itself after every (re)connect."""

    TYPE: ClassVar[int] = 1
    node: str
    cluster: str
    boot_id: str
    capabilities: list[str] = field(default_factory=list)
    interval: float = 5.0
    agent_version: str = ""
    CHECKS: ClassVar[dict[str, Any]] = {
        "node": check_name, "cluster": check_name, "boot_id": check_text,
        "capabilities": _text_list, "interval": _interval,
        "agent_version": lambda n, v: check_text(n, v, 64, empty_ok=True),
    }


COLUMNS = "columns"      # a capability: takes pushes of columns (ColumnPush, since 1.3)


@dataclass
class Welcome(Message):
    """fleetd's answer to hello: its version, its clock, and what it takes (since 1.3)."""

    TYPE: ClassVar[int] = 2
    server_version: str
    recv_at: float
    sent_at: float
    capabilities: list[str] = field(default_factory=list)
    CHECKS: ClassVar[dict[str, Any]] = {
        "server_version": check_text, "recv_at": _seconds, "sent_at": _seconds,
        "capabilities": _text_list,
    }


@dataclass
class Push(Message):
    """One batch from ingerod: its health score, state and events, numbered per boot."""

    TYPE: ClassVar[int] = 3
    seq: int
    node: str
    cluster: str
    boot_id: str
    score: float
    signals: dict[str, float]
    state: str
    sent_at: float
    interval: float
    job: str | None = None
    job_nodes: int | None = None
    events: list[dict] = field(default_factory=list)
    clock: list[float] | None = None
    host_boot: str | None = None       # the host's boot id: a new one, a new clock estimate
    body: ClassVar[bytes | None] = None  # a ColumnPush's body frame, as it came off the wire

    def job_of(self, event: dict) -> str | None:
        """An event's Slurm job: its process's (a node-wide agent traces several jobs), else
        the agent's own --job."""
        return event["attrs"].get("job") or self.job

    def jobs(self) -> set[str | None]:
        """The jobs its events belong to."""
        return {self.job_of(event) for event in self.events}

    def event_count(self) -> int:
        return len(self.events)

    def all_events(self) -> list[dict]:
        """Every event as a map."""
        return self.events

    def stored_rows(self, events: list[dict] | None = None) -> list[dict]:
        """Its events (or these of them) as echod stores them: each with the node, cluster,
        boot id and job."""
        identity = {"node": self.node, "cluster": self.cluster, "boot_id": self.boot_id}
        return [{**event, **identity, "job": self.job_of(event)}
                for event in (self.all_events() if events is None else events)]

    CHECKS: ClassVar[dict[str, Any]] = {
        "seq": lambda n, v: check_int(n, v), "node": check_name, "cluster": check_name,
        "boot_id": check_text, "score": _unit, "signals": check_signals, "state": _state,
        "sent_at": _seconds, "interval": _interval, "job": _optional(check_text),
        "job_nodes": _optional(_count), "events": _event_list,
        "clock": _optional(_clock_sample), "host_boot": _optional(check_text),
    }


@dataclass
class ColumnPush(Push):
    """A push whose events are typed columns (``ingero.columns``), any the columns cannot carry
    still maps in ``events``. Its own type, so that a fleetd before 1.3 refuses it (and the
    agent sends it again as a ``Push``) rather than dropping the unknown field; sent only to a
    fleetd whose ``Welcome`` lists the ``columns`` capability."""

    TYPE: ClassVar[int] = 10
    columns: columnar.EventColumns | dict | None = None
    REQUIRED: ClassVar[tuple[str, ...]] = ("columns",)

    def jobs(self) -> set[str | None]:
        found = set(self.columns.texts("job")) | super().jobs()
        job = self.columns.attrs.get("job")
        if self.columns.n and (job is None or not job.mask(self.columns.n).all()):
            found.add(self.job)
        return found

    def event_count(self) -> int:
        return len(self.events) + self.columns.n

    def all_events(self) -> list[dict]:
        return self.columns.rows() + self.events

    def as_push(self) -> Push:
        """The same push as a fleetd before 1.3 takes it: every event a map."""
        values = {name: getattr(self, name) for name in Push.field_names()}
        return Push(**{**values, "events": self.all_events()})

    CHECKS: ClassVar[dict[str, Any]] = {
        **Push.CHECKS,
        "columns": lambda n, v: columnar.check(n, v, ATTR_TYPES, MAX_ATTRS),
    }


@dataclass
class Reply(Message):
    """fleetd's answer to a push: the ack, the cohort's bar and fleetd's clock."""

    TYPE: ClassVar[int] = 4
    ack: int
    cohort: str
    threshold: float | None
    quorum_met: bool
    panic: bool
    straggler: bool
    recv_at: float
    sent_at: float
    agent_sent_at: float
    duplicate: bool = False
    straggler_ranks: list[int] = field(default_factory=list)
    straggler_jobs: list[str | None] | None = None    # each rank's job (since 1.2)
    CHECKS: ClassVar[dict[str, Any]] = {
        "ack": lambda n, v: check_int(n, v), "cohort": check_text,
        "threshold": _optional(check_float), "quorum_met": check_bool, "panic": check_bool,
        "straggler": check_bool, "recv_at": _seconds, "sent_at": _seconds,
        "agent_sent_at": _seconds, "duplicate": check_bool, "straggler_ranks": _ranks,
        "straggler_jobs": _optional(lambda n, v: check_list(
            n, v, _optional(check_text), MAX_EVENTS)),
    }

    def stragglers(self) -> list[tuple[str | None, int]]:
        """(job, rank) of each rank named; an older fleetd names ranks only."""
        jobs = self.straggler_jobs or [None] * len(self.straggler_ranks)
        return list(zip(jobs, self.straggler_ranks))


@dataclass
class Query(Message):
    """Ask fleetd for a cohort's threshold and stragglers without pushing a score."""

    TYPE: ClassVar[int] = 5
    cohort: str
    CHECKS: ClassVar[dict[str, Any]] = {"cohort": check_text}


@dataclass
class Status(Message):
    """fleetd's answer to a query: the cohort's statistics as of its last recompute."""

    TYPE: ClassVar[int] = 6
    cohort: str
    known: bool
    threshold: float | None
    median: float | None
    mad: float | None
    quorum_met: bool
    panic: bool
    active_nodes: int
    expected_nodes: int | None
    stragglers: list[str]
    sent_at: float
    CHECKS: ClassVar[dict[str, Any]] = {
        "cohort": check_text, "known": check_bool, "threshold": _optional(check_float),
        "median": _optional(check_float), "mad": _optional(check_float),
        "quorum_met": check_bool, "panic": check_bool, "active_nodes": _count,
        "expected_nodes": _optional(_count),
        "stragglers": lambda n, v: check_list(n, v, check_text, 10_000), "sent_at": _seconds,
    }


@dataclass
class Heartbeat(Message):
    """Liveness, both ways, when nothing else has been said for a heartbeat interval."""

    TYPE: ClassVar[int] = 7
    sent_at: float
    CHECKS: ClassVar[dict[str, Any]] = {"sent_at": _seconds}


MAX_FORWARD_ROWS = 20_000
MAX_ARRAY = MAX_FORWARD_ROWS  # the longest list any message may hold
MAX_ROW_FIELDS = 64


def _row(name: str, value: Any) -> dict:
    """A forwarded row: a flat-ish map; its content is the store's to check, row by row, so
    that one bad row is rejected alone rather than the whole batch."""
    if not isinstance(value, dict) or len(value) > MAX_ROW_FIELDS:
        _fail(name, f"expected a map of at most {MAX_ROW_FIELDS} entries")
    return value


def _rows(name: str, value: Any) -> list[dict]:
    return check_list(name, value, _row, MAX_FORWARD_ROWS)


@dataclass
class Forward(Message):
    """fleetd → echod: what fleetd accepted, for storage; numbered per fleetd instance."""

    TYPE: ClassVar[int] = 8
    seq: int
    source: str
    events: list[dict] = field(default_factory=list)
    scores: list[dict] = field(default_factory=list)
    thresholds: list[dict] = field(default_factory=list)
    verdicts: list[dict] = field(default_factory=list)
    peer_lag: list[dict] = field(default_factory=list)
    CHECKS: ClassVar[dict[str, Any]] = {
        "seq": lambda n, v: check_int(n, v), "source": check_text, "events": _rows,
        "scores": _rows, "thresholds": _rows, "verdicts": _rows, "peer_lag": _rows,
    }


    SECTIONS: ClassVar[tuple[str, ...]] = ("events", "scores", "thresholds", "verdicts",
                                           "peer_lag")

    def row_count(self) -> int:
        return sum(len(getattr(self, section)) for section in self.SECTIONS)


MAX_FORWARD_PUSHES = 4096


def _bodies(name: str, value: Any) -> list[bytes]:
    if type(value) is not list or len(value) > MAX_FORWARD_PUSHES or any(
            type(body) is not bytes for body in value):
        _fail(name, f"expected a list of at most {MAX_FORWARD_PUSHES} bin")
    return value


@dataclass
class ForwardColumns(Forward):
    """fleetd → echod: a ``Forward`` that also carries pushes of columns as fleetd received
    them (each ``ColumnPush``'s body frame, not encoded again), for echod to check and store.
    Its own type, so that an echod before 1.3 refuses it rather than ignore the field; sent
    only to an echod whose ``ForwardAck`` lists the ``columns`` capability."""

    TYPE: ClassVar[int] = 11
    pushes: list[bytes] = field(default_factory=list)
    CHECKS: ClassVar[dict[str, Any]] = {**Forward.CHECKS, "pushes": _bodies}

    def column_pushes(self) -> list[ColumnPush | FrameError]:
        """Each push, checked as fleetd checked it; a bad one as its error."""
        header = _HEADER.pack(MAGIC, MAJOR, MINOR, ColumnPush.TYPE, 0)
        found = []
        for body in self.pushes:
            try:
                found.append(decode([header, body]))
            except FrameError as exc:
                found.append(exc)
        return found

    def row_count(self) -> int:
        return super().row_count() + sum(
            push.event_count() for push in self.column_pushes() if isinstance(push, Push))

    def as_forward(self) -> Forward:
        """The same batch as an echod before 1.3 takes it: every event a row."""
        values = {name: getattr(self, name) for name in Forward.field_names()}
        rows = [row for push in self.column_pushes() if isinstance(push, Push)
                for row in push.stored_rows()]
        return Forward(**{**values, "events": self.events + rows})


@dataclass
class ForwardAck(Message):
    """echod → fleetd: batch ``ack`` is committed (stored, already there, or rejected rows),
    and what echod takes (since 1.3)."""

    TYPE: ClassVar[int] = 9
    ack: int
    stored: int
    duplicates: int
    rejected: int
    capabilities: list[str] = field(default_factory=list)
    CHECKS: ClassVar[dict[str, Any]] = {
        "ack": lambda n, v: check_int(n, v), "stored": _count, "duplicates": _count,
        "rejected": _count, "capabilities": _text_list,
    }


MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.TYPE: cls for cls in (Hello, Welcome, Push, Reply, Query, Status, Heartbeat, Forward,
                              ForwardAck, ColumnPush, ForwardColumns)
}


# -- framing -----------------------------------------------------------------------------------

def encode(message: Message) -> list[bytes]:
    """Two frames ready for ``send_multipart``."""
    header = _HEADER.pack(MAGIC, MAJOR, MINOR, message.TYPE, 0)
    body = {name: getattr(message, name) for name in message.field_names()}
    return [header, msgpack.packb(body, use_bin_type=True)]


def _reject_ext(code: int, data: bytes) -> None:
    raise BadSchema(f"msgpack extension type {code} is not part of the protocol")


def _unpack(body: bytes, columns: bool = False) -> dict:
    """The body's map; msgpack ``bin`` in a push of columns only."""
    try:
        value = msgpack.unpackb(
            body, raw=False, strict_map_key=True, use_list=True, ext_hook=_reject_ext,
            max_str_len=MAX_FRAME_BYTES, max_bin_len=MAX_FRAME_BYTES if columns else 0,
            max_array_len=MAX_ARRAY,
            max_map_len=MAX_EVENTS * 4, max_ext_len=0,
        )
    except FrameError:
        raise
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError, UnicodeDecodeError) as exc:
        raise BadSchema(f"body is not a well-formed msgpack value: {exc}", "bad_msgpack") from None
    if not isinstance(value, dict):
        raise BadSchema("body is not a map")
    return value


def forward_seq(frames: list[bytes]) -> int | None:
    """The batch number of a frame that claims to be a ``Forward`` (or ``ForwardColumns``)
    but fails its checks, read from the head of its body alone (fleetd encodes ``seq``
    first); None when even that is unreadable. echod acknowledges such a batch as refused."""
    if len(frames) != 2 or len(frames[0]) != HEADER_SIZE:
        return None
    magic, major, _minor, kind, _reserved = _HEADER.unpack(frames[0])
    if magic != MAGIC or major != MAJOR or kind not in (Forward.TYPE, ForwardColumns.TYPE):
        return None
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(frames[1]) or 1)
    unpacker.feed(frames[1])
    try:
        if unpacker.read_map_header() < 1 or unpacker.unpack() != "seq":
            return None
        seq = unpacker.unpack()
    except Exception:           # msgpack raises several kinds for a body cut short
        return None
    return seq if type(seq) is int and 0 <= seq < 2**63 else None


def decode(frames: list[bytes], max_bytes: int = MAX_FRAME_BYTES) -> Message:
    """Check two frames completely and return the message they carry."""
    if len(frames) != 2:
        raise FrameError(f"expected 2 frames, got {len(frames)}", "frame_count")
    header, body = frames
    if len(header) + len(body) > max_bytes:
        raise FrameTooLarge(f"{len(header) + len(body)} bytes exceeds the {max_bytes}-byte limit")
    if len(header) != HEADER_SIZE:
        raise FrameError(f"header is {len(header)} bytes, expected {HEADER_SIZE}", "bad_header")
    magic, major, _minor, kind, _reserved = _HEADER.unpack(header)
    if magic != MAGIC:
        raise FrameError("header magic is not INGR", "bad_header")
    if major != MAJOR:
        raise BadVersion(f"protocol major version {major}, this end speaks {MAJOR}")
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        raise FrameError(f"unknown message type {kind}", "bad_type")
    values = _unpack(body, cls in (ColumnPush, ForwardColumns))
    checked = {}
    for f in fields(cls):
        if f.name in values:
            checked[f.name] = cls.CHECKS[f.name](f.name, values[f.name])
        elif (f.default is MISSING and f.default_factory is MISSING) or f.name in cls.REQUIRED:
            raise BadSchema(f"field {f.name!r} is missing")
    message = cls(**checked)
    if cls is ColumnPush:
        if message.event_count() > MAX_EVENTS:      # its columns and maps together
            raise BadSchema(f"a push of {message.event_count()} events: at most {MAX_EVENTS}, "
                            "in columns and maps together", "bad_column")
        message.body = body
    return message
