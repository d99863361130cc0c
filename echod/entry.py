"""The ``echod`` program: on an installation without the head extra (a compute node's
``ingero[agent]``) it says what is missing in one line instead of a traceback."""

from __future__ import annotations

import importlib.util
import sys

from ingero.runtime import HEAD_MODULES


def main() -> None:
    missing = [name for name in HEAD_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        sys.exit(f"echod: this installation lacks {', '.join(missing)}: echod runs on the "
                 "head node, installed with pip install 'ingero[head]'")
    from .cli import main as run
    run()
