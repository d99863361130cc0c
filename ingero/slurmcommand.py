"""Slurm's commands (sacct, squeue, scontrol, sinfo) run by a daemon or the command, off any
job's path: with a timeout, no standard input, and every failure one line to log."""

from __future__ import annotations

import shutil
import subprocess


class SlurmUnavailable(Exception):
    """The command is missing, too slow, or its answer is an error (slurmctld or slurmdbd
    down, not allowed, no such job)."""


def run_slurm(argv: list[str], timeout_s: float, env: dict | None = None) -> str:
    """``argv``'s standard output; SlurmUnavailable saying why there is none."""
    if shutil.which(argv[0], path=(env or {}).get("PATH")) is None:
        raise SlurmUnavailable(f"{argv[0]} is not installed (not on PATH)")
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=env,
                              timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"{argv[0]} took over {timeout_s:.0f} s") from None
    except OSError as exc:
        raise SlurmUnavailable(f"{argv[0]}: {exc.strerror or exc}") from None
    if done.returncode != 0:
        raise SlurmUnavailable(f"{' '.join(argv[:3])}: "
                               f"{(done.stderr or done.stdout).strip()[:300]}")
    return done.stdout
