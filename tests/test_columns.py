"""Pushes of columns (wire 1.3): what goes in comes out, what is wrong is refused by name."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest

from ingero import columns, wire
from ingero.errors import BadSchema, FrameError

SIG = {s: 0.9 for s in wire.SIGNALS}


def events(n: int = 300, prefix: str = "node7:b0:", first: int = 5) -> list[dict]:
    """Collectives, syncs, allocations and an exit of 4 ranks, the attributes ingerod sends."""
    out = []
    for k in range(n):
        kind = ("collective", "sync", "alloc", "process_exit")[k % 4 if k % 50 else 3]
        attrs = {"pid": 4000 + k % 4, "rank": k % 4, "job": "77", "local_rank": k % 4,
                 "world_size": 4, "requeue": 1}
        if kind == "collective":
            attrs |= {"op": "ncclAllReduce", "comm_hash": "00000000c0ffee00", "seq": k // 4,
                      "comm_rank": k % 4, "nranks": 4, "bytes": 1 << 20, "in_group": False,
                      "datatype": "float32", "stream": "0x5"}
        elif kind == "sync":
            attrs |= {"duration_ns": 1000 + k, "peer_wait": k % 8 == 1, "result": 0}
        elif kind == "alloc":
            attrs |= {"bytes": 2**40 + k, "addr": hex(0x7f0000 + k), "duration_ns": 7}
        else:
            attrs |= {"exit_status": 0, "role": "helper"}
        out.append({"id": f"{prefix}{first + k}", "t": 1.8e9 + k / 1000, "kind": kind,
                    "attrs": attrs})
    return out


def column_push(evs: list[dict], rest: list[dict] = ()) -> list[bytes]:
    return wire.encode(wire.ColumnPush(3, "node7", "c", "b0", 0.9, SIG, "active", time.time(),
                                       1.0, None, None, list(rest), None, None,
                                       columns.encode(evs)))


def test_events_come_back_as_they_went_in_a_third_of_the_bytes():
    sent = events()
    carried, rest = columns.split(sent)
    assert (carried, rest) == (sent, [])
    frames = column_push(carried)
    push = wire.decode(frames)
    assert isinstance(push, wire.ColumnPush) and push.event_count() == len(sent)
    assert push.all_events() == sent
    assert push.jobs() == {"77"}
    as_maps = wire.encode(push.as_push())
    assert wire.decode(as_maps).events == sent
    assert len(frames[1]) * 3 < len(as_maps[1]), (len(frames[1]), len(as_maps[1]))


def test_ids_that_skip_numbers_texts_past_255_and_a_missing_attribute_round_trip():
    sent = events(600)[::2]                       # ids skip: sent as offsets
    for k, event in enumerate(sent):
        event["attrs"]["stream"] = f"0x{k:x}"     # 300 distinct texts: two-byte indices
        if k % 3:
            del event["attrs"]["job"]
    body = msgpack.unpackb(column_push(sent)[1])["columns"]
    assert body["ids"][2] is not None and body["attrs"]["stream"][0] == "s2"
    push = wire.decode(column_push(sent))
    assert push.all_events() == sent
    assert push.jobs() == {"77", None}


def test_what_columns_cannot_carry_goes_as_maps():
    sent = events(20)
    odd = [{**sent[3], "id": "spool:job-77:start"},                    # another id scheme
           {**sent[5], "attrs": {**sent[5]["attrs"], "rank": "5"}}]    # a text rank
    carried, rest = columns.split(sent[:3] + odd + sent[6:])
    assert rest == odd and len(carried) == 17


def test_pack_carries_what_split_would_and_leaves_the_rest_as_maps():
    """The agent's fast way, a column at a time, agrees with the slow one event by event:
    a text rank, a value past 64 bits, a nil and an id of another scheme."""
    sent = events(40)
    sent[7]["attrs"]["rank"] = "7"
    sent[9]["attrs"]["bytes"] = 2**70
    sent[11]["attrs"]["job"] = None
    sent[13] = {**sent[13], "id": "spool:job-77:start"}
    carried, rest = columns.split(sent)
    packed, left = columns.pack(sent)
    assert left == rest and len(rest) == 3
    assert packed == columns.encode(carried)
    push = wire.decode(column_push_packed(packed))
    assert push.all_events() == [{**e, "attrs": {k: v for k, v in e["attrs"].items()
                                                 if v is not None}} for e in carried]
    assert columns.pack(sent[13:14]) == (None, sent[13:14])


def column_push_packed(packed: dict) -> list[bytes]:
    return wire.encode(wire.ColumnPush(3, "node7", "c", "b0", 0.9, SIG, "active", time.time(),
                                       1.0, None, None, [], None, None, packed))


def bad(mutate) -> FrameError:
    frames = column_push(events(40))
    body = msgpack.unpackb(frames[1])
    mutate(body["columns"])
    with pytest.raises(FrameError) as caught:
        wire.decode([frames[0], msgpack.packb(body, use_bin_type=True)])
    return caught.value


@pytest.mark.parametrize("mutate, says", [
    (lambda c: c["attrs"].__setitem__("rank", ["s1", bytes(40), None, ["5"]]),
     "'columns.attrs.rank': expected integers, got a column of str"),
    (lambda c: c.__setitem__("t", c["t"][:-8]), "'columns.t': 312 bytes, expected 40 values"),
    (lambda c: c.__setitem__("t", np.full(40, np.nan).tobytes()), "not finite"),
    (lambda c: c.__setitem__("kind", bytes([9] * 40)), "a kind index past the kinds"),
    (lambda c: c["attrs"]["op"].__setitem__(3, []), "a text index past its strings"),
    (lambda c: c["attrs"]["in_group"].__setitem__(1, bytes([2] * 40)),
     "neither 0 nor 1"),
    (lambda c: c["attrs"]["seq"].__setitem__(0, "q8"), "unknown column code 'q8'"),
    (lambda c: c["attrs"].update({f"x{k}": ["u1", bytes(40), None, None] for k in range(30)}),
     "an event with more than 32 attributes"),
    (lambda c: c.__setitem__("n", 10**6), "expected an integer from 0 to 4096"),
    (lambda c: c.__setitem__("ids", ["p:", 0, np.zeros(40, "<u4").tobytes()]),
     "distinct, numbered upwards"),
])
def test_a_bad_column_is_refused_naming_it(mutate, says):
    error = bad(mutate)
    assert error.reason == "bad_column" and says in str(error), str(error)


def syncs(first: int, n: int) -> list[dict]:
    return [{"id": f"node7:b0:{first + k}", "t": 1.8e9 + k, "kind": "sync",
             "attrs": {"rank": k % 8, "duration_ns": 1000 + k}} for k in range(n)]


def test_a_push_carries_as_many_events_as_columns_as_as_maps_and_no_more_in_both():
    """4,096 events a push, whichever form they take: as maps, as columns, or some of each;
    one more is refused in each form, and a column's strings number no more than its
    values."""
    most = wire.MAX_EVENTS
    for packed, rest in ((None, syncs(0, most)), (columns.encode(syncs(0, most)), []),
                         (columns.encode(syncs(0, most - 96)), syncs(most, 96))):
        push = wire.ColumnPush(3, "node7", "c", "b0", 0.9, SIG, "active", time.time(), 1.0,
                               None, None, rest, None, None, packed) if packed else \
            wire.Push(3, "node7", "c", "b0", 0.9, SIG, "active", time.time(), 1.0, None, None,
                      rest)
        assert wire.decode(wire.encode(push)).event_count() == most
    with pytest.raises(BadSchema, match="more than 4096 items"):
        wire.decode(wire.encode(wire.Push(3, "node7", "c", "b0", 0.9, SIG, "active",
                                          time.time(), 1.0, None, None, syncs(0, most + 1))))
    with pytest.raises(BadSchema, match="from 0 to 4096"):
        wire.decode(column_push(syncs(0, most + 1)))
    with pytest.raises(BadSchema, match="a push of 4097 events: at most 4096"):
        wire.decode(column_push(syncs(0, most), syncs(most, 1)))
    error = bad(lambda c: c["attrs"]["op"].__setitem__(3, c["attrs"]["op"][3] * 41))
    assert "at most 40 strings" in str(error)


def test_a_push_of_columns_without_its_columns_is_refused():
    frames = column_push(events(4))
    body = msgpack.unpackb(frames[1])
    del body["columns"]
    with pytest.raises(BadSchema, match="'columns' is missing"):
        wire.decode([frames[0], msgpack.packb(body, use_bin_type=True)])


def test_bin_is_refused_outside_a_push_of_columns():
    frames = wire.encode(wire.Hello("n", "c", "b"))
    body = msgpack.unpackb(frames[1])
    body["node"] = b"n"
    with pytest.raises(FrameError, match="msgpack"):
        wire.decode([frames[0], msgpack.packb(body, use_bin_type=True)])
