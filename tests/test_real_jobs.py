"""Verdicts on jobs as people run them, not as the sim's simplest job is.

Launchers: srun, torchrun under srun, torchrun in the batch script, mpirun, and bare metal
without Slurm. Each tells its ranks who they are in its own variables (and torchrun's agent,
which maps libcudart, is a process of the job that is no rank); the verdict must name the rank
by its true RANK on the right node whatever the launcher.

Data-loader workers: forked from each rank at every epoch, mapping libcudart, inheriting the
rank's environment, reading input and exiting at the epoch's end. Their CPU, I/O and exits are
the rank's own: never a foreign preemptor, never the rank's death.

Tensor, pipeline and data parallelism: every group a communicator split from the world, the
pipeline's stages doing unequal work by design and exchanging activations with send/recv.

NCCL as PyTorch 2.11 drives it (REAL-GPU.md): the world made with ncclCommInitRankScalable from
a unique id per node, or non-blocking (ncclInProgress, then polled); groups split from it with
the non-members passing NCCL_SPLIT_NOCOLOR; a mixture-of-experts layer's two ncclAlltoAll a
step.

Agents that restart: an agent killed and restarted mid-job (as systemd would) no longer knows
the communicators its ranks made; nobody is named hung for it, and the job is still judged. A
node whose agent never ran is reported uncovered, and its ranks are never named; so is one whose
agent cannot trace (no kernel headers for its kernel), which keeps running and says so once.

Jobs that fail fast: a rank that crashes while its peers wait is dead at once; a rank that
hangs while its peers' NCCL timeout is shorter than fleetd's hang timeout is named when they
give up, after the job has failed; both stay in ``ingero report`` after the job.

One stack serves the module (``stack.local``): echod, fleetd (its hang timeout the default
30 s) and five node-wide ingerods (no --job, as the shipped unit runs them), one per simulated
node, told apart by the sim's host label. node3's agent sends its events as maps, as an agent
before wire 1.3 does, the others as columns; node4's finds no kernel headers (bcc is pointed
at an empty tree) and runs untraced: every job here is judged across a fleet in the
middle of a rolling upgrade. Each test runs sim jobs through it and reads the
answers back from echod's API, or from ``ingero report`` as a user runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

import sim
from stack import local as stack_module
from stack.launch import wait_for
from sim import scenario as scenarios
from sim.cluster import Cluster
from sim.records import read_record

from .support import assert_same_lags, lag_quartiles, metric, needs_ebpf, said, why

pytestmark = [pytest.mark.slow, needs_ebpf]

PUSH_S = 1.0
UNTRACED = 4                   # the node whose agent finds no kernel headers
HANG_TIMEOUT_S = 30.0          # fleetd's default
NCCL_TIMEOUT_S = 6.0           # the peers' own, shorter
WORKERS = {"workers": 2, "epoch_steps": 10, "worker_cpu_ms": 2}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sim.build()
    no_headers = tmp_path_factory.mktemp("no-kernel-headers")
    stack = stack_module.Stack(tmp_path_factory.mktemp("jobs"), 5, push_s=PUSH_S,
                               hang_timeout_s=HANG_TIMEOUT_S,
                               echod_flags=("--rate-limit", "500", "--rate-burst", "2000"),
                               echod_root=Path(tempfile.mkdtemp(prefix="echod-jobs-")),
                               node_flags={3: ("--wire-maps",)},
                               node_env={UNTRACED: {"BCC_KERNEL_SOURCE": str(no_headers)}})
    yield stack
    assert stack.stop() == [0] * 7, stack.logs()


def scenario(job_id: str, launcher: str, stragglers=(), **job) -> scenarios.Scenario:
    return scenarios.parse({"name": f"job-{job_id}", "stragglers": list(stragglers), "job": {
        "nodes": 4, "ranks_per_node": 4, "steps": 30, "step_ms": 30, "launcher": launcher,
        "allreduce_bytes": 1 << 20, "timeout_s": 30, "job_id": job_id, **job}})


def run(stack, job_id: str, launcher: str, stragglers=(), hosts=None, env=None,
        workdir: str | None = None, **job) -> None:
    with Cluster(scenario(job_id, launcher, stragglers, **job),
                 stack.root / (workdir or f"job-{job_id}"), hosts=hosts,
                 extra_env=env) as cluster:
        result = cluster.wait()
    assert result.ok, result.describe()
    assert stack.wait_judged(job_id, result), stack.logs()


def report(stack, job: str) -> dict[int, dict]:
    """``ingero report -j JOB --json`` as a user runs it: a row per rank."""
    token = stack.root / "token"
    token.write_text(stack.token + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("INGERO_")}
    done = subprocess.run([sys.executable, "-m", "ingero", "report", "-j", job, "--json"],
                          capture_output=True, text=True, timeout=120, cwd=stack.root, env={
                              **env, "HOME": str(stack.root), "INGERO_URL": stack.echod.url,
                              "INGERO_TOKEN_FILE": str(token),
                              "INGERO_CA_CERT": str(stack.echod.cert)})
    assert done.returncode == 0, done.stderr
    return {row["rank"]: {**row, "job": job["job"]}
            for job in json.loads(done.stdout)["jobs"] for row in job["per_rank"]}


def wall(monotonic_ns: int) -> float:
    """A sim record's CLOCK_MONOTONIC time on this host's wall clock."""
    return monotonic_ns / 1e9 - time.monotonic() + time.time()


def verdicts(stack, job: str) -> dict[int, dict]:
    """The latest verdict of each rank, as find_stragglers (and so ingero report) answers."""
    found = sorted(stack.tool("find_stragglers", job=job)["verdicts"], key=lambda v: v["raised"])
    return {v["rank"]: v for v in found}


def described(found: dict[int, dict]) -> dict[int, tuple]:
    """What a failed assertion should show of each verdict: enough to tell why it was made."""
    return {r: (v["kind"], v["cause"], v["node"], v["lag_p50_ms"], v["step"],
                v["cost_gpu_seconds"], v["findings"][:2]) for r, v in found.items()}


@pytest.mark.parametrize("launcher", scenarios.LAUNCHERS)
def test_a_late_rank_is_named_by_its_true_rank_and_node_under_every_launcher(stack, launcher):
    number = 2100 + 10 * scenarios.LAUNCHERS.index(launcher)
    late, healthy = str(number), str(number + 1)
    run(stack, late, launcher, [{"rank": 9, "kind": "host_delay", "delay_ms": 80,
                                 "from_step": 8}])
    found = verdicts(stack, late)
    assert set(found) == {9}, "\n".join([*said(found), stack.logs()])
    assert found[9]["node"] == "node2" and found[9]["cause"] == "host_work", found[9]
    report = stack.tool("job_report", job=late)
    assert report["ranks"] == 16, report     # no launcher counted, no two workers merged
    run(stack, healthy, launcher)
    assert verdicts(stack, healthy) == {}
    if launcher not in ("srun", "mpirun"):    # torchrun's agent imports torch: libcudart
        # known as the launcher when first seen, or once it has spawned its workers
        assert all(re.search(r"(, |now )launcher", agent.log())
                   for agent in stack.agents[:UNTRACED]), stack.logs()


def test_with_data_loader_workers_a_host_delayed_rank_is_its_own_host_work(stack):
    """Two workers per rank, forked anew every 10 steps, decoding on the same two CPUs as the
    ranks: the ranks are preempted by workers all the time, their own and each other's, and
    none of that is a foreign preemptor."""
    run(stack, "2201", "torchrun", [{"rank": 5, "kind": "host_delay", "delay_ms": 80,
                                     "from_step": 8}], nodes=2, **WORKERS)
    found = verdicts(stack, "2201")
    assert set(found) == {5}, "\n".join([*said(found), stack.logs()])
    assert found[5]["cause"] == "host_work", found[5]
    assert all(", helper of pid" in agent.log() for agent in stack.agents[:2]), stack.logs()


def test_a_rank_that_hangs_after_an_epoch_boundary_is_named_hung_not_dead(stack):
    """Its workers finish the epoch's batches and exit after it stopped: those exits are not
    its death."""
    with Cluster(scenario("2202", "torchrun", [{"rank": 6, "kind": "hang", "at_step": 12}],
                          nodes=2, steps=40, timeout_s=NCCL_TIMEOUT_S, **WORKERS),
                 stack.root / "job-2202") as cluster:
        cluster.wait()
    assert wait_for(lambda: 6 in verdicts(stack, "2202"), 3 * PUSH_S + 2), stack.logs()
    time.sleep(2 * PUSH_S)
    found = verdicts(stack, "2202")
    assert {r: v["kind"] for r, v in found.items()} == {6: "hang"}, found


def test_a_rank_stalled_by_its_own_workers_reads_is_named_for_its_own_work_or_io(stack):
    """Rank 5's workers read 4 MiB a batch (its peers' 256 KiB) from a slow store: it waits for
    its data every step. Its workers' reads and CPU are its own, whatever they cost it."""
    run(stack, "2203", "torchrun", [{"rank": 5, "kind": "slow_input", "delay_ms": 200,
                                     "read_kb": 4096}], nodes=2, **WORKERS)
    found = verdicts(stack, "2203")
    assert set(found) == {5}, "\n".join([*said(found), stack.logs()])
    assert found[5]["cause"] in ("io", "host_work"), found[5]


def test_a_rank_that_dies_while_its_peers_wait_is_named_dead_within_two_pushes(stack):
    with Cluster(scenario("2301", "srun", [{"rank": 6, "kind": "die", "at_step": 40}],
                          nodes=2, steps=60, timeout_s=NCCL_TIMEOUT_S),
                 stack.root / "job-2301") as cluster:
        dead = wait_for(lambda: verdicts(stack, "2301").get(6, {}).get("kind") == "died", 15)
        result = cluster.wait()
    assert dead, stack.logs()
    assert result.rank(6).status == "died" and result.rank(0).status == "error"
    last = read_record(result.rank(6).record_path).at_step(39)
    raised = datetime.fromisoformat(verdicts(stack, "2301")[6]["raised"]).timestamp()
    assert raised - wall(last["entry_ns"]) <= 2 * PUSH_S + 0.5, (raised, last)
    time.sleep(2 * PUSH_S)
    assert {r: v["kind"] for r, v in verdicts(stack, "2301").items()} == {6: "died"}
    rows = report(stack, "2301")                        # after the job: still there
    assert rows[6]["cause"] == "died", rows[6]


def test_a_hang_cut_short_by_the_peers_nccl_timeout_is_named_after_the_job_failed(stack):
    """The peers give up after 6 s, far inside fleetd's 30 s: the job fails, and rank 9, which
    never arrived at the all-reduce of step 10, is named for it."""
    with Cluster(scenario("2302", "torchrun", [{"rank": 9, "kind": "hang", "at_step": 10}],
                          steps=40, timeout_s=NCCL_TIMEOUT_S), stack.root / "job-2302") as cluster:
        result = cluster.wait()
    assert result.rank(9).status == "killed" and result.rank(0).status == "error"
    assert wait_for(lambda: 9 in verdicts(stack, "2302"), 3 * PUSH_S + 2), stack.logs()
    time.sleep(2 * PUSH_S)
    found = verdicts(stack, "2302")
    assert {r: v["kind"] for r, v in found.items()} == {9: "hang"}, described(found)
    assert found[9]["node"] == "node2" and "never entered ncclAllReduce" in \
        found[9]["findings"][0], found[9]
    rows = report(stack, "2302")
    assert rows[9]["cause"] == "hang", rows[9]


def test_a_healthy_job_with_jitter_polled_while_it_runs_never_names_anyone(stack):
    """16 ranks, each with up to 6 ms of random host time a step: what a user or an alert reads
    from find_stragglers while the job runs (fleetd's verdicts and echod's own reading of the
    stored events, some nodes' entries still on their way) must be as right as the end."""
    named = polled(stack, "2401", "srun", steps=300, step_ms=20, jitter_ms=6)
    answer = stack.tool("find_stragglers", job="2401")
    assert len(answer["ranks"]) == 16 and not [r for r in answer["ranks"] if r["straggler"]]
    assert named + answer["verdicts"] == []


def polled(stack, job_id: str, launcher: str, **job) -> list[dict]:
    """Run a healthy job, reading find_stragglers once a second while it runs, as a user or an
    alert would: every verdict and every rank called a straggler it said."""
    named = []
    with Cluster(scenario(job_id, launcher, **job), stack.root / f"job-{job_id}") as cluster:
        while any(rank.popen.poll() is None for rank in cluster.ranks):
            time.sleep(1.0)
            answer = stack.tool("find_stragglers", job=job_id)
            named += answer["verdicts"] + [r for r in answer["ranks"] if r["straggler"]]
        result = cluster.wait()
    assert result.ok, result.describe()
    assert stack.wait_judged(job_id, result), stack.logs()
    return named


def test_an_agent_restarted_mid_job_names_no_hang_and_the_job_is_still_judged(stack):
    """node1's agent is killed -9 a second into the job and started again; rank 2, on node0,
    turns late after that. node1's ranks, whose communicator the new agent did not see made,
    are not waited for; rank 2 is named."""
    with Cluster(scenario("2501", "srun", [{"rank": 2, "kind": "host_delay", "delay_ms": 40,
                                            "from_step": 150}], nodes=2, steps=400,
                          step_ms=20), stack.root / "job-2501") as cluster:
        time.sleep(1.0)
        killed = time.time()
        stack.restart_agent(1)
        result = cluster.wait()
    assert result.ok, result.describe()
    assert stack.wait_judged("2501", result), stack.logs()
    found = verdicts(stack, "2501")
    assert set(found) == {2}, "\n".join([*said(found), stack.logs()])
    assert datetime.fromisoformat(found[2]["raised"]).timestamp() > killed
    assert "node node1's agent restarted" in stack.fleetd.log()


RAW_SYNCS = """SELECT rank, count(*), sum(duration_ns) FROM events WHERE job = '2901'
AND kind = 'sync' AND duration_ns IS NOT NULL GROUP BY rank ORDER BY rank"""
SUMMED_SYNCS = """SELECT rank, sum(timed), sum(duration_ns) FROM call_stats WHERE job = '2901'
AND kind = 'sync' GROUP BY rank ORDER BY rank"""
SELF_WORK = """SELECT rank, percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ns) FROM events
WHERE job = '2901' AND kind = 'sync' AND duration_ns IS NOT NULL
  AND coalesce(attrs -> 'peer_wait', 'false'::jsonb) <> 'true'::jsonb GROUP BY rank"""


def test_agents_of_both_wire_versions_push_one_job_and_both_are_judged_and_stored(stack):
    """A rolling upgrade: node3's agent sends maps (the push of wire 1.2), node0's to node2's
    columns (1.3). One job spans the four; a rank late on each side is named on its node, and
    echod stores every collective of every rank, and summaries of its calls that answer as the
    raw events do."""
    pushes = {kind: metric(stack.fleet_port, "ingero_fleet_messages_total", type=kind)
              for kind in ("push", "columnpush")}
    run(stack, "2901", "srun", [{"rank": r, "kind": "host_delay", "delay_ms": 80,
                                 "from_step": 8} for r in (2, 13)])
    found = verdicts(stack, "2901")
    assert {r: (v["node"], v["cause"]) for r, v in found.items()} == {
        2: ("node0", "host_work"), 13: ("node3", "host_work")}, why(found, stack.logs())
    assert stack.tool("job_report", job="2901")["collectives"] == 30 * 16
    assert len(stack.tool("find_stragglers", job="2901")["ranks"]) == 16
    assert "job 2901: rank(s)" not in stack.fleetd.log(), "one run, whatever each node sends"
    # The per-minute summaries echod wrote from both forms say what the raw events say.
    sql = stack.client().sql
    assert sql(SUMMED_SYNCS)["rows"] == sql(RAW_SYNCS)["rows"]
    median = {rank: ns / 1e6 for rank, ns in sql(SELF_WORK)["rows"]}
    answered = {row["rank"]: row["self_work_ms"]
                for row in stack.tool("job_report", job="2901")["per_rank"]}
    assert answered.keys() == median.keys() and len(median) == 16
    for rank, ms in median.items():
        assert answered[rank] == pytest.approx(ms, rel=0.023, abs=0.001), rank
    for kind, before in pushes.items():
        assert metric(stack.fleet_port, "ingero_fleet_messages_total", type=kind) > before, kind


def test_a_node_whose_agent_never_ran_is_reported_uncovered_and_never_named(stack):
    run(stack, "2502", "srun", [{"rank": 1, "kind": "host_delay", "delay_ms": 40}], nodes=3,
        steps=60, hosts=[0, 1, 9])                  # no agent traces host 9
    assert set(verdicts(stack, "2502")) == {1}
    assert "job 2502: rank(s) 8,9,10,11 never told of by any agent" in stack.fleetd.log()


def test_a_node_whose_agent_cannot_trace_says_so_once_and_its_peers_are_still_judged(stack):
    """REAL-GPU.md's H200 has BTF but no kernel headers, so bcc cannot compile there. The
    agent used to exit, and systemd restarted it every 2 s for good. Now it says why in one
    line, keeps serving (metrics: ingero_agent_tracing{reason="no_kernel_headers"} 0), tells
    fleetd once, and its node's ranks are uncovered: the late rank elsewhere is named, and
    none of theirs."""
    from .support import metric

    agent = stack.agents[UNTRACED]
    run(stack, "2503", "srun", [{"rank": 1, "kind": "host_delay", "delay_ms": 40}], nodes=3,
        steps=60, hosts=[0, 1, UNTRACED])
    assert set(verdicts(stack, "2503")) == {1}
    assert "job 2503: rank(s) 8,9,10,11 never told of by any agent" in stack.fleetd.log()
    assert agent.alive() and agent.log().count("cannot trace (no_kernel_headers)") == 1, \
        agent.log()
    port = stack.agent_ports[UNTRACED]
    assert metric(port, "ingero_agent_tracing", reason="no_kernel_headers") == 0
    assert metric(port, "ingero_agent_batches_pushed_total") > 0      # still heard from
    assert metric(stack.agent_ports[0], "ingero_agent_tracing", reason="none") == 1
    said = "node node4's agent cannot trace (no_kernel_headers)"
    assert stack.fleetd.log().count(said) == 1, stack.fleetd.log()
    assert metric(stack.fleet_port, "ingero_fleet_nodes_untraced") == 1


def test_steps_a_requeue_and_a_bare_metal_job_on_the_same_nodes_are_runs_of_their_own(stack):
    """Job 2601 runs two srun steps, rank 1 late in both; then it is requeued, rank 3 late;
    then a bare-metal torchrun (no Slurm) on the same nodes, rank 5 late. Each run is judged
    apart: its own verdicts, each with its own cost, none inheriting another's. The job's
    report has a row for each rank of each step."""
    late = lambda rank: [{"rank": rank, "kind": "host_delay", "delay_ms": 40}]  # noqa: E731
    run(stack, "2601", "srun", late(1), nodes=2, steps=70, steps_in_job=2)
    run(stack, "2601", "srun", late(3), nodes=2, steps=30, env={"SLURM_RESTART_COUNT": "1"},
        workdir="job-2601-requeued")
    run(stack, "exp-2601", "bare", late(5), nodes=2, steps=30)
    found = sorted(stack.tool("find_stragglers", job="2601")["verdicts"],
                   key=lambda v: (v["rank"], v["evidence"].get("run", {}).get("step", "")))
    runs = [(v["rank"], v["evidence"].get("run")) for v in found]
    assert runs == [(1, {"step": "0"}), (1, {"step": "1"}), (3, {"step": "0", "requeue": 1})], \
        why(runs, stack.logs())
    steps = [v["cost_gpu_seconds"] for v in found[:2]]
    assert all(0 < cost < 1.5 * min(steps) for cost in steps), \
        ("no run carries another's cost", found)
    bare = stack.tool("find_stragglers", job="exp-2601")["verdicts"]
    assert [(v["rank"], v["evidence"].get("run")) for v in bare] == [(5, {"restart": 0})]
    # job_report: a row per rank of each step, each with its own step's verdict, from the raw
    # collectives and from fleetd's summaries alike (the requeued run's step 0 is step 0)
    raw = stack.tool("job_report", job="2601")
    summed = stack.tool("job_report", job="2601", max_entries=1000)    # of 1,360
    assert (raw["coverage"]["source"], summed["coverage"]["source"]) == ("events", "summaries")
    for report in (raw, summed):
        rows = {(r["step"], r["rank"]): r["verdict"] for r in report["per_rank"]}
        assert set(rows) == {(step, rank) for step in "01" for rank in range(8)}, rows
        assert {key for key, verdict in rows.items() if verdict} == {
            ("0", 1), ("1", 1), ("0", 3)}, rows
        assert report["ranks"] == 8


SUBGROUPS = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]


def test_worlds_made_as_pytorch_makes_them_their_nocolor_splits_and_all_to_all_are_judged(
        stack):
    """A world made with ncclCommInitRankScalable, four groups split from it (each split has
    twelve NCCL_SPLIT_NOCOLOR ranks, which get no communicator), rank 5 late into its group's
    all-reduce only: every split resolves, and rank 5 is named there, for its host work. Its
    group then comes late to the next world all-reduce, waiting on it: not named. A world made
    non-blocking, with an MoE layer's two all-to-alls a step and rank 9 late on the host: named
    at ncclAlltoAll. An all-to-all with uneven splits (a group of Send/Recv with every peer,
    as PyTorch makes it) and rank 6 late into it only: named at that exchange, on the world.
    Before, neither world was seen made, no NOCOLOR split was told, all-to-all was not
    probed, and sends and receives were never judged for lag: nobody could be named."""
    unaligned = metric(stack.fleet_port, "ingero_fleet_unaligned_collectives_total")
    run(stack, "3101", "torchrun", [{"rank": 5, "kind": "host_delay", "delay_ms": 30,
                                     "from_step": 5, "before": "subgroup"}],
        nccl_init="scalable", subgroups=SUBGROUPS, steps=40)
    late = verdicts(stack, "3101")
    assert {r: (v["kind"], v["cause"]) for r, v in late.items()} == {
        5: ("persistent", "host_work")}, why(described(late), stack.logs())
    record = read_record(stack.root / "job-3101" / "rank-5.jsonl")
    group = {f"{c['comm_id_hash']:016x}" for c in record.ops("ncclAllReduce")} - {
        f"{record.summary['comm_id_hash']:016x}"}
    assert [late[5]["comm_hash"]] == list(group), (late[5], group)
    run(stack, "3102", "srun", [{"rank": 9, "kind": "host_delay", "delay_ms": 30,
                                 "from_step": 5}],
        nccl_init="nonblocking", extra_collectives=["alltoall"], steps=40)
    late = verdicts(stack, "3102")
    assert {r: (v["cause"], v["op"]) for r, v in late.items()} == {
        9: ("host_work", "ncclAlltoAll")}, why(described(late), stack.logs())
    run(stack, "3103", "srun", [{"rank": 6, "kind": "host_delay", "delay_ms": 30,
                                 "from_step": 5, "before": "alltoallv"}],
        extra_collectives=["alltoallv"], steps=40)
    late = verdicts(stack, "3103")
    assert {r: (v["cause"], v["op"]) for r, v in late.items()} == {
        6: ("host_work", "alltoallv")}, why(described(late), stack.logs())
    world = read_record(stack.root / "job-3103" / "rank-6.jsonl").summary["comm_id_hash"]
    assert late[6]["comm_hash"] == f"{world:016x}", late[6]
    assert metric(stack.fleet_port, "ingero_fleet_unaligned_collectives_total") == unaligned


PYTORCH = {"loop": "pytorch", "buckets": 2, "kernels": 8, "steps": 60}


def test_pytorch_ddp_loops_are_judged_through_their_nccl_stream_and_loss_reads(stack):
    """Steps as PyTorch's DDP runs them (REAL-GPU.md): NCCL on its own stream behind events,
    the host's only sync the loss read every few steps, launches through cudaLaunchKernel and
    cuLaunchKernelEx, memory from the caching allocator. Healthy, nobody is named; a rank 30
    ms late on the host every step is named for its host work; a rank whose host is 6 ms
    slower a step but, syncing every 10 steps, still ahead of its GPU queue costs nobody and
    is only noted. The agents count every launch once, whichever path it took, and every
    asynchronous copy, in the kernel: not an event each."""
    launches = lambda: sum(metric(port, "ingero_agent_kernel_launches_total")  # noqa: E731
                           for port in stack.agent_ports[:4])
    before = launches()
    run(stack, "3001", "srun", **PYTORCH)
    assert verdicts(stack, "3001") == {}
    counted = sum(sum(read_record(stack.root / "job-3001" / f"rank-{r}.jsonl").summary[
        "launches"].values()) for r in range(16))
    assert wait_for(lambda: launches() - before >= counted, 10)
    assert launches() - before == counted == 16 * 60 * (8 + 16 + 1)
    # the batch copied in and the loss read out each step: counted in the kernel, a few
    # events a sample, and every copy in memcpy_bandwidth
    copies = lambda: {(c["rank"], c["direction"]): c["copies"]  # noqa: E731
                      for c in stack.tool("memcpy_bandwidth", job="3001")["copies"]}
    each = {(r, d): 60 for r in range(16) for d in ("host_to_device", "device_to_host")}
    assert wait_for(lambda: copies() == each, 10), copies()
    run(stack, "3002", "srun", [{"rank": 6, "kind": "host_delay", "delay_ms": 30,
                                 "from_step": 10}], **PYTORCH)
    late = verdicts(stack, "3002")
    assert {r: (v["kind"], v["cause"]) for r, v in late.items()} == {
        6: ("persistent", "host_work")}, why(described(late), stack.logs())
    run(stack, "3003", "srun", [{"rank": 5, "kind": "host_delay", "delay_ms": 6,
                                 "from_step": 40}], **{**PYTORCH, "steps": 100, "step_ms": 20,
                                                       "sync_every": 10})
    assert verdicts(stack, "3003") == {}
    notes = {n["rank"]: n for n in stack.tool("find_stragglers", job="3003")["notes"]}
    assert (notes[5]["kind"], notes[5]["cost_gpu_seconds"]) == ("ahead", 0.0), \
        why(notes, stack.logs())


GRAPHS = {"graphs": {"from_step": 20}, "steps": 80}


def test_jobs_replaying_cuda_graphs_are_judged_and_their_nodes_stay_healthy(stack):
    """From step 20 each step is one CUDA graph's replay: its kernels and all-reduce were
    captured once, and a replay calls no launch or NCCL entry point. Before, the replays were
    invisible: nobody could be judged, and the nodes' collective and launch rates fell to
    nothing, halving their health scores. Healthy, nobody is named and no node flags itself;
    a rank late on the host from step 40 is named for it; a rank that hangs at step 60, inside
    its replays, is named hung."""
    flagged = lambda: [a.log().count("straggler: score") for a in stack.agents[:4]]  # noqa: E731
    launches = lambda: sum(metric(port, "ingero_agent_kernel_launches_total")  # noqa: E731
                           for port in stack.agent_ports[:4])
    before, counted = flagged(), launches()
    run(stack, "3201", "srun", **GRAPHS)
    assert verdicts(stack, "3201") == {}
    assert flagged() == before, stack.logs()
    made = sum(sum(read_record(stack.root / "job-3201" / f"rank-{r}.jsonl").summary[
        "launches"].values()) for r in range(16))
    assert wait_for(lambda: launches() - counted == made == 16 * 80 * (3 * 4 + 1), 10), (
        launches() - counted, made, [metric(port, "ingero_agent_kernel_launches_total")
                                     for port in stack.agent_ports[:4]],
        [a.log()[-3000:] for a in stack.agents[:1]])
    run(stack, "3202", "srun", [{"rank": 10, "kind": "host_delay", "delay_ms": 30,
                                 "from_step": 40}], **GRAPHS)
    late = verdicts(stack, "3202")
    assert {r: (v["kind"], v["cause"]) for r, v in late.items()} == {
        10: ("persistent", "host_work")}, why(described(late), stack.logs())
    with Cluster(scenario("3203", "srun", [{"rank": 13, "kind": "hang", "at_step": 60}],
                          timeout_s=NCCL_TIMEOUT_S, **GRAPHS),
                 stack.root / "job-3203") as cluster:
        result = cluster.wait()
    assert result.rank(13).status == "killed" and result.rank(0).status == "error"
    assert wait_for(lambda: 13 in verdicts(stack, "3203"), 3 * PUSH_S + 2), stack.logs()
    time.sleep(2 * PUSH_S)
    found = verdicts(stack, "3203")
    assert {r: v["kind"] for r, v in found.items()} == {13: "hang"}, described(found)


PARALLEL = {"parallel": {"tp": 2, "pp": 2}, "stage_work": [30, 15], "nodes": 2, "steps": 40}


def test_tensor_and_pipeline_parallel_jobs_are_judged_within_their_groups(stack):
    """tp = 2, pp = 2 on two nodes: tensor-parallel pairs, data-parallel pairs and pipeline
    pairs, all split from a world that carries no collective; stage 0's kernels take twice
    stage 1's. Healthy, nobody is named; a GPU 1.4 times slower is named, cause slow_gpu,
    and the stage-1 ranks it holds up through their receives are not (they come late to their
    data-parallel groups only because their GPUs waited); a rank late on the host is found
    from its groups' collectives."""
    run(stack, "2701", "torchrun", **PARALLEL)
    assert verdicts(stack, "2701") == {}
    run(stack, "2702", "torchrun", [{"rank": 2, "kind": "slow_gpu", "factor": 1.4}], **PARALLEL)
    slow = verdicts(stack, "2702")
    assert {r: v["cause"] for r, v in slow.items()} == {2: "slow_gpu"}, why(slow, stack.logs())
    # Rank 6 and 7 wait on its sends; through its tensor-parallel partner (3) and their
    # data-parallel groups the wait reaches further (beside a busy loop rank 1 showed it once):
    # whoever is noted is noted as passed down, and the slow rank is never among them.
    passed = stack.tool("find_stragglers", job="2702")["notes"]
    assert passed and 2 not in {n["rank"] for n in passed} and \
        {n["kind"] for n in passed} == {"passed_down"}, passed
    run(stack, "2703", "torchrun", [{"rank": 6, "kind": "host_delay", "delay_ms": 40,
                                     "from_step": 5}], **{**PARALLEL, "steps": 60})
    late = verdicts(stack, "2703")
    assert {r: (v["kind"], v["cause"]) for r, v in late.items()} == {
        6: ("persistent", "host_work")}, why(late, stack.logs())
    groups = {f"{c['comm_id_hash']:016x}"
              for c in read_record(stack.root / "job-2703" / "rank-6.jsonl").ops("ncclAllReduce")}
    assert late[6]["node"] == "node1" and late[6]["comm_hash"] in groups, late[6]
    # Past a cap on the raw entries (1,440 of the groups' collectives), the lags come from
    # fleetd's summaries: the same answer. Neither counts the pipeline's sends and receives.
    raw = stack.tool("job_report", job="2703")
    summed = stack.tool("job_report", job="2703", max_entries=1000)
    assert (raw["coverage"]["source"], summed["coverage"]["source"]) == ("events", "summaries")
    assert_same_lags(summed, raw, lag_quartiles(stack, "2703"))


def test_a_healthy_pipeline_job_with_workers_jitter_and_few_syncs_names_nobody(stack):
    """mpirun, tp = 2 and pp = 2 with unequal stages, two data-loader workers a rank forked
    anew every 40 steps, the hosts syncing with their GPUs every 5 steps, each up to 3 ms of
    random host time a step: the pipeline's stages wait for each other by design and the
    two-rank groups' lags swing by ms either way. Nobody is late; nobody is named, by fleetd
    or by any tool, while it runs or after."""
    named = polled(stack, "2704", "mpirun", **{**PARALLEL, "steps": 120}, workers=2,
                   epoch_steps=40, sync_every=5, jitter_ms=3)
    assert named == [], why(named, stack.logs())
    one_answer(stack, "2704", {})


def test_a_late_node_s_ranks_are_each_named_for_their_host_work_and_charged(stack):
    """All four ranks of node 2 spend 30 ms more on the host each 25 ms step from step 10,
    syncing every step. Their GPUs had some of the step queued, so the collectives start
    later by less than their host lag; the twelve others wait that much more a step. Each of
    the four is named for its host work, with the cost its lateness shared."""
    run(stack, "2803", "srun", [{"rank": r, "kind": "host_delay", "delay_ms": 30,
                                 "from_step": 10} for r in range(8, 12)],
        step_ms=25, steps=80)
    late = verdicts(stack, "2803")
    assert {r: (v["node"], v["cause"]) for r, v in late.items()} == {
        r: ("node2", "host_work") for r in range(8, 12)}, why(described(late), stack.logs())
    assert all(v["cost_gpu_seconds"] > 0 and v["severity"] != "info" for v in late.values())
    one_answer(stack, "2803", late)


def test_a_slightly_slow_gpu_is_named_slow_gpu_and_a_late_host_among_24_ranks_host_work(stack):
    """A GPU 1.3 times slower than its peers is a slow GPU, not host work; and in a job of 24
    ranks on the machine's CPUs, every rank preempted by the others all the time, a rank
    late in its own host code is late by its host work, not preempted."""
    run(stack, "2705", "srun", [{"rank": 6, "kind": "slow_gpu", "factor": 1.3}], steps=60)
    slow = verdicts(stack, "2705")
    assert {r: v["cause"] for r, v in slow.items()} == {6: "slow_gpu"}, \
        why(described(slow), stack.logs())
    run(stack, "2706", "srun", [{"rank": 13, "kind": "host_delay", "delay_ms": 80,
                                 "from_step": 10}], ranks_per_node=6, steps=60)
    late = verdicts(stack, "2706")
    assert {r: v["cause"] for r, v in late.items()} == {13: "host_work"}, \
        why(described(late), stack.logs())
    one_answer(stack, "2706", late)


def test_a_host_late_but_ahead_of_its_gpu_costs_nothing_and_one_behind_its_queue_is_named(stack):
    """The hosts sync with their GPUs every 10 steps only, enqueueing steps ahead of them in
    between. From step 40 rank 5's host spends 6 ms more a step: its collectives are enqueued
    tens of ms after its peers', yet its GPU queue still runs ahead of 20 ms of GPU work a
    step, and its peers wait no longer than before. With 30 ms more, it falls behind its
    queue, and everyone waits for it."""
    ahead = {"nodes": 2, "steps": 100, "step_ms": 20, "sync_every": 10}
    run(stack, "2801", "srun", [{"rank": 5, "kind": "host_delay", "delay_ms": 6,
                                 "from_step": 40}], **ahead)
    assert verdicts(stack, "2801") == {}
    notes = {n["rank"]: n for n in stack.tool("find_stragglers", job="2801")["notes"]}
    assert (notes[5]["kind"], notes[5]["severity"], notes[5]["cost_gpu_seconds"]) == (
        "ahead", "info", 0.0), why(notes, stack.logs())
    # Eight ranks on two CPUs: a host kept off its CPU for a while comes a few ms late, costs
    # nobody, and may be noted so too; never for as long as rank 5.
    assert all((n["kind"], n["cost_gpu_seconds"]) == ("ahead", 0.0)
               and n["lag_p50_ms"] < notes[5]["lag_p50_ms"] / 2 for n in notes.values()
               if n["rank"] != 5), notes
    assert report(stack, "2801")[5]["note"] == "ahead"        # what ingero report says
    one_answer(stack, "2801", {})
    run(stack, "2802", "srun", [{"rank": 5, "kind": "host_delay", "delay_ms": 30,
                                 "from_step": 40}], **ahead)
    behind = verdicts(stack, "2802")
    assert set(behind) == {5} and behind[5]["cost_gpu_seconds"] > 0, \
        why(described(behind), stack.logs())
    one_answer(stack, "2802", behind)


def one_answer(stack, job: str, named: dict[int, dict]) -> None:
    """What a user reads of the job says what fleetd judged (``named``: its verdicts, by rank),
    however far over its job's bar the stored events put a rank: find_stragglers' and
    ingero report's stragglers are fleetd's, explain gives its cause, and its cost."""
    found = stack.tool("find_stragglers", job=job)
    assert {r["rank"] for r in found["ranks"] if r["straggler"]} == set(named), found["ranks"]
    assert [j["judged_by"] for j in found["jobs"]] == ["fleetd"], found["jobs"]
    rows = report(stack, job)
    assert {rank for rank, row in rows.items() if row["straggler"]} == set(named), rows
    notes = {n["rank"]: n for n in found["notes"]}
    for rank in {r["rank"] for r in found["ranks"] if r["over_bar"]} | set(named) | set(notes):
        said = stack.tool("explain", job=job, rank=rank)
        if rank in named:
            verdict = said["evidence"]["verdict"]
            assert (said["cause"], verdict["cost_gpu_seconds"]) == (
                named[rank]["cause"], named[rank]["cost_gpu_seconds"]), said
            assert rows[rank]["cause"] == named[rank]["cause"], rows[rank]
        else:
            assert said["cause"] == "none", said
            if rank in notes:
                assert said["findings"][0].startswith(
                    f"fleetd did not name it ({notes[rank]['kind']})"), said
