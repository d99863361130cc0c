"""ingerod's eBPF tracing: real bcc, real uprobes on the sim's libraries and on NVIDIA's."""

from __future__ import annotations

import collections
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import sim
from ingero.analysis.lag import peer_lag
from stack.launch import wait_for
from stack.local import AGENT_STOP_S
from sim import scenario as scenarios
from sim.cluster import Cluster
from sim.records import read_record

from .support import needs_ebpf

pytestmark = needs_ebpf

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", autouse=True)
def built():
    sim.build()


def sim_libraries() -> str:
    return sim.traced_libraries()


class Trace:
    """``ingerod trace --json`` as a real process; ``stop()`` returns what it printed."""

    def __init__(self, tmp_path: Path, name: str, *args: str, env: dict | None = None):
        self.out_path, self.err_path = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.err"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ingerod", "trace", "--json", *args], cwd=REPO,
            stdout=open(self.out_path, "w"), stderr=open(self.err_path, "w"),
            env={**os.environ, "INGEROD_RESCAN_INTERVAL": "0.2", "INGEROD_LOG_LEVEL": "debug",
                 **(env or {})})
        ready = wait_for(lambda: "tracing;" in self.err_path.read_text()
                         or self.process.poll() is not None, 60)
        assert ready and self.process.poll() is None, self.err_path.read_text()

    def stop(self) -> tuple[list[dict], int]:
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(30) == 0, self.err_path.read_text()
        summary = self.err_path.read_text().strip().splitlines()[-1]
        shown, lost = (int(word) for word in summary.replace(",", "").split()[::3][:2])
        events = [json.loads(line) for line in self.out_path.read_text().splitlines()]
        assert len(events) == shown
        return events, lost


def run_job(tmp_path: Path, scenario: scenarios.Scenario, timeout: float = 120):
    with Cluster(scenario, tmp_path / f"job-{scenario.name}") as cluster:
        result = cluster.wait(timeout)
        ranks = list(cluster.ranks)
    assert result.ok, result.describe()
    return ranks


def collectives_of(events: list[dict], pid: int) -> list[dict]:
    return sorted((e["attrs"] for e in events
                   if e["kind"] == "collective" and e["attrs"]["pid"] == pid),
                  key=lambda a: (a["seq"], a["op"]))   # Send/Recv have a sequence of their own


def job(name: str, stragglers=(), **fields) -> scenarios.Scenario:
    base = {"nodes": 1, "ranks_per_node": 4, "steps": 12, "step_ms": 10,
            "allreduce_bytes": 1 << 20, "timeout_s": 30}
    return scenarios.parse({"name": name, "job": base | fields, "stragglers": list(stragglers)})


def test_two_nodes_every_collective_exactly_once(tmp_path):
    traces = [Trace(tmp_path, f"node{n}", "--libraries", sim_libraries(),
                    "--match-env", f"INGERO_SIM_NODE={n}") for n in (0, 1)]
    ranks = run_job(tmp_path, job("two-nodes", nodes=2, extra_collectives=[
        "allgather", "reducescatter", "broadcast", "sendrecv"]))
    seen = [trace.stop() for trace in traces]
    hashes = set()
    for node, (events, lost) in enumerate(seen):
        assert lost == 0
        mine = {r.pid for r in ranks if r.node == node}
        assert {e["attrs"]["pid"] for e in events} <= mine, "a tracer saw another node's rank"
        for rank in (r for r in ranks if r.node == node):
            truth = read_record(rank.record_path).collectives
            traced = collectives_of(events, rank.pid)
            assert len(traced) == len(truth), f"rank {rank.rank}"
            for want, got in zip(sorted(truth, key=lambda c: (c["seq"], c["op"])), traced):
                assert got["op"] == want["op"] and got["seq"] == want["seq"]
                assert got["bytes"] == want["bytes"] and got["count"] == want["count"]
                assert (got["comm_rank"], got["nranks"]) == (want["rank"], want["nranks"])
                assert got["rank"] == rank.rank and got["job"] == want["job_id"]
                assert int(got["comm_hash"], 16) == want["comm_id_hash"]
                if want["peer"] >= 0:
                    assert got["peer"] == want["peer"]
                hashes.add(got["comm_hash"])
    assert len(hashes) == 1, "every rank of the communicator carries the same comm_id_hash"


def test_entry_lag_names_the_rank_delayed_on_the_host(tmp_path):
    delayed, delay_ms = 2, 30
    trace = Trace(tmp_path, "trace", "--libraries", sim_libraries())
    ranks = run_job(tmp_path, job("host-delay", stragglers=[
        {"rank": delayed, "kind": "host_delay", "delay_ms": delay_ms, "from_step": 4}]))
    events, lost = trace.stop()
    assert lost == 0
    order = sorted(ranks, key=lambda r: r.rank)
    entry = {(e["attrs"]["pid"], e["attrs"]["seq"]): e["t"] for e in events
             if e["kind"] == "collective" and e["attrs"]["op"] == "ncclAllReduce"}
    seqs = sorted({seq for pid, seq in entry if pid == order[0].pid})
    times = np.array([[entry[(r.pid, s)] for r in order] for s in seqs])
    lag = peer_lag(times[4:])
    mean_lag = lag.mean(axis=0)
    assert int(np.argmax(mean_lag)) == delayed, mean_lag
    assert mean_lag[delayed] > 0.5 * delay_ms / 1000



def test_a_pytorch_step_s_loss_read_waits_on_its_all_reduce_through_the_event_chain(tmp_path):
    """PyTorch runs NCCL on the process group's own stream: the compute stream records an
    event per gradient bucket, the NCCL stream waits on it and all-reduces, and the compute
    stream waits on the NCCL stream's event before the optimizer. The step's only sync, the
    loss read on the compute stream, then waits on the last bucket's all-reduce, and is told
    as a wait on that collective's peers (it read as the rank's own work: the compute stream
    had no collective of its own)."""
    trace = Trace(tmp_path, "trace", "--libraries", sim_libraries())
    ranks = run_job(tmp_path, job("pytorch", loop="pytorch", buckets=3, kernels=6, steps=10,
                                  sync_every=2))
    events, lost = trace.stop()
    assert lost == 0
    for rank in ranks:
        collectives = collectives_of(events, rank.pid)
        assert [c["seq"] for c in collectives] == list(range(30))
        assert len({c["stream"] for c in collectives}) == 1
        syncs = [e["attrs"] for e in events if e["kind"] == "sync"
                 and e["attrs"]["pid"] == rank.pid]
        assert len(syncs) == 5 and all(s["stream"] != collectives[0]["stream"] for s in syncs)
        assert [(s["peer_wait"], s.get("seq")) for s in syncs] == [
            (True, 3 * step + 2) for step in (1, 3, 5, 7, 9)], syncs
        assert {s["comm_hash"] for s in syncs} == {collectives[0]["comm_hash"]}


def test_collectives_captured_in_a_cuda_graph_are_told_at_every_replay(tmp_path):
    """From step 4 each step is one CUDA graph's replay: its all-reduce and all-gather were
    captured once (NCCL was called then, and never again) and run at every cudaGraphLaunch,
    which calls no NCCL entry point. Each replay tells both, with the communicator's next
    sequence numbers, as the ranks' own records number them; the capture tells none (it ran
    nothing)."""
    trace = Trace(tmp_path, "trace", "--libraries", sim_libraries())
    ranks = run_job(tmp_path, job("graphs", graphs={"from_step": 4}, steps=12,
                                  extra_collectives=["allgather"]))
    events, lost = trace.stop()
    assert lost == 0
    for rank in ranks:
        told = [(c["op"], c["seq"], c.get("graph", False))
                for c in collectives_of(events, rank.pid)]
        done = [(c["op"], c["seq"], c["step"] >= 4)
                for c in read_record(rank.record_path).collectives]
        assert told == sorted(done, key=lambda c: (c[1], c[0])) and len(told) == 24, told

def test_sched_switch_names_the_competing_process(tmp_path):
    contended = 2
    trace = Trace(tmp_path, "trace", "--libraries", sim_libraries())
    ranks = run_job(tmp_path, job("contention", steps=20, step_ms=20, host_work_ms=3, stragglers=[
        {"rank": contended, "kind": "cpu_contention", "hogs": 2, "nice": -5}]))
    events, lost = trace.stop()
    by_rank = collections.Counter()
    for e in events:
        a = e["attrs"]
        if e["kind"] == "preempted" and a["preemptor_comm"] == "ingero-hog":
            by_rank[a["rank"]] += a["count"]
    assert by_rank[contended] > 0, "no preemption of the contended rank by ingero-hog recorded"
    assert set(by_rank) == {contended}, by_rank
    assert {r.rank for r in ranks} >= {contended}


def test_a_sync_lasts_as_long_as_the_gpu_kept_it_not_its_busy_hosts_wake_up(tmp_path):
    """Two busy loops at nice -10 share rank 2's CPU: woken from a sync, it often waits behind
    them for its CPU, for milliseconds. That wait is its host's, not its GPU's: a sync on its
    own kernels (the loss read) must last until its GPU was done (the sim's record says when),
    or its GPU looks slow."""
    contended = 2
    trace = Trace(tmp_path, "trace", "--libraries", sim_libraries())
    ranks = run_job(tmp_path, job("late-wake", steps=60, step_ms=20, stragglers=[
        {"rank": contended, "kind": "cpu_contention", "hogs": 2, "nice": -10}]))
    events, lost = trace.stop()
    assert lost == 0
    rank = next(r for r in ranks if r.rank == contended)
    traced = [e["attrs"]["duration_ns"] for e in sorted(events, key=lambda e: e["t"])
              if e["kind"] == "sync" and e["attrs"]["pid"] == rank.pid
              and not e["attrs"]["peer_wait"]]
    summary = read_record(rank.record_path).summary
    held, device = (np.array(summary[name], float) for name in ("loss_sync_ns", "loss_device_ns"))
    read = held > 0
    assert len(traced) == read.sum(), (len(traced), read.sum())
    late = held[read] - device[read]
    delayed = late > 1e6
    assert delayed.sum() >= 5, f"the hogs hardly delayed its wake-ups ({late}): no test"
    error = np.abs(np.array(traced) - device[read])
    assert np.median(error[delayed]) < 0.25 * np.median(late[delayed]), (error, late)
    assert np.median(error) < 0.5e6, (error, late)


def test_late_library_and_restarted_rank_are_followed(tmp_path):
    trace = Trace(tmp_path, "trace")  # no library attached up front: found by rescanning /proc
    first = run_job(tmp_path, job("first", ranks_per_node=1, steps=60, step_ms=20))
    second = run_job(tmp_path, job("second", ranks_per_node=1, steps=10, step_ms=10))
    events, lost = trace.stop()
    assert lost == 0
    assert collectives_of(events, first[0].pid), "the library mapped after start was not attached"
    restarted = collectives_of(events, second[0].pid)
    assert len(restarted) == len(read_record(second[0].record_path).collectives)


NVIDIA_CALLS = """
import ctypes, sys
cudart = ctypes.CDLL(sys.argv[1])
pointer, buffer = ctypes.c_void_p(), ctypes.create_string_buffer(64)
results = [cudart.cudaMalloc(ctypes.byref(pointer), 1 << 20),
           cudart.cudaMemcpy(buffer, buffer, 64, 4),
           cudart.cudaStreamSynchronize(None),
           cudart.cudaDeviceSynchronize(),
           cudart.cudaFree(None)]
print(results)
"""


def nvidia_library(package: str, name: str) -> Path:
    module = pytest.importorskip(package, reason=f"{package} is a test dependency (make setup)")
    return Path(list(module.__path__)[0]) / "lib" / name


@pytest.mark.parametrize("runtime", [("nvidia.cuda_runtime", "libcudart.so.12"),
                                     ("nvidia.cu13", "libcudart.so.13")], ids=["cuda12", "cuda13"])
def test_nvidia_binaries_attach_and_real_calls_are_seen(tmp_path, runtime):
    """NVIDIA's own CUDA runtimes (12, and 13 as PyTorch 2.11's cu130 wheels ship it) and
    NCCL 2.28.9 (what REAL-GPU.md ran): every probe of each attaches, NCCL 2.28's inits,
    shrink, finalize and all-to-all included, and real calls (failing: no driver) are seen."""
    from ingerod.discovery import library_file
    from ingerod.events import decode
    from ingerod.probes import Tracer, probes_for

    cudart = nvidia_library(*runtime)
    nccl = nvidia_library("nvidia.nccl", "libnccl.so.2")
    assert {"ncclCommInitRankScalable", "ncclCommShrink", "ncclAlltoAll"} <= {
        p.symbol for p in probes_for(library_file(str(nccl)))}
    seen = []
    tracer = Tracer(lambda raw: seen.append(decode(raw)))
    try:
        for path in (cudart, nccl):
            library = library_file(str(path))
            attached = tracer.attach(library)
            assert [p.symbol for p in attached] == [p.symbol for p in probes_for(library)]
            assert library not in tracer.missing
        call = subprocess.run([sys.executable, "-c", NVIDIA_CALLS, str(cudart)],
                              capture_output=True, text=True, timeout=60)
        assert call.returncode == 0, call.stderr
        assert all(code != 0 for code in json.loads(call.stdout)), "no driver: calls must fail"
        tracer.poll()
    finally:
        tracer.close()
    ops = [e["op"] for e in seen]
    for name in ("cudaMalloc", "cudaMemcpy", "cudaStreamSynchronize", "cudaDeviceSynchronize",
                 "cudaFree"):
        assert name in ops, f"{name} not observed in {ops}"
    assert all(e["result"] != 0 for e in seen if "result" in e)


@pytest.mark.parametrize("links", [True, False], ids=["uprobe_multi", "perf_events"])
def test_probes_attach_as_links_or_as_perf_events_and_see_the_same_calls(monkeypatch, links):
    """Where the kernel has uprobe_multi links (6.6 on: this one) each probe is a link, and
    they all come off at once when the tracer closes (as perf events each waits out kernel
    grace periods, ~0.1 s apiece); where the kernel refuses them (older kernels: the refusal
    stood in for here), bcc's perf-event uprobes see the same calls."""
    import ingerod.uprobes
    from ingerod.discovery import library_file
    from ingerod.events import decode
    from ingerod.probes import Tracer, probes_for

    if not links:
        def refused(*_args):
            raise OSError(errno.EINVAL, "Invalid argument")
        monkeypatch.setattr(ingerod.uprobes, "link_uprobe", refused)
    cudart = sim.lib_dir() / "libcudart.so.13"
    seen = []
    tracer = Tracer(lambda raw: seen.append(decode(raw)))
    try:
        library = library_file(str(cudart))
        assert [p.symbol for p in tracer.attach(library)] == [
            p.symbol for p in probes_for(library)]
        assert tracer.uprobes.as_links is links
        assert bool(tracer.uprobes.links) is links and bool(tracer.bpf.uprobe_fds) is not links
        call = subprocess.run([sys.executable, "-c", NVIDIA_CALLS, str(cudart)],
                              capture_output=True, text=True, timeout=60)
        assert call.returncode == 0, call.stderr
        assert json.loads(call.stdout) == [0] * 5, "the sim's calls succeed"
        tracer.poll()
    finally:
        tracer.close()
    assert not tracer.uprobes.links and not tracer.bpf.uprobe_fds
    ops = collections.Counter(e["op"] for e in seen if e["pid"] == call_pid(seen, "cudaFree"))
    assert ops == {"cudaMalloc": 1, "cudaMemcpy": 1, "cudaStreamSynchronize": 1,
                   "cudaDeviceSynchronize": 1, "cudaFree": 1}, ops


def call_pid(events: list[dict], op: str) -> int:
    """The process that made the one ``op`` among ``events``."""
    (pid,) = {e["pid"] for e in events if e.get("op") == op}
    return pid


def test_the_agent_pushes_traced_events_to_fleetd(spawn, keys, endpoint, tmp_path):
    from stack.launch import free_port

    from .support import metric, scrape

    fleet_port, agent_port = free_port(), free_port()
    spawn("fleetd", "fleetd", ["--bind", endpoint, "--metrics-addr", f"127.0.0.1:{fleet_port}",
                               *keys.fleetd_flags()])
    agent = spawn("ingerod", "ingerod", [
        "--source", "ebpf", "--libraries", sim_libraries(), "--fleet", endpoint,
        "--push-interval", "0.5", "--metrics-addr", f"127.0.0.1:{agent_port}",
        *keys.ingerod_flags()])
    assert wait_for(lambda: metric(fleet_port, "ingero_fleet_batches_accepted_total") > 0, 60), \
        agent.log()
    ranks = run_job(tmp_path, job("pushed", steps=10))
    issued = sum(len(read_record(r.record_path).collectives) for r in ranks)
    assert wait_for(lambda: metric(fleet_port, "ingero_fleet_events_accepted_total") >= issued,
                    30), agent.log()
    assert scrape(agent_port)[("ingero_agent_events_lost_total", ())] == 0
    assert agent.stop(AGENT_STOP_S) == 0     # drained, then its probes detached


LAUNCHES = """
import ctypes, sys
from ctypes import Structure, byref, c_size_t, c_uint, c_uint64, c_void_p
cudart = ctypes.CDLL(sys.argv[1] + "/libcudart.so.13")
cuda = ctypes.CDLL(sys.argv[1] + "/libcuda.so.1")
class Dim3(Structure):
    _fields_ = [("x", c_uint), ("y", c_uint), ("z", c_uint)]
class Kernel(Structure):      # ingero_sim.h: a kernel of a given length
    _fields_ = [("magic", c_uint64), ("duration_ns", c_uint64)]
class RuntimeConfig(Structure):     # cudaLaunchConfig_t
    _fields_ = [("grid", Dim3), ("block", Dim3), ("shared", c_size_t), ("stream", c_void_p),
                ("attrs", c_void_p), ("attrs_n", c_uint)]
class DriverConfig(Structure):      # CUlaunchConfig
    _fields_ = [(name, c_uint) for name in ("gx", "gy", "gz", "bx", "by", "bz", "shared")] + [
        ("stream", c_void_p), ("attrs", c_void_p), ("attrs_n", c_uint)]
kernel, one = Kernel(0x4B534F5245474E49, 1000), Dim3(1, 1, 1)
cudart.cudaLaunchKernel.argtypes = [c_void_p, Dim3, Dim3, c_void_p, c_size_t, c_void_p]
cuda.cuLaunchKernel.argtypes = [c_void_p] + [c_uint] * 7 + [c_void_p] * 3
runtime_config, driver_config = RuntimeConfig(one, one), DriverConfig(1, 1, 1, 1, 1, 1, 0)
paths = {
    "cudaLaunchKernel": lambda: cudart.cudaLaunchKernel(byref(kernel), one, one, None, 0, None),
    "cudaLaunchKernelExC": lambda: cudart.cudaLaunchKernelExC(byref(runtime_config),
                                                              byref(kernel), None),
    "cuLaunchKernel": lambda: cuda.cuLaunchKernel(byref(kernel), 1, 1, 1, 1, 1, 1, 0, None,
                                                  None, None),
    "cuLaunchKernelEx": lambda: cuda.cuLaunchKernelEx(byref(driver_config), byref(kernel),
                                                      None, None),
}
assert cuda.cuInit(0) == 0
print("ready", flush=True)
for line in sys.stdin:
    for name in line.split():       # the paths named, one launch each, in turn
        assert paths[name]() == 0, name
    assert cudart.cudaDeviceSynchronize() == 0
    print("done", flush=True)
"""


def test_each_kernel_launch_is_counted_once_whichever_path_it_takes(spawn, keys, endpoint):
    """CUDA 13's runtime enters the driver's exported cuLaunchKernel for every cudaLaunchKernel
    (REAL-GPU.md: 792 = 792 a step), and the sim's now does; older runtimes may launch on their
    own (the second program here). cuBLAS launches its GEMMs with cuLaunchKernelEx, Triton with
    cuLaunchKernel. The node-wide agent counts each launch once either way (it counted the
    runtime's twice, and the Ex paths not at all)."""
    from stack.launch import free_port

    from .support import metric, scrape

    agent_port = free_port()
    spawn("fleetd", "fleetd", ["--bind", endpoint, *keys.fleetd_flags()])
    agent = spawn("ingerod", "ingerod", [
        "--source", "ebpf", "--fleet", endpoint, "--push-interval", "0.5",
        "--rescan-interval", "0.5", "--metrics-addr", f"127.0.0.1:{agent_port}",
        "--log-level", "debug", "--match-env", "INGERO_LAUNCH_TEST=1", *keys.ingerod_flags()])
    assert wait_for(lambda: metric(agent_port, "ingero_agent_kernel_launches_total") == 0
                    and ("ingero_agent_score", ()) in scrape(agent_port), 60), agent.log()
    counted = 0
    for via_driver in (1, 0):
        program = subprocess.Popen([sys.executable, "-c", LAUNCHES, str(sim.lib_dir())],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                   env={**os.environ, "INGERO_LAUNCH_TEST": "1",
                                        "INGERO_SIM_RUNTIME_VIA_DRIVER": str(via_driver)})
        try:
            assert program.stdout.readline() == "ready\n"
            assert wait_for(lambda: f"pid {program.pid}: CUDA code at " in agent.log(), 30), \
                agent.log()
            phases = [["cudaLaunchKernel"] * 300, ["cudaLaunchKernelExC"] * 200,
                      ["cuLaunchKernel"] * 150, ["cuLaunchKernelEx"] * 100,
                      ["cudaLaunchKernel", "cuLaunchKernelEx", "cuLaunchKernel",
                       "cudaLaunchKernelExC"] * 100]   # a step's mix: runtime, cuBLAS, Triton
            for phase in phases:
                program.stdin.write(" ".join(phase) + "\n")
                program.stdin.flush()
                assert program.stdout.readline() == "done\n"
                counted += len(phase)
                assert wait_for(lambda: metric(agent_port, "ingero_agent_kernel_launches_total")
                                >= counted, 20), (via_driver, phase[:4], agent.log())
                time.sleep(1.0)     # two more samples: nothing counted twice comes in late
                assert metric(agent_port, "ingero_agent_kernel_launches_total") == counted, \
                    (via_driver, phase[:4])
        finally:
            program.kill()
            program.wait()


HOLD_LIBRARIES = "import ctypes, sys, time; [ctypes.CDLL(p) for p in sys.argv[1:]]; time.sleep(600)"


def test_short_jobs_are_traced_whole_while_the_agent_detaches_files(spawn, keys, endpoint,
                                                                    tmp_path):
    """Files no process maps any more come off a probe at a time (each ~0.1 s here, a file's
    2 s), the agent reading events between them: jobs that start and end meanwhile are traced
    whole. When a file came off in one piece, a job short enough to fit in it had exited by
    the time the agent read its events: it could not read whose they were and dropped them
    (in CI, beside a busy loop, one node's half of an 8-rank job of 1.5 s was never seen so).
    Without the fix, each of these jobs was lost about half the time."""
    from stack.launch import free_port

    from .support import metric

    copies = tmp_path / "copies"
    copies.mkdir()
    files = [copies / f"libnccl.so.2.{k}" for k in range(6)]
    for copy in files:
        copy.write_bytes((sim.lib_dir() / "libnccl.so.2").read_bytes())
    fleet_port = free_port()
    spawn("fleetd", "fleetd", ["--bind", endpoint, "--metrics-addr", f"127.0.0.1:{fleet_port}",
                               *keys.fleetd_flags()])
    agent = spawn("ingerod", "ingerod", [
        "--source", "ebpf", "--libraries", sim_libraries(), "--fleet", endpoint,
        "--push-interval", "0.5", "--library-grace", "1", "--match-env", "INGERO_SIM_NODE=0",
        *keys.ingerod_flags()])
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LIBRARIES, *map(str, files)],
                              env={**os.environ, "INGERO_SIM_NODE": "0",
                                   "LD_LIBRARY_PATH": str(sim.lib_dir())})
    try:
        assert wait_for(lambda: agent.log().count(f"{copies}/") == len(files), 60), agent.log()
    finally:
        holder.kill()
        holder.wait()
    detached = "detached (no traced process maps it)"
    assert wait_for(lambda: detached in agent.log(), 60), agent.log()
    ranks, issued = [], 0
    for k in range(8):      # the other five files take ~20 s to come off: these run meanwhile,
        # each rank a second from its first call to its exit (well past a pass of the loop:
        # a process gone within one is not identified; no training job lives so briefly)
        ran = run_job(tmp_path, job(f"short-{k}", steps=100, job_id=f"55{k}"))
        ranks += [(f"55{k}", r) for r in ran]
        issued += sum(len(read_record(r.record_path).collectives) for r in ran)
    assert agent.log().count(detached) < len(files), \
        "the jobs ran after the files came off: the test proves nothing on this machine"
    log = agent.log()
    for job_id, r in ranks:
        assert f"tracing pid {r.pid} (ingero-sim-rank) job {job_id} rank {r.rank}," in log, log
    assert "launcher's variables said rank None" not in log, log
    assert wait_for(lambda: metric(fleet_port, "ingero_fleet_events_accepted_total") >= issued,
                    30), agent.log()
    assert wait_for(lambda: agent.log().count(detached) == len(files), 60), agent.log()


def test_launch_counter_duty_cycle_detaches_and_reattaches(tmp_path):
    from types import SimpleNamespace

    from ingerod.ebpf_source import EbpfSource

    from ingerod.config import SETTINGS

    cfg = SimpleNamespace(**{s.name: s.default for s in SETTINGS})
    vars(cfg).update(libraries=sim_libraries().split(","), rescan_interval=60.0,
                     gpu_memory_bytes=2**30, launch_duty_cycle=0.25, launch_duty_period=4.0)
    source = EbpfSource(cfg, 0.0)
    try:
        hot = {(p, s) for p, s in source.tracer.hot_attached}
        assert hot, "cudaLaunchKernel and cuLaunchKernel are attached at start"
        source.duty_cycle(2.0)  # past 25% of the period: launch counters off
        assert not source.tracer.hot_attached and not source.counting_launches
        source.duty_cycle(4.5)  # next period: on again
        assert source.tracer.hot_attached == hot
    finally:
        source.close()


TORCH_LIKE_JOB = """
import ctypes, sys, threading, time
from ctypes import Structure, byref, c_char, c_int, c_size_t, c_void_p
cudart = ctypes.CDLL(sys.argv[1] + "/libcudart.so.12")
nccl = ctypes.CDLL(sys.argv[1] + "/libtorch_cuda.so")  # NCCL linked into the torch library
time.sleep(float(sys.argv[2]))  # long enough for ingerod's rescan to find the new library
class UniqueId(Structure):
    _fields_ = [("internal", c_char * 128)]
nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(c_void_p), c_int, UniqueId, c_int]
nccl.ncclAllReduce.argtypes = [c_void_p, c_void_p, c_size_t, c_int, c_int, c_void_p, c_void_p]
nccl.ncclCommSplit.argtypes = [c_void_p, c_int, c_int, ctypes.POINTER(c_void_p), c_void_p]
uid = UniqueId()
assert nccl.ncclGetUniqueId(byref(uid)) == 0
def rank(r):
    comm, child, again, buf, stream = c_void_p(), c_void_p(), c_void_p(), c_void_p(), c_void_p()
    assert nccl.ncclCommInitRank(byref(comm), 2, uid, r) == 0
    cudart.cudaMalloc(byref(buf), 4096)
    cudart.cudaStreamCreate(byref(stream))
    assert nccl.ncclAllReduce(buf, buf, 1024, 7, 0, comm, stream) == 0
    assert cudart.cudaStreamSynchronize(stream) == 0
    assert nccl.ncclCommSplit(comm, 3, r, byref(child), None) == 0
    assert nccl.ncclCommSplit(comm, 3, r, byref(again), None) == 0  # same color, a new split
    nccl.ncclCommDestroy(again)
    nccl.ncclCommDestroy(child)
    nccl.ncclCommDestroy(comm)
threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
[t.start() for t in threads]; [t.join(30) for t in threads]
"""


def test_nccl_inside_libtorch_cuda_and_split_communicators(tmp_path):
    """NCCL linked into libtorch_cuda.so, beside CUDA 12's runtime, both found by rescanning
    /proc (nothing attached up front)."""
    import shutil

    lib = tmp_path / "lib"
    lib.mkdir()
    for name in ("libcudart.so.12", "libcuda.so.1", sim.VGPU_LIBRARY):
        shutil.copy(sim.lib_dir() / name, lib / name)
    shutil.copy(sim.lib_dir() / "libnccl.so.2", lib / "libtorch_cuda.so")
    trace = Trace(tmp_path, "trace")
    job = subprocess.run([sys.executable, "-c", TORCH_LIKE_JOB, str(lib), "1.5"],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "INGERO_SIM_TIMEOUT_S": "10"})
    events, lost = trace.stop()
    assert job.returncode == 0, job.stderr
    mine = [e["attrs"] | {"kind": e["kind"]} for e in events if e["attrs"]["pid"] != os.getpid()
            and e["kind"] in ("comm_init", "collective", "comm_destroy")]
    inits = [e for e in mine if e["kind"] == "comm_init"]
    world = {e["comm_hash"] for e in inits if e["op"] == "ncclCommInitRank"}
    split = {e["comm_hash"] for e in inits if e["op"] == "ncclCommSplit"}
    assert len(world) == 1 and len(split) == 2 and not world & split, inits
    assert sorted(e["comm_rank"] for e in inits if e["op"] == "ncclCommInitRank") == [0, 1]
    reduces = [e for e in mine if e["op"] == "ncclAllReduce"]
    assert len(reduces) == 2 and {e["comm_hash"] for e in reduces} == world
    assert {e["seq"] for e in reduces} == {0} and {e["bytes"] for e in reduces} == {4096}
    assert len([e for e in mine if e["kind"] == "comm_destroy"]) == 6
    assert lost == 0


# What PyTorch 2.11 calls on NCCL 2.28 besides the classic calls (REAL-GPU.md): the world made
# with ncclCommInitRankScalable from two roots' ids; a second communicator made non-blocking
# (ncclInProgress, then polled); a new_group of ranks 0 and 1, ranks 2 and 3 passing
# NCCL_SPLIT_NOCOLOR; all-to-all, gather and scatter; rank 3 dropped with ncclCommShrink;
# every communicator finalized, then destroyed. Four ranks, one thread each.
NCCL_228_JOB = """
import ctypes, sys, threading
from ctypes import Structure, byref, c_char, c_int, c_size_t, c_void_p, POINTER
lib = sys.argv[1]
cudart = ctypes.CDLL(lib + "/libcudart.so.13")
nccl = ctypes.CDLL(lib + "/libnccl.so.2")
class UniqueId(Structure):
    _fields_ = [("internal", c_char * 128)]
class Config(Structure):
    _fields_ = [("size", c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", c_int), ("cga", c_int), ("minCTAs", c_int), ("maxCTAs", c_int),
                ("netName", c_void_p), ("splitShare", c_int)]
def config(blocking):
    m = -2**31
    return Config(ctypes.sizeof(Config), 0xcafebeef, 22809, blocking, m, m, m, None, m)
N = 4
ids = (UniqueId * 2)()
assert nccl.ncclGetUniqueId(byref(ids[0])) == 0 and nccl.ncclGetUniqueId(byref(ids[1])) == 0
other = UniqueId()
assert nccl.ncclGetUniqueId(byref(other)) == 0
nccl.ncclCommInitRankConfig.argtypes = [POINTER(c_void_p), c_int, UniqueId, c_int, POINTER(Config)]
def exchange(r, comm, buf, stream, skip=()):
    # all_to_all_single with uneven splits, as PyTorch makes it; no call for a zero split
    assert nccl.ncclGroupStart() == 0
    for peer in range(N):
        if (r, peer) not in skip:
            assert nccl.ncclSend(buf, c_size_t(8), 7, peer, comm, stream) == 0
        if (peer, r) not in skip:
            assert nccl.ncclRecv(buf, c_size_t(8), 7, peer, comm, stream) == 0
    assert nccl.ncclGroupEnd() == 0
def rank(r):
    world, nb, sub, shrunk, buf, stream = (c_void_p() for _ in range(6))
    cfg = config(1)
    assert nccl.ncclCommInitRankScalable(byref(world), N, r, 2, ids, byref(cfg)) == 0
    nbcfg = config(0)
    assert nccl.ncclCommInitRankConfig(byref(nb), N, other, r, byref(nbcfg)) == 7
    state = c_int(7)
    while state.value == 7:
        assert nccl.ncclCommGetAsyncError(nb, byref(state)) == 0
    assert state.value == 0
    cudart.cudaMalloc(byref(buf), 1 << 16)
    cudart.cudaStreamCreate(byref(stream))
    assert nccl.ncclCommSplit(world, 5 if r < 2 else -1, r, byref(sub), None) == 0
    assert (sub.value is None) == (r >= 2)
    assert nccl.ncclAlltoAll(buf, buf, c_size_t(64), 7, world, stream) == 0
    exchange(r, world, buf, stream, skip={(0, 2), (0, 3)})
    assert nccl.ncclGroupStart() == 0     # a pipeline's: a send on, a receive from behind
    assert nccl.ncclSend(buf, c_size_t(8), 7, (r + 1) % N, world, stream) == 0
    assert nccl.ncclRecv(buf, c_size_t(8), 7, (r - 1) % N, world, stream) == 0
    assert nccl.ncclGroupEnd() == 0
    exchange(r, world, buf, stream)
    assert nccl.ncclGather(buf, buf, c_size_t(64), 7, 1, nb, stream) == 0
    assert nccl.ncclScatter(buf, buf, c_size_t(64), 7, 2, nb, stream) == 0
    if r < 2:
        assert nccl.ncclAllReduce(buf, buf, c_size_t(64), 7, 0, sub, stream) == 0
    assert cudart.cudaStreamSynchronize(stream) == 0
    if r != 3:
        excluded = (c_int * 1)(3)
        assert nccl.ncclCommShrink(world, excluded, 1, byref(shrunk), None, 0) == 0
        assert nccl.ncclAllReduce(buf, buf, c_size_t(64), 7, 0, shrunk, stream) == 0
        assert cudart.cudaStreamSynchronize(stream) == 0
    for comm in (shrunk, sub, nb, world):
        if comm.value:
            assert nccl.ncclCommFinalize(comm) == 0
            assert nccl.ncclCommDestroy(comm) == 0
threads = [threading.Thread(target=rank, args=(r,)) for r in range(N)]
[t.start() for t in threads]; [t.join(30) for t in threads]
"""


def test_scalable_nonblocking_nocolor_shrink_and_all_to_all_are_traced(tmp_path):
    """Each of these used to be invisible: the scalable world never registered (its
    collectives carried no communicator), the non-blocking one neither (registered on a 0
    return only), a NOCOLOR rank's split was never told (fleetd waited for it for ever),
    all-to-all, gather, scatter, shrink and finalize were not probed, and an all-to-all of
    grouped Send/Recv (uneven splits) was only its sends and receives."""
    trace = Trace(tmp_path, "trace", "--libraries", sim_libraries())
    job = subprocess.run([sys.executable, "-c", NCCL_228_JOB, str(sim.lib_dir())],
                         capture_output=True, text=True, timeout=60,
                         env={**os.environ, "INGERO_SIM_TIMEOUT_S": "10"})
    events, lost = trace.stop()
    assert job.returncode == 0 and not job.stderr, job.stderr
    mine = [e["attrs"] | {"kind": e["kind"]} for e in events
            if e["kind"] in ("comm_init", "collective", "comm_destroy")]
    inits = collections.defaultdict(list)
    for e in mine:
        if e["kind"] == "comm_init":
            inits[e["op"]].append(e)
    world = {e["comm_hash"] for e in inits["ncclCommInitRankScalable"]}
    assert len(world) == 1 and sorted(e["comm_rank"] for e in inits[
        "ncclCommInitRankScalable"]) == [0, 1, 2, 3], inits
    other = {e["comm_hash"] for e in inits["ncclCommInitRankConfig"]}
    assert len(other) == 1 and other != world
    # the split: ranks 0 and 1 in colour 5, ranks 2 and 3 told with no communicator
    splits = sorted(inits["ncclCommSplit"], key=lambda e: e["parent_rank"])
    assert [(e["parent_rank"], e["color"], e["parent_nranks"], e["comm_rank"]) for e in splits
            ] == [(0, 5, 4, -1), (1, 5, 4, -1), (2, -1, 4, -1), (3, -1, 4, -1)], splits
    assert {e["parent_hash"] for e in splits} == world
    shrinks = inits["ncclCommShrink"]
    assert sorted((e["parent_rank"], e["parent_nranks"], e["color"]) for e in shrinks) == [
        (0, 3, 0), (1, 3, 0), (2, 3, 0)], shrinks
    ops = collections.Counter((e["op"], e["comm_hash"] in world, e["comm_hash"] in other)
                              for e in mine if e["kind"] == "collective")
    assert ops == {("ncclAlltoAll", True, False): 4, ("ncclGather", False, True): 4,
                   ("ncclScatter", False, True): 4, ("ncclAllReduce", False, False): 5,
                   ("ncclSend", True, False): 34, ("ncclRecv", True, False): 34,
                   ("alltoallv", True, False): 7}, ops
    # each group of Send/Recv on the world counts; one with every peer (all but one at
    # least) is told as an exchange: rank 0's first sent to two peers only, and the
    # pipeline's group between them is none
    exchanges = sorted((e["seq"], e["comm_rank"], e["count"], e["bytes"], e["datatype"])
                       for e in mine if e.get("op") == "alltoallv")
    assert exchanges == [(0, 1, 64, 256, "float32"), (0, 2, 56, 224, "float32"),
                         (0, 3, 56, 224, "float32"), *((2, r, 64, 256, "float32")
                                                       for r in range(4))], exchanges
    rooted = {(e["op"], e.get("root")) for e in mine if e["op"] in ("ncclGather", "ncclScatter")}
    assert rooted == {("ncclGather", 1), ("ncclScatter", 2)}
    gone = collections.Counter(e["op"] for e in mine if e["kind"] == "comm_destroy")
    assert gone == {"ncclCommFinalize": 13, "ncclCommDestroy": 13}, gone
    assert lost == 0


def test_trace_with_pids_follows_those_processes_only(tmp_path):
    with Cluster(job("pids", steps=100_000, step_ms=10), tmp_path / "job-pids") as cluster:
        assert wait_for(lambda: len(cluster.ranks) == 4, 30)
        chosen = sorted(rank.pid for rank in cluster.ranks)[1:3]
        trace = Trace(tmp_path, "trace", "-p", ",".join(map(str, chosen)),
                      "--libraries", sim_libraries())
        time.sleep(2)
        events, lost = trace.stop()
        cluster.stop()
    assert lost == 0
    assert {e["attrs"]["pid"] for e in events if "pid" in e["attrs"]} == set(chosen), events[:5]
    assert all(collectives_of(events, pid) for pid in chosen)


def test_check_says_what_the_node_lacks_and_how_to_fix_it(tmp_path):
    """`ingerod check` on this machine (bcc, root, headers linked by setup) can trace: every
    line ok, the program compiled and loaded, exit 0. With bcc pointed at an empty header tree
    (a node booting a kernel it has no headers for) it says so, with the fix, and exits 1."""
    done = subprocess.run([sys.executable, "-m", "ingerod", "check"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    marks = [line.split()[0] for line in lines[:-1] if not line.startswith(" ")]
    assert len(marks) == 9 and set(marks) <= {"ok", "note"}, done.stdout   # notes: not needed
    assert "program               compiled and loaded" in done.stdout
    bare = subprocess.run([sys.executable, "-m", "ingerod", "check"], capture_output=True,
                          text=True, timeout=120, cwd=REPO,
                          env={**os.environ, "BCC_KERNEL_SOURCE": str(tmp_path)})
    assert bare.returncode == 1, bare.stdout + bare.stderr
    assert f"MISSING kernel headers        none for the running kernel {os.uname().release}" \
        in bare.stdout, bare.stdout
    assert "fix: install them (Debian/Ubuntu: apt-get install linux-headers-" in bare.stdout
    assert "program" not in bare.stdout            # not tried: it could not compile
    assert bare.stdout.splitlines()[-1].startswith("ingerod cannot trace on this node")
