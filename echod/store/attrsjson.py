"""The attributes of events pushed as columns, as the JSON ``checks.attrs_json`` writes for an
event, made over arrays: each value rendered once per column (each distinct text once), the
events of one shape (which attributes they have) joined with one template.
"""

from __future__ import annotations

import numpy as np

from ingero.columns import Column, EventColumns
from ingero.vocabulary import LIFTED

from . import checks

LIFTED_NAMES = frozenset(name for name, _ in LIFTED)
# The most characters a value can take as JSON where it is not text (an int64, a float's repr,
# "false").
NUMBER_JSON = 24


def check(cols: EventColumns, slow: np.ndarray) -> None:
    """Mark slow the events whose attributes' JSON ``checks.attrs_json`` would refuse for a
    name or a text (no NUL, no lone surrogate), to be refused with its reason."""
    for name, column in attributes(cols).items():
        if "\x00" in name or not checks.encodable(name):
            slow |= column.mask(cols.n)
        if column.strings is not None:
            bad = [k for k, text in enumerate(column.strings)
                   if "\x00" in text or not checks.encodable(text)]
            slow |= column.mask(cols.n) & np.isin(column.values, bad)


def attributes(cols: EventColumns) -> dict[str, Column]:
    """The columns that go into the JSON: all but the lifted."""
    return {name: column for name, column in cols.attrs.items() if name not in LIFTED_NAMES}


def longest(cols: EventColumns) -> int:
    """The most characters any event's attributes can take as JSON."""
    total = 2
    for name, column in attributes(cols).items():
        value = NUMBER_JSON if column.strings is None else max(
            (len(checks.encode_json(text)) for text in column.strings), default=0)
        total += len(checks.encode_json(name)) + 2 + value
    return total


def texts(cols: EventColumns, at: np.ndarray, without: dict | None = None) -> np.ndarray:
    """The JSON of the attributes (all but the lifted) of the events at ``at``; of a name in
    ``without``, not where its mask (over ``at``) is set."""
    parts, masks = [], []
    for name, column in attributes(cols).items():
        present = column.mask(cols.n)[at]
        if without and name in without:
            present = present & ~without[name]
        if not present.any():
            continue
        parts.append((checks.encode_json(name).replace("%", "%%") + ":", rendered(column, at)))
        masks.append(present)
    out = np.full(len(at), "{}", dtype=object)
    if not parts:
        return out
    present = np.stack(masks, axis=1)
    shape_of = present @ (np.int64(1) << np.arange(len(masks), dtype=np.int64)) \
        if len(masks) < 63 else np.unique(present, axis=0, return_inverse=True)[1].ravel()
    # each shape's events from one sort: a shape an event (a user's processes choose their
    # attributes) costs a slice each, not a pass over all of them
    order = np.argsort(shape_of, kind="stable")
    _, starts = np.unique(shape_of[order], return_index=True)
    for where in np.split(order, starts[1:]):
        have = [parts[k] for k in np.flatnonzero(present[where[0]]).tolist()]
        template = "{" + ",".join(key + "%s" for key, _ in have) + "}"
        columns = [json[where].tolist() for _, json in have]
        out[where] = [template % row for row in zip(*columns)] if have else "{}"
    return out


def rendered(column: Column, at: np.ndarray) -> np.ndarray:
    """A column's values at ``at`` as JSON text (texts: each distinct text once)."""
    values = column.values[at]
    if column.strings is not None:
        table = np.array([checks.encode_json(text) for text in column.strings] + ["null"],
                         dtype=object)
        return table[np.minimum(values, len(column.strings))]
    if column.code == "b1":
        return np.array(["false", "true"], dtype=object)[values.astype(bool).astype(int)]
    if column.code == "f8":
        return np.array(list(map(float.__repr__, values.tolist())), dtype=object)
    return np.array(list(map(str, values.tolist())), dtype=object)
