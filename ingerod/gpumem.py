"""How much device memory this node's GPUs hold and use, asked of NVIDIA's management library
(NVML, ``libnvidia-ml.so.1``, which the driver installs). The memory signal is what the GPUs
say they use against what they hold, per device: PyTorch's caching allocator reserves memory
once and reuses it, and maps more through the driver's VMM calls, so the bytes a job passes to
cudaMalloc say little of how full a GPU is. Where there is no NVML (no NVIDIA driver) the
answers are None, and the signal falls back to the job's own allocations counted against the
setting's (or the default) size. ctypes only."""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger("ingerod")


class _Memory(ctypes.Structure):        # nvml.h: nvmlMemory_t
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


class DeviceMemory:
    """NVML kept open: each GPU's memory in use, as a share of what it holds."""

    def __init__(self, library: str = "libnvidia-ml.so.1"):
        self.nvml = None
        self.handles: list[ctypes.c_void_p] = []
        try:
            nvml = ctypes.CDLL(library)
        except OSError:
            return
        count = ctypes.c_uint(0)
        if nvml.nvmlInit_v2() != 0:
            return
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            nvml.nvmlShutdown()
            return
        for index in range(count.value):
            handle = ctypes.c_void_p()
            if nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle)) == 0:
                self.handles.append(handle)
        if self.handles:
            self.nvml = nvml
        else:
            nvml.nvmlShutdown()

    def used_share(self) -> float | None:
        """The fullest GPU's memory in use over its total, or None where NVML says nothing."""
        if self.nvml is None:
            return None
        shares = []
        for handle in self.handles:
            memory = _Memory()
            if self.nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0 \
                    and memory.total:
                shares.append(min(memory.used / memory.total, 1.0))
        return max(shares) if shares else None

    def close(self) -> None:
        if self.nvml is not None:
            self.nvml.nvmlShutdown()
            self.nvml = None


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
