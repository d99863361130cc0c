"""sacct's conventions, for ``ingero report`` and ``ingero jobs``: its time grammar (-S/-E), its
field selection (-o NAME%WIDTH), and its layouts (header and dashes, -p, -P, -n).

Pure functions of their arguments; the commands supply the rows and the current time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any, Callable

from ingero.vocabulary import STATE_CODES

TIME_FORMS = ("HH:MM[:SS][AM|PM], MMDD[YY], MM/DD[/YY], MM.DD[.YY], YYYY-MM-DD[THH:MM[:SS]], "
              "today, midnight, noon, elevenses, fika, teatime, now[{+|-}COUNT[seconds|minutes|"
              "hours|days|weeks]]")
NAMED_TIMES = {"midnight": time(0), "today": time(0), "noon": time(12), "elevenses": time(11),
               "fika": time(15), "teatime": time(16)}
UNITS = {"s": 1, "sec": 1, "second": 1, "m": 60, "min": 60, "minute": 60, "h": 3600,
         "hour": 3600, "d": 86400, "day": 86400, "w": 604800, "week": 604800}
_NOW = re.compile(r"^now(?:([+-])(\d+)([a-z]*))?$")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?\s*(am|pm)?$")
_ISO = re.compile(r"^(\d{4})-(\d{2})-(\d{2})(?:t(\d{1,2}):(\d{2})(?::(\d{2}))?)?$")
_MMDD = re.compile(r"^(\d{2})(\d{2})(\d{2})?$")
_SLASHED = re.compile(r"^(\d{1,2})([/.])(\d{1,2})(?:\2(\d{2}|\d{4}))?$")


def parse_time(text: str, now: datetime) -> datetime:
    """A time in sacct's grammar, in ``now``'s time zone; ValueError naming the forms."""
    value = text.strip().lower()
    for parse in (_named, _relative, _clock, _iso, _month_day):
        found = parse(value, now)
        if found is not None:
            return found
    raise ValueError(f"bad time {text!r}: use {TIME_FORMS}")


def _at(day: date, clock: time, now: datetime) -> datetime:
    return datetime.combine(day, clock, tzinfo=now.tzinfo)


def _named(value: str, now: datetime) -> datetime | None:
    clock = NAMED_TIMES.get(value)
    return None if clock is None else _at(now.date(), clock, now)


def _relative(value: str, now: datetime) -> datetime | None:
    match = _NOW.match(value)
    if match is None:
        return None
    sign, count, unit = match.groups()
    if sign is None:
        return now
    seconds = UNITS.get(unit.rstrip("s") if len(unit) > 1 else unit) if unit else 1
    if seconds is None:
        raise ValueError(f"bad time unit {unit!r} in {value!r}: use seconds, minutes, "
                         "hours, days or weeks")
    delta = timedelta(seconds=int(count) * seconds)
    return now + delta if sign == "+" else now - delta


def _clock(value: str, now: datetime) -> datetime | None:
    match = _CLOCK.match(value)
    if match is None:
        return None
    hour, minute, second, half = match.groups()
    hour = int(hour) % 12 + (12 if half == "pm" else 0) if half else int(hour)
    return _at(now.date(), _checked_time(hour, int(minute), int(second or 0), value), now)


def _iso(value: str, now: datetime) -> datetime | None:
    match = _ISO.match(value)
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) if g else 0 for g in match.groups())
    return _at(_checked_date(year, month, day, value),
               _checked_time(hour, minute, second, value), now)


def _month_day(value: str, now: datetime) -> datetime | None:
    match = _MMDD.match(value)
    if match:
        month, day, year = match.groups()
    else:
        match = _SLASHED.match(value)
        if match is None:
            return None
        month, _sep, day, year = match.groups()
    full_year = now.year if not year else int(year) + (2000 if len(year) == 2 else 0)
    return _at(_checked_date(full_year, int(month), int(day), value), time(0), now)


def _checked_date(year: int, month: int, day: int, value: str) -> date:
    try:
        return date(year, month, day)
    except ValueError:
        raise ValueError(f"bad date in {value!r}") from None


def _checked_time(hour: int, minute: int, second: int, value: str) -> time:
    try:
        return time(hour, minute, second)
    except ValueError:
        raise ValueError(f"bad time of day in {value!r}") from None


# -- fields and layouts ------------------------------------------------------------------------

@dataclass(frozen=True)
class Field:
    """A column a command can print: its name (the header), default width, and how to read
    it from a row (None prints empty)."""

    name: str
    width: int
    get: Callable[[Any], Any]
    align: str = "right"


@dataclass(frozen=True)
class Column:
    field: Field
    width: int
    align: str


def parse_format(spec: str, fields: dict[str, Field]) -> list[Column]:
    """``NAME[%WIDTH],...`` (names in any case): as sacct, %N right-justifies in N columns
    and %-N left-justifies."""
    columns = []
    for item in (part.strip() for part in spec.split(",")):
        if not item:
            continue
        name, _, width = item.partition("%")
        found = fields.get(name.lower())
        if found is None:
            raise ValueError(f"unknown field {name!r}: the fields are "
                             f"{', '.join(f.name for f in fields.values())}")
        if not width:
            columns.append(Column(found, found.width, found.align))
            continue
        if not re.fullmatch(r"-?\d{1,4}", width) or int(width) == 0:
            raise ValueError(f"bad width in {item!r}: NAME%N (right) or NAME%-N (left)")
        columns.append(Column(found, abs(int(width)),
                              "left" if width.startswith("-") else "right"))
    if not columns:
        raise ValueError("no field to print")
    return columns


def helpformat(fields: dict[str, Field], per_line: int = 5) -> str:
    """The field names in columns, as ``sacct --helpformat`` lays them out."""
    names = [f.name for f in fields.values()]
    width = max(len(n) for n in names) + 1
    return "\n".join("".join(n.ljust(width) for n in names[i:i + per_line]).rstrip()
                     for i in range(0, len(names), per_line))


def cell(value: Any) -> str:
    return "" if value is None else str(value)


def fit(text: str, column: Column) -> str:
    """Pad to the column; truncate with '+' as the last character, as sacct does."""
    if len(text) > column.width:
        return text[:column.width - 1] + "+"
    return text.ljust(column.width) if column.align == "left" else text.rjust(column.width)


def render(columns: list[Column], rows: list, *, parsable: bool = False,
           parsable2: bool = False, noheader: bool = False, delimiter: str = "|") -> str:
    """The rows in sacct's layout: header, dashes and padded columns; or separated by
    ``delimiter`` (parsable: one ends each line too; parsable2: not)."""
    body = [[cell(c.field.get(row)) for c in columns] for row in rows]
    if parsable or parsable2:
        end = delimiter if parsable else ""
        lines = [] if noheader else [delimiter.join(c.field.name for c in columns) + end]
        return "\n".join(lines + [delimiter.join(values) + end for values in body])
    lines = [] if noheader else [
        " ".join(fit(c.field.name, c) for c in columns),
        " ".join("-" * c.width for c in columns)]
    lines += [" ".join(fit(v, c) for v, c in zip(values, columns)) for values in body]
    return "\n".join(lines)


def colour(text: str, style: str, enabled: bool) -> str:
    """ANSI colour (red, yellow, green, bold) only where it is enabled: a terminal."""
    codes = {"red": "31", "yellow": "33", "green": "32", "bold": "1"}
    return f"\033[{codes[style]}m{text}\033[0m" if enabled else text


def parse_states(text: str) -> list[str]:
    """sacct's -s list (CA,TO,completed) as state names; ValueError naming the known ones."""
    names = []
    for item in (part.strip().upper() for part in text.split(",") if part.strip()):
        name = STATE_CODES.get(item, item)
        if name not in STATE_CODES.values():
            raise ValueError(f"bad state {item!r}: use "
                             + ", ".join(f"{c} ({n})" for c, n in STATE_CODES.items()))
        names.append(name)
    return names
