"""What an ordinary cluster user can do to ingero from their own processes, done for real.

Every process on a compute node may be an attacker's: its environment, names and libraries are
its user's to choose, and ingerod reads every one of them as root. Here processes of another
user (nobody, uid 65534) sit beside the sim jobs of the shared stack (conftest's ``two_nodes``:
real bcc, fleetd and echod, two node-wide agents as the shipped unit runs them), each claiming
to be a rank of a simulated node: a rank of '--1', '²' or past 2^64, a 300-character job id, a
6 MB environment, a hundred copies of libnccl of their own. The agents must refuse what does
not parse and what is past a user's share, say so in their logs and metrics, keep running, and
go on judging the real job beside them.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import sim
from stack.launch import wait_for
from sim import scenario as scenarios
from sim.cluster import Cluster

from .support import Producer, TwoNodes, metric, needs_ebpf, said

pytestmark = [pytest.mark.slow, needs_ebpf]

NOBODY = 65534
STUBS = 100
LIBRARIES_PER_USER = TwoNodes.LIBRARIES_PER_USER     # the stack's (ingerod's default is 16)
# Holds the libraries it is given mapped until it is killed; says so on stdout first. With
# HOLD_CALLS=N, once told to go on stdin (the agents have attached the file by then), the first
# (a libcudart) is asked for 2^62 bytes three times (each fails, and the probe sees the size
# asked), then to synchronise N times, and the process exits with 3.
HOLD = """
import ctypes, os, sys, time
libraries = [ctypes.CDLL(path) for path in sys.argv[1:]]
print("mapped", flush=True)
calls = int(os.environ.get("HOLD_CALLS", "0"))
if not calls:
    time.sleep(3600)
sys.stdin.readline()
cudart, pointer = libraries[0], ctypes.c_void_p()
for _ in range(3):
    cudart.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(2**62))
for _ in range(calls):
    cudart.cudaDeviceSynchronize()
    time.sleep(0.05)
sys.exit(3)
"""
# 48 variables of just under the kernel's 128 KiB per string: a 6 MB environment.
PADDING = {f"PAD{k}": "x" * 130_000 for k in range(48)}


@pytest.fixture(scope="module")
def stack(two_nodes):
    return two_nodes


@pytest.fixture
def as_nobody():
    """Start processes as another user, each holding the libraries it is given mapped; killed
    at the end."""
    started: list[subprocess.Popen] = []
    work = Path(tempfile.mkdtemp(prefix="ingero-hostile-"))
    work.chmod(0o755)
    (work / "hold.py").write_text(HOLD)

    def bigger_stack():     # room for a 6 MB environment (a quarter of the stack limit)
        resource.setrlimit(resource.RLIMIT_STACK, (64 << 20, 64 << 20))

    def start(libraries: list[Path], env: dict[str, str]) -> subprocess.Popen:
        process = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "/usr/bin/python3", str(work / "hold.py"), *map(str, libraries)],
            env={"PATH": "/usr/bin:/bin", **env}, stdout=subprocess.PIPE,
            stdin=subprocess.PIPE, preexec_fn=bigger_stack)
        started.append(process)
        assert process.stdout.readline() == b"mapped\n", process.wait()
        return process

    start.work = work
    yield start
    for process in started:
        process.kill()
        process.wait()
    shutil.rmtree(work, ignore_errors=True)


def copy_library(name: str, to: Path, as_name: str | None = None) -> Path:
    """A copy of a sim library where another user may read it (with the virtual GPU it
    drives beside it)."""
    to.mkdir(parents=True, exist_ok=True)
    to.chmod(0o755)
    copy = to / (as_name or name)
    for source, target in ((name, copy), (sim.VGPU_LIBRARY, to / sim.VGPU_LIBRARY)):
        shutil.copy(sim.lib_dir() / source, target)
        target.chmod(0o755)
    return copy


def scenario(job_id: str, late: int, steps: int = 30) -> scenarios.Scenario:
    return scenarios.parse({"name": f"job-{job_id}", "job": {
        "nodes": 2, "ranks_per_node": 4, "steps": steps, "step_ms": 20,
        "allreduce_bytes": 1 << 20, "timeout_s": 30, "job_id": job_id},
        "stragglers": [{"rank": late, "kind": "host_delay", "delay_ms": 200}]})


def test_what_a_user_puts_in_their_processes_neither_stops_nor_blinds_the_agents(
        stack: TwoNodes, as_nobody):
    cudart = copy_library("libcudart.so.12", as_nobody.work / "root-owned")
    claims = [{"RANK": "--1"}, {"RANK": "²", "WORLD_SIZE": "٣"},
              {"RANK": "1" * 25, "WORLD_SIZE": "9" * 25},
              {"SLURM_JOB_ID": "7" * 300, "RANK": "0"}]
    for k, claim in enumerate(claims):        # two on each simulated node
        as_nobody([cudart], {"INGERO_SIM_NODE": str(k % 2), **claim, **PADDING})
    # a hundred library files of the user's own, each a copy of libnccl, mapped by one process
    own = as_nobody.work / "own"
    stubs = [copy_library("libnccl.so.2", own, f"libnccl.so.2.{k}") for k in range(STUBS)]
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(own)], check=True)
    stub_holder = as_nobody(stubs, {"INGERO_SIM_NODE": "0"})

    def refused(node: int, reason: str) -> float:
        return metric(stack.agent_ports[node], "ingero_agent_refused_total", reason=reason)

    # every library file past the user's share is refused; the first ones are attached
    assert wait_for(lambda: refused(0, "library_cap") >= STUBS - LIBRARIES_PER_USER, 60), \
        stack.agents[0].log()[-3000:]
    # each agent reads every process before it picks its own (counted at its next push)
    assert wait_for(lambda: all(refused(node, "bad_variable") >= len(claims)
                                for node in (0, 1)), 10), stack.logs()
    log0 = stack.agents[0].log()
    # one line for them all (rate limited), naming whichever process the agent read first
    assert re.search(rf"uid {NOBODY}\): (RANK|WORLD_SIZE|SLURM_JOB_ID)(, [A-Z_]+)* read as "
                     "unset", log0), log0[-3000:]
    assert f"already has {LIBRARIES_PER_USER} library files attached" in log0, log0[-3000:]
    fds = len(os.listdir(f"/proc/{stack.agents[0].process.pid}/fd"))
    assert fds < 1024, fds         # what a unit without LimitNOFILE would allow
    assert refused(0, "loop_error") == refused(1, "loop_error") == 0, stack.logs()

    # the real job beside them is traced and judged: its late rank named, nobody else
    late = 6
    result = stack.run(scenario("3601", late))
    assert result.ok, result.describe()
    found = {v["rank"]: v for v in stack.verdicts("3601")}
    assert set(found) == {late}, "\n".join([*said(found), stack.logs()])
    assert all(agent.alive() for agent in stack.agents), stack.logs()

    # once the user's processes are gone, their files are detached (after --library-grace,
    # 20 s here): a long-lived agent holds no file nobody maps, and the user's share is
    # theirs again
    stub_holder.kill()
    stub_holder.wait()
    assert wait_for(lambda: stack.agents[0].log().count("detached (no traced process maps it)")
                    >= LIBRARIES_PER_USER, 180), stack.agents[0].log()[-3000:]


def test_a_user_claiming_anothers_job_plants_nothing_in_it_nor_stops_the_store(
        stack: TwoNodes, as_nobody):
    """While a job runs, a process of another user claims to be its rank 2 (its job id and
    rank in the environment), synchronises, asks for 2^62 bytes and exits with 3; another of
    theirs does the same in a job of its own. Their events carry their uid: those in the job
    they do not own are refused by fleetd (neither judged nor stored: no death, no verdict),
    those in their own job go to echod, which refuses the impossible sizes row by row and
    stores the rest."""
    cudart = copy_library("libcudart.so.12", as_nobody.work / "root-owned")
    job = scenario("3602", late=6, steps=120)

    def sql(statement: str) -> list:
        return stack.client().sql(statement)["rows"]
    with Cluster(job, stack.root / "job-3602") as cluster:
        # the job's own events come first (a job without a Slurm record is its first user's)
        assert wait_for(lambda: sql("SELECT count(*) > 0 FROM events WHERE job = '3602'")
                        == [[True]], 60), stack.logs()
        claimers = [
            as_nobody([cudart], {"INGERO_SIM_NODE": "0", "SLURM_JOB_ID": "3602", "RANK": "2",
                                 "WORLD_SIZE": "8", "HOLD_CALLS": "40"}),
            as_nobody([cudart], {"INGERO_SIM_NODE": "1", "SLURM_JOB_ID": "3603", "RANK": "0",
                                 "HOLD_CALLS": "5"})]
        assert wait_for(lambda: all(f"{cudart}: attached" in agent.log()
                                    for agent in stack.agents), 30), stack.logs()
        for process in claimers:
            process.stdin.write(b"go\n")
            process.stdin.flush()
        result = cluster.wait()
    assert result.ok, result.describe()
    assert stack.wait_judged("3602", result), stack.logs()
    found = {v["rank"]: v for v in stack.verdicts("3602")}
    assert set(found) == {6}, "\n".join([*said(found), stack.logs()])
    # its three allocations, 40 synchronisations and exit (which may come after the job's end)
    assert wait_for(lambda: metric(stack.fleet_port, "ingero_fleet_events_refused_total",
                                   reason="foreign_uid") >= 44, 30), stack.fleetd.log()[-3000:]
    assert "foreign_uid" in stack.fleetd.log()
    assert sql(f"SELECT count(*) FROM events WHERE job = '3602' "
               f"AND attrs ->> 'uid' = '{NOBODY}'") == [[0]]
    assert sql("SELECT count(*) > 0 FROM events WHERE job = '3602' "
               "AND attrs ->> 'uid' = '0'") == [[True]]
    # the other job is the user's own: stored, less the three sizes no call can have
    assert wait_for(lambda: sql("SELECT count(*) FROM events WHERE job = '3603' "
                                "AND kind = 'sync'") == [[5]], 30), stack.echod.daemon.log()
    assert sql("SELECT count(*) FROM events WHERE job = '3603' AND kind = 'alloc'") == [[0]]
    assert "attrs.bytes: 4611686018427387904 out of range" in stack.echod.daemon.log()
    assert all(d.alive() for d in [stack.echod.daemon, *stack.daemons]), stack.logs()


# A libnccl of the user's own that claims whatever communicator it is told: ncclCommInitRank
# hands back a handle at once, ncclAllReduce returns at once.
STUB_NCCL = r"""
typedef struct { char internal[128]; } ncclUniqueId;
static char handle;
int ncclCommInitRank(void **comm, int nranks, ncclUniqueId id, int rank)
{ (void)nranks; (void)id; (void)rank; *comm = &handle; return 0; }
int ncclAllReduce(const void *s, void *r, unsigned long n, int t, int op, void *comm, void *st)
{ (void)s; (void)r; (void)n; (void)t; (void)op; (void)comm; (void)st; return 0; }
"""
CLAIM = """
import ctypes, sys, time
nccl = ctypes.CDLL(sys.argv[1])
print("mapped", flush=True)
sys.stdin.readline()
comm, unique = ctypes.c_void_p(), (ctypes.c_char * 128)()
nccl.ncclCommInitRank(ctypes.byref(comm), 400_000, unique, 0)
for _ in range(200):
    nccl.ncclAllReduce(None, None, ctypes.c_ulong(1), 0, 0, comm, None)
    time.sleep(0.005)
"""


def peak_kib(pid: int) -> int:
    """A process's peak resident memory so far (VmHWM)."""
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def test_a_communicator_of_400000_ranks_claimed_costs_fleetd_nothing(stack: TwoNodes,
                                                                       as_nobody):
    """A user's own libnccl initialises a communicator of 400,000 ranks and all-reduces on it:
    its events reach fleetd, which refuses them at intake (a window over so many ranks took
    fleetd past its unit's 4 GiB before); fleetd's peak memory stays where it was."""
    own = as_nobody.work / "stub"
    own.mkdir()
    (own / "stub.c").write_text(STUB_NCCL)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(own / "libnccl.so.2"),
                    str(own / "stub.c")], check=True)
    (as_nobody.work / "claim.py").write_text(CLAIM)
    subprocess.run(["chown", "-R", f"{NOBODY}:{NOBODY}", str(own)], check=True)
    before = peak_kib(stack.fleetd.process.pid)
    claimer = subprocess.Popen(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         "/usr/bin/python3", str(as_nobody.work / "claim.py"), str(own / "libnccl.so.2")],
        env={"PATH": "/usr/bin:/bin", "INGERO_SIM_NODE": "0", "SLURM_JOB_ID": "3604",
             "RANK": "0"}, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert claimer.stdout.readline() == b"mapped\n"
        # attached (its two probes: "no symbol for" the others)
        assert wait_for(lambda: f"{own}/libnccl.so.2: " in stack.agents[0].log(), 30), \
            stack.agents[0].log()[-3000:]
        claimer.stdin.write(b"go\n")
        claimer.stdin.flush()
        assert claimer.wait(30) == 0
        assert wait_for(lambda: metric(stack.fleet_port, "ingero_fleet_events_refused_total",
                                       reason="too_many_ranks") >= 200, 30), \
            stack.fleetd.log()[-3000:]
    finally:
        claimer.kill()
        claimer.wait()
    grown = peak_kib(stack.fleetd.process.pid) - before
    assert grown < 64 * 1024, f"fleetd's peak grew {grown} KiB"
    assert stack.fleetd.alive()


def test_a_key_stolen_from_a_node_speaks_for_that_node_only(stack: TwoNodes):
    """Root on node0 (a compromised node, not a user) takes its agent's key and pushes as
    node1, and as node0 of another cluster, the events of a rank of a job: fleetd
    refuses both (the key is authorised as node0@sim) and counts them; nothing of theirs
    reaches echod, and the real agents go on being heard."""
    stolen = stack.keys.node_secrets[stack.key_name("node0")]
    refused = lambda: metric(stack.fleet_port, "ingero_fleet_frames_rejected_total",  # noqa: E731
                             reason="key_not_node")
    before = refused()
    for node, cluster in (("node1", "sim"), ("node0", "other")):
        producer = Producer(stack.endpoint, stack.keys, node, cluster=cluster, secret=stolen)
        try:
            producer.push(3, job="3605", rank=1, comm_hash="00000000000000c5", nranks=2, seq=0)
            assert producer.collect_acks(3) == 0, f"a push as {node} of {cluster} was taken"
        finally:
            producer.close()
    assert wait_for(lambda: refused() >= before + 2, 10), stack.fleetd.log()[-3000:]
    assert "the key authorised as node0@sim sent a Push as node node1 of cluster sim" \
        in stack.fleetd.log()
    assert stack.client().sql("SELECT count(*) FROM events WHERE job = '3605'")["rows"] == [[0]]
    result = stack.run(scenario("3606", late=6))
    assert result.ok, result.describe()
    assert {v["rank"] for v in stack.verdicts("3606")} == {6}, stack.logs()
