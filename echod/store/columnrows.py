"""The events of a push of columns as the rows echod stages, a column at a time.

A push of columns (wire 1.3) reaches echod as fleetd received it, checked by ``wire.decode``
again: types, lengths, finite numbers. What echod checks beyond that (``check_event``: the
text rules, the id's node, times within bounds, the lifted columns' ranges, the attributes'
JSON) is checked here over whole arrays, and each text once per batch, not once per event. An
event that any of it fails, and the rare kind that says more than its row (a job's start and
end, which fill the job records), goes through ``check_event`` as a map: the same checks, the
same reasons, the same rows; a batch of columns and the same events as maps store alike. The
frequent calls that pass are kept in chunks (``echod.store.chunks``), the others as rows; the view
``events`` reads both alike.
"""

from __future__ import annotations

from datetime import UTC, datetime
from itertools import repeat

import numpy as np

from ingero import wire
from ingero.columns import EventColumns
from ingero.vocabulary import LIFTED

from . import attrsjson, checks, chunks
from .jobrecords import JOB_KINDS



def plain(text: str) -> bool:
    """What ``checks.check_string`` passes at once (the rest is checked event by event)."""
    return 0 < len(text) <= checks.MAX_TEXT and text.isascii() and "\x00" not in text


def stage(checked: "checks.CheckedBatch", push: wire.ColumnPush, now: float,
          first_index: int) -> None:
    """Stage the events of ``push``'s columns into ``checked`` (``first_index``: the first
    one's index among the batch's events, for the reasons of those refused)."""
    cols = push.columns
    slow = np.zeros(cols.n, bool)
    if not (plain(push.node) and plain(push.cluster) and plain(push.boot_id)
            and cols.id_prefix.startswith(push.node + ":")):
        slow[:] = True
    slow |= (cols.t < checks.earliest(now)) | (cols.t > now + checks.FUTURE_SLACK_S)
    kinds = np.array(cols.kinds, dtype=object)
    slow |= np.isin(cols.kind, [k for k, name in enumerate(cols.kinds)
                                if not plain(name) or name in JOB_KINDS])
    lifted = {name: _lifted(cols, name, bounds, slow) for name, bounds in LIFTED}
    job = _job(cols, push.job, slow)
    attrsjson.check(cols, slow)
    # The frequent calls go into chunks, their attributes' JSON made there (a chunk's common
    # values once); none is too long for it where the longest an event's can be is not.
    chunkable = chunks.chunkable(cols) & ~slow
    if attrsjson.longest(cols) > checks.MAX_ATTRS_JSON:
        chunkable[:] = False
    attrs = np.full(cols.n, None, dtype=object)
    rowed = np.flatnonzero(~chunkable)
    attrs[rowed] = attrsjson.texts(cols, rowed)
    slow[rowed] |= np.fromiter(map(len, attrs[rowed].tolist()), np.int64, len(rowed)) \
        > checks.MAX_ATTRS_JSON
    fast = np.flatnonzero(~slow)
    if len(fast):
        t = cols.t[fast]
        for end in (int(np.argmin(t)), int(np.argmax(t))):
            checked.saw_node(push.cluster, push.node, datetime.fromtimestamp(float(t[end]), UTC),
                             push.boot_id)
        checked.days.update(datetime.fromtimestamp(day * 86_400, UTC).date()
                            for day in np.unique(t // 86_400).tolist())
        chunked = chunkable[fast]
        made, stats = chunks.build(push, cols, fast[chunked])
        checked.chunks.extend(made)
        checked.chunk_stats.extend(stats)
        checked.chunked += int(chunked.sum())
        fast = fast[~chunked]
    if len(fast):
        stamps = [datetime.fromtimestamp(x, UTC) for x in cols.t[fast].tolist()]
        rows = list(zip(stamps, cols.ids(fast), repeat(push.cluster),
                        repeat(push.node), job[fast].tolist(), *(
                            lifted[name][fast].tolist() for name in ("rank",)),
                        kinds[cols.kind[fast]].tolist(), *(
                            lifted[name][fast].tolist() for name, _ in LIFTED[1:]),
                        attrs[fast].tolist()))
        checked.rows.setdefault("events", []).extend(rows)
    at = np.flatnonzero(slow)
    for index, row in zip(at.tolist(), push.stored_rows(cols.rows(at))):
        try:
            staged = checks.check_event(row, now)
        except checks.Rejected as exc:
            checked.rejected.append(("events", first_index + index, str(exc)))
            continue
        checked.rows.setdefault("events", []).append(staged)
        checks.note_row(checked, "events", row, staged)


def _lifted(cols: EventColumns, name: str, bounds: tuple[int, int] | None,
            slow: np.ndarray) -> np.ndarray:
    """The values of a lifted column (None where an event lacks it), as Python objects;
    events whose value its check would refuse are marked slow."""
    column = cols.attrs.get(name)
    if column is None:
        return np.full(cols.n, None, dtype=object)
    present = column.mask(cols.n)
    if bounds is None:                                   # text
        if column.strings is None:
            slow |= present
            return np.full(cols.n, None, dtype=object)
        bad = [k for k, text in enumerate(column.strings) if not plain(text)]
        slow |= present & np.isin(column.values, bad)
        return column.objects(np.arange(cols.n))
    if column.strings is not None or column.code in ("f8", "b1"):
        slow |= present
        return np.full(cols.n, None, dtype=object)
    values = column.values
    lo, hi = bounds
    wide = values.astype(np.uint64) > np.uint64(hi) if values.dtype.kind == "u" else \
        (values < lo) | (values > hi)
    slow |= present & wide
    return column.objects(np.arange(cols.n))


def _job(cols: EventColumns, default: str | None, slow: np.ndarray) -> np.ndarray:
    """Each event's job: its process's, else the push's (``Push.job_of``)."""
    codes, jobs = cols.codes("job")
    if default is not None and not plain(default):
        slow[codes < 0] = True
    column = cols.attrs.get("job")
    if column is not None and column.strings is None:   # a job that is not text: as a map
        slow |= column.mask(cols.n)
    bad = [k for k, text in enumerate(jobs) if text and not plain(text)]
    slow |= np.isin(codes, bad)
    names = np.array([text or default for text in jobs] + [default], dtype=object)
    return names[np.where(codes < 0, len(jobs), codes)]
