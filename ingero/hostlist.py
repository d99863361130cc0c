"""Slurm's compressed host lists: ``node[01-03,07],login1`` → node01 node02 node03 node07 login1.

The Slurm prolog hands its job's nodes over in this form (``SLURM_NODELIST``); echod expands it
into the job's node names. Ranges keep the zero padding of their lower bound, several bracket
groups in one name multiply (``r[1-2]n[1-2]`` → r1n1 r1n2 r2n1 r2n2). Stdlib only: the Slurm
hooks import this.
"""

from __future__ import annotations

import re

MAX_HOSTS = 100_000
_GROUP = re.compile(r"\[([^\[\]]*)\]")
_NUMBER = re.compile(r"[0-9]{1,18}")     # ASCII digits: '²' is a digit to str.isdigit


class BadHostList(ValueError):
    """Not a host list Slurm would write."""


def expand(hostlist: str, limit: int = MAX_HOSTS) -> list[str]:
    """Every host name of ``hostlist``, in order, without duplicates."""
    names: dict[str, None] = {}
    for item in _split_top(hostlist):
        if _count(item) > limit:        # counted before a name is made: r[0-99999]n[0-99999]
            raise BadHostList(f"more than {limit} hosts")
        for name in _expand_item(item):
            names[name] = None
            if len(names) > limit:
                raise BadHostList(f"more than {limit} hosts")
    return list(names)


def _split_top(hostlist: str) -> list[str]:
    """Split at the commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, char in enumerate(hostlist):
        if char == "[":
            depth += 1
            if depth > 1:
                raise BadHostList(f"nested brackets in {hostlist!r}")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise BadHostList(f"unbalanced ']' in {hostlist!r}")
        elif char == "," and depth == 0:
            items.append(hostlist[start:i])
            start = i + 1
    if depth:
        raise BadHostList(f"unbalanced '[' in {hostlist!r}")
    items.append(hostlist[start:])
    return [item.strip() for item in items if item.strip()]


def _count(item: str) -> int:
    """How many names an item expands to (before duplicates go)."""
    count = 1
    for group in _GROUP.findall(item):
        count *= sum(len(_bounds(piece)) for piece in group.split(","))
    return count


def _bounds(piece: str) -> range:
    low, dash, high = piece.strip().partition("-")
    if not _NUMBER.fullmatch(low) or (dash and not _NUMBER.fullmatch(high)):
        raise BadHostList(f"bad range {piece!r}")
    if dash and int(high) < int(low):
        raise BadHostList(f"range {piece!r} runs backwards")
    return range(int(low), int(high if dash else low) + 1)


def _expand_item(item: str) -> list[str]:
    match = _GROUP.search(item)
    if match is None:
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    return [head + part + rest for part in _ranges(match.group(1)) for rest in _expand_item(tail)]


def _ranges(spec: str) -> list[str]:
    parts = []
    for piece in spec.split(","):
        numbers = _bounds(piece)
        if len(numbers) > MAX_HOSTS:
            raise BadHostList(f"range {piece!r} too long")
        width = len(piece.strip().partition("-")[0])
        parts += [str(n).zfill(width) for n in numbers]
    return parts
