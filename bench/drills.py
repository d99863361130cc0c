"""The fault drills, as a benchmark run: kill -9 of fleetd, echod and PostgreSQL during a traced
job; a node's link down for 30 s; fleetd's spool on a full filesystem; 10,000 connected agents.

Each drill is a test (tests/test_drills.py, tests/test_spool.py, tests/test_fleetd_limits.py)
that asserts its outcome; this script runs them and gathers the line each prints (what was
produced, stored and dropped, and how long recovery took) into one table. ``--smoke`` runs
the quickest drill only (the spool on a full filesystem).

    .venv/bin/python -m bench.drills [--smoke]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from bench import harness

NAME = "drills"
ROOT_BECAUSE = "the drills kill daemons, cut network namespaces and mount a tmpfs"
SPOOL_DRILL = "tests/test_spool.py::test_a_full_filesystem_drops_events_by_priority_and_keeps_verdicts"
DRILLS = ["tests/test_drills.py", SPOOL_DRILL,
          "tests/test_fleetd_limits.py::test_fleetd_holds_10000_connected_agents_and_still_answers"]


def add_arguments(parser) -> None:
    pass


def run(args) -> dict:
    done = subprocess.run([sys.executable, "-m", "pytest", "-s", "-q", "-rfE", "-p",
                           "no:cacheprovider", *([SPOOL_DRILL] if args.smoke else DRILLS)],
                          cwd=REPO, capture_output=True, text=True)
    rows = [line.split("drill: ", 1)[1].split(" | ") for line in done.stdout.splitlines()
            if "drill: " in line]          # pytest's progress dots may lead the line
    failed = [line for line in done.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
    if done.returncode != 0:
        raise RuntimeError("a drill failed:\n" + "\n".join(failed or [done.stdout[-3000:],
                                                                      done.stderr[-3000:]]))
    return {"rows": rows, "pytest": done.stdout.strip().splitlines()[-1]}


def summary(result: dict) -> str:
    return f"{len(result['rows'])} drills held ({result['pytest']})"


def section(result: dict) -> str:
    return "\n\n".join([
        "## Fault drills: `drills.py`",
        "The drills are tests that assert their outcome (`tests/test_drills.py`, the "
        "full-filesystem test of `tests/test_spool.py`, the 10,000-agent test of "
        "`tests/test_fleetd_limits.py`); this script runs them together and gathers the line "
        "each prints: what the ranks produced, what was stored, what was dropped and counted, "
        "and how long recovery took. Real bcc on sim ranks, node-wide ingerod, CURVE.",
        harness.table(["drill", "what it showed"],
                      [[row[0], "; ".join(row[1:])] for row in result["rows"]]),
        "None is doubled: events are keyed by their id, health scores by the push that "
        "carried them, and the counts are against the ranks' own records.",
        harness.measured_line(result)])


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
