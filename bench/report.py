"""What every benchmark does once it has parsed its arguments: refuse to run without root, run,
print the result as JSON and, with --json, write it to a file too."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def run_and_report(script: str, needs_root_because: str, run, args) -> None:
    if os.geteuid() != 0:
        sys.exit(f"bench/{Path(script).name} needs root: {needs_root_because}")
    text = json.dumps(run(args), indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
