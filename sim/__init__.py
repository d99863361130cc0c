"""A GPU cluster without GPUs.

The C half (built by `make -C sim` into sim/build/) provides libcudart.so.13 and .so.12,
libcuda.so.1 and libnccl.so.2 with NVIDIA's symbol names and prototypes over one virtual GPU,
a rank driver that trains through them (linked to either runtime), and a CPU hog. This
package loads scenarios (sim.scenario), runs them as real processes (sim.cluster), serves the
TCP rendezvous (sim.rendezvous) and reads the ranks' ground-truth records (sim.records).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from sim.errors import BuildError

PACKAGE_DIR = Path(__file__).resolve().parent
UNIQUE_ID_BYTES = 128
# INGERO_SIM_KERNEL_MAGIC of sim/include/ingero_sim.h: a struct ingero_sim_kernel passed as the
# kernel function gives the kernel its own duration.
KERNEL_MAGIC = 0x4B534F5245474E49
_MASK64 = (1 << 64) - 1


def build_dir() -> Path:
    """Where `make -C sim` puts everything it builds."""
    return PACKAGE_DIR / "build"


def lib_dir() -> Path:
    """The directory holding libcudart.so.13 and .so.12, libcuda.so.1 and libnccl.so.2 (and
    libingero-sim-vgpu.so, the virtual GPU they drive)."""
    return build_dir() / "lib"


# The virtual GPU every sim library drives, found next to them (a copy of one needs a copy of it).
VGPU_LIBRARY = "libingero-sim-vgpu.so"


def traced_libraries(cuda: int = 13, directory: Path | None = None) -> str:
    """The sim's libraries a rank linked to CUDA ``cuda``'s runtime maps, as ``--libraries``
    takes them (attached up front: each probe attached is another to take off at the end,
    ~0.1 s apiece here)."""
    names = ("libcuda.so.1", f"libcudart.so.{cuda}", "libnccl.so.2")
    return ",".join(str((directory or lib_dir()) / name) for name in names)


def bin_dir() -> Path:
    return build_dir() / "bin"


def nvml_library() -> Path:
    """The stand-in for NVIDIA's libnvidia-ml.so.1 (INGERO_SIM_GPUS, INGERO_SIM_GPU_MEMORY_MIB)."""
    return build_dir() / "nvml" / "libnvidia-ml.so.1"


def rank_binary(cuda: int = 13) -> Path:
    """The rank driver linked to CUDA ``cuda``'s runtime (libcudart.so.13 or .so.12)."""
    return bin_dir() / ("ingero-sim-rank" if cuda == 13 else f"ingero-sim-rank-cuda{cuda}")


def hog_binary() -> Path:
    return bin_dir() / "ingero-hog"


def build(quiet: bool = True) -> Path:
    """Run `make -C sim` (quick when nothing changed) and return the build directory."""
    result = subprocess.run(["make", "-C", str(PACKAGE_DIR), *(["-s"] if quiet else [])],
                            capture_output=quiet, text=True)
    if result.returncode != 0:
        raise BuildError(f"make -C {PACKAGE_DIR} failed:\n{result.stdout}{result.stderr}")
    return build_dir()


def splitmix64(x: int) -> int:
    """One step of splitmix64, exactly as ingero_sim_splitmix64 in sim/include/ingero_sim.h."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def comm_id_hash(unique_id: bytes) -> int:
    """comm_id_hash of a 128-byte ncclUniqueId: splitmix64 folded over 16 little-endian words."""
    if len(unique_id) != UNIQUE_ID_BYTES:
        raise ValueError(f"an ncclUniqueId has {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
    h = 0
    for offset in range(0, UNIQUE_ID_BYTES, 8):
        h = splitmix64(h ^ int.from_bytes(unique_id[offset:offset + 8], "little"))
    return h


__all__ = ["build", "build_dir", "lib_dir", "bin_dir", "VGPU_LIBRARY", "traced_libraries",
           "rank_binary", "hog_binary", "splitmix64", "comm_id_hash", "UNIQUE_ID_BYTES",
           "KERNEL_MAGIC"]
