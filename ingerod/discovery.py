"""Which processes to trace, which libraries they map, and who they are in the job.

Everything is read from a /proc tree passed in (``proc``), so tests can point it elsewhere.
A process is a candidate when its memory map holds a CUDA or NCCL library (any path: a virtual
environment under /home is as good as /usr/lib). Paths are resolved through
``/proc/<pid>/root`` so that libraries inside containers are found on the host. NCCL may be
linked statically into libtorch_cuda.so; such a file counts as an NCCL library.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("ingerod")

# kind → file name prefixes; libtorch_cuda is checked for NCCL symbols before it is used.
LIBRARY_PREFIXES = {
    "nccl": ("libnccl.so",),
    "cudart": ("libcudart.so",),
    "cuda": ("libcuda.so",),
    "torch_cuda": ("libtorch_cuda.so",),
}

RANK_VARIABLES = ("SLURM_PROCID", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
LOCAL_RANK_VARIABLES = ("SLURM_LOCALID", "LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                        "MPI_LOCALRANKID")
WORLD_VARIABLES = ("SLURM_NTASKS", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
_JOB_IN_CGROUP = re.compile(r"/job_(\d+)(?:/|$)")


@dataclass(frozen=True)
class LibraryFile:
    """One library file on the host, as a uprobe sees it: by inode, whatever the path."""

    kind: str
    path: str = field(compare=False)
    device: int
    inode: int


@dataclass
class TracedProcess:
    pid: int
    comm: str
    job: str | None = None
    step: str | None = None
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    libraries: set[LibraryFile] = field(default_factory=set)
    environ: dict[str, str] = field(default_factory=dict, repr=False)
    started: int | None = None   # clock ticks after boot: with the pid, which process it is

    def matches(self, job: str | None, match_env: dict[str, str],
                pids: list[int] | None = None) -> bool:
        """Whether this process is one ingerod was asked to trace."""
        if job is not None and self.job != job:
            return False
        if pids and self.pid not in pids:
            return False
        return all(self.environ.get(k) == v for k, v in match_env.items())

    def tags(self) -> dict:
        """What every event of this process carries."""
        return {"pid": self.pid, "job": self.job, "step": self.step, "rank": self.rank,
                "local_rank": self.local_rank, "world_size": self.world_size}


def library_file(path: str) -> LibraryFile | None:
    """A library named in the configuration, attached before any process maps it."""
    kind = library_kind(path)
    try:
        st = os.stat(path)
    except OSError:
        return None
    return LibraryFile(kind, path, st.st_dev, st.st_ino) if kind else None


def library_kind(path: str) -> str | None:
    name = os.path.basename(path)
    for kind, prefixes in LIBRARY_PREFIXES.items():
        if name.startswith(prefixes):
            return kind
    return None


def mapped_libraries(proc: Path, pid: int) -> set[LibraryFile]:
    """The CUDA and NCCL libraries a process maps, resolved through its root."""
    try:
        lines = (proc / str(pid) / "maps").read_text().splitlines()
    except OSError:
        return set()
    found = set()
    for line in lines:
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].removesuffix(" (deleted)")
        kind = library_kind(path)
        if kind is None:
            continue
        library = resolve(proc, pid, kind, path)
        if library is not None:
            found.add(library)
    return found


def resolve(proc: Path, pid: int, kind: str, path: str) -> LibraryFile | None:
    """The file as the host sees it; the plain path when it is the same file (it outlives the
    process), else through the process's root (a container's file system)."""
    through_root = proc / str(pid) / "root" / path.lstrip("/")
    try:
        st = through_root.stat()
    except OSError:
        return None
    try:
        plain = os.stat(path)
        if (plain.st_dev, plain.st_ino) == (st.st_dev, st.st_ino):
            return LibraryFile(kind, path, st.st_dev, st.st_ino)
    except OSError:
        pass
    return LibraryFile(kind, str(through_root), st.st_dev, st.st_ino)


def read_environ(proc: Path, pid: int) -> dict[str, str]:
    try:
        raw = (proc / str(pid) / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def job_from_cgroup(proc: Path, pid: int) -> str | None:
    try:
        text = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return None
    match = _JOB_IN_CGROUP.search(text)
    return match.group(1) if match else None


def _first_int(env: dict[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = env.get(name, "")
        if value.lstrip("-").isdigit():
            return int(value)
    return None


def start_time(proc: Path, pid: int) -> int | None:
    """When the process started (a reused pid starts later); None when it cannot be read."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        return int(stat.rsplit(")", 1)[1].split()[19])    # field 22, starttime
    except (OSError, ValueError, IndexError):
        return None


def identify(proc: Path, pid: int) -> TracedProcess:
    """Job, step, rank, local rank and world size, as the launcher told the process."""
    started = start_time(proc, pid)
    env = read_environ(proc, pid)
    try:
        comm = (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        comm = "?"
    return TracedProcess(
        pid=pid, comm=comm, job=env.get("SLURM_JOB_ID") or job_from_cgroup(proc, pid),
        step=env.get("SLURM_STEP_ID"), rank=_first_int(env, RANK_VARIABLES),
        local_rank=_first_int(env, LOCAL_RANK_VARIABLES),
        world_size=_first_int(env, WORLD_VARIABLES), environ=env, started=started)


def scan(proc: Path = Path("/proc"), own_pid: int | None = None,
         known: dict[int, TracedProcess] | None = None) -> dict[int, TracedProcess]:
    """Every process that maps CUDA or NCCL. A process in ``known`` (the same pid and start
    time) that was read whole, environment and job, keeps that identity: a process's launch
    environment does not change, and reading it again can only fail (its memory is busy, or
    it is exiting), which would turn a rank of the job into a stranger mid-run."""
    own_pid = os.getpid() if own_pid is None else own_pid
    found = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own_pid:
            continue
        pid = int(entry.name)
        libraries = mapped_libraries(proc, pid)
        if not libraries:
            continue
        before = (known or {}).get(pid)
        if (before is not None and before.environ and before.job is not None
                and before.started is not None and before.started == start_time(proc, pid)):
            process = dataclasses.replace(before, libraries=libraries)
        else:
            process = identify(proc, pid)
            process.libraries = libraries
        found[pid] = process
    return found
