"""GPU memory from the GPU: ingerod asks NVML (here the sim's stand-in for libnvidia-ml.so.1,
loaded by ctypes as the real one is) how much memory the smallest GPU holds, instead of
assuming 80 GiB; the setting still wins, and without NVML the default stands."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

import sim
from ingerod.ebpf_source import DEFAULT_GPU_MEMORY, gpu_memory

from .support import needs_ebpf


def ask(library: str, **env: str) -> str:
    """gpu_memory of a fresh process (NVML reads its environment), as ingerod starts it."""
    code = ("from types import SimpleNamespace as S; from ingerod.ebpf_source import gpu_memory;"
            f"print(gpu_memory(S(gpu_memory_bytes=None, nvml_library={library!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_h200_node_reads_141_gib_from_nvml_not_80():
    library = str(sim.nvml_library())
    assert ask(library, INGERO_SIM_GPUS="8", INGERO_SIM_GPU_MEMORY_MIB="144384") == \
        str(141 * 2**30)
    assert ask(library, INGERO_SIM_GPUS="2", INGERO_SIM_GPU_MEMORY_MIB="196608") == \
        str(192 * 2**30)


def test_no_gpu_and_no_nvml_keep_the_default_and_the_setting_wins():
    library = str(sim.nvml_library())
    assert ask(library, INGERO_SIM_GPUS="0") == str(DEFAULT_GPU_MEMORY)
    assert ask("/nonexistent/libnvidia-ml.so.1") == str(DEFAULT_GPU_MEMORY)
    assert gpu_memory(SimpleNamespace(gpu_memory_bytes=2**30, nvml_library=library)) == 2**30


HOLD = """
import ctypes, sys, time
cudart = ctypes.CDLL(sys.argv[1] + "/libcudart.so.12")
assert cudart.cudaSetDevice(int(sys.argv[2])) == 0
pointer = ctypes.c_void_p()
assert cudart.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(int(sys.argv[3]))) == 0
print("held", flush=True)
time.sleep(60)
"""


def used_share(library: str, **env: str) -> float | None:
    code = ("from ingerod.gpumem import DeviceMemory; m = DeviceMemory(%r); "
            "print(m.used_share()); m.close()" % library)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", **env})
    assert done.returncode == 0, done.stderr
    return None if done.stdout.strip() == "None" else float(done.stdout)


def test_the_memory_signal_is_what_the_gpus_say_they_use_not_what_a_job_allocated():
    """PyTorch's caching allocator reserves memory once and keeps it: what NVML says a GPU
    uses is the signal, per device, the fullest one counted. A process of host label 7 holds
    24 GiB of an 80 GiB GPU 2 (the sim's libcudart publishes what it holds; the sim's NVML
    sums the live processes' of its label): 30% used, headroom 0.7. Another label's GPUs
    hold none of it, and once the process is gone the GPU is empty again. Without NVML the
    signal is the job's own allocations against the GPU's size, as before."""
    from ingerod.ebpf_source import memory_signal

    library, label = str(sim.nvml_library()), "7"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(sim.lib_dir()), "2",
                               str(24 * 2**30)], stdout=subprocess.PIPE, text=True,
                              env={"PATH": "/usr/bin:/bin", "INGERO_SIM_NODE": label,
                                   "INGERO_SIM_GPU_MEM_GB": "80"})
    try:
        assert holder.stdout.readline() == "held\n"
        share = used_share(library, INGERO_SIM_NODE=label)
        assert share == pytest.approx(0.3), share
        assert memory_signal(share, 0, 80 * 2**30) == pytest.approx(0.7)
        assert used_share(library, INGERO_SIM_NODE="8") == 0.0
    finally:
        holder.kill()
        holder.wait()
    assert used_share(library, INGERO_SIM_NODE=label) == 0.0
    assert used_share("/nonexistent/libnvidia-ml.so.1") is None
    assert memory_signal(None, 20 * 2**30, 80 * 2**30) == pytest.approx(0.75)


@needs_ebpf
def test_a_node_s_agent_reads_its_memory_signal_from_nvml(spawn, keys, endpoint, tmp_path):
    """The agent as the shipped unit runs it (node-wide, NVML found by name; here the sim's,
    named by --nvml-library): a process of its node that reserved 72 GiB of an 80 GiB GPU
    through the sim's CUDA 13 runtime before the agent started (as PyTorch's caching
    allocator reserves most of a GPU once, or maps it through the driver's VMM calls, which
    no probe sees) takes the node's memory signal to 0.1 (headroom): counting the
    allocations the agent saw, it read 1. Once the process exits the GPU is empty again."""
    from stack.launch import free_port, wait_for

    from .support import metric

    fleet_port, agent_port = free_port(), free_port()
    label = {"INGERO_SIM_NODE": "5", "INGERO_SIM_GPU_MEM_GB": "80"}
    holder = subprocess.Popen([sys.executable, "-c", HOLD.replace("so.12", "so.13"),
                               str(sim.lib_dir()), "0", str(72 * 2**30)],
                              stdout=subprocess.PIPE, text=True,
                              env={"PATH": "/usr/bin:/bin", **label})
    try:
        assert holder.stdout.readline() == "held\n"
        spawn("fleetd", "fleetd", ["--bind", endpoint, "--metrics-addr",
                                   f"127.0.0.1:{fleet_port}", *keys.fleetd_flags()])
        agent = spawn("ingerod", "ingerod", [
            "--source", "ebpf", "--fleet", endpoint, "--push-interval", "0.5",
            "--nvml-library", str(sim.nvml_library()),
            "--metrics-addr", f"127.0.0.1:{agent_port}", *keys.ingerod_flags()],
            env={**os.environ, **label})

        def memory() -> float:
            return metric(agent_port, "ingero_agent_signal", signal="memory")

        assert wait_for(lambda: metric(fleet_port, "ingero_fleet_batches_accepted_total") > 0,
                        60), agent.log()
        assert wait_for(lambda: memory() == pytest.approx(0.1, abs=0.01), 10), \
            (memory(), agent.log())
    finally:
        holder.kill()
        holder.wait()
    assert wait_for(lambda: memory() == pytest.approx(1.0), 10), (memory(), agent.log())
