"""Which processes to trace, which libraries they map, and who they are in the job.

Everything is read from a /proc tree passed in (``proc``), so tests can point it elsewhere.
A process is a candidate when its memory map holds a CUDA or NCCL library (any path: a virtual
environment under /home is as good as /usr/lib). Paths are resolved through
``/proc/<pid>/root`` so that libraries inside containers are found on the host. NCCL may be
linked statically into libtorch_cuda.so; such a file counts as an NCCL library.

Who a process is comes from its launcher's variables: the launcher that spawned it (torchrun's
RANK, Open MPI's OMPI_COMM_WORLD_*, PMIx, PMI) before Slurm's task id, which under torchrun or
mpirun is the per-node launcher's and not the rank's. NCCL has the last word: the rank and size
a process passed to ncclCommInitRank for the communicator spanning the job (``said``).

A rank is a process tree. Each candidate gets a role (``roles``): a *helper* was started by a
rank and carries its identity (PyTorch's data-loader and compile workers, which map libcudart
and inherit the rank's environment): its CPU, I/O and exits are that rank's own work; a
*launcher* started processes of another identity (torchrun's agent, which imports torch): it is
no rank at all; every other candidate is a *rank*.
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

# Each launcher's (rank, local rank, world size) variables, the one that spawns the worker
# first: where several are set, the first whose rank is set speaks for all three.
LAUNCHER_VARIABLES = {
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE"),
    "pmix": ("PMIX_RANK", None, None),
    "pmi": ("PMI_RANK", "MPI_LOCALRANKID", "PMI_SIZE"),         # MPICH, Intel MPI
    "slurm": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS"),
}
UNNAMED_RUN = "none"             # torchrun's run id when --rdzv-id is not given
ANCESTRY_DEPTH = 8               # how far up the process tree a helper's rank is looked for
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
    ppid: int | None = None
    told_by: str | None = None   # which launcher's variables gave rank and world size
    requeue: int | None = None   # SLURM_RESTART_COUNT: the job's how-manieth requeue
    restart: int | None = None   # TORCHELASTIC_RESTART_COUNT: torchrun's elastic restarts
    said: tuple[int, int] | None = None   # (rank, world size) NCCL was given for the job's
    role: str = "rank"           # rank, helper or launcher (see ``roles``)
    owner: int | None = None     # a helper's rank process

    def matches(self, job: str | None, match_env: dict[str, str],
                pids: list[int] | None = None) -> bool:
        """Whether this process is one ingerod was asked to trace."""
        if job is not None and self.job != job:
            return False
        if pids and self.pid not in pids:
            return False
        return all(self.environ.get(k) == v for k, v in match_env.items())

    def identity(self) -> tuple:
        """What a forked child inherits unchanged: the same for a rank and its helpers."""
        return (self.job, self.step, self.requeue, self.restart, self.rank, self.local_rank,
                self.world_size)

    def tags(self, owner: "TracedProcess | None" = None) -> dict:
        """What every event of this process carries: a helper's are its rank's, and say so; a
        launcher's name no rank."""
        who = owner if self.role == "helper" and owner is not None else self
        tags = {"pid": self.pid, "job": who.job, "step": who.step, "requeue": who.requeue,
                "restart": who.restart}
        if self.role != "launcher":
            rank, world = who.said or (who.rank, who.world_size)
            tags.update(rank=rank, local_rank=who.local_rank, world_size=world)
        if self.role != "rank":
            tags["role"] = self.role
        return tags

    def learn(self, comm_rank: int, nranks: int) -> bool:
        """NCCL's word on who the process is, from a communicator it initialised: taken for
        the one spanning the job, the largest so far, as large as the launcher's world size
        where a launcher that spawns ranks says one (a smaller one is a group within the job;
        Slurm's task count may be of per-node launchers, so NCCL's larger size wins over it).
        True when it changed who the process is."""
        if nranks < 1 or not 0 <= comm_rank < nranks:
            return False
        if self.world_size is not None and (nranks < self.world_size or (
                nranks > self.world_size and self.told_by != "slurm")):
            return False
        if self.said is not None and nranks <= self.said[1]:
            return False
        changed = (comm_rank, nranks) != (self.rank, self.world_size)
        self.said = (comm_rank, nranks)
        self.role = "rank"
        return changed


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


def _int(env: dict[str, str], name: str | None) -> int | None:
    value = env.get(name, "") if name else ""
    return int(value) if value.lstrip("-").isdigit() else None


def launcher_identity(env: dict[str, str]) -> tuple[str | None, int | None, int | None,
                                                    int | None]:
    """(launcher, rank, local rank, world size) from the first launcher whose rank variable
    is set."""
    for launcher, (rank, local, world) in LAUNCHER_VARIABLES.items():
        if _int(env, rank) is not None:
            return launcher, _int(env, rank), _int(env, local), _int(env, world)
    return None, None, None, None


def job_of(env: dict[str, str], proc: Path, pid: int) -> str | None:
    """The Slurm job (its id, else the job cgroup), else the launcher's own run id: torchrun's
    --rdzv-id on bare metal, when one was given."""
    run = env.get("TORCHELASTIC_RUN_ID")
    return (env.get("SLURM_JOB_ID") or job_from_cgroup(proc, pid)
            or (run if run and run != UNNAMED_RUN else None))


def read_stat(proc: Path, pid: int) -> tuple[int | None, int | None]:
    """(parent pid, start time) of a process: a reused pid starts later; None when unread."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])      # fields 4 and 22: ppid, starttime
    except (OSError, ValueError, IndexError):
        return None, None


def start_time(proc: Path, pid: int) -> int | None:
    return read_stat(proc, pid)[1]


def identify(proc: Path, pid: int) -> TracedProcess:
    """Job, step, rank, local rank and world size, as the launcher told the process."""
    ppid, started = read_stat(proc, pid)
    env = read_environ(proc, pid)
    try:
        comm = (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        comm = "?"
    told_by, rank, local_rank, world_size = launcher_identity(env)
    return TracedProcess(pid=pid, comm=comm, job=job_of(env, proc, pid),
                         step=env.get("SLURM_STEP_ID"), rank=rank, local_rank=local_rank,
                         world_size=world_size, environ=env, started=started, ppid=ppid,
                         told_by=told_by, requeue=_int(env, "SLURM_RESTART_COUNT"),
                         restart=_int(env, "TORCHELASTIC_RESTART_COUNT"))


def scan(proc: Path = Path("/proc"), own_pid: int | None = None,
         known: dict[int, TracedProcess] | None = None) -> dict[int, TracedProcess]:
    """Every process that maps CUDA or NCCL. A process in ``known`` (the same pid and start
    time) that was read whole, environment and job, keeps that identity while its
    environment reads the same or cannot be read (its memory is busy, or it is exiting: a
    failed read would turn a rank of the job into a stranger mid-run). One reaped between
    the reads (its maps read, its stat gone) is not found: read again, it would be a stranger
    with no start time, and the agent would drop the rank's last events as a stranger's and
    never say that it was gone (beside a busy loop, a job's last rank to be scanned as the
    ranks exit together lost its last second of collectives so, now and then). One that reads
    otherwise has exec'd since: a launcher's child caught between fork and exec maps the
    launcher's libraries and carries its environment (torchrun's agent imports torch), and
    only after exec is it the rank its launcher made it."""
    own_pid = os.getpid() if own_pid is None else own_pid
    found = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own_pid:
            continue
        pid = int(entry.name)
        libraries = mapped_libraries(proc, pid)
        if not libraries:
            continue
        started = start_time(proc, pid)
        if started is None:
            continue        # gone since its maps were read (reaped mid-scan): gone, not a stranger
        before = (known or {}).get(pid)
        same = before is not None and before.started == started
        whole = same and before.environ and before.job is not None
        exec_d = whole and read_environ(proc, pid) not in ({}, before.environ)
        if whole and not exec_d:
            process = dataclasses.replace(before, libraries=libraries)
        else:
            process = identify(proc, pid)
            if process.started is None:
                continue    # gone while it was read
            process.libraries = libraries
            if same and not exec_d:
                process.said = before.said      # the same program, read whole only now
        found[pid] = process
    roles(found, proc)
    return found


def nearest_candidate(proc: Path, ppid: int | None,
                      processes: dict[int, TracedProcess]) -> int | None:
    """The closest ancestor that is itself a candidate, through at most ANCESTRY_DEPTH others
    (a rank's worker pool may sit between it and its workers)."""
    for _ in range(ANCESTRY_DEPTH):
        if ppid is None or ppid <= 1:
            return None
        if ppid in processes:
            return ppid
        ppid = read_stat(proc, ppid)[0]
    return None


def roles(processes: dict[int, TracedProcess], proc: Path) -> None:
    """Each candidate's role and a helper's owner. A helper's nearest candidate ancestor has
    its identity and NCCL never named the helper (a rank it is not); its owner is the first
    process up its line that is no helper. A launcher is the parent of candidates of another
    identity, unless NCCL named it a rank."""
    parents = {pid: nearest_candidate(proc, p.ppid, processes) for pid, p in processes.items()}
    for p in processes.values():
        p.role, p.owner = "rank", None
    for pid, parent in parents.items():
        child = processes[pid]
        if parent is not None and child.said is None \
                and processes[parent].identity() == child.identity():
            child.role = "helper"
    for pid, parent in parents.items():
        if parent is not None and processes[parent].role == "rank" \
                and processes[parent].said is None and processes[pid].role == "rank" \
                and processes[parent].identity() != processes[pid].identity():
            processes[parent].role = "launcher"
    for p in processes.values():
        owner = p.pid
        while processes[owner].role == "helper" and parents[owner] is not None:
            owner = parents[owner]
        if p.role == "helper":
            p.owner = owner
