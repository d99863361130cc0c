"""The wire protocol: every message type round-trips; every kind of bad frame is named."""

import math

import msgpack
import pytest
from hypothesis import given, settings, strategies as st

from ingero import fields, wire
from ingero.errors import BadSchema, BadVersion, FrameError, FrameTooLarge

SIGNALS = {"throughput": 0.9, "compute": 0.8, "memory": 0.7, "cpu": 1.0}


def push(**over):
    fields = dict(seq=3, node="n1", cluster="c", boot_id="b", score=0.9, signals=SIGNALS,
                  state="active", sent_at=1.7e9, interval=5.0, job="42", job_nodes=2,
                  events=[{"id": "n1:b:0", "t": 1.7e9, "kind": "straggler",
                           "attrs": {"score": 0.4, "mode": "fleet", "n": 3, "ok": True,
                                     "none": None}}])
    fields.update(over)
    return wire.Push(**fields)


EXAMPLES = [
    wire.Hello("n1", "c", "b", ["synthetic"], 5.0, "0.1.0"),
    wire.Welcome("0.1.0", 1.0, 2.0),
    push(),
    wire.Reply(3, "job:42", 0.87, True, False, False, 1.0, 2.0, 0.5),
    wire.Reply(3, "job:42", None, False, False, False, 1.0, 2.0, 0.5, duplicate=True),
    wire.Query("job:42"),
    wire.Status("job:42", True, 0.87, 0.9, 0.01, True, False, 20, 20, ["n7"], 3.0),
    wire.Heartbeat(1.0),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_round_trip(message):
    frames = wire.encode(message)
    assert len(frames[0]) == wire.HEADER_SIZE
    assert wire.decode(frames) == message


def test_optional_fields_may_be_left_out():
    header, body = wire.encode(push())
    values = msgpack.unpackb(body)
    del values["job"], values["job_nodes"], values["events"]
    decoded = wire.decode([header, msgpack.packb(values)])
    assert decoded.job is None and decoded.events == []


def test_unknown_fields_are_ignored_for_newer_minor_versions():
    header, body = wire.encode(wire.Heartbeat(1.0))
    values = msgpack.unpackb(body)
    values["added_in_1_1"] = [1, 2, 3]
    assert wire.decode([header, msgpack.packb(values)]) == wire.Heartbeat(1.0)


def reencode(message, /, **changes):
    """``message`` encoded with its body's fields changed (any names: positional-only, so a
    generated field called "message" is a field, not a second argument)."""
    header, body = wire.encode(message)
    values = msgpack.unpackb(body)
    values.update(changes)
    return [header, msgpack.packb(values, use_bin_type=True)]


@pytest.mark.parametrize("frames, error, reason", [
    ([b"x"], FrameError, "frame_count"),
    ([b"a", b"b", b"c"], FrameError, "frame_count"),
    ([b"INGR", b"\x80"], FrameError, "bad_header"),
    ([b"XXXX\x01\x00\x07\x00", b"\x80"], FrameError, "bad_header"),
    ([b"INGR\x02\x00\x07\x00", b"\x80"], BadVersion, "bad_version"),
    ([b"INGR\x01\x00\x63\x00", b"\x80"], FrameError, "bad_type"),
    ([b"INGR\x01\x00\x07\x00", b"\xc1"], BadSchema, "bad_msgpack"),
    ([b"INGR\x01\x00\x07\x00", b"\x93\x01\x02\x03"], BadSchema, "bad_schema"),
    ([b"INGR\x01\x00\x07\x00", msgpack.packb({"sent_at": 1.0}) + b"\x00"], BadSchema,
     "bad_msgpack"),
    ([b"INGR\x01\x00\x07\x00", b"\x81\xa7sent_at\xc7\x01\x05\x00"], BadSchema, "bad_msgpack"),
])
def test_bad_frames_are_named(frames, error, reason):
    with pytest.raises(error) as caught:
        wire.decode(frames)
    assert caught.value.reason == reason


def test_size_limit_is_checked_before_parsing():
    header, body = wire.encode(push())
    with pytest.raises(FrameTooLarge):
        wire.decode([header, body], max_bytes=len(body))


@pytest.mark.parametrize("field, value", [
    ("score", math.nan), ("score", math.inf), ("score", 1.5), ("score", -0.1), ("score", "0.9"),
    ("seq", -1), ("seq", 1.0), ("seq", True), ("node", ""), ("node", "x" * 65), ("node", 7),
    ("node", "n1:b"), ("node", "n1@c"), ("node", "-n"), ("node", "n 1"), ("node", "n\u00b2"),
    ("cluster", "a/b"), ("cluster", ""),
    ("state", "sleeping"), ("signals", {"throughput": 1.0}),
    ("signals", {**SIGNALS, "throughput": 2.0}), ("interval", 0), ("job_nodes", -2),
    ("events", [{"id": "x", "t": 1.0}]), ("events", "none"),
    ("events", [{"id": "x", "t": 1.0, "kind": "k", "attrs": {"a": [1, 2]}}]),
    ("events", [{"id": "x", "t": math.nan, "kind": "k"}]),
    ("events", [{"id": "x", "t": 1.0, "kind": "k", "attrs": {str(i): i for i in range(40)}}]),
    ("events", [{"id": "x", "t": 1.0, "kind": "k"}] * (wire.MAX_EVENTS + 1)),
])
def test_field_checks(field, value):
    with pytest.raises(BadSchema):
        wire.decode(reencode(push(), **{field: value}))


def test_missing_required_field():
    header, body = wire.encode(push())
    values = msgpack.unpackb(body)
    del values["boot_id"]
    with pytest.raises(BadSchema, match="boot_id"):
        wire.decode([header, msgpack.packb(values)])


@settings(max_examples=500, deadline=None)
@given(st.lists(st.binary(max_size=300), min_size=0, max_size=4))
def test_arbitrary_bytes_raise_only_frame_errors(frames):
    try:
        wire.decode(frames)
    except FrameError:
        pass


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=20),
                    st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(EXAMPLES), st.dictionaries(st.text(max_size=12), values, max_size=6))
def test_mutated_bodies_raise_only_frame_errors(message, changes):
    frames = reencode(message, **changes)
    try:
        decoded = wire.decode(frames)
    except FrameError:
        return
    assert type(decoded) is type(message)


def _edge_text(limit: int):
    """Text mostly within ``limit`` characters and not empty, sometimes just past either end."""
    fits = st.text(min_size=1, max_size=limit)
    return st.one_of(fits, fits, fits, fits, st.just(""),
                     st.text(min_size=limit + 1, max_size=limit + 1))


attr_values = st.one_of(st.integers(-(2**63), 2**64 - 1), st.text(max_size=20),
                        st.floats(allow_nan=False, allow_infinity=False), scalars)
times = st.one_of(st.floats(min_value=0.0, allow_infinity=False), st.floats())
events = st.one_of(
    st.fixed_dictionaries(
        {"id": _edge_text(128), "kind": _edge_text(64), "t": times},
        optional={"attrs": st.dictionaries(
            st.one_of(_edge_text(64), st.sampled_from(sorted(fields.ATTR_TYPES))), attr_values,
            max_size=4)}),
    st.fixed_dictionaries({}, optional={
        "id": st.one_of(st.text(max_size=3), st.integers()),
        "t": st.one_of(st.floats(), st.integers(-5, 5), st.text(max_size=3)),
        "kind": st.one_of(st.text(max_size=3), st.none()),
        "attrs": st.one_of(st.dictionaries(st.integers(), values, max_size=2),
                           st.lists(scalars, max_size=2)),
        "extra": scalars}))


@settings(max_examples=1000, deadline=None)
@given(events)
def test_event_fast_path_agrees_with_the_named_checks(event):
    """fleetd takes well-formed events without naming each field; whatever it takes that way
    must be exactly what the field-by-field checks take, and what they refuse it refuses."""
    try:
        slow = fields.check_event_fields("e", event)
    except BadSchema:
        slow = None
    assert fields.plain_event(event) == (slow is not None and type(event.get("t")) is float)
    try:
        fast = fields.check_event("e", event)
    except BadSchema:
        fast = None
    assert fast == slow


@pytest.mark.parametrize("attr, value", [("rank", "3"), ("nranks", "8"), ("seq", 1.0),
                                         ("comm_hash", 7), ("peer_wait", 1),
                                         ("preemptor_own", "yes"), ("rank", True)])
def test_an_attribute_the_daemons_read_must_have_its_type(attr, value):
    event = {"id": "n:b:0", "t": 1.0, "kind": "collective", "attrs": {attr: value}}
    push = wire.Push(0, "n", "c", "b", 0.5, SIGNALS, "active", 1.0, 1.0,
                     events=[event])
    with pytest.raises(BadSchema, match=f"events\\[0\\].attrs.{attr}.*expected"):
        wire.decode(wire.encode(push))
    event["attrs"][attr] = None                      # not known: fine
    assert wire.decode(wire.encode(push)).events[0]["attrs"][attr] is None
