"""The processes of a sim cluster: what each rank, launcher and hog is (``RankSpec``,
``LaunchedProcess``, ``HogProcess``), where each rank records (``record_of``), how a child is
set up (its CPUs, its niceness, dying with its parent), and what came of each (``RankResult``,
``ClusterResult``). ``sim.cluster`` starts and stops them.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sim.scenario import Straggler

STATUS_BY_EXIT = {0: "ok", 1: "died", 2: "usage", 3: "error", 4: "restarted"}
EXIT_RESTART = 4
STOP_GRACE_S = 3.0
FAILURE_GRACE_S = 5.0
POLL_S = 0.05
LAUNCH_TIMEOUT_S = 30.0
INPUT_BYTES = 32 << 20          # the loader workers' input file
PR_SET_PDEATHSIG = 1
# What a launcher tells its processes; the test runner's own (a test run inside a Slurm job or
# under torchrun) must not leak into the sim's job.
LAUNCHER_PREFIXES = ("SLURM_", "SLURMD_", "OMPI_", "PMIX_", "PMI_", "TORCHELASTIC_")
LAUNCHER_NAMES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                  "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                  "MASTER_ADDR", "MASTER_PORT", "MPI_LOCALRANKID"}


def plain_environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if k not in LAUNCHER_NAMES and not k.startswith(LAUNCHER_PREFIXES)}


@dataclass
class RankProcess:
    rank: int
    local_rank: int
    node: int
    record_path: Path
    log_path: Path
    cpu: int | None
    namespace: str | None
    popen: "subprocess.Popen | LaunchedProcess"
    step: int = 0              # the Slurm step it runs in
    generation: int = 0        # its elastic restarts so far

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def current(self) -> tuple[int, Path]:
        """(generation, record) of its latest run: a launcher may have restarted it."""
        generation = getattr(self.popen, "generation", self.generation)
        return generation, record_of(self.record_path.parent, self.rank, self.step,
                                     generation)


@dataclass(frozen=True)
class RankSpec:
    """How one rank is started: by the cluster itself (srun) or by its node's launcher."""
    rank: int
    local_rank: int
    node: int
    argv: list[str]
    env: dict[str, str]
    cpus: set[int] | None
    record_path: Path
    log_path: Path
    step: int = 0
    generation: int = 0


class LaunchedProcess:
    """A rank spawned by its node's launcher, with the part of Popen's interface the cluster
    uses. The launcher reaps it and writes how it ended to its status file; a rank outliving a
    launcher that was killed dies with it (PR_SET_PDEATHSIG), reported as killed by SIGKILL.
    When the launcher restarts its ranks (an elastic restart), this follows the new one."""

    def __init__(self, launcher: subprocess.Popen, status: Path, rank: int, restarts: bool):
        self.launcher, self.status, self.rank, self.restarts = launcher, status, rank, restarts
        self.returncode: int | None = None
        self.pid, self.generation = 0, -1
        self._read()

    def _read(self) -> int | None:
        """Take the launcher's latest word on this rank; its exit status, if it ended."""
        code, generation = None, -1
        for entry in launcher_lines(self.status):
            if entry["rank"] != self.rank:
                continue
            if "pid" in entry:
                self.pid, generation, code = entry["pid"], generation + 1, None
            else:
                code = entry["exit"]
        self.generation = generation
        return code

    def poll(self) -> int | None:
        if self.returncode is None:
            code = self._read()
            gone = self.launcher.poll() is not None
            if code == EXIT_RESTART and self.restarts and self.generation == 0 and not gone:
                code = None                      # its launcher starts it again
            if code is None and gone and not alive(self.pid):
                code = -signal.SIGKILL
            self.returncode = code
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(POLL_S / 5)
        return self.returncode

    def terminate(self) -> None:
        send_signal(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        send_signal(self.pid, signal.SIGKILL)


def launcher_lines(status: Path) -> list[dict]:
    """What a launcher wrote so far: {"rank", "pid"} as it starts a rank, {"rank", "exit"}
    as it reaps one."""
    return [json.loads(line) for line in
            (status.read_text().splitlines() if status.exists() else ())]


def run_suffix(step: int, generation: int) -> str:
    """What tells a step's (and restart's) files apart: nothing for the first run."""
    return "" if (step, generation) == (0, 0) else f".s{step}.g{generation}"


def record_of(workdir: Path, rank: int, step: int = 0, generation: int = 0) -> Path:
    """Where a rank's ground truth of that step and restart is."""
    return workdir / f"rank-{rank}{run_suffix(step, generation)}.jsonl"


def worker_plan(spec: RankSpec) -> dict:
    """A rank as its launcher's plan names it."""
    return {"rank": spec.rank, "argv": spec.argv, "env": spec.env, "log": str(spec.log_path),
            "cpus": sorted(spec.cpus) if spec.cpus else None}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def send_signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


@dataclass
class HogProcess:
    """A busy loop competing with `rank` for `cpu` (process name ingero-hog)."""
    rank: int
    cpu: int
    popen: subprocess.Popen

    @property
    def pid(self) -> int:
        return self.popen.pid


@dataclass(frozen=True)
class RankResult:
    rank: int
    local_rank: int
    node: int
    pid: int
    exit_code: int | None     # None: killed by the launcher after the timeout
    status: str               # ok, died, error, usage, killed, restarted
    record_path: Path
    log_path: Path
    step: int = 0             # the Slurm step
    generation: int = 0       # elastic restarts before this run of it


@dataclass(frozen=True)
class ClusterResult:
    ranks: tuple[RankResult, ...]

    @property
    def ok(self) -> bool:
        return all(r.status in ("ok", "restarted") for r in self.ranks)

    @property
    def failed(self) -> list[RankResult]:
        return [r for r in self.ranks if r.status not in ("ok", "restarted")]

    def rank(self, rank: int, step: int | None = None) -> RankResult:
        """The rank's latest run (in ``step``, or in the last step)."""
        return [r for r in self.ranks if r.rank == rank and step in (None, r.step)][-1]

    def describe(self) -> str:
        """One line per rank, for people."""
        lines = []
        for r in self.ranks:
            code = "killed after timeout" if r.exit_code is None else f"exit {r.exit_code}"
            run = f"step {r.step}, " if r.step else ""
            run += f"restart {r.generation}, " if r.generation else ""
            lines.append(f"rank {r.rank} ({run}node {r.node}, local {r.local_rank}, pid {r.pid}): "
                         f"{r.status}, {code}")
        return "\n".join(lines)


def child_setup(cpus: set[int] | None, nice: int = 0):
    """Runs in the child before exec: die with the launcher, pin, renice (all inherited)."""
    def setup():
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if cpus:
            os.sched_setaffinity(0, cpus)
        if nice:
            os.nice(nice)
    return setup


def delay_flag(s: Straggler) -> list[str]:
    spec = f"ms={s.delay_ms:g},from={s.from_step},every={s.every}"
    if s.until_step is not None:
        spec += f",until={s.until_step}"
    if s.before != "allreduce":
        spec += f",before={s.before}"
    return ["--delay", spec]
