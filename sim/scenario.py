"""Scenarios: the shape of a simulated job and the stragglers injected into it, from YAML.

    name: host-delay
    description: rank 5 sleeps 40 ms before each all-reduce from step 4
    job:        {nodes: 2, ranks_per_node: 4, steps: 12, step_ms: 20, allreduce_bytes: 4194304}
    hardware:   {net_gbps: 10, pcie_gbps: 25}
    stragglers:
      - {rank: 5, kind: host_delay, delay_ms: 40, from_step: 4}

Every field is declared once in the tables below (name, default, check, meaning); parse()
rejects unknown keys and bad values with a message naming the field.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from sim.errors import ScenarioError

DATATYPES = ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
             "float64", "bfloat16")
EXTRA_COLLECTIVES = ("allgather", "reducescatter", "broadcast", "reduce", "sendrecv", "alltoall",
                     "alltoallv")
# How the world communicator is made: ncclCommInitRankConfig (PyTorch's default), or
# ncclCommInitRankScalable with a unique id per node (PyTorch over TORCH_NCCL_RANKS_PER_ROOT
# ranks), or non-blocking (TORCH_NCCL_USE_COMM_NONBLOCKING=1: ncclInProgress, then polled).
NCCL_INITS = ("config", "scalable", "nonblocking")
# Ranks of one job at most (SIM_MAX_RANKS in sim/src/rdv.h): 64 nodes of 8 GPUs.
MAX_WORLD = 512
# The CUDA runtimes the sim builds (libcudart.so.12 and .so.13; PyTorch 2.11's cu130 wheels
# ship 13), one rank binary linked to each.
CUDA_VERSIONS = (13, 12)
# The training loop: the sim's own (one stream, a loss read on the rank's own kernels) or
# PyTorch DDP's (an NCCL stream of its own, buckets, one .item() sync every sync_every steps).
LOOPS = ("sim", "pytorch")
# Where a host_delay or hiccup sleeps: before the gradient all-reduce, before the rank's
# subgroups' all-reduces (after the world's), or before its uneven all-to-all (alltoallv).
DELAY_PLACES = ("allreduce", "subgroup", "alltoallv")
RENDEZVOUS = ("shm", "tcp")
# How the ranks are started (sim.cluster): srun, one task per rank; torchrun under srun, one
# launcher task per node spawning its ranks; torchrun in the batch script (every process sees
# the batch step's SLURM_PROCID=0); mpirun, an orted per node spawning Open MPI ranks; bare, a
# torchrun per node and no Slurm at all (the job id is torchrun's run id).
LAUNCHERS = ("srun", "torchrun", "torchrun-batch", "mpirun", "bare")


@dataclass(frozen=True)
class Job:
    nodes: int = 1
    ranks_per_node: int = 4
    steps: int = 20
    step_ms: float = 20.0            # GPU compute per step (forward, backward, optimizer)
    kernels: int = 4                 # kernel launches per forward pass
    host_work_ms: float = 0.5        # CPU time of host-side work per step
    allreduce_bytes: int = 4 << 20
    dtype: str = "float32"
    extra_collectives: tuple[str, ...] = ()
    memcpy_every: int = 5
    loss_every: int = 1              # a self-work sync after the forward pass (loss.item())
    sync_every: int = 1              # the host waits for its GPU only every N steps
    jitter_ms: float = 0.0           # random host time per step, uniform in [0, jitter_ms]
    job_id: str = "4242"
    launcher: str = "srun"
    parallel: tuple[int, int] = (1, 1)   # (tp, pp): tensor-parallel size, pipeline stages
    stage_work: tuple[float, ...] = ()  # GPU compute per step of each stage, ms (step_ms)
    steps_in_job: int = 1            # srun steps of the job id, one after another
    restart_at: int | None = None    # every rank leaves at this step and is started again
    workers: int = 0                 # data-loader worker processes per rank, forked per epoch
    epoch_steps: int = 0             # steps per epoch (workers exit and respawn); 0: one epoch
    input_kb: int = 256              # read from the input file per batch
    worker_cpu_ms: float = 1.0       # CPU time a worker spends decoding a batch
    rendezvous: str = "shm"
    netns: bool = False              # each node in its own network namespace (needs tcp, root)
    timeout_s: float = 60.0          # how long a rank waits for a peer before erroring out
    nccl_init: str = "config"        # how the world communicator is made (NCCL_INITS)
    cuda: int = 13                   # the CUDA runtime the ranks link: libcudart.so.13 or .so.12
    # groups split from the world (PyTorch's new_group), non-members passing NCCL_SPLIT_NOCOLOR;
    # each all-reduces among its members every step, after the world's all-reduce
    subgroups: tuple[tuple[int, ...], ...] = ()
    loop: str = "sim"                # the training loop (LOOPS)
    buckets: int = 1                 # loop pytorch: gradient all-reduces a step
    gemm_share: float = 0.15         # loop pytorch: share of launches through cuLaunchKernelEx
    graphs: int | None = None        # from this step, each step is one CUDA graph's replay

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


@dataclass(frozen=True)
class Hardware:
    pcie_gbps: float = 25.0
    hbm_gbps: float = 1500.0
    net_gbps: float = 10.0
    net_latency_us: float = 5.0
    kernel_us: float = 50.0


@dataclass(frozen=True)
class Straggler:
    rank: int
    kind: str
    delay_ms: float = 0.0            # host_delay, hiccup
    from_step: int = 0               # host_delay, hiccup
    until_step: int | None = None    # host_delay, hiccup
    every: int = 1                   # host_delay, hiccup
    factor: float = 1.0              # slow_gpu
    at_step: int = -1                # die, hang
    read_kb: int | None = None       # slow_input: read per batch instead of job.input_kb
    cpu: int | None = None           # cpu_contention; default: one the rank may use
    hogs: int = 1                    # cpu_contention
    nice: int = 0                    # cpu_contention: the hogs' nice value
    before: str = "allreduce"        # host_delay, hiccup: where it sleeps (DELAY_PLACES)


@dataclass(frozen=True)
class Scenario:
    name: str
    job: Job = field(default_factory=Job)
    hardware: Hardware = field(default_factory=Hardware)
    stragglers: tuple[Straggler, ...] = ()
    description: str = ""

    def stragglers_of(self, rank: int, *kinds: str) -> list[Straggler]:
        return [s for s in self.stragglers if s.rank == rank and (not kinds or s.kind in kinds)]


Check = Callable[[Any], Any]


def _integer(minimum: int | None = None, maximum: int | None = None) -> Check:
    def check(value):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise ValueError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be <= {maximum}, got {value}")
        return value
    return check


def _number(minimum: float = 0.0, exclusive: bool = False) -> Check:
    def check(value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"must be a number, got {value!r}")
        if value < minimum or (exclusive and value == minimum):
            raise ValueError(f"must be {'>' if exclusive else '>='} {minimum}, got {value}")
        return float(value)
    return check


def _choice(options: tuple) -> Check:
    def check(value):
        if isinstance(value, bool) or value not in options:   # True == 1: no choice of ints
            raise ValueError(f"must be one of {', '.join(map(str, options))}, got {value!r}")
        return value
    return check


def _boolean(value):
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def _text(value):
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise ValueError(f"must be a string, got {value!r}")
    return str(value)


def _collectives(value):
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        raise ValueError(f"must be a list of {', '.join(EXTRA_COLLECTIVES)}")
    return tuple(_choice(EXTRA_COLLECTIVES)(v) for v in value)


def _parallel(value):
    if not isinstance(value, Mapping) or set(value) - {"tp", "pp"}:
        raise ValueError(f"must be a mapping of tp and pp, got {value!r}")
    return tuple(_integer(1, 64)(value.get(name, 1)) for name in ("tp", "pp"))


def _stage_work(value):
    if not isinstance(value, list) or not value:
        raise ValueError("must be a list of milliseconds, one per pipeline stage")
    return tuple(_number()(v) for v in value)


def _graphs(value):
    if not isinstance(value, Mapping) or set(value) != {"from_step"}:
        raise ValueError(f"must be a mapping with from_step, got {value!r}")
    return _integer(0)(value["from_step"])


def _share(value):
    value = _number()(value)
    if value > 1:
        raise ValueError(f"must be a share from 0 to 1, got {value:g}")
    return value


def _subgroups(value):
    if not isinstance(value, list) or not value or len(value) > 8 \
            or not all(isinstance(g, list) and g for g in value):
        raise ValueError("must be a list of 1 to 8 lists of world ranks")
    groups = tuple(tuple(_integer(0)(r) for r in g) for g in value)
    if any(len(set(g)) != len(g) for g in groups):
        raise ValueError("a rank is listed twice in one group")
    return groups


def _optional(check: Check) -> Check:
    return lambda value: None if value is None else check(value)


JOB_FIELDS: dict[str, Check] = {
    "nodes": _integer(1, 64), "ranks_per_node": _integer(1, 64), "steps": _integer(1),
    "step_ms": _number(), "kernels": _integer(1), "host_work_ms": _number(),
    "allreduce_bytes": _integer(0), "dtype": _choice(DATATYPES),
    "extra_collectives": _collectives, "memcpy_every": _integer(0),
    "loss_every": _integer(0), "sync_every": _integer(1), "jitter_ms": _number(), "job_id": _text,
    "launcher": _choice(LAUNCHERS), "parallel": _parallel, "stage_work": _stage_work,
    "steps_in_job": _integer(1, 16),
    "restart_at": _optional(_integer(1)), "workers": _integer(0, 16), "epoch_steps": _integer(0),
    "input_kb": _integer(1, 65536), "worker_cpu_ms": _number(),
    "rendezvous": _choice(RENDEZVOUS), "netns": _boolean, "timeout_s": _number(0, True),
    "nccl_init": _choice(NCCL_INITS), "subgroups": _subgroups, "loop": _choice(LOOPS),
    "buckets": _integer(1, 64), "gemm_share": _share, "graphs": _graphs,
    "cuda": _choice(CUDA_VERSIONS),
}

HARDWARE_FIELDS: dict[str, Check] = {
    "pcie_gbps": _number(0, True), "hbm_gbps": _number(0, True), "net_gbps": _number(0, True),
    "net_latency_us": _number(), "kernel_us": _number(),
}

# Per straggler kind: which fields it takes and which of those it requires.
STRAGGLER_KINDS: dict[str, tuple[dict[str, Check], set[str]]] = {
    "host_delay": ({"delay_ms": _number(0, True), "from_step": _integer(0),
                    "until_step": _optional(_integer(0)), "every": _integer(1),
                    "before": _choice(DELAY_PLACES)}, {"delay_ms"}),
    "hiccup": ({"delay_ms": _number(0, True), "every": _integer(2), "from_step": _integer(0),
                "until_step": _optional(_integer(0)), "before": _choice(DELAY_PLACES)},
               {"delay_ms", "every"}),
    "slow_gpu": ({"factor": _number(0, True)}, {"factor"}),
    "slow_input": ({"delay_ms": _number(0, True), "read_kb": _optional(_integer(1, 65536))},
                   {"delay_ms"}),
    "cpu_contention": ({"cpu": _optional(_integer(0)), "hogs": _integer(1, 16),
                        "nice": _integer(-20, 19)}, set()),
    "die": ({"at_step": _integer(0)}, {"at_step"}),
    "hang": ({"at_step": _integer(0)}, {"at_step"}),
}


def _section(data: Any, where: str, checks: Mapping[str, Check],
             required: set[str] = frozenset()) -> dict[str, Any]:
    """Validate one mapping against its field table; errors name the field."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where}: must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(checks))
    if unknown:
        raise ScenarioError(f"{where}.{unknown[0]}: unknown key; expected one of "
                            f"{', '.join(sorted(checks))}")
    missing = sorted(required - set(data))
    if missing:
        raise ScenarioError(f"{where}.{missing[0]}: required")
    values = {}
    for name, value in data.items():
        try:
            values[name] = checks[name](value)
        except ValueError as exc:
            raise ScenarioError(f"{where}.{name}: {exc}") from None
    return values


def _straggler(data: Any, where: str, job: Job) -> Straggler:
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{where}: must be a mapping")
    head = {k: data[k] for k in ("rank", "kind") if k in data}
    head = _section(head, where, {"rank": _integer(0, job.world_size - 1),
                                  "kind": _choice(tuple(STRAGGLER_KINDS))}, {"rank", "kind"})
    checks, required = STRAGGLER_KINDS[head["kind"]]
    rest = {k: v for k, v in data.items() if k not in ("rank", "kind")}
    values = _section(rest, f"{where} ({head['kind']})", checks, required)
    if head["kind"] == "hiccup" and "from_step" not in values:
        values["from_step"] = values["every"] - 1
    if head["kind"] in ("die", "hang") and values["at_step"] >= job.steps:
        raise ScenarioError(f"{where}.at_step: must be below job.steps ({job.steps})")
    if values.get("before") == "subgroup" and not any(head["rank"] in g for g in job.subgroups):
        raise ScenarioError(f"{where}.before: rank {head['rank']} is in no job.subgroups")
    if values.get("before") == "alltoallv" and "alltoallv" not in job.extra_collectives:
        raise ScenarioError(f"{where}.before: alltoallv is not in job.extra_collectives")
    if head["kind"] == "slow_input" and not job.workers:
        raise ScenarioError(f"{where}: slow_input slows the rank's data-loader workers: "
                            f"set job.workers")
    return Straggler(**head, **values)


def _check_parallel(job: Job, source: str) -> None:
    tp, pp = job.parallel
    if job.ranks_per_node % tp:
        raise ScenarioError(f"{source}: job.parallel.tp: {tp} must divide job.ranks_per_node "
                            f"({job.ranks_per_node}): tensor-parallel groups lie in a node")
    if job.world_size % (tp * pp):
        raise ScenarioError(f"{source}: job.parallel: tp × pp ({tp * pp}) must divide the "
                            f"world size ({job.world_size})")
    if job.stage_work and len(job.stage_work) != pp:
        raise ScenarioError(f"{source}: job.stage_work: one value per pipeline stage ({pp})")
    if tp * pp > 1 and job.extra_collectives:
        raise ScenarioError(f"{source}: job.extra_collectives: not with job.parallel")
    if tp * pp > 1 and job.subgroups:
        raise ScenarioError(f"{source}: job.subgroups: not with job.parallel")
    for group in job.subgroups:
        if max(group) >= job.world_size:
            raise ScenarioError(f"{source}: job.subgroups: rank {max(group)} is not below the "
                                f"world size ({job.world_size})")


def _check_job(job: Job, source: str) -> Job:
    _check_parallel(job, source)
    if job.world_size > MAX_WORLD:
        raise ScenarioError(f"{source}: job: {job.nodes} nodes of {job.ranks_per_node} ranks "
                            f"make {job.world_size}; the sim's NCCL takes {MAX_WORLD} at most")
    if job.loop == "pytorch" and (job.parallel != (1, 1) or job.subgroups
                                  or job.extra_collectives or job.graphs is not None):
        raise ScenarioError(f"{source}: job.loop: pytorch takes no job.parallel, "
                            f"job.subgroups, job.extra_collectives or job.graphs")
    if job.graphs is not None and job.parallel != (1, 1):
        raise ScenarioError(f"{source}: job.graphs: not with job.parallel")
    if job.graphs is not None and job.graphs >= job.steps:
        raise ScenarioError(f"{source}: job.graphs.from_step: must be below job.steps "
                            f"({job.steps})")
    if job.restart_at is not None and job.restart_at >= job.steps:
        raise ScenarioError(f"{source}: job.restart_at: must be below job.steps ({job.steps})")
    if job.netns and job.rendezvous == "shm":
        raise ScenarioError(f"{source}: job.netns: ranks in separate network namespaces "
                            f"need job.rendezvous: tcp")
    return job


def _check_stragglers(stragglers: tuple[Straggler, ...], source: str) -> None:
    fatal = [s.rank for s in stragglers if s.kind in ("die", "hang")]
    if len(fatal) != len(set(fatal)):
        raise ScenarioError(f"{source}: stragglers: a rank can die or hang only once")
    for s in stragglers:
        if s.kind == "cpu_contention" and s.cpu is not None \
                and s.cpu not in os.sched_getaffinity(0):
            raise ScenarioError(f"{source}: stragglers: cpu {s.cpu} is not one this machine "
                                f"lets us use ({sorted(os.sched_getaffinity(0))})")


def parse(data: Any, source: str = "scenario") -> Scenario:
    """A Scenario from already-loaded YAML (a mapping); raises ScenarioError."""
    top = _section(data, source, {"name": _text, "description": _text, "job": lambda v: v,
                                  "hardware": lambda v: v, "stragglers": lambda v: v}, {"name"})
    job = top.get("job") or {}
    if isinstance(job, Mapping) and job.get("netns") is True and "rendezvous" not in job:
        job = {**job, "rendezvous": "tcp"}
    job = _check_job(Job(**_section(job, f"{source}: job", JOB_FIELDS)), source)
    hardware = Hardware(**_section(top.get("hardware"), f"{source}: hardware", HARDWARE_FIELDS))
    raw = top.get("stragglers") or []
    if not isinstance(raw, list):
        raise ScenarioError(f"{source}: stragglers: must be a list")
    stragglers = tuple(_straggler(s, f"{source}: stragglers[{i}]", job) for i, s in enumerate(raw))
    _check_stragglers(stragglers, source)
    return Scenario(name=top["name"], description=top.get("description", ""), job=job,
                    hardware=hardware, stragglers=stragglers)


def load(path: str | os.PathLike) -> Scenario:
    """Read and validate a scenario YAML file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML: {exc}") from None
    return parse(data, str(path))


def scenarios_dir() -> Path:
    """The example scenarios shipped with the sim."""
    return Path(__file__).resolve().parent / "scenarios"


def with_job(scenario: Scenario, **changes) -> Scenario:
    """A copy with some job fields changed, validated like a file would be."""
    known = {f.name for f in fields(Job)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ScenarioError(f"job.{unknown[0]}: unknown key")
    merged = {f.name: getattr(scenario.job, f.name) for f in fields(Job)} | changes
    merged["extra_collectives"] = list(merged["extra_collectives"])
    merged["subgroups"] = [list(g) for g in merged["subgroups"]] or None
    if merged["subgroups"] is None:
        del merged["subgroups"]
    if merged["graphs"] is None:
        del merged["graphs"]
    else:
        merged["graphs"] = {"from_step": merged["graphs"]}
    merged["parallel"] = dict(zip(("tp", "pp"), merged["parallel"]))
    merged["stage_work"] = list(merged["stage_work"]) or None
    if merged["stage_work"] is None:
        del merged["stage_work"]
    checked = _section(merged, "job", JOB_FIELDS)
    return replace(scenario, job=_check_job(Job(**checked), scenario.name))


__all__ = ["Scenario", "Job", "Hardware", "Straggler", "parse", "load", "with_job",
           "scenarios_dir", "DATATYPES", "DELAY_PLACES", "EXTRA_COLLECTIVES", "LAUNCHERS",
           "LOOPS", "NCCL_INITS", "STRAGGLER_KINDS", "CUDA_VERSIONS"]
