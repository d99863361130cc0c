"""A per-node launcher, as torchrun's agent or Open MPI's orted is: one process on each node
that spawns that node's ranks as its children, reaps them and reports how each ended.

    python -m sim.launcher SPEC.json

SPEC holds ``workers`` (each: rank, argv, env, cpus or null, log path), ``cwd``, ``status``
(a file this process appends JSON lines to: ``{"rank", "pid"}`` when a worker starts,
``{"rank", "exit"}`` when it ends, the exit as Popen reports it: negative for a signal),
``load`` (a library to map first, as torchrun's agent maps libcudart when it imports torch;
null for orted, which maps none) and ``restart`` (the workers to start, once, when every
worker has left with status 4 for an elastic restart, as torchrun's agent restarts its
workers; null for none). SIGTERM is passed on to the workers; the workers die with the
launcher (PR_SET_PDEATHSIG), and it exits once they all have: 0 when every one exited 0.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1


def _worker_setup(cpus: list[int] | None):
    def setup():
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if cpus:
            os.sched_setaffinity(0, cpus)
    return setup


RESTART = 4          # the status a worker leaves with for an elastic restart


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    if spec.get("load"):
        ctypes.CDLL(spec["load"])
    workers: dict[int, tuple[int, subprocess.Popen]] = {}   # pid → (rank, its Popen, kept
    # referenced so that it never reaps the worker itself: os.wait below does)
    codes: list[int] = []
    restart = spec.get("restart")
    with open(spec["status"], "a", buffering=1) as status:
        signal.signal(signal.SIGTERM, lambda *_: [_signal(pid, signal.SIGTERM)
                                                  for pid in list(workers)])
        start(spec["workers"], spec["cwd"], workers, status)
        while workers:
            try:
                pid, raw = os.wait()
            except ChildProcessError:
                break
            except InterruptedError:
                continue
            if pid in workers:
                codes.append(os.waitstatus_to_exitcode(raw))
                status.write(json.dumps({"rank": workers.pop(pid)[0], "exit": codes[-1]}) + "\n")
            if not workers and restart and set(codes) == {RESTART}:
                start(restart, spec["cwd"], workers, status)
                codes, restart = [], None
    return 1 if any(codes) else 0


def start(plan: list[dict], cwd: str, workers: dict, status) -> None:
    """Start the workers of ``plan``, and say each one's pid."""
    for w in plan:
        with open(w["log"], "w") as log:
            popen = subprocess.Popen(w["argv"], stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=log, env=w["env"], cwd=cwd,
                                     preexec_fn=_worker_setup(w.get("cpus")))
        workers[popen.pid] = (w["rank"], popen)
        status.write(json.dumps({"rank": w["rank"], "pid": popen.pid}) + "\n")


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
