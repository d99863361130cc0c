"""Events as typed columns: the body of a columnar push (wire 1.3).

A batch of events is carried as one array per field instead of one map per event: the times,
the kinds (indices into the batch's list of kinds), and per attribute a little-endian array of
one type, with a bitmap of the events that have it where not all do. Text values are indices
into the attribute's own list of strings. Event ids are implicit: ``prefix + str(first + k)``
for the k-th event, where ``k`` counts up from 0, or the offsets are sent where ids skip.

    columns = {"n": N, "ids": [prefix, first, offsets u4 | nil], "t": f8,
               "kinds": [text], "kind": u1 | u2,
               "attrs": {name: [code, values, present bitmap | nil, [text] | nil]}}

Checking a batch is a handful of numpy operations over whole arrays, whatever N; the checks
are those of a map event (ingero/wire.py), column by column: finite times and numbers, the
attribute types the daemons read (a text rank cannot be written as a column of integers),
text lengths, at most ``MAX_ATTRS`` attributes an event. nil and an absent attribute are one
thing in a column: neither is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import BadSchema

MAX_EVENTS = 4096          # events one push may carry, as columns or as maps (wire.MAX_EVENTS)
MAX_COLUMNS = 64
MAX_ID_PREFIX = 96

# code → numpy dtype; "s1"/"s2"/"s4" are text: indices of that width into the strings list
NUMERIC = {"i1": "<i1", "i2": "<i2", "i4": "<i4", "i8": "<i8", "u1": "<u1", "u2": "<u2",
           "u4": "<u4", "u8": "<u8", "f8": "<f8", "b1": "<u1"}
TEXT = {"s1": "<u1", "s2": "<u2", "s4": "<u4"}
DTYPES = {**NUMERIC, **TEXT}
KIND_OF_CODE = {**dict.fromkeys(("i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"), int),
                "f8": float, "b1": bool, **dict.fromkeys(TEXT, str)}


def _fail(name: str, why: str) -> None:
    raise BadSchema(f"field {name!r}: {why}", "bad_column")


@dataclass
class Column:
    """One attribute over the batch: ``values`` (numeric, or indices into ``strings``) and
    ``present`` (None: every event has it)."""

    code: str
    values: np.ndarray
    present: np.ndarray | None = None
    strings: list[str] | None = None

    def mask(self, n: int) -> np.ndarray:
        return np.ones(n, bool) if self.present is None else self.present

    def objects(self, at: np.ndarray) -> np.ndarray:
        """The values at ``at`` as Python objects (texts looked up, booleans as bool), None
        where absent."""
        values, present = self.values[at], self.mask(len(self.values))[at]
        if self.strings is not None:
            return np.array(self.strings + [None], dtype=object)[
                np.where(present, values, len(self.strings))]
        out = np.array([bool(v) for v in values.tolist()], dtype=object) \
            if self.code == "b1" else values.astype(object)
        out[~present] = None
        return out


@dataclass
class EventColumns:
    """A checked batch of events as columns."""

    n: int
    id_prefix: str
    id_first: int
    id_offsets: np.ndarray | None
    t: np.ndarray
    kinds: list[str]
    kind: np.ndarray
    attrs: dict[str, Column]

    def __len__(self) -> int:
        return self.n

    def ids(self, which: np.ndarray | None = None) -> list[str]:
        """The events' ids (all, or those at the indices ``which``)."""
        at = np.arange(self.n) if which is None else np.asarray(which, np.int64)
        numbers = self.id_first + (at if self.id_offsets is None
                                   else self.id_offsets[at].astype(np.int64))
        return [f"{self.id_prefix}{k}" for k in numbers.tolist()]

    def of_kind(self, name: str) -> np.ndarray:
        """Which events are of kind ``name`` (a boolean array)."""
        try:
            return self.kind == self.kinds.index(name)
        except ValueError:
            return np.zeros(self.n, bool)

    def texts(self, name: str) -> list[str]:
        """The distinct texts attribute ``name`` takes (empty if it is absent)."""
        column = self.attrs.get(name)
        if column is None or column.strings is None:
            return []
        used = np.unique(column.values[column.mask(self.n)])
        return [column.strings[k] for k in used.tolist()]

    def rows(self, which: np.ndarray | None = None) -> list[dict[str, Any]]:
        """The events (all, or those at the indices ``which``) as maps, as the same events
        sent as maps decode: the slow path, for what reads a few events one by one."""
        at = np.arange(self.n) if which is None else np.asarray(which, np.int64)
        if not len(at):
            return []
        values = {name: column.objects(at).tolist() for name, column in self.attrs.items()}
        rows = []
        for k, (event_id, t, kind) in enumerate(zip(self.ids(at), self.t[at].tolist(),
                                                    self.kind[at].tolist())):
            attrs = {name: column[k] for name, column in values.items()
                     if column[k] is not None}
            rows.append({"id": event_id, "t": t, "kind": self.kinds[kind], "attrs": attrs})
        return rows

    def ints(self, name: str, missing: int = -1) -> np.ndarray:
        """An integer attribute as int64, ``missing`` where an event lacks it."""
        column = self.attrs.get(name)
        if column is None or column.code not in NUMERIC or column.code in ("f8", "b1"):
            return np.full(self.n, missing, np.int64)
        values = column.values.astype(np.int64)
        return values if column.present is None else np.where(column.present, values, missing)

    def flags(self, name: str) -> np.ndarray:
        """A boolean attribute; False where an event lacks it."""
        column = self.attrs.get(name)
        if column is None or column.code != "b1":
            return np.zeros(self.n, bool)
        return column.values.astype(bool) & column.mask(self.n)

    def coded(self, name: str) -> tuple[np.ndarray, list]:
        """Any attribute as codes, -1 where an event lacks it, and the values (Python objects)
        the codes stand for: texts as ``codes`` gives them, numbers numbered in order."""
        column = self.attrs.get(name)
        if column is None or column.strings is not None:
            return self.codes(name)
        present = column.mask(self.n)
        values, code = np.unique(column.values[present], return_inverse=True)
        codes = np.full(self.n, -1, np.int64)
        codes[present] = code.ravel()
        return codes, Column(column.code, values).objects(np.arange(len(values))).tolist()

    def codes(self, name: str) -> tuple[np.ndarray, list[str]]:
        """A text attribute as indices into its strings, -1 where an event lacks it."""
        column = self.attrs.get(name)
        if column is None or column.strings is None:
            return np.full(self.n, -1, np.int64), []
        values = column.values.astype(np.int64)
        if column.present is not None:
            values = np.where(column.present, values, -1)
        return values, column.strings


# -- encoding (the agent) ----------------------------------------------------------------------

def _int_code(values: np.ndarray) -> str:
    lo, hi = (int(values.min()), int(values.max())) if len(values) else (0, 0)
    for code in ("u1", "u2", "u4", "u8") if lo >= 0 else ("i1", "i2", "i4", "i8"):
        info = np.iinfo(NUMERIC[code])
        if info.min <= lo and hi <= info.max:
            return code
    raise OverflowError


def _id_parts(ident: str) -> tuple[str, int] | None:
    prefix, _, number = ident.rpartition(":")
    if not number.isdigit() or (number[0] == "0" and number != "0") \
            or len(prefix) >= MAX_ID_PREFIX:
        return None
    return prefix + ":", int(number)


def split(events: list[dict]) -> tuple[list[dict], list[dict]]:
    """The events a batch of columns can carry (those whose ids share the first one's prefix,
    numbered upwards, and whose attributes keep one type each and fit 64 bits), and the rest,
    for maps: event by event, the slow way (``pack`` tries the fast one first)."""
    columnar, rest, prefix, first, last, types = [], [], None, 0, -1, {}
    for event in events:
        parts = _id_parts(event["id"])
        if parts is None or (prefix is not None and (
                parts[0] != prefix or parts[1] <= last or parts[1] - first >= 2**32)):
            rest.append(event)
            continue
        kinds = {k: type(v) for k, v in event["attrs"].items() if v is not None}
        if any(types.get(k, kind) is not kind for k, kind in kinds.items()) or any(
                kind not in (int, float, bool, str) for kind in kinds.values()) or any(
                type(v) is int and not -(2**63) <= v < 2**63 for v in event["attrs"].values()):
            rest.append(event)
            continue
        types.update(kinds)
        if prefix is None:
            first = parts[1]
        prefix, last = parts
        columnar.append(event)
    return columnar, rest


def _ids(events: list[dict]) -> tuple[list[dict], list[dict], str, list[int]]:
    """The events whose ids share the first one's prefix, numbered upwards (and within 2**32
    of the first), their prefix and numbers; and the rest."""
    carried, rest, numbers, prefix = [], [], [], None
    for event in events:
        parts = _id_parts(event["id"])
        if parts is None or (prefix is not None and (
                parts[0] != prefix or parts[1] <= numbers[-1]
                or parts[1] - numbers[0] >= 2**32)):
            rest.append(event)
            continue
        prefix = parts[0]
        numbers.append(parts[1])
        carried.append(event)
    return carried, rest, prefix or "", numbers


def _gather(events: list[dict]) -> dict[str, tuple[list[int], list]] | None:
    """Each attribute's events and values, set apart by the events' shape (their attribute
    names, in order: one per kind, mostly) so that the values come out a column at a time;
    None when an attribute changes type or a value is not one columns carry."""
    shapes: dict[tuple, list[int]] = {}
    for i, event in enumerate(events):
        shapes.setdefault(tuple(event["attrs"]), []).append(i)
    found: dict[str, tuple[list[int], list]] = {}
    types: dict[str, type] = {}
    for names, members in shapes.items():
        rows = [tuple(events[i]["attrs"].values()) for i in members]
        for name, values in zip(names, zip(*rows)):
            kinds = set(map(type, values))
            where = members
            if type(None) in kinds:
                kept = [k for k, v in enumerate(values) if v is not None]
                where, values = [members[k] for k in kept], [values[k] for k in kept]
                kinds.discard(type(None))
            if not values:
                continue
            if len(kinds) != 1 or types.setdefault(name, next(iter(kinds))) not in kinds \
                    or types[name] not in (int, float, bool, str):
                return None
            slot = found.setdefault(name, ([], []))
            slot[0].extend(where)
            slot[1].extend(values)
    return found


def _bits(mask: np.ndarray) -> bytes | None:
    return None if mask.all() else np.packbits(mask, bitorder="little").tobytes()


def _attr(n: int, where: list[int], values: list) -> list:
    """One attribute's column: [code, values, present, strings]."""
    at = np.array(where, np.int64)
    present = np.zeros(n, bool)
    present[at] = True
    bits = _bits(present)
    sample = values[0]
    if type(sample) is str:
        strings = list(dict.fromkeys(values))
        index = {s: k for k, s in enumerate(strings)}
        code = "s1" if len(strings) <= 0xFF else "s2" if len(strings) <= 0xFFFF else "s4"
        array = np.zeros(n, TEXT[code])
        array[at] = [index[v] for v in values]
        return [code, array.tobytes(), bits, strings]
    if type(sample) is bool:
        code, given = "b1", np.array(values, np.uint8)
    elif type(sample) is float:
        code, given = "f8", np.array(values, "<f8")
    else:
        given = np.array(values, np.int64)          # OverflowError past 64 bits
        code = _int_code(given)
    array = np.zeros(n, NUMERIC[code])
    array[at] = given
    return [code, array.tobytes(), bits, None]


def pack(events: list[dict]) -> tuple[dict | None, list[dict]]:
    """The wire form of the events a batch of columns can carry, and the rest, for maps (None
    and all of them when columns carry none)."""
    carried, rest, prefix, numbers = _ids(events)
    if not carried:
        return None, events
    found = _gather(carried)
    try:
        attrs = None if found is None else \
            {name: _attr(len(carried), *slot) for name, slot in found.items()}
    except OverflowError:                  # an integer past 64 bits, one way or the other
        attrs = None
    if attrs is None:                      # sort them out one by one, then pack what is left
        carried, others = split(carried)
        packed, left = pack(carried) if carried else (None, [])
        return packed, left + others + rest
    first = numbers[0]
    offsets = np.array(numbers, np.int64) - first
    contiguous = offsets[-1] == len(offsets) - 1
    kinds = list(dict.fromkeys(e["kind"] for e in carried))
    index = {k: i for i, k in enumerate(kinds)}
    return {"n": len(carried),
            "ids": [prefix, first, None if contiguous else offsets.astype("<u4").tobytes()],
            "t": np.array([e["t"] for e in carried], "<f8").tobytes(),
            "kinds": kinds,
            "kind": np.array([index[e["kind"]] for e in carried],
                             "<u1" if len(kinds) <= 0xFF else "<u2").tobytes(),
            "attrs": attrs}, rest


def encode(events: list[dict]) -> dict:
    """The wire form of events ``split`` took for columns, every one of them."""
    if not events:
        return {"n": 0, "ids": ["", 0, None], "t": b"", "kinds": [], "kind": b"", "attrs": {}}
    packed, rest = pack(events)
    if rest:
        raise ValueError(f"{len(rest)} event(s) columns cannot carry: split them off first")
    return packed


# -- checking (fleetd) -------------------------------------------------------------------------

def _array(name: str, data: Any, dtype: str, n: int) -> np.ndarray:
    if type(data) is not bytes:
        _fail(name, "expected bin")
    itemsize = np.dtype(dtype).itemsize
    if len(data) != n * itemsize:
        _fail(name, f"{len(data)} bytes, expected {n} values of {itemsize}")
    return np.frombuffer(data, dtype)


def _texts(name: str, value: Any, max_len: int, most: int) -> list[str]:
    if type(value) is not list or len(value) > most:
        _fail(name, f"expected a list of at most {most} strings")
    if value and (set(map(type, value)) != {str} or not 0 < min(map(len, value))
                  or max(map(len, value)) > max_len):
        _fail(name, f"expected strings of 1 to {max_len} characters")
    return value


def _present(name: str, data: Any, n: int) -> np.ndarray | None:
    if data is None:
        return None
    if type(data) is not bytes or len(data) != (n + 7) // 8:
        _fail(name, f"expected a bitmap of {(n + 7) // 8} bytes")
    return np.unpackbits(np.frombuffer(data, np.uint8), count=n, bitorder="little").astype(bool)


def _column(name: str, value: Any, n: int, want: type | None) -> Column:
    if type(value) is not list or len(value) != 4:
        _fail(name, "expected [code, values, present, strings]")
    code, data, bits, strings = value
    if code not in DTYPES:
        _fail(name, f"unknown column code {code!r}")
    if want is not None and KIND_OF_CODE[code] is not want:
        _fail(name, f"expected {'integers' if want is int else want.__name__}, got a "
                    f"column of {KIND_OF_CODE[code].__name__}")
    values = _array(name, data, DTYPES[code], n)
    present = _present(f"{name} present", bits, n)
    where = values if present is None else values[present]
    if code in TEXT:
        strings = _texts(f"{name} strings", strings, 256, n)   # at most one per value
        if len(where) and int(where.max()) >= len(strings):
            _fail(name, "a text index past its strings")
    elif strings is not None:
        _fail(name, "strings given for a column that is not text")
    elif code == "f8" and not np.isfinite(where).all():
        _fail(name, "a number that is not finite")
    elif code == "b1" and len(where) and int(where.max()) > 1:
        _fail(name, "a boolean that is neither 0 nor 1")
    return Column(code, values, present, strings)


def check(name: str, value: Any, attr_types: dict[str, type], max_attrs: int) -> EventColumns:
    """A columnar batch off the wire, checked whole; raises ``BadSchema`` (reason
    ``bad_column``) naming what is wrong."""
    if type(value) is not dict:
        _fail(name, "expected a map")
    n = value.get("n")
    if type(n) is not int or not 0 <= n <= MAX_EVENTS:
        _fail(f"{name}.n", f"expected an integer from 0 to {MAX_EVENTS}")
    ids = value.get("ids")
    if type(ids) is not list or len(ids) != 3:
        _fail(f"{name}.ids", "expected [prefix, first, offsets]")
    prefix, first, offsets = ids
    if type(prefix) is not str or len(prefix) > MAX_ID_PREFIX or type(first) is not int \
            or not 0 <= first < 2**63:
        _fail(f"{name}.ids", f"expected a prefix of at most {MAX_ID_PREFIX} characters and "
                             "a first number from 0")
    offsets = None if offsets is None else _array(f"{name}.ids offsets", offsets, "<u4", n)
    last = first + (n - 1 if offsets is None else int(offsets.max(initial=0)))
    if n and (not 0 < len(prefix) + len(str(last)) <= 128 or (
            offsets is not None and len(offsets) > 1 and (np.diff(offsets) <= 0).any())):
        _fail(f"{name}.ids", "ids must be 1 to 128 characters and distinct, numbered upwards")
    t = _array(f"{name}.t", value.get("t"), "<f8", n)
    if not (np.isfinite(t) & (t >= 0)).all():
        _fail(f"{name}.t", "a time that is negative or not finite")
    kinds = _texts(f"{name}.kinds", value.get("kinds"), 64, n)
    kind = _array(f"{name}.kind", value.get("kind"),
                  "<u1" if len(kinds) <= 0xFF else "<u2", n)
    if n and int(kind.max()) >= len(kinds):
        _fail(f"{name}.kind", "a kind index past the kinds")
    attrs = value.get("attrs")
    if type(attrs) is not dict or len(attrs) > MAX_COLUMNS:
        _fail(f"{name}.attrs", f"expected a map of at most {MAX_COLUMNS} columns")
    columns = {}
    for key, column in attrs.items():
        if type(key) is not str or not 0 < len(key) <= 64:
            _fail(f"{name}.attrs", "an attribute name that is not 1 to 64 characters")
        columns[key] = _column(f"{name}.attrs.{key}", column, n, attr_types.get(key))
    if len(columns) > max_attrs:
        counts = sum(c.mask(n).astype(np.int32) for c in columns.values())
        if int(counts.max()) > max_attrs:
            _fail(f"{name}.attrs", f"an event with more than {max_attrs} attributes")
    return EventColumns(n, prefix, first, offsets, t, kinds, kind, columns)
