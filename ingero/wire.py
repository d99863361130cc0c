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

import math
import struct
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

import msgpack

from . import columns as columnar
from .errors import BadSchema, BadVersion, FrameError, FrameTooLarge
from .vocabulary import NAME, NAME_RULE, SIGNALS

MAGIC = b"INGR"
MAJOR = 1
MINOR = 3
_HEADER = struct.Struct("!4sBBBB")
HEADER_SIZE = _HEADER.size

MAX_FRAME_BYTES = 4 * 1024 * 1024
MAX_EVENTS = columnar.MAX_EVENTS    # a push's events, whichever form they take
MAX_ATTRS = 32
MAX_TEXT = 256
MAX_LIST = 64
STATES = ("calibrating", "active", "idle")
# Event attributes the daemons read, and the one type each must have where it is set (nil is
# "not known"): an event whose attribute has another type is malformed, so a string rank is
# refused with its frame at decode instead of stopping the analysis that would read it.
ATTR_TYPES: dict[str, type] = {
    **dict.fromkeys(("rank", "comm_rank", "nranks", "seq", "pid", "local_rank", "world_size",
                     "count", "bytes", "duration_ns", "requests", "preempted_ns",
                     "preemptor_pid", "preemptor_tgid", "peer", "root", "covered_ts_ns",
                     "exit_status", "signal", "requeue", "restart", "color", "key",
                     "parent_rank", "parent_nranks", "split"), int),
    **dict.fromkeys(("comm_hash", "op", "role", "preemptor_comm", "preemptor_job",
                     "parent_hash"), str),
    **dict.fromkeys(("peer_wait", "preemptor_own", "in_group"), bool),
}


# -- field checks ------------------------------------------------------------------------------

def _fail(name: str, why: str) -> None:
    raise BadSchema(f"field {name!r}: {why}")


def check_text(name: str, value: Any, max_len: int = MAX_TEXT, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        _fail(name, f"expected a string, got {type(value).__name__}")
    if len(value) > max_len:
        _fail(name, f"longer than {max_len} characters")
    if not value and not empty_ok:
        _fail(name, "empty")
    return value


def check_name(name: str, value: Any) -> str:
    """A node's or cluster's name (``vocabulary.NAME``)."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        _fail(name, f"not a node or cluster name ({NAME_RULE})")
    return value


def check_int(name: str, value: Any, lo: int = 0, hi: int = 2**63 - 1) -> int:
    if type(value) is not int:
        _fail(name, f"expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        _fail(name, f"{value} outside [{lo}, {hi}]")
    return value


def check_float(name: str, value: Any, lo: float = -math.inf, hi: float = math.inf) -> float:
    if type(value) not in (int, float):
        _fail(name, f"expected a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        _fail(name, "not a finite number")
    if not lo <= value <= hi:
        _fail(name, f"{value} outside [{lo}, {hi}]")
    return value


def check_bool(name: str, value: Any) -> bool:
    if type(value) is not bool:
        _fail(name, f"expected a boolean, got {type(value).__name__}")
    return value


def check_scalar(name: str, value: Any) -> Any:
    """An event attribute: a short string, an integer, a finite number, a boolean or nil."""
    if value is None or type(value) is bool:
        return value
    if type(value) is int:
        return check_int(name, value, -(2**63), 2**64 - 1)
    if type(value) is float:
        return check_float(name, value)
    return check_text(name, value, empty_ok=True)


def check_signals(name: str, value: Any) -> dict[str, float]:
    if not isinstance(value, dict):
        _fail(name, "expected a map")
    if set(value) != set(SIGNALS):
        _fail(name, f"expected exactly the signals {', '.join(SIGNALS)}")
    return {k: check_float(f"{name}.{k}", value[k], 0.0, 1.0) for k in SIGNALS}


def _plain_event(value: Any) -> bool:
    """Whether an event passes every check of ``check_event`` unchanged (its time already a
    float), tested without naming each field: fleetd checks thousands of events a second, and
    only a bad one needs the names, which ``check_event`` then finds the slow way."""
    if type(value) is not dict:
        return False
    attrs, ident, t, kind = (value.get("attrs", {}), value.get("id"), value.get("t"),
                             value.get("kind"))
    if (type(attrs) is not dict or len(attrs) > MAX_ATTRS or type(ident) is not str
            or not 0 < len(ident) <= 128 or type(kind) is not str or not 0 < len(kind) <= 64
            or type(t) is not float or not 0.0 <= t < math.inf):
        return False
    for k, v in attrs.items():
        if type(k) is not str or not 0 < len(k) <= 64:
            return False
        kind_of = type(v)
        want = ATTR_TYPES.get(k)
        if want is not None and kind_of is not want and v is not None:
            return False
        if kind_of is str:
            if len(v) > MAX_TEXT:
                return False
        elif kind_of is int:
            if not -(2**63) <= v <= 2**64 - 1:
                return False
        elif kind_of is float:
            if v - v != 0.0:        # an infinity or NaN
                return False
        elif v is not None and kind_of is not bool:
            return False
    return True


def _event(value: dict) -> dict[str, Any]:
    return {"id": value["id"], "t": value["t"], "kind": value["kind"],
            "attrs": value.get("attrs", {})}


def check_event(name: str, value: Any) -> dict[str, Any]:
    """One traced event: a node-namespaced id, a wall time, a kind and flat attributes."""
    return _event(value) if _plain_event(value) else check_event_fields(name, value)


def check_event_fields(name: str, value: Any) -> dict[str, Any]:
    """``check_event`` field by field, naming the first that is wrong."""
    if not isinstance(value, dict):
        _fail(name, "expected a map")
    attrs = value.get("attrs", {})
    if not isinstance(attrs, dict) or len(attrs) > MAX_ATTRS:
        _fail(f"{name}.attrs", f"expected a map of at most {MAX_ATTRS} entries")
    return {
        "id": check_text(f"{name}.id", value.get("id"), 128),
        "t": check_float(f"{name}.t", value.get("t"), 0.0),
        "kind": check_text(f"{name}.kind", value.get("kind"), 64),
        "attrs": {check_text(f"{name}.attrs key", k, 64): check_attr(f"{name}.attrs.{k}", k, v)
                  for k, v in attrs.items()},
    }


def check_attr(name: str, key: str, value: Any) -> Any:
    """An event attribute: a scalar, of its own type where the daemons read it."""
    value = check_scalar(name, value)
    want = ATTR_TYPES.get(key)
    if want is not None and value is not None and type(value) is not want:
        _fail(name, f"expected {'an integer' if want is int else 'a ' + want.__name__}, "
                    f"got {type(value).__name__}")
    return value


def check_list(name: str, value: Any, item, max_len: int = MAX_LIST) -> list:
    if not isinstance(value, list):
        _fail(name, f"expected a list, got {type(value).__name__}")
    if len(value) > max_len:
        _fail(name, f"more than {max_len} items")
    return [item(f"{name}[{i}]", v) for i, v in enumerate(value)]


def _text_list(name: str, value: Any) -> list[str]:
    return check_list(name, value, check_text)


def _event_list(name: str, value: Any) -> list[dict]:
    if type(value) is list and len(value) <= MAX_EVENTS and all(map(_plain_event, value)):
        return list(map(_event, value))
    return check_list(name, value, check_event, MAX_EVENTS)


def _state(name: str, value: Any) -> str:
    if value not in STATES:
        _fail(name, f"expected one of {', '.join(STATES)}")
    return value


def _optional(check):
    def optional(name: str, value: Any):
        return None if value is None else check(name, value)
    return optional


def _seconds(name: str, value: Any) -> float:
    return check_float(name, value, 0.0)


def _interval(name: str, value: Any) -> float:
    return check_float(name, value, 0.001, 3600.0)


def _unit(name: str, value: Any) -> float:
    return check_float(name, value, 0.0, 1.0)


def _count(name: str, value: Any) -> int:
    return check_int(name, value, 0, 10_000_000)


def _clock_sample(name: str, value: Any) -> list[float]:
    """One exchange's four times: push sent (agent's clock), received and answered (fleetd's),
    reply received (agent's)."""
    times = check_list(name, value, _seconds, 4)
    if len(times) != 4:
        _fail(name, "expected 4 times")
    return times


def _ranks(name: str, value: Any) -> list[int]:
    return check_list(name, value, lambda n, v: check_int(n, v, 0, 2**31 - 1), MAX_EVENTS)


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
