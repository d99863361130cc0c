"""Runs of equal keys in sorted arrays, quantiles per run, and rows of integer columns grouped:
the group-by of the analysis, and of a push's events in fleetd's intake and echod's writer."""

from __future__ import annotations

import numpy as np


def segments(*keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and lengths of the runs of equal keys in sorted arrays."""
    size = len(keys[0])
    if size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    new = np.zeros(size, bool)
    new[0] = True
    for key in keys:
        new[1:] |= key[1:] != key[:-1]
    starts = np.flatnonzero(new)
    return starts, np.diff(np.append(starts, size))


def segment_quantile(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray,
                     q: float) -> np.ndarray:
    """The q-quantile of each sorted segment, interpolated as percentile_cont and numpy do."""
    position = q * (sizes - 1)
    below = np.floor(position).astype(np.int64)
    above = np.minimum(below + 1, sizes - 1)
    low, high = values[starts + below], values[starts + above]
    return low + (position - below) * (high - low)


KEY_LIMIT = 1 << 62


def group_rows(*columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of integer columns (each an array, all as long) grouped: the distinct rows in
    order, first column first (an array a row), and each row's group. A column the same in
    every row costs one comparison; the others are numbered and the numbers combined into one
    integer a row (numbered afresh where it would overflow), so one sort of single integers
    is the most a column takes: the group-by of a push's events in fleetd and in echod."""
    rows = np.stack(columns, axis=1)
    if not len(rows):
        return rows.astype(np.int64), np.zeros(0, np.int64)
    combined, size = np.zeros(len(rows), np.int64), 1
    for column in columns:
        if column.min() == column.max():
            continue
        values, code = np.unique(column, return_inverse=True)
        if size * len(values) >= KEY_LIMIT:
            seen, combined = np.unique(combined, return_inverse=True)
            combined, size = combined.ravel().astype(np.int64), len(seen)
        combined = combined * len(values) + code.ravel()
        size *= len(values)
    _, first, group = np.unique(combined, return_index=True, return_inverse=True)
    return rows[first], group.ravel()


def grouped(*columns: np.ndarray) -> list[tuple[list[int], np.ndarray]]:
    """Each distinct row of the columns (``group_rows``) with the positions holding it, in
    order."""
    distinct, group = group_rows(*columns)
    if len(distinct) <= 1:
        return [(row.tolist(), np.arange(len(group))) for row in distinct]
    order = np.argsort(group, kind="stable")
    cuts = np.flatnonzero(np.diff(group[order])) + 1
    return [(distinct[group[chunk[0]]].tolist(), chunk) for chunk in np.split(order, cuts)]
