"""Running a scenario as a cluster of real processes.

    cluster = Cluster(scenario, workdir).start()
    for rank in cluster.ranks: rank.pid, rank.node, rank.record_path …
    result = cluster.wait(timeout=60)     # ClusterResult; hung ranks are killed and reported
    cluster.stop()                        # idempotent; also what `with Cluster(...)` does

Each rank is an ingero-sim-rank process with the environment its launcher gives
(``job.launcher``): srun starts the ranks itself, one Slurm task each; torchrun, torchrun in the
batch script, mpirun and bare metal start one launcher process per node (``sim.launcher``, as
torchrun's agent or Open MPI's orted is) that spawns the node's ranks as its children, with the
variables that launcher sets over what its own task inherited. Rank 0 writes the ncclUniqueId
file the others read. Stragglers become rank flags (host delays, hiccups, death, hang), an
environment knob (slow GPU), or a real competing process (CPU contention: ingero-hog pinned to
the rank's CPU).
With job.rendezvous tcp the ranks meet through sim.rendezvous; with job.netns each node's ranks
run in their own network namespace.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import sim
from sim.errors import LaunchError
from sim.netns import NodeNetworks
from sim.processes import (EXIT_RESTART, FAILURE_GRACE_S, INPUT_BYTES, LAUNCH_TIMEOUT_S, POLL_S,
                           STATUS_BY_EXIT, STOP_GRACE_S, ClusterResult, HogProcess,
                           LaunchedProcess, RankProcess, RankResult, RankSpec, child_setup,
                           delay_flag, launcher_lines, plain_environ, record_of, run_suffix,
                           worker_plan)
from sim.scenario import Scenario


class Cluster:
    """``hosts`` labels each simulated node with the host it stands for (INGERO_SIM_NODE, which
    the sim's records and the test agents' --match-env read): node n by default; two nodes of
    one job may share a label, or a node take another job's."""

    def __init__(self, scenario: Scenario, workdir: str | os.PathLike,
                 extra_env: dict[str, str] | None = None,
                 failure_grace_s: float = FAILURE_GRACE_S, hosts: list[int] | None = None):
        self.scenario = scenario
        self.failure_grace_s = failure_grace_s
        self.workdir = Path(workdir)
        self.extra_env = dict(extra_env or {})
        self.hosts = list(hosts) if hosts is not None else list(range(scenario.job.nodes))
        if len(self.hosts) != scenario.job.nodes:
            raise LaunchError(f"hosts: {len(self.hosts)} labels for {scenario.job.nodes} nodes")
        self.input_path = self.workdir / "input.bin"
        self.slurm_step = 0                   # the srun step running now (job.steps_in_job)
        self.generation = 0                   # its elastic restarts so far (job.restart_at)
        self.unique_ids: list[Path] = []
        self.ranks: list[RankProcess] = []
        self.finished: list[RankResult] = []  # the ranks of the steps run before
        self.launchers: list[subprocess.Popen] = []
        self.hogs: list[HogProcess] = []
        self.rendezvous_address: str | None = None
        self.coordinator: subprocess.Popen | None = None
        self.networks: NodeNetworks | None = None
        self.result: ClusterResult | None = None
        self._first_failure: float | None = None

    def __enter__(self) -> "Cluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Cluster":
        for binary in (sim.rank_binary(self.scenario.job.cuda), sim.hog_binary()):
            if not os.access(binary, os.X_OK):
                raise LaunchError(f"{binary} is missing: run `make -C sim` first")
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self._write_input()
            self._start_rendezvous()
            self._start_run(0, 0)
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def unique_id_path(self) -> Path:
        """Where the running step's (and generation's) rank 0 writes its ncclUniqueId."""
        return self.workdir / ("nccl-unique-id" + self._suffix(self.slurm_step,
                                                                 self.generation))

    _suffix = staticmethod(lambda step, generation: run_suffix(step, generation))

    def _start_run(self, step: int, generation: int) -> None:
        """Start srun step ``step`` (a launcher per node, or a task per rank), or, for srun's
        ranks, their ``generation``-th elastic restart."""
        self.slurm_step, self.generation = step, generation
        self.unique_ids.append(self.unique_id_path)
        self.ranks = []
        for node in range(self.scenario.job.nodes):
            specs = [self._rank_spec(node, local_rank, generation)
                     for local_rank in range(self.scenario.job.ranks_per_node)]
            if self.scenario.job.launcher == "srun":
                self.ranks += [self._start_rank(spec) for spec in specs]
            else:
                self.ranks += self._start_launcher(node, specs)
        self._start_hogs()

    def _start_rendezvous(self) -> None:
        job = self.scenario.job
        if job.rendezvous != "tcp":
            return
        host = "127.0.0.1"
        if job.netns:
            if os.geteuid() != 0:
                raise LaunchError("job.netns needs root to create network namespaces")
            self.networks = NodeNetworks(job.nodes)
            self.networks.create()
            host = self.networks.hub_address
        self._start_coordinator(host)

    def _start_coordinator(self, host: str) -> None:
        path = [str(sim.PACKAGE_DIR.parent), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
        with open(self.workdir / "rendezvous.log", "w") as log:
            self.coordinator = subprocess.Popen(
                [sys.executable, "-m", "sim.rendezvous", "--listen", f"{host}:0"],
                stdout=subprocess.PIPE, stderr=log, text=True, env=env,
                preexec_fn=child_setup(None))
        line = self.coordinator.stdout.readline().split()
        if len(line) != 2 or line[0] != "listening":
            raise LaunchError(f"the rendezvous coordinator did not start; see "
                              f"{self.workdir / 'rendezvous.log'}")
        self.rendezvous_address = line[1]

    def _slurm_task(self, task: int, local: int, tasks: int, node: int,
                    per_node: int) -> dict[str, str]:
        """What srun tells a task of step 0."""
        job = self.scenario.job
        return {"SLURM_JOB_ID": job.job_id, "SLURM_STEP_ID": str(self.slurm_step),
                "SLURM_PROCID": str(task),
                "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
                "SLURM_NTASKS": str(tasks), "SLURM_NTASKS_PER_NODE": str(per_node),
                "SLURM_JOB_NUM_NODES": str(job.nodes), "SLURM_NNODES": str(job.nodes),
                "SLURMD_NODENAME": f"simnode{node}"}

    def _slurm_batch(self) -> dict[str, str]:
        """What the batch script, and whatever it starts, sees: task 0 of the first node, and
        no step id (it is the batch step)."""
        job = self.scenario.job
        return {"SLURM_JOB_ID": job.job_id, "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": str(job.nodes),
                "SLURM_NNODES": str(job.nodes), "SLURMD_NODENAME": "simnode0"}

    def node_env(self, node: int) -> dict[str, str]:
        """What a node's launcher process inherits from what started it (srun: no launcher)."""
        job = self.scenario.job
        if job.launcher in ("torchrun", "mpirun"):
            return self._slurm_task(node, 0, job.nodes, node, 1)
        if job.launcher == "torchrun-batch":
            return self._slurm_batch()
        return {}

    def _launcher_env(self, rank: int, node: int, local_rank: int,
                      generation: int = 0) -> dict[str, str]:
        """What the rank's launcher tells it about itself and the job, over what the launcher
        itself inherited."""
        job = self.scenario.job
        master = (self.rendezvous_address or "tcp://127.0.0.1:29500").removeprefix("tcp://")
        where = {"MASTER_ADDR": master.rpartition(":")[0],
                 "MASTER_PORT": master.rpartition(":")[2]}
        # an elastic restart is torchrun's own; srun's and mpirun's ranks start again as a
        # requeued job's do
        requeue = {"SLURM_RESTART_COUNT": str(generation)} if generation else {}
        if job.launcher == "srun":
            return {**self._slurm_task(rank, local_rank, job.world_size, node,
                                       job.ranks_per_node), **where, **requeue}
        if job.launcher == "mpirun":
            return {**self.node_env(node), **requeue, "OMPI_COMM_WORLD_RANK": str(rank),
                    "OMPI_COMM_WORLD_SIZE": str(job.world_size),
                    "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
                    "OMPI_COMM_WORLD_LOCAL_SIZE": str(job.ranks_per_node),
                    "OMPI_COMM_WORLD_NODE_RANK": str(node), "PMIX_RANK": str(rank),
                    "PMIX_NAMESPACE": f"prterun-sim-{job.job_id}@1", **where}
        return {**self.node_env(node), "RANK": str(rank), "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(job.world_size), "LOCAL_WORLD_SIZE": str(job.ranks_per_node),
                "GROUP_RANK": str(node), "ROLE_RANK": str(rank),
                "ROLE_WORLD_SIZE": str(job.world_size), "TORCHELASTIC_RUN_ID": job.job_id,
                "TORCHELASTIC_RESTART_COUNT": str(generation), **where}

    def _knob_env(self, rank: int, node: int) -> dict[str, str]:
        """The INGERO_SIM_* settings the sim libraries read, this rank's slow GPU included."""
        job, hw = self.scenario.job, self.scenario.hardware
        slowdown = 1.0
        for s in self.scenario.stragglers_of(rank, "slow_gpu"):
            slowdown *= s.factor
        return {
            "INGERO_SIM_NODE": str(self.hosts[node]), "INGERO_SIM_TIMEOUT_S": f"{job.timeout_s:g}",
            "INGERO_SIM_PCIE_GBPS": f"{hw.pcie_gbps:g}", "INGERO_SIM_HBM_GBPS": f"{hw.hbm_gbps:g}",
            "INGERO_SIM_NET_GBPS": f"{hw.net_gbps:g}",
            "INGERO_SIM_NET_LATENCY_US": f"{hw.net_latency_us:g}",
            "INGERO_SIM_KERNEL_US": f"{hw.kernel_us:g}",
            "INGERO_SIM_RENDEZVOUS": self.rendezvous_address or "shm",
            "INGERO_SIM_GPU_SLOWDOWN": f"{slowdown:g}",
        }

    def _rank_env(self, rank: int, node: int, local_rank: int,
                  generation: int = 0) -> dict[str, str]:
        return {**plain_environ(), **self._launcher_env(rank, node, local_rank, generation),
                **self._knob_env(rank, node), **self.extra_env}

    def _rank_argv(self, rank: int, record_path: Path, generation: int = 0) -> list[str]:
        job = self.scenario.job
        argv = [str(sim.rank_binary(job.cuda)), "--steps", str(job.steps),
                "--step-ms", f"{job.step_ms:g}",
                "--kernels", str(job.kernels), "--bytes", str(job.allreduce_bytes),
                "--dtype", job.dtype, "--host-work-ms", f"{job.host_work_ms:g}",
                "--memcpy-every", str(job.memcpy_every),
                "--loss-every", str(job.loss_every), "--jitter-ms", f"{job.jitter_ms:g}",
                "--sync-every", str(job.sync_every),
                "--record", str(record_path),
                "--unique-id-file", str(self.workdir / (
                    "nccl-unique-id" + self._suffix(self.slurm_step, generation)))]
        if job.restart_at is not None:
            argv += ["--restart-at", str(job.restart_at)] if generation == 0 else \
                ["--first-step", str(job.restart_at)]
        if job.extra_collectives:
            argv += ["--extra", ",".join(job.extra_collectives)]
        if job.parallel != (1, 1):
            argv += ["--tp", str(job.parallel[0]), "--pp", str(job.parallel[1])]
        if job.nccl_init != "config":
            argv += ["--nccl-init", job.nccl_init]
        if job.loop != "sim":
            argv += ["--loop", job.loop, "--buckets", str(job.buckets),
                     "--gemm-share", f"{job.gemm_share:g}"]
        if job.graphs is not None:
            argv += ["--graphs-from", str(job.graphs)]
        for group in job.subgroups:
            argv += ["--subgroup", ",".join(map(str, group))]
        if job.stage_work:
            argv += ["--stage-work", ",".join(f"{ms:g}" for ms in job.stage_work)]
        if job.workers:
            argv += ["--workers", str(job.workers), "--input", str(self.input_path),
                     "--input-kb", str(job.input_kb), "--worker-cpu-ms", f"{job.worker_cpu_ms:g}"]
            if job.epoch_steps:
                argv += ["--epoch-steps", str(job.epoch_steps)]
        for s in self.scenario.stragglers_of(rank):
            if s.kind in ("host_delay", "hiccup"):
                argv += delay_flag(s)
            elif s.kind in ("die", "hang"):
                argv += [f"--{s.kind}-at", str(s.at_step)]
            elif s.kind == "slow_input":
                argv += ["--input-stall-ms", f"{s.delay_ms:g}"]
                argv += ["--input-kb", str(s.read_kb)] if s.read_kb else []
        return argv

    def _write_input(self) -> None:
        """The data the ranks' loader workers read: real bytes on a real file system."""
        if self.scenario.job.workers and not self.input_path.exists():
            with open(self.input_path, "wb") as data:
                for _ in range(INPUT_BYTES // (1 << 20)):
                    data.write(os.urandom(1 << 20))

    def contention_cpu(self, rank: int) -> int | None:
        """The CPU a contended rank and its hogs share; None if the rank is not contended."""
        contention = self.scenario.stragglers_of(rank, "cpu_contention")
        if not contention:
            return None
        allowed = sorted(os.sched_getaffinity(0))
        return contention[0].cpu if contention[0].cpu is not None else allowed[rank % len(allowed)]

    def rank_cpus(self, rank: int) -> set[int] | None:
        """Where a rank may run: a contended rank on its one CPU; the others, like ranks with
        cores of their own, off every contended CPU while any CPU is left; else anywhere."""
        cpu = self.contention_cpu(rank)
        if cpu is not None:
            return {cpu}
        contended = {self.contention_cpu(s.rank) for s in self.scenario.stragglers
                     if s.kind == "cpu_contention"}
        rest = set(os.sched_getaffinity(0)) - contended
        return rest if contended and rest else None

    def _rank_spec(self, node: int, local_rank: int, generation: int = 0) -> RankSpec:
        rank = node * self.scenario.job.ranks_per_node + local_rank
        suffix = self._suffix(self.slurm_step, generation)
        record_path = record_of(self.workdir, rank, self.slurm_step, generation)
        return RankSpec(rank, local_rank, node, self._rank_argv(rank, record_path, generation),
                        self._rank_env(rank, node, local_rank, generation), self.rank_cpus(rank),
                        record_path, self.workdir / f"rank-{rank}{suffix}.log",
                        self.slurm_step, generation)

    def _process(self, spec: RankSpec, popen) -> RankProcess:
        namespace = self.networks.namespace(spec.node) if self.networks else None
        return RankProcess(spec.rank, spec.local_rank, spec.node, spec.record_path,
                           spec.log_path, self.contention_cpu(spec.rank), namespace, popen,
                           spec.step, spec.generation)

    def _start_rank(self, spec: RankSpec) -> RankProcess:
        """srun's way: the rank is a task of its own."""
        argv = self.networks.wrap(spec.node, spec.argv) if self.networks else spec.argv
        with open(spec.log_path, "w") as log:
            popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     env=spec.env, cwd=self.workdir,
                                     preexec_fn=child_setup(spec.cpus))
        return self._process(spec, popen)

    def _start_launcher(self, node: int, specs: list[RankSpec]) -> list[RankProcess]:
        """The node's launcher, which spawns its ranks; returns them once each has a pid."""
        plan = self.workdir / f"launcher-{node}{self._suffix(self.slurm_step, 0)}.json"
        status = plan.with_suffix(".status")
        status.unlink(missing_ok=True)
        # torchrun's agent imports torch, which maps libcudart; Open MPI's orted maps none
        load = None if self.scenario.job.launcher == "mpirun" \
            else str(sim.lib_dir() / f"libcudart.so.{self.scenario.job.cuda}")
        restarts = self.scenario.job.restart_at is not None
        plan.write_text(json.dumps({
            "cwd": str(self.workdir), "status": str(status), "load": load,
            "workers": [worker_plan(s) for s in specs],
            "restart": [worker_plan(self._rank_spec(s.node, s.local_rank, 1)) for s in specs]
            if restarts else None}))
        argv = [sys.executable, "-m", "sim.launcher", str(plan)]
        if self.networks:
            argv = self.networks.wrap(node, argv)
        env = {**plain_environ(), **self.node_env(node), **self._knob_env(-1, node),
               "PYTHONPATH": os.pathsep.join(
                   p for p in (str(sim.PACKAGE_DIR.parent), os.environ.get("PYTHONPATH")) if p)}
        with open(plan.with_suffix(".log"), "w") as log:
            launcher = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                        env=env, cwd=self.workdir, preexec_fn=child_setup(None))
        self.launchers.append(launcher)
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        while len({e["rank"] for e in launcher_lines(status)}) < len(specs):
            if launcher.poll() is not None or time.monotonic() > deadline:
                raise LaunchError(f"node {node}'s launcher did not start its ranks; see "
                                  f"{plan.with_suffix('.log')}")
            time.sleep(POLL_S / 5)
        return [self._process(s, LaunchedProcess(launcher, status, s.rank, restarts))
                for s in specs]

    def _start_hogs(self) -> None:
        for process in self.ranks:
            for s in self.scenario.stragglers_of(process.rank, "cpu_contention"):
                for _ in range(s.hogs):
                    popen = subprocess.Popen(
                        [str(sim.hog_binary()), "--watch-pid", str(process.pid)],
                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                        preexec_fn=child_setup({process.cpu}, s.nice))
                    self.hogs.append(HogProcess(process.rank, process.cpu, popen))

    def default_timeout(self) -> float:
        """Long enough for every step, every injected delay, and a peer timing out twice."""
        job = self.scenario.job
        delay_ms = sum(s.delay_ms for s in self.scenario.stragglers)
        per_step_s = (job.step_ms * 3 + delay_ms + 20) / 1000
        return 2 * job.timeout_s + 30 + job.steps * per_step_s

    def wait(self, timeout: float | None = None) -> ClusterResult:
        """Wait for every rank (of every step, and through elastic restarts); kill those still
        running at the deadline (reported "killed").

        Once a rank has failed, the others get job.timeout_s (plus a margin) to notice and
        error out on their own; whatever still runs then is hung, as a launcher would judge.
        """
        job = self.scenario.job
        deadline = time.monotonic() + (self.default_timeout() if timeout is None else timeout)
        while True:
            results = self._wait_ranks(deadline)
            self.finished += results
            restart = job.restart_at is not None and self.generation == 0 and \
                job.launcher == "srun" and all(r.exit_code == EXIT_RESTART for r in results)
            if restart:                       # srun's ranks: the cluster starts them again
                self._start_run(self.slurm_step, 1)
            elif all(r.status in ("ok", "restarted") for r in results) \
                    and self.slurm_step + 1 < job.steps_in_job:
                self._start_run(self.slurm_step + 1, 0)
            else:
                break
        self._clean_up()
        self.result = ClusterResult(tuple(self.finished))
        return self.result

    def _wait_ranks(self, deadline: float) -> list[RankResult]:
        """Wait for the running ranks; kill those still running at the deadline."""
        leaving = EXIT_RESTART if self.scenario.job.restart_at is not None else None
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in self.ranks):
            if self._first_failure is None and any(
                    p.popen.poll() not in (None, 0, leaving) for p in self.ranks):
                self._first_failure = time.monotonic()
                deadline = min(deadline, self._first_failure + self.scenario.job.timeout_s
                               + self.failure_grace_s)
            time.sleep(POLL_S)
        killed = {p.rank for p in self.ranks if p.popen.poll() is None}
        self._kill_ranks()
        return [self._result_of(p, p.rank in killed) for p in self.ranks]

    def _result_of(self, process: RankProcess, killed: bool) -> RankResult:
        code = None if killed else process.popen.returncode
        status = "killed" if killed else STATUS_BY_EXIT.get(code, "died")
        generation, record = process.current
        return RankResult(process.rank, process.local_rank, process.node, process.pid, code,
                          status, record, process.log_path, process.step, generation)

    def _kill_ranks(self) -> None:
        for process in self.ranks:
            if process.popen.poll() is None:
                process.popen.kill()
            process.popen.wait()

    def stop(self) -> None:
        """Terminate whatever still runs (ranks, hogs, coordinator) and remove namespaces."""
        for process in self.ranks:
            if process.popen.poll() is None:
                process.popen.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self.ranks:
            try:
                process.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._kill_ranks()
        self._clean_up()

    def comm_id_hash(self, path: Path | None = None) -> int | None:
        """comm_id_hash of the running step's communicator (or of the one whose unique id is
        at ``path``), once its rank 0 has written the unique id (the first root's, for
        nccl_init: scalable)."""
        path = path or self.unique_id_path
        if self.scenario.job.nccl_init == "scalable":
            path = path.with_name(path.name + ".root0")
        try:
            return sim.comm_id_hash(path.read_bytes())
        except (OSError, ValueError):
            return None

    def _clean_up(self) -> None:
        for launcher in self.launchers:     # its ranks are gone: it exits by itself
            try:
                launcher.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                launcher.kill()
                launcher.wait()
        for hog in self.hogs:
            if hog.popen.poll() is None:
                hog.popen.kill()
            hog.popen.wait()
        if self.coordinator and self.coordinator.poll() is None:
            self.coordinator.terminate()
            try:
                self.coordinator.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.coordinator.kill()
                self.coordinator.wait()
        if self.coordinator and self.coordinator.stdout:
            self.coordinator.stdout.close()
        if self.networks:
            self.networks.delete()
        self._remove_shared_memory()

    def _remove_shared_memory(self) -> None:
        """A rank that died (or left for a restart) never detached from its segment: remove
        every step's and generation's for it."""
        for path in self.unique_ids:
            comm_hash = self.comm_id_hash(path)
            if comm_hash is not None:
                Path(f"/dev/shm/ingero-sim-{comm_hash:016x}").unlink(missing_ok=True)


__all__ = ["Cluster", "ClusterResult", "RankProcess", "RankResult", "HogProcess",
           "LaunchedProcess"]
