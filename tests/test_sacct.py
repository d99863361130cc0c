"""sacct's conventions as ``ingero report`` and ``ingero jobs`` follow them: the time grammar,
field widths and alignment, and the layouts."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from ingero.command import sacct

ZONE = timezone(timedelta(hours=2))
NOW = datetime(2026, 11, 24, 15, 30, 45, tzinfo=ZONE)


@pytest.mark.parametrize("text, expected", [
    ("now", NOW),
    ("now-1hour", NOW - timedelta(hours=1)),
    ("now-90", NOW - timedelta(seconds=90)),
    ("now-30min", NOW - timedelta(minutes=30)),
    ("now-2days", NOW - timedelta(days=2)),
    ("now+1week", NOW + timedelta(weeks=1)),
    ("now-10seconds", NOW - timedelta(seconds=10)),
    ("today", datetime(2026, 11, 24, tzinfo=ZONE)),
    ("midnight", datetime(2026, 11, 24, tzinfo=ZONE)),
    ("noon", datetime(2026, 11, 24, 12, tzinfo=ZONE)),
    ("elevenses", datetime(2026, 11, 24, 11, tzinfo=ZONE)),
    ("fika", datetime(2026, 11, 24, 15, tzinfo=ZONE)),
    ("teatime", datetime(2026, 11, 24, 16, tzinfo=ZONE)),
    ("10:05", datetime(2026, 11, 24, 10, 5, tzinfo=ZONE)),
    ("10:05:07", datetime(2026, 11, 24, 10, 5, 7, tzinfo=ZONE)),
    ("4:15pm", datetime(2026, 11, 24, 16, 15, tzinfo=ZONE)),
    ("12:00AM", datetime(2026, 11, 24, 0, 0, tzinfo=ZONE)),
    ("2026-11-21T10:00", datetime(2026, 11, 21, 10, tzinfo=ZONE)),
    ("2026-11-21T10:00:30", datetime(2026, 11, 21, 10, 0, 30, tzinfo=ZONE)),
    ("2026-11-21", datetime(2026, 11, 21, tzinfo=ZONE)),
    ("1121", datetime(2026, 11, 21, tzinfo=ZONE)),
    ("112125", datetime(2025, 11, 21, tzinfo=ZONE)),
    ("11/21", datetime(2026, 11, 21, tzinfo=ZONE)),
    ("11/21/25", datetime(2025, 11, 21, tzinfo=ZONE)),
    ("11.21.2024", datetime(2024, 11, 21, tzinfo=ZONE)),
    ("NOW-1HOUR", NOW - timedelta(hours=1)),
])
def test_the_time_grammar(text, expected):
    assert sacct.parse_time(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "now-1fortnight", "25:00", "2026-13-01",
                                  "13/45", "", "now-", "10:61"])
def test_bad_times_name_the_accepted_forms(text):
    with pytest.raises(ValueError, match="bad"):
        sacct.parse_time(text, NOW)


FIELDS = {f.name.lower(): f for f in (
    sacct.Field("JobID", 6, lambda r: r["job"]),
    sacct.Field("Rank", 4, lambda r: r["rank"]),
    sacct.Field("Cause", 9, lambda r: r.get("cause")))}
ROWS = [{"job": "4242", "rank": 0}, {"job": "4242", "rank": 5, "cause": "host_preemption"}]


def test_default_layout_header_dashes_right_justified_and_truncated_with_plus():
    text = sacct.render(sacct.parse_format("jobid,rank,cause", FIELDS), ROWS)
    assert text.splitlines() == [
        " JobID Rank     Cause",
        "------ ---- ---------",
        "  4242    0          ",
        "  4242    5 host_pre+"]


def test_widths_and_left_justification():
    columns = sacct.parse_format("JobID%-8,Cause%15", FIELDS)
    assert [(c.width, c.align) for c in columns] == [(8, "left"), (15, "right")]
    lines = sacct.render(columns, ROWS, noheader=True).splitlines()
    assert lines == ["4242                    ", "4242     host_preemption"]


def test_parsable_layouts():
    columns = sacct.parse_format("jobid,cause", FIELDS)
    assert sacct.render(columns, ROWS, parsable=True).splitlines() == [
        "JobID|Cause|", "4242||", "4242|host_preemption|"]
    assert sacct.render(columns, ROWS, parsable2=True, noheader=True).splitlines() == [
        "4242|", "4242|host_preemption"]


@pytest.mark.parametrize("spec, complaint", [
    ("jobid,nosuch", "unknown field 'nosuch'"), ("rank%x", "bad width"),
    ("rank%0", "bad width"), ("", "no field")])
def test_bad_formats(spec, complaint):
    with pytest.raises(ValueError, match=complaint):
        sacct.parse_format(spec, FIELDS)


def test_helpformat_lists_every_field():
    assert sacct.helpformat(FIELDS).split() == ["JobID", "Rank", "Cause"]


def test_colour_only_where_enabled():
    assert sacct.colour("x", "red", False) == "x"
    assert sacct.colour("x", "red", True) == "\033[31mx\033[0m"


def test_every_ingero_command_s_help_ends_with_an_example():
    from click.testing import CliRunner

    from ingero.command.cli import main

    for name in main.commands:
        done = CliRunner().invoke(main, [name, "--help"])
        assert done.exit_code == 0, done.output
        last_paragraph = done.output.rstrip().split("\n\n")[-1].strip()
        assert last_paragraph.startswith("Example: ingero "), name
