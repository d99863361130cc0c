"""The fault drills, as a benchmark run: kill -9 of fleetd, echod and PostgreSQL during a traced
job; a node's link down for 30 s; fleetd's spool on a full filesystem; 10,000 connected agents.

Each drill is a test (tests/test_drills.py, tests/test_spool.py, tests/test_fleetd_limits.py)
that asserts its outcome; this script runs them and gathers the line each prints (what was
produced, stored and dropped, and how long recovery took) into one table.

    .venv/bin/python bench/drills.py [--json results/drills.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DRILLS = ["tests/test_drills.py", "tests/test_spool.py::test_a_full_filesystem_drops_events_by_"
          "priority_and_keeps_verdicts", "tests/test_fleetd_limits.py::test_fleetd_holds_10000_"
          "connected_agents_and_still_answers"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    done = subprocess.run([sys.executable, "-m", "pytest", "-s", "-q", "-rfE", "-p",
                           "no:cacheprovider",
                           *DRILLS], cwd=REPO, capture_output=True, text=True)
    rows = [line.split("drill: ", 1)[1].split(" | ") for line in done.stdout.splitlines()
            if "drill: " in line]          # pytest's progress dots may lead the line
    for row in rows:
        print(" | ".join(row))
    for line in done.stdout.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            print(line)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "pytest_exit": done.returncode}, indent=1))
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-500:]
    print(f"drills: {len(rows)} reported, pytest: {summary}")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
