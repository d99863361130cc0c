"""GPU memory from the GPU: ingerod asks NVML (here the sim's stand-in for libnvidia-ml.so.1,
loaded by ctypes as the real one is) how much memory the smallest GPU holds, instead of
assuming 80 GiB; the setting still wins, and without NVML the default stands."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import sim
from ingerod.ebpf_source import DEFAULT_GPU_MEMORY, gpu_memory


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
