"""Which processes to trace, which libraries they map, and who they are in the job.

Everything is read from a /proc tree passed in (``proc``), so tests can point it elsewhere.
A process is a candidate when its memory map holds a CUDA or NCCL library (any path: a virtual
environment under /home is as good as /usr/lib). Paths are resolved through
``/proc/<pid>/root`` so that libraries inside containers are found on the host. NCCL may be
linked statically into libtorch_cuda.so; such a file counts as an NCCL library.

Who a process is comes from its launcher's variables: the launcher that spawned it (torchrun's
RANK, Open MPI's OMPI_COMM_WORLD_*, PMIx, PMI) before Slurm's task id, which under torchrun or
mpirun is the per-node launcher's and not the rank's. NCCL has the last word: the rank and size
a process passed to ncclCommInitRank for the communicator spanning the job (``said``). Which job
it belongs to comes from the kernel first: the Slurm job cgroup it runs in, where it has one.

Everything a process shows is its owner's to choose: its environment, names and cgroup paths
below a delegated subtree. So what is read is read in bounded amounts, only the variables used
are kept, and every value is parsed strictly into a bounded range (ASCII digits: '²' is a digit
to str.isdigit but not to int); a value that does not parse is as good as unset.

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
# The variables read from a process's environment (``match_env`` may name others); the rest
# is never kept. How much of it is read: real ones are a few KiB, a user may make theirs MBs.
IDENTITY_VARIABLES = frozenset(
    [name for names in LAUNCHER_VARIABLES.values() for name in names if name]
    + ["SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
       "TORCHELASTIC_RESTART_COUNT"])
ENVIRON_BYTES = 256 * 1024
MAX_VALUE = 256                  # characters of a kept variable's value
MAX_WORLD = 1 << 20              # ranks in one job, and so in any of its communicators
MAX_COUNT = 1 << 31              # restarts, requeues
_DECIMAL = re.compile(r"[0-9]{1,10}")
_SLURM_JOB = re.compile(r"[0-9]{1,10}")
_RUN_ID = re.compile(r"[A-Za-z0-9._:+-]{1,64}")
_STEP = re.compile(r"[A-Za-z0-9._+-]{1,32}")
# Slurm's job cgroup, anchored at the hierarchy's root: under cgroup v2, slurmstepd's scope
# below slices only (a user's delegated subtree lies below their user@ service, and a
# directory made there cannot read as this); under v1, a controller's /slurm[_node]/uid_N/.
_SLURM_CGROUP = re.compile(r"^(?:0::(?:/[^/\n]+\.slice)*/slurmstepd\.scope"
                           r"|[0-9]+:[^:\n]*:/slurm(?:_[^/\n]+)?/uid_[0-9]+)"
                           r"/job_([0-9]{1,10})(?:/|$)", re.MULTILINE)
CGROUP_BYTES = 16 * 1024


@dataclass(frozen=True)
class LibraryFile:
    """One library file on the host, as a uprobe sees it: by inode, whatever the path."""

    kind: str
    path: str = field(compare=False)
    device: int
    inode: int
    owner: int = field(compare=False, default=0)    # the file's user id


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
    cuda_text: tuple[tuple[int, int], ...] = ()   # its CUDA runtime's and driver's code
    environ: dict[str, str] | None = field(default=None, repr=False)   # None: not read
    uid: int | None = None       # its real user id, as the kernel says
    started: int | None = None   # clock ticks after boot: with the pid, which process it is
    ppid: int | None = None
    told_by: str | None = None   # which launcher's variables gave rank and world size
    requeue: int | None = None   # SLURM_RESTART_COUNT: the job's how-manieth requeue
    restart: int | None = None   # TORCHELASTIC_RESTART_COUNT: torchrun's elastic restarts
    said: tuple[int, int] | None = None   # (rank, world size) NCCL was given for the job's
    unparsed: tuple[str, ...] = ()    # identity variables set to what does not parse
    role: str = "rank"           # rank, helper or launcher (see ``roles``)
    owner: int | None = None     # a helper's rank process

    def matches(self, job: str | None, match_env: dict[str, str],
                pids: list[int] | None = None) -> bool:
        """Whether this process is one ingerod was asked to trace."""
        if job is not None and self.job != job:
            return False
        if pids and self.pid not in pids:
            return False
        return all((self.environ or {}).get(k) == v for k, v in match_env.items())

    def identity(self) -> tuple:
        """What a forked child inherits unchanged: the same for a rank and its helpers."""
        return (self.job, self.step, self.requeue, self.restart, self.rank, self.local_rank,
                self.world_size)

    def tags(self, owner: "TracedProcess | None" = None) -> dict:
        """What every event of this process carries: a helper's are its rank's, and say so; a
        launcher's name no rank."""
        who = owner if self.role == "helper" and owner is not None else self
        tags = {"pid": self.pid, "uid": self.uid, "job": who.job, "step": who.step,
                "requeue": who.requeue, "restart": who.restart}
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
        if not 0 < nranks <= MAX_WORLD or not 0 <= comm_rank < nranks:
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
    return LibraryFile(kind, path, st.st_dev, st.st_ino, st.st_uid) if kind else None


def library_kind(path: str) -> str | None:
    name = os.path.basename(path)
    for kind, prefixes in LIBRARY_PREFIXES.items():
        if name.startswith(prefixes):
            return kind
    return None


# The files whose code calls a launch entry from inside a launch (the runtime entering the
# driver): cuda.bpf.c counts such an entry with the launch that made it.
CUDA_TEXT_KINDS = ("cudart", "cuda")
CUDA_TEXTS = 8          # the ranges cuda.bpf.c's cuda_text holds (its CUDA_TEXTS)


def mapped_libraries(proc: Path, pid: int) -> set[LibraryFile]:
    """The CUDA and NCCL libraries a process maps, resolved through its root."""
    return mappings(proc, pid)[0]


def mappings(proc: Path, pid: int) -> tuple[set[LibraryFile], tuple[tuple[int, int], ...]]:
    """The CUDA and NCCL libraries a process maps, and the executable address ranges of its
    CUDA runtime's and driver's files (the lowest ``CUDA_TEXTS``)."""
    try:
        lines = (proc / str(pid) / "maps").read_text().splitlines()
    except OSError:
        return set(), ()
    found, text = set(), []
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
        if kind in CUDA_TEXT_KINDS and "x" in parts[1]:
            start, _, end = parts[0].partition("-")
            try:
                text.append((int(start, 16), int(end, 16)))
            except ValueError:
                continue
    if len(text) > CUDA_TEXTS:
        log.debug("pid %d maps %d CUDA code ranges; the launch counter knows the lowest %d: "
                  "launches from the others' runtimes may be counted twice", pid, len(text),
                  CUDA_TEXTS)
    return found, tuple(sorted(text)[:CUDA_TEXTS])


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
            return LibraryFile(kind, path, st.st_dev, st.st_ino, st.st_uid)
    except OSError:
        pass
    return LibraryFile(kind, str(through_root), st.st_dev, st.st_ino, st.st_uid)


def read_head(path: Path, limit: int) -> bytes | None:
    """At most ``limit`` bytes of a /proc file; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def read_environ(proc: Path, pid: int, names: frozenset[str] = frozenset()) -> dict | None:
    """The identity variables (and ``names``) of a process's environment, from its first
    ENVIRON_BYTES; None when it cannot be read or reads empty (a process exiting, or one whose
    memory is busy, reads so). A value is kept to MAX_VALUE characters and one more, which no
    identity or match may have: too long to be one, it still reads as set."""
    raw = read_head(proc / str(pid) / "environ", ENVIRON_BYTES)
    if not raw:
        return None
    wanted, kept = IDENTITY_VARIABLES | names, {}
    items = raw.split(b"\0")
    if len(raw) == ENVIRON_BYTES:
        items.pop()                     # cut short: the last one may be part of a variable
    for item in items:
        name, eq, value = item.partition(b"=")
        key = name.decode(errors="replace")
        if eq and key in wanted:
            kept[key] = value[:MAX_VALUE + 1].decode(errors="replace")
    return kept


def job_from_cgroup(proc: Path, pid: int) -> str | None:
    """The Slurm job whose cgroup the process runs in: the kernel's word, which the process
    cannot change (see ``_SLURM_CGROUP``)."""
    raw = read_head(proc / str(pid) / "cgroup", CGROUP_BYTES)
    match = _SLURM_CGROUP.search(raw.decode(errors="replace")) if raw else None
    return match.group(1) if match else None


def read_uid(proc: Path, pid: int) -> int | None:
    """The process's real user id (its status's first Uid), None once it is gone."""
    raw = read_head(proc / str(pid) / "status", 4096)
    for line in (raw or b"").splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def counter(env: dict[str, str], name: str | None, high: int) -> int | None:
    """A variable as a count in [0, high): plain ASCII digits, else None."""
    value = env.get(name) if name else None
    if value is None or not _DECIMAL.fullmatch(value):
        return None
    number = int(value)
    return number if number < high else None


def launcher_identity(env: dict[str, str]) -> tuple[str | None, int | None, int | None,
                                                    int | None]:
    """(launcher, rank, local rank, world size) from the first launcher whose rank variable
    is set and reads as a rank; a world size must hold the rank."""
    for launcher, (rank, local, world) in LAUNCHER_VARIABLES.items():
        said = counter(env, rank, MAX_WORLD)
        if said is not None:
            size = counter(env, world, MAX_WORLD + 1)
            return (launcher, said, counter(env, local, MAX_WORLD),
                    size if size is not None and said < size else None)
    return None, None, None, None


def unparsed(env: dict[str, str]) -> tuple[str, ...]:
    """The identity variables set to what does not parse (each reads as unset)."""
    shapes = {"SLURM_JOB_ID": _SLURM_JOB, "TORCHELASTIC_RUN_ID": _RUN_ID, "SLURM_STEP_ID": _STEP}
    return tuple(sorted(name for name, value in env.items() if name in IDENTITY_VARIABLES
                        and not shapes.get(name, _DECIMAL).fullmatch(value)))


def job_of(env: dict[str, str], cgroup_job: str | None) -> str | None:
    """The Slurm job: its cgroup's, else (no Slurm cgroup: proctrack/linuxproc, or none
    mounted) the id in its environment; else the launcher's own run id: torchrun's --rdzv-id
    on bare metal, when one was given."""
    if cgroup_job is not None:
        return cgroup_job
    job = env.get("SLURM_JOB_ID", "")
    if _SLURM_JOB.fullmatch(job):
        return job
    run = env.get("TORCHELASTIC_RUN_ID", "")
    return run if run != UNNAMED_RUN and _RUN_ID.fullmatch(run) else None


def read_stat(proc: Path, pid: int) -> tuple[int | None, int | None]:
    """(parent pid, start time) of a process: a reused pid starts later; None when unread."""
    try:
        fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        return int(fields[1]), int(fields[19])      # fields 4 and 22: ppid, starttime
    except (OSError, ValueError, IndexError):
        return None, None


def start_time(proc: Path, pid: int) -> int | None:
    return read_stat(proc, pid)[1]


def identify(proc: Path, pid: int, names: frozenset[str] = frozenset()) -> TracedProcess:
    """Job, step, rank, local rank and world size, as the kernel and the launcher tell."""
    ppid, started = read_stat(proc, pid)
    env = read_environ(proc, pid, names)
    said = env or {}
    comm = (read_head(proc / str(pid) / "comm", 64) or b"?").decode(errors="replace").strip()
    told_by, rank, local_rank, world_size = launcher_identity(said)
    step = said.get("SLURM_STEP_ID", "")
    return TracedProcess(pid=pid, comm=comm, job=job_of(said, job_from_cgroup(proc, pid)),
                         step=step if _STEP.fullmatch(step) else None, rank=rank,
                         local_rank=local_rank, world_size=world_size, environ=env,
                         started=started, ppid=ppid, told_by=told_by,
                         requeue=counter(said, "SLURM_RESTART_COUNT", MAX_COUNT),
                         restart=counter(said, "TORCHELASTIC_RESTART_COUNT", MAX_COUNT),
                         uid=read_uid(proc, pid), unparsed=unparsed(said))


def scan(proc: Path = Path("/proc"), own_pid: int | None = None,
         known: dict[int, TracedProcess] | None = None,
         names: frozenset[str] = frozenset()) -> dict[int, TracedProcess]:
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
        libraries, text = mappings(proc, pid)
        if not libraries:
            continue
        started = start_time(proc, pid)
        if started is None:
            continue        # gone since its maps were read (reaped mid-scan): gone, not a stranger
        before = (known or {}).get(pid)
        same = before is not None and before.started == started
        whole = same and before.environ is not None and before.job is not None
        now = read_environ(proc, pid, names) if whole else None
        exec_d = now is not None and now != before.environ
        if whole and not exec_d:
            process = dataclasses.replace(before, libraries=libraries, cuda_text=text)
        else:
            process = identify(proc, pid, names)
            if process.started is None:
                continue    # gone while it was read
            process.libraries, process.cuda_text = libraries, text
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
