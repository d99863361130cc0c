"""The fields of the wire's messages, each checked where it enters (``ingero.wire`` declares
which field takes which check): texts by length, names as Slurm's, integers and floats in their
ranges, an event's id, time, kind and attributes (those the daemons read by their one type).
A field that fails raises ``BadSchema`` naming it. The checks themselves (``FieldChecks``) are
echod's store's too, which raises its own error with them. Imports only ``ingero.columns``,
``ingero.errors`` and ``ingero.vocabulary``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NoReturn

from .columns import MAX_EVENTS
from .errors import BadSchema
from .vocabulary import NAME, NAME_RULE, SIGNALS

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
                     "parent_rank", "parent_nranks", "split", "calls"), int),
    **dict.fromkeys(("comm_hash", "op", "role", "preemptor_comm", "preemptor_job",
                     "parent_hash"), str),
    **dict.fromkeys(("peer_wait", "preemptor_own", "in_group", "graph"), bool),
}


# -- field checks ------------------------------------------------------------------------------

class FieldChecks:
    """The checks of one field, said alike wherever a field enters: the wire's (``BadSchema``,
    a frame refused) and echod's store's (``Rejected``, a row refused). Each raises
    ``error(name, why)`` where the value fails, and returns it checked where it passes."""

    def __init__(self, error: Callable[[str, str], Exception]):
        self.error = error

    def fail(self, name: str, why: str) -> NoReturn:
        raise self.error(name, why)

    def text(self, name: str, value: Any, max_len: int = MAX_TEXT, empty_ok: bool = False,
             utf8: bool = False) -> str:
        """A string of at most ``max_len`` characters, empty where ``empty_ok``; with
        ``utf8``, one UTF-8 can carry and PostgreSQL can hold (no NUL)."""
        if type(value) is not str:
            self.fail(name, f"expected a string, got {type(value).__name__}")
        if not value and not empty_ok:
            self.fail(name, "empty")
        if len(value) > max_len:
            self.fail(name, f"longer than {max_len} characters ({len(value)})")
        if utf8 and ("\x00" in value or not encodable(value)):
            self.fail(name, "not valid UTF-8 text")
        return value

    def integer(self, name: str, value: Any, lo: int = 0, hi: int = 2**63 - 1) -> int:
        if type(value) is not int:
            self.fail(name, f"expected an integer, got {type(value).__name__}")
        if not lo <= value <= hi:
            self.fail(name, "negative" if value < 0 <= lo else
                      f"{value} out of range [{lo}, {hi}]")
        return value

    def number(self, name: str, value: Any, lo: float = -math.inf,
               hi: float = math.inf) -> float:
        if type(value) not in (int, float):
            self.fail(name, f"expected a number, got {type(value).__name__}")
        if not math.isfinite(value):
            self.fail(name, "not a finite number")
        if not lo <= value <= hi:
            self.fail(name, f"{value} out of range [{lo}, {hi}]")
        return float(value)

    def boolean(self, name: str, value: Any) -> bool:
        if type(value) is not bool:
            self.fail(name, f"expected a boolean, got {type(value).__name__}")
        return value


def encodable(value: str) -> bool:
    """Whether a string encodes as UTF-8 (a lone surrogate does not)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


WIRE = FieldChecks(lambda name, why: BadSchema(f"field {name!r}: {why}"))
fail, check_int, check_float, check_bool = WIRE.fail, WIRE.integer, WIRE.number, WIRE.boolean


def check_text(name: str, value: Any, max_len: int = MAX_TEXT, empty_ok: bool = False) -> str:
    return WIRE.text(name, value, max_len, empty_ok)


def check_name(name: str, value: Any) -> str:
    """A node's or cluster's name (``vocabulary.NAME``)."""
    if not isinstance(value, str) or not NAME.fullmatch(value):
        fail(name, f"not a node or cluster name ({NAME_RULE})")
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
        fail(name, "expected a map")
    if set(value) != set(SIGNALS):
        fail(name, f"expected exactly the signals {', '.join(SIGNALS)}")
    return {k: check_float(f"{name}.{k}", value[k], 0.0, 1.0) for k in SIGNALS}


def plain_event(value: Any) -> bool:
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


def event(value: dict) -> dict[str, Any]:
    return {"id": value["id"], "t": value["t"], "kind": value["kind"],
            "attrs": value.get("attrs", {})}


def check_event(name: str, value: Any) -> dict[str, Any]:
    """One traced event: a node-namespaced id, a wall time, a kind and flat attributes."""
    return event(value) if plain_event(value) else check_event_fields(name, value)


def check_event_fields(name: str, value: Any) -> dict[str, Any]:
    """``check_event`` field by field, naming the first that is wrong."""
    if not isinstance(value, dict):
        fail(name, "expected a map")
    attrs = value.get("attrs", {})
    if not isinstance(attrs, dict) or len(attrs) > MAX_ATTRS:
        fail(f"{name}.attrs", f"expected a map of at most {MAX_ATTRS} entries")
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
        fail(name, f"expected {'an integer' if want is int else 'a ' + want.__name__}, "
                    f"got {type(value).__name__}")
    return value


def check_list(name: str, value: Any, item, max_len: int = MAX_LIST) -> list:
    if not isinstance(value, list):
        fail(name, f"expected a list, got {type(value).__name__}")
    if len(value) > max_len:
        fail(name, f"more than {max_len} items")
    return [item(f"{name}[{i}]", v) for i, v in enumerate(value)]


def text_list(name: str, value: Any) -> list[str]:
    return check_list(name, value, check_text)


def event_list(name: str, value: Any) -> list[dict]:
    if type(value) is list and len(value) <= MAX_EVENTS and all(map(plain_event, value)):
        return list(map(event, value))
    return check_list(name, value, check_event, MAX_EVENTS)


def state(name: str, value: Any) -> str:
    if value not in STATES:
        fail(name, f"expected one of {', '.join(STATES)}")
    return value


def optional(check):
    def optional(name: str, value: Any):
        return None if value is None else check(name, value)
    return optional


def seconds(name: str, value: Any) -> float:
    return check_float(name, value, 0.0)


def interval(name: str, value: Any) -> float:
    return check_float(name, value, 0.001, 3600.0)


def unit(name: str, value: Any) -> float:
    return check_float(name, value, 0.0, 1.0)


def count(name: str, value: Any) -> int:
    return check_int(name, value, 0, 10_000_000)


def clock_sample(name: str, value: Any) -> list[float]:
    """One exchange's four times: push sent (agent's clock), received and answered (fleetd's),
    reply received (agent's)."""
    times = check_list(name, value, seconds, 4)
    if len(times) != 4:
        fail(name, "expected 4 times")
    return times


def ranks(name: str, value: Any) -> list[int]:
    return check_list(name, value, lambda n, v: check_int(n, v, 0, 2**31 - 1), MAX_EVENTS)
