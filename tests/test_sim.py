"""The GPU-less cluster (sim/): its libraries' ABI, the virtual GPU's timing, and whole jobs run
as real processes with injected stragglers. Timing checks compare ratios within one run, with
wide margins, so a noisy 2-core VM does not flake them."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from statistics import median

import pytest

import sim
from sim import scenario as scenarios
from sim.cluster import Cluster
from sim.processes import record_of
from sim.errors import ScenarioError
from sim.records import read_record

REPO = Path(__file__).resolve().parent.parent

CUDART_API = """cudaGetDeviceCount cudaSetDevice cudaGetDevice cudaGetLastError cudaPeekAtLastError
    cudaGetErrorString cudaMalloc cudaFree cudaMallocManaged cudaMallocHost cudaFreeHost cudaMemset
    cudaMemsetAsync cudaLaunchKernel cudaLaunchKernelExC cudaMemcpy cudaMemcpyAsync cudaMemcpy2D
    cudaMemcpy2DAsync cudaMemcpyPeer cudaMemcpyPeerAsync cudaStreamCreate cudaStreamCreateWithFlags
    cudaStreamDestroy cudaStreamSynchronize cudaStreamQuery cudaEventCreate
    cudaEventCreateWithFlags cudaEventRecord cudaEventSynchronize cudaEventQuery
    cudaEventElapsedTime cudaEventDestroy cudaDeviceSynchronize cudaStreamWaitEvent
    cudaEventRecordWithFlags""".split()
CUDA_API = """cuInit cuDeviceGet cuCtxCreate_v2 cuCtxSynchronize cuLaunchKernel cuLaunchKernelEx
    cuMemAlloc_v2 cuMemFree_v2 cuMemcpyHtoD_v2 cuMemcpyDtoH_v2 cuMemcpyAsync
    cuStreamSynchronize""".split()
NCCL_API = """ncclGetVersion ncclGetUniqueId ncclCommInitRank ncclCommInitRankConfig
    ncclCommInitAll ncclCommSplit ncclCommDestroy ncclCommAbort ncclCommCount ncclCommUserRank
    ncclGetErrorString ncclAllReduce ncclAllGather ncclReduceScatter ncclReduce ncclBroadcast
    ncclBcast ncclSend ncclRecv ncclGroupStart ncclGroupEnd ncclCommInitRankScalable
    ncclCommShrink ncclCommFinalize ncclCommGetAsyncError ncclGetLastError ncclAlltoAll
    ncclGather ncclScatter""".split()


@pytest.fixture(scope="module", autouse=True)
def built():
    sim.build()


def job_scenario(name: str = "test", stragglers: list | None = None, **job) -> scenarios.Scenario:
    base = {"nodes": 1, "ranks_per_node": 4, "steps": 6, "step_ms": 10, "host_work_ms": 0.2,
            "allreduce_bytes": 1 << 20, "timeout_s": 20}
    return scenarios.parse({"name": name, "job": base | job, "stragglers": stragglers or []})


def run_job(workdir: Path, scenario: scenarios.Scenario, **cluster_args):
    with Cluster(scenario, workdir, **cluster_args) as cluster:
        result = cluster.wait()
    return cluster, result


def records(result) -> dict[int, object]:
    return {r.rank: read_record(r.record_path) for r in result.ranks}


def dyn_symbols(library: Path) -> list[str]:
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(library)], capture_output=True,
                         text=True, check=True).stdout
    return [line.split()[7] for line in out.splitlines()
            if len(line.split()) >= 8 and line.split()[6] != "UND" and "FUNC" in line]


def dynamic_section(library: Path) -> str:
    return subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True,
                          check=True).stdout


# --- the libraries look like NVIDIA's ------------------------------------------------------

@pytest.mark.parametrize("version", [12, 13])
def test_libcudart_exports_the_runtime_api_versioned_like_nvidias(version):
    soname = f"libcudart.so.{version}"
    library = sim.lib_dir() / soname
    symbols = dyn_symbols(library)
    for name in CUDART_API:
        assert f"{name}@@{soname}" in symbols, name
    assert "SONAME" in dynamic_section(library) and f"[{soname}]" in dynamic_section(library)
    assert os.readlink(sim.lib_dir() / "libcudart.so") == "libcudart.so.13"
    assert not [s for s in symbols if s.startswith(("vgpu_", "sim_", "ingero_sim_"))], \
        "internals leaked"


def test_the_libraries_export_their_apis_and_share_one_gpu_whichever_runtime_is_loaded():
    nccl, cuda = sim.lib_dir() / "libnccl.so.2", sim.lib_dir() / "libcuda.so.1"
    assert set(NCCL_API) <= set(dyn_symbols(nccl))
    assert set(CUDA_API) <= set(dyn_symbols(cuda))
    for library, soname in ((nccl, "libnccl.so.2"), (cuda, "libcuda.so.1")):
        section = dynamic_section(library)
        assert f"Library soname: [{soname}]" in section
        assert "Shared library: [libingero-sim-vgpu.so]" in section
        assert "libcudart" not in section     # NCCL reaches the GPU without the app's runtime
    for version in (13, 12):
        rank = dynamic_section(sim.rank_binary(version))
        for soname in (f"libcudart.so.{version}", "libnccl.so.2", "libcuda.so.1"):
            assert f"Shared library: [{soname}]" in rank
        assert "$ORIGIN/../lib" in rank


@pytest.mark.parametrize("cuda", [13, 12])
def test_jobs_beyond_64_ranks_run_on_either_runtime(tmp_path, cuda):
    """72 ranks (the sim's NCCL took 64 at most), an all-to-all of grouped Send/Recv with every
    peer each step, the ranks linked to CUDA 13's runtime or 12's, one virtual GPU each."""
    scenario = job_scenario(nodes=2, ranks_per_node=36, steps=3, step_ms=5,
                            allreduce_bytes=1 << 12, extra_collectives=["alltoallv"], cuda=cuda)
    cluster, result = run_job(tmp_path, scenario)
    assert result.ok, result.describe()
    assert {r.popen.args[0] for r in cluster.ranks} == {str(sim.rank_binary(cuda))}
    truth = records(result)
    assert len(truth) == 72 and all(r.summary["nranks"] == 72 for r in truth.values())
    assert all(len(r.ops("ncclSend")) == 72 * 3 for r in truth.values())


def test_make_is_up_to_date_after_a_build():
    assert subprocess.run(["make", "-C", str(REPO / "sim"), "-q"]).returncode == 0


def test_comm_id_hash_is_the_splitmix64_fold_of_the_header():
    assert sim.splitmix64(0) == 0xE220A8397B1DCDAF
    unique_id = bytes(range(128))
    h = 0
    for i in range(16):
        h = sim.splitmix64(h ^ int.from_bytes(unique_id[8 * i:8 * i + 8], "little"))
    assert sim.comm_id_hash(unique_id) == h
    header = (REPO / "sim/include/ingero_sim.h").read_text()
    magic = re.search(r"#define INGERO_SIM_KERNEL_MAGIC (0x[0-9a-fA-F]+)ULL", header).group(1)
    assert int(magic, 16) == sim.KERNEL_MAGIC
    with pytest.raises(ValueError):
        sim.comm_id_hash(b"short")


# --- the virtual GPU, driven directly through ctypes -----------------------------------------

VGPU_PROBE = textwrap.dedent("""
    import ctypes, json, sys, time
    from ctypes import POINTER, Structure, byref, c_float, c_size_t, c_uint, c_uint64, c_void_p
    lib = sys.argv[1]
    cudart = ctypes.CDLL(lib + "/libcudart.so.12")
    class Dim3(Structure):
        _fields_ = [("x", c_uint), ("y", c_uint), ("z", c_uint)]
    class Kernel(Structure):
        _fields_ = [("magic", c_uint64), ("duration_ns", c_uint64)]
    cudart.cudaLaunchKernel.argtypes = [c_void_p, Dim3, Dim3, c_void_p, c_size_t, c_void_p]
    cudart.cudaGetErrorString.restype = ctypes.c_char_p
    kernel = Kernel(int(sys.argv[2]), 150_000_000)
    stream, start, end = c_void_p(), c_void_p(), c_void_p()
    assert cudart.cudaStreamCreate(byref(stream)) == 0
    cudart.cudaEventCreate(byref(start)); cudart.cudaEventCreate(byref(end))
    cudart.cudaEventRecord(start, stream)
    t0 = time.monotonic()
    launched = cudart.cudaLaunchKernel(byref(kernel), Dim3(8, 1, 1), Dim3(128, 1, 1), None, 0,
                                       stream)
    launch_s = time.monotonic() - t0
    cudart.cudaEventRecord(end, stream)
    query = cudart.cudaStreamQuery(stream)
    t1 = time.monotonic()
    synced = cudart.cudaStreamSynchronize(stream)
    sync_s = time.monotonic() - t1
    ms = c_float()
    elapsed = cudart.cudaEventElapsedTime(byref(ms), start, end)
    bad_free = cudart.cudaFree(c_void_p(12345))
    last = cudart.cudaGetLastError()
    cleared = cudart.cudaGetLastError()
    print(json.dumps({"launched": launched, "launch_s": launch_s, "query": query,
                      "synced": synced, "sync_s": sync_s, "elapsed": elapsed, "ms": ms.value,
                      "bad_free": bad_free, "last": last, "cleared": cleared,
                      "no_error": cudart.cudaGetErrorString(0).decode()}))
""")


def run_probe(script: str, *args: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", script, str(sim.lib_dir()), *args],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, **(env or {})))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_kernels_run_asynchronously_and_syncs_sleep_until_the_device_is_done():
    probe = run_probe(VGPU_PROBE, str(sim.KERNEL_MAGIC))
    assert probe["launched"] == 0 and probe["synced"] == 0 and probe["elapsed"] == 0
    assert probe["launch_s"] < 0.05, "a launch must return before the kernel runs"
    assert probe["query"] == 600, "cudaErrorNotReady while the kernel runs"
    assert probe["sync_s"] >= 0.14, "cudaStreamSynchronize must wait for the 150 ms kernel"
    # Virtual device times: the kernel's 150 ms exactly, plus the host's gap between recording
    # the start event and launching (the device idles meanwhile).
    assert 150.0 <= probe["ms"] < 150.0 + probe["launch_s"] * 1e3 + 5
    assert probe["bad_free"] == 1 and probe["last"] == 1 and probe["cleared"] == 0
    assert probe["no_error"] == "no error"


def test_a_slow_gpu_stretches_kernel_durations():
    probe = run_probe(VGPU_PROBE, str(sim.KERNEL_MAGIC), env={"INGERO_SIM_GPU_SLOWDOWN": "2"})
    assert 300.0 <= probe["ms"] < 310.0


NCCL_PROBE = textwrap.dedent("""
    import ctypes, json, sys, threading
    from ctypes import Structure, byref, c_char, c_int, c_size_t, c_void_p
    lib = sys.argv[1]
    cudart = ctypes.CDLL(lib + "/libcudart.so.12")
    nccl = ctypes.CDLL(lib + "/libnccl.so.2")
    class UniqueId(Structure):
        _fields_ = [("internal", c_char * 128)]
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(c_void_p), c_int, UniqueId, c_int]
    nccl.ncclAllReduce.argtypes = [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p,
                                   c_void_p]
    nccl.ncclCommSplit.argtypes = [c_void_p, c_int, c_int, ctypes.POINTER(c_void_p), c_void_p]
    uid = UniqueId()
    assert nccl.ncclGetUniqueId(byref(uid)) == 0
    comms, results = [c_void_p(), c_void_p()], {}
    def rank(r):
        # The id travels by value; rank is the third integer argument.
        results[f"init{r}"] = nccl.ncclCommInitRank(byref(comms[r]), 2, uid, r)
        buf, stream = c_void_p(), c_void_p()
        cudart.cudaMalloc(byref(buf), 4096)
        cudart.cudaStreamCreate(byref(stream))
        results[f"allreduce{r}"] = nccl.ncclAllReduce(buf, buf, 1024, 7, 0, comms[r], stream)
        results[f"sync{r}"] = cudart.cudaStreamSynchronize(stream)
        child = c_void_p()
        results[f"split{r}"] = nccl.ncclCommSplit(comms[r], 0, -r, byref(child), None)
        got = c_int()
        nccl.ncclCommUserRank(comms[r], byref(got)); results[f"rank{r}"] = got.value
        nccl.ncclCommUserRank(child, byref(got)); results[f"child_rank{r}"] = got.value
        nccl.ncclCommCount(child, byref(got)); results[f"child_count{r}"] = got.value
        results[f"destroy{r}"] = nccl.ncclCommDestroy(child) or nccl.ncclCommDestroy(comms[r])
    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]; [t.join(30) for t in threads]
    version = c_int()
    nccl.ncclGetVersion(byref(version))
    results["version"] = version.value
    print(json.dumps(results))
""")


@pytest.fixture
def coordinator():
    """A TCP rendezvous coordinator on a random loopback port; yields its tcp:// address."""
    process = subprocess.Popen([sys.executable, "-m", "sim.rendezvous", "--listen",
                                "127.0.0.1:0"], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        words = process.stdout.readline().split()
        assert words[0] == "listening"
        yield words[1]
    finally:
        process.terminate()
        process.wait(10)
        process.stdout.close()


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_nccl_abi_by_value_unique_id_and_split(transport, request):
    address = request.getfixturevalue("coordinator") if transport == "tcp" else "shm"
    probe = run_probe(NCCL_PROBE, env={"INGERO_SIM_TIMEOUT_S": "10",
                                       "INGERO_SIM_RENDEZVOUS": address})
    for r in (0, 1):
        for call in ("init", "allreduce", "sync", "split", "destroy"):
            assert probe[f"{call}{r}"] == 0, (call, r, probe)
        assert probe[f"rank{r}"] == r
        assert probe[f"child_count{r}"] == 2
    assert (probe["child_rank0"], probe["child_rank1"]) == (1, 0), "split orders ranks by key"
    assert probe["version"] == 22809     # NCCL 2.28.9, as REAL-GPU.md's stack


# --- whole jobs ----------------------------------------------------------------------------

EXTRAS = ["allgather", "reducescatter", "broadcast", "reduce", "sendrecv"]
# How many elements each op moves: the whole gradient, or one rank's share of it.
WHOLE, SHARE = "whole", "share"
OPS = {"ncclAllReduce": WHOLE, "ncclAllGather": SHARE, "ncclReduceScatter": SHARE,
       "ncclBroadcast": WHOLE, "ncclReduce": WHOLE, "ncclSend": SHARE, "ncclRecv": SHARE}


def test_healthy_two_node_job_records_every_collective(tmp_path):
    steps, nbytes = 6, 1 << 20
    scenario = job_scenario(nodes=2, ranks_per_node=4, steps=steps, allreduce_bytes=nbytes,
                            extra_collectives=EXTRAS, dtype="bfloat16")
    cluster, result = run_job(tmp_path, scenario)
    assert result.ok, result.describe()
    unique_id = cluster.unique_id_path.read_bytes()
    hashes = set()
    for process in cluster.ranks:
        record = read_record(process.record_path)
        assert record.summary["status"] == "ok" and record.summary["steps_done"] == steps
        assert record.summary["pid"] == process.pid
        assert (record.summary["rank"], record.summary["node"]) == (process.rank, process.node)
        assert record.summary["local_rank"] == process.local_rank
        assert record.summary["job_id"] == scenario.job.job_id
        for op, size in OPS.items():
            calls = record.ops(op)
            assert len(calls) == steps, (op, process.rank)
            expected_count = (nbytes // 2) // (8 if size == SHARE else 1)
            assert all(c["count"] == expected_count and c["bytes"] == expected_count * 2
                       and c["datatype"] == "ncclBfloat16" and c["datatype_id"] == 9
                       for c in calls), op
        # Send/Recv number their calls per peer; the collectives' sequence skips them.
        p2p = ("ncclSend", "ncclRecv")
        assert [c["seq"] for c in record.collectives if c["op"] not in p2p] == \
            list(range((len(OPS) - len(p2p)) * steps))
        for op in p2p:
            assert [c["seq"] for c in record.ops(op)] == list(range(steps))
        assert all(c["nranks"] == 8 for c in record.collectives)
        hashes |= {c["comm_id_hash"] for c in record.collectives}
        step_ns = record.summary["step_ns"]
        assert max(step_ns) < 10 * median(step_ns), "a step stalled: a lost device wake-up?"
        assert median(step_ns) < 0.5e9, "10 ms steps take ~1 s only if device wake-ups are lost"
    assert hashes == {sim.comm_id_hash(unique_id)}
    assert not Path(f"/dev/shm/ingero-sim-{sim.comm_id_hash(unique_id):016x}").exists()
    sends = read_record(cluster.ranks[3].record_path).ops("ncclSend")
    assert {c["peer"] for c in sends} == {4}, "ring: rank 3 sends to rank 4"


def test_host_delay_straggler_enters_late_and_its_peers_wait(tmp_path):
    delay_ms, first = 60, 3
    scenario = job_scenario(steps=7, step_ms=10, stragglers=[
        {"rank": 2, "kind": "host_delay", "delay_ms": delay_ms, "from_step": first}])
    _, result = run_job(tmp_path, scenario)
    assert result.ok, result.describe()
    recs = records(result)
    peers = [0, 1, 3]
    for step in range(7):
        late = recs[2].at_step(step)["entry_ns"]
        lag_ms = (late - median(recs[p].at_step(step)["entry_ns"] for p in peers)) / 1e6
        if step >= first:
            assert delay_ms * 0.6 < lag_ms < delay_ms * 1.6, (step, lag_ms)
        else:
            assert abs(lag_ms) < delay_ms * 0.4, (step, lag_ms)
    for p in peers:
        steps = recs[p].summary["step_ns"]
        before, after = median(steps[:first]), median(steps[first:])
        assert after - before > delay_ms * 0.5e6, "peers must wait for the late rank (lockstep)"
        waits = recs[p].summary["sync_wait_ns"]
        assert median(waits[first:]) > 3 * median(recs[2].summary["sync_wait_ns"][first:])


def test_slow_gpu_slows_the_whole_job(tmp_path):
    healthy = job_scenario(steps=5, step_ms=30)
    slow = job_scenario(steps=5, step_ms=30,
                        stragglers=[{"rank": 1, "kind": "slow_gpu", "factor": 3.0}])
    _, fast_result = run_job(tmp_path / "healthy", healthy)
    _, slow_result = run_job(tmp_path / "slow", slow)
    assert fast_result.ok and slow_result.ok
    fast, slowed = records(fast_result), records(slow_result)
    for rank in range(4):
        ratio = median(slowed[rank].summary["step_ns"]) / median(fast[rank].summary["step_ns"])
        assert ratio > 1.8, (rank, ratio)
    # The slow GPU's own rank waits on its own kernels; its peers wait on it.
    assert median(slowed[0].summary["sync_wait_ns"]) > median(fast[0].summary["sync_wait_ns"]) * 1.8


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_dead_rank_makes_peers_error_out_after_the_timeout(tmp_path):
    scenario = job_scenario(steps=6, timeout_s=3,
                            stragglers=[{"rank": 1, "kind": "die", "at_step": 2}])
    cluster = Cluster(scenario, tmp_path).start()
    try:
        dead = cluster.ranks[1].popen
        dead.wait(30)
        died_at = time.monotonic()
        time.sleep(0.3)
        peers = [p.pid for p in cluster.ranks if p.rank != 1]
        before = {pid: cpu_seconds(pid) for pid in peers}
        time.sleep(1.5)
        used = {pid: cpu_seconds(pid) - before[pid] for pid in peers}
        result = cluster.wait(30)
        errored_after = time.monotonic() - died_at
    finally:
        cluster.stop()
    assert all(cpu < 0.15 for cpu in used.values()), f"waiting ranks burn CPU: {used}"
    assert result.rank(1).status == "died" and result.rank(1).exit_code == 1
    for rank in (0, 2, 3):
        assert result.rank(rank).status == "error" and result.rank(rank).exit_code == 3
        summary = read_record(result.rank(rank).record_path).summary
        assert summary["status"] == "error" and "timed out" in summary["error"]
        assert summary["steps_done"] == 2
    assert 2.0 < errored_after < 20, errored_after
    assert read_record(result.rank(1).record_path).summary is None
    assert len(read_record(result.rank(1).record_path).ops("ncclAllReduce")) == 2
    assert "rank 1" in result.describe() and "died" in result.describe()


def test_a_hung_rank_is_killed_and_reported(tmp_path):
    scenario = job_scenario(steps=6, timeout_s=2,
                            stragglers=[{"rank": 3, "kind": "hang", "at_step": 1}])
    _, result = run_job(tmp_path, scenario, failure_grace_s=1.0)
    assert result.rank(3).status == "killed" and result.rank(3).exit_code is None
    assert [result.rank(r).status for r in (0, 1, 2)] == ["error"] * 3


def test_tcp_rendezvous_between_processes(tmp_path):
    scenario = job_scenario(nodes=2, ranks_per_node=2, steps=4, rendezvous="tcp",
                            extra_collectives=["sendrecv", "broadcast"])
    cluster, result = run_job(tmp_path, scenario)
    assert result.ok, result.describe()
    assert cluster.rendezvous_address.startswith("tcp://127.0.0.1:")
    assert cluster.coordinator.poll() is not None, "the coordinator stops with the cluster"
    hashes = {c["comm_id_hash"] for rec in records(result).values() for c in rec.collectives}
    assert hashes == {cluster.comm_id_hash()}
    assert all(len(rec.collectives) == 4 * 4 for rec in records(result).values())


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("ip"),
                    reason="network namespaces need root and iproute2")
def test_nodes_in_their_own_network_namespaces(tmp_path):
    scenario = job_scenario(nodes=2, ranks_per_node=2, steps=4, netns=True)
    cluster, result = run_job(tmp_path, scenario)
    assert result.ok, result.describe()
    namespaces = {r.rank: read_record(r.record_path).summary["net_ns"] for r in result.ranks}
    ours = os.stat("/proc/self/ns/net").st_ino
    assert namespaces[0] == namespaces[1] != namespaces[2] == namespaces[3]
    assert ours not in namespaces.values()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert cluster.networks.token not in listed, "namespaces are removed with the cluster"


def test_cpu_contention_pins_a_real_hog_to_the_ranks_cpu(tmp_path):
    scenario = job_scenario(steps=40, step_ms=10,
                            stragglers=[{"rank": 1, "kind": "cpu_contention", "hogs": 1}])
    with Cluster(scenario, tmp_path) as cluster:
        rank = cluster.ranks[1]
        [hog] = cluster.hogs
        time.sleep(0.2)
        assert Path(f"/proc/{hog.pid}/comm").read_text().strip() == "ingero-hog"
        assert os.sched_getaffinity(hog.pid) == {hog.cpu} == {rank.cpu}
        for task in Path(f"/proc/{rank.pid}/task").iterdir():
            assert os.sched_getaffinity(int(task.name)) == {rank.cpu}, "every rank thread"
        if len(os.sched_getaffinity(0)) > 1:
            assert rank.cpu not in os.sched_getaffinity(cluster.ranks[0].pid)
        result = cluster.wait()
    assert result.ok, result.describe()
    assert hog.popen.poll() is not None, "the hog ends with its scenario"


# --- scenarios and the command line ---------------------------------------------------------

def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


# launcher → (SLURM_PROCID of rank 5 of a 2 × 4 job, the variable its rank is in, whether its
# node's launcher maps libcudart)
LAUNCHED = {"srun": ("5", "SLURM_PROCID", None), "torchrun": ("1", "RANK", True),
            "torchrun-batch": ("0", "RANK", True), "mpirun": ("1", "OMPI_COMM_WORLD_RANK", False),
            "bare": (None, "RANK", True)}


@pytest.mark.parametrize("launcher", scenarios.LAUNCHERS)
def test_every_launcher_starts_its_ranks_as_it_does_for_real(tmp_path, launcher):
    procid, variable, maps_cudart = LAUNCHED[launcher]
    scenario = job_scenario(nodes=2, launcher=launcher, steps=40, job_id="61")
    with Cluster(scenario, tmp_path) as cluster:
        rank = next(r for r in cluster.ranks if r.rank == 5)
        seen, parent = environ_of(rank.pid), parent_of(rank.pid)
        parent_maps = Path(f"/proc/{parent}/maps").read_text()
        result = cluster.wait()
    assert result.ok, result.describe()
    assert seen.get("SLURM_PROCID") == procid and seen[variable] == "5"
    assert seen["INGERO_SIM_NODE"] == "1"
    assert ("SLURM_JOB_ID" in seen) == (launcher != "bare")
    if maps_cudart is None:
        assert parent == os.getpid(), "srun: the rank is a task of its own"
    else:
        assert parent != os.getpid(), "the rank is its node launcher's child"
        assert ("libcudart.so.13" in parent_maps) == maps_cudart
    truth = records(result)
    assert all(r.summary["rank"] == n and r.summary["nranks"] == 8 for n, r in truth.items())
    assert truth[5].summary["job_id"] == "61" and truth[5].summary["node"] == 1


def test_a_launched_rank_that_dies_or_hangs_is_reported_as_with_srun(tmp_path):
    scenario = job_scenario(nodes=2, launcher="torchrun", steps=20, timeout_s=2, stragglers=[
        {"rank": 6, "kind": "hang", "at_step": 3}])
    _cluster, result = run_job(tmp_path, scenario)
    assert result.rank(6).status == "killed"
    assert {r.status for r in result.ranks if r.rank != 6} == {"error"}


def children_named(pid: int, comm: str) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if parent_of(int(entry.name)) == pid and \
                        (entry / "comm").read_text().strip() == comm:
                    found.add(int(entry.name))
            except (OSError, ValueError, IndexError):
                pass
    return found


def test_data_loader_workers_are_forked_each_epoch_map_libcudart_and_exit(tmp_path):
    scenario = job_scenario(ranks_per_node=2, steps=30, step_ms=40, workers=2, epoch_steps=10)
    seen: list[set[int]] = []
    looked = 0
    with Cluster(scenario, tmp_path) as cluster:
        rank = cluster.ranks[0]
        while rank.popen.poll() is None:
            workers = children_named(rank.pid, "pt_data_worker")
            if len(workers) == 2 and workers not in seen:
                seen.append(workers)
            for worker in workers:
                try:
                    maps = Path(f"/proc/{worker}/maps").read_text()
                    same = environ_of(worker) == environ_of(rank.pid)
                except OSError:
                    continue            # gone meanwhile
                if maps:                # not exiting
                    assert "libcudart.so.13" in maps and same
                    looked += 1
            time.sleep(0.05)
        result = cluster.wait()
    assert result.ok, result.describe()
    assert len(seen) >= 2 and looked, seen
    assert not seen[0] & seen[-1], "the workers of a later epoch are new processes"
    assert (tmp_path / "input.bin").stat().st_size == 32 << 20


def test_a_slow_input_stalls_its_rank_waiting_for_its_data(tmp_path):
    fast = job_scenario(ranks_per_node=2, steps=12, step_ms=10, workers=2)
    slow = job_scenario(ranks_per_node=2, steps=12, step_ms=10, workers=2, stragglers=[
        {"rank": 1, "kind": "slow_input", "delay_ms": 100}])
    times = []
    for name, scenario in (("fast", fast), ("slow", slow)):
        _cluster, result = run_job(tmp_path / name, scenario)
        assert result.ok, result.describe()
        times.append(median(read_record(result.rank(1).record_path).summary["step_ns"]))
    assert times[1] > 3 * times[0], times      # 100 ms a read, two workers: ~50 ms a step


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_steps_of_a_job_and_an_elastic_restart_are_runs_of_their_own(tmp_path, launcher):
    scenario = job_scenario(nodes=2, ranks_per_node=2, steps=12, launcher=launcher,
                            steps_in_job=2, restart_at=5, job_id="62")
    cluster, result = run_job(tmp_path, scenario)
    assert result.ok, result.describe()
    variable = "TORCHELASTIC_RESTART_COUNT" if launcher == "torchrun" else "SLURM_RESTART_COUNT"
    hashes = set()
    for step in (0, 1):
        last = result.rank(3, step)
        assert (last.step, last.generation, last.status) == (step, 1, "ok")
        record = read_record(last.record_path)
        assert [c["step"] for c in record.ops("ncclAllReduce")] == list(range(5, 12))
        first = read_record(record_of(tmp_path, 3, step, 0))
        assert [c["step"] for c in first.ops("ncclAllReduce")] == list(range(5))
        hashes |= {record.summary["comm_id_hash"], first.collectives[0]["comm_id_hash"]}
    assert len(hashes) == 4, "every step and every restart made its own communicator"
    assert len({r.pid for r in result.ranks if r.rank == 3}) >= 2
    assert cluster._launcher_env(3, 1, 1, generation=1)[variable] == "1"


def test_every_example_scenario_validates():
    names = {p.stem for p in scenarios.scenarios_dir().glob("*.yaml")}
    assert {"healthy", "host-delay", "cpu-contention", "slow-gpu", "hiccup", "slow-from-start",
            "two-stragglers", "rank-dies", "rank-hangs", "two-nodes"} <= names
    for path in scenarios.scenarios_dir().glob("*.yaml"):
        scenarios.load(path)
    two_nodes = scenarios.load(scenarios.scenarios_dir() / "two-nodes.yaml")
    assert (two_nodes.job.nodes, two_nodes.job.ranks_per_node) == (2, 4)


@pytest.mark.parametrize("data, complaint", [
    ({"name": "x", "job": {"stepz": 3}}, "job.stepz: unknown key"),
    ({"name": "x", "job": {"steps": 0}}, "job.steps: must be >= 1"),
    ({"name": "x", "stragglers": [{"rank": 9, "kind": "die", "at_step": 1}]},
     "stragglers[0].rank: must be <= 3"),
    ({"name": "x", "stragglers": [{"rank": 1, "kind": "die", "at_step": 99}]},
     "stragglers[0].at_step: must be below job.steps"),
    ({"name": "x", "stragglers": [{"rank": 1, "kind": "host_delay"}]}, "delay_ms: required"),
    ({"name": "x", "stragglers": [{"rank": 1, "kind": "nap"}]}, "kind: must be one of"),
    ({"name": "x", "job": {"netns": True, "rendezvous": "shm"}}, "need job.rendezvous: tcp"),
    ({"name": "x", "job": {"launcher": "pbs"}}, "job.launcher: must be one of srun, torchrun"),
    ({"name": "x", "stragglers": [{"rank": 1, "kind": "slow_input", "delay_ms": 5}]},
     "slow_input slows the rank's data-loader workers: set job.workers"),
    ({"job": {}}, "name: required"),
    ({"name": "x", "job": {"nccl_init": "eager"}}, "job.nccl_init: must be one of config"),
    ({"name": "x", "job": {"subgroups": [[0, 9]]}}, "job.subgroups: rank 9 is not below"),
    ({"name": "x", "job": {"subgroups": [0, 1]}}, "job.subgroups: must be a list of 1 to 8"),
    ({"name": "x", "job": {"subgroups": [[1, 1]]}}, "a rank is listed twice"),
    ({"name": "x", "job": {"subgroups": [[0, 1]]}, "stragglers": [
        {"rank": 2, "kind": "host_delay", "delay_ms": 5, "before": "subgroup"}]},
     "stragglers[0].before: rank 2 is in no job.subgroups"),
    ({"name": "x", "job": {"extra_collectives": ["alltoallw"]}}, "must be one of"),
    ({"name": "x", "stragglers": [
        {"rank": 2, "kind": "host_delay", "delay_ms": 5, "before": "alltoallv"}]},
     "stragglers[0].before: alltoallv is not in job.extra_collectives"),
    ({"name": "x", "job": {"graphs": {"from_step": 20}}}, "job.graphs.from_step: must be below"),
    ({"name": "x", "job": {"graphs": {"from": 2}}}, "job.graphs: must be a mapping with from_step"),
    ({"name": "x", "job": {"loop": "pytorch", "graphs": {"from_step": 2}}},
     "job.loop: pytorch takes no"),
    ({"name": "x", "job": {"loop": "jax"}}, "job.loop: must be one of sim, pytorch"),
    ({"name": "x", "job": {"cuda": 11}}, "job.cuda: must be one of 13, 12, got 11"),
    ({"name": "x", "job": {"nodes": 64, "ranks_per_node": 9}},
     "64 nodes of 9 ranks make 576; the sim's NCCL takes 512 at most"),
    ({"name": "x", "job": {"gemm_share": 1.5}}, "job.gemm_share: must be a share from 0 to 1"),
])
def test_bad_scenarios_are_rejected_with_the_field_named(data, complaint):
    with pytest.raises(ScenarioError, match=re.escape(complaint)):
        scenarios.parse(data)


def test_cli_runs_a_scenario_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text("name: tiny\njob: {ranks_per_node: 2, steps: 3, step_ms: 5}\n")
    out = subprocess.run([sys.executable, "-m", "sim", "run", str(path), "--json",
                          "--workdir", str(tmp_path / "run")], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["ok"] and [r["status"] for r in summary["ranks"]] == ["ok", "ok"]
    bad = subprocess.run([sys.executable, "-m", "sim", "check", str(tmp_path / "missing.yaml")],
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read" in bad.stderr


def test_the_last_instance_every_rank_entered_is_read_from_the_records(tmp_path):
    """What ``Stack.wait_judged`` waits for: per communicator, the last collective all its
    ranks entered (a rank that stopped early holds it back), as fleetd and echod write the
    communicator's hash; sends and receives, which fleetd summarises no lag of, left out."""
    from stack.local import last_instances

    result = run_job(tmp_path, job_scenario(steps=5, timeout_s=2, extra_collectives=["sendrecv"],
                                            stragglers=[{"rank": 3, "kind": "die",
                                                         "at_step": 3}]))[1]
    found = records(result)
    comms = {f"{c['comm_id_hash']:016x}" for r in found.values() for c in r.collectives}
    assert last_instances([r.record_path for r in result.ranks]) == {
        comm: min(max(c["seq"] for c in r.collectives if c["op"] == "ncclAllReduce")
                  for r in found.values()) for comm in comms}
    assert {c["op"] for r in found.values() for c in r.collectives} >= {"ncclSend", "ncclRecv"}
