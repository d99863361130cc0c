"""How much device memory this node's GPUs hold, asked of NVIDIA's management library (NVML,
``libnvidia-ml.so.1``, which the driver installs) once at start: the memory signal counts a
job's allocations against it, so a hard-wired 80 GiB would read a 141 GiB H200 or a 192 GiB
B200 as nearly full. ctypes only; where there is no NVML (no NVIDIA driver) the answer is None
and the setting's value stands."""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("ingerod")


class _Memory(ctypes.Structure):        # nvml.h: nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def device_memory(library: str = "libnvidia-ml.so.1") -> int | None:
    """The smallest GPU's total memory in bytes (a job's ranks may land on any of them), or
    None where NVML cannot be loaded or answers no GPU."""
    try:
        nvml = ctypes.CDLL(library)
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count = ctypes.c_uint(0)
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0 or count.value == 0:
            return None
        totals = []
        for index in range(count.value):
            handle, memory = ctypes.c_void_p(), _Memory()
            if (nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0
                    and nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0):
                totals.append(memory.total)
        return min(totals) if totals else None
    finally:
        nvml.nvmlShutdown()
