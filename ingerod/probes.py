"""Loading ingero's BPF program and attaching its probes to the libraries the targets map.

The program is the files of bpf/ joined into one text (bcc rewrites map calls only in its main
source); settings reach it as -D macros. Probes attach once per library file (by inode), so
every process mapping that file is seen from its first call; the ``excluded`` map drops other
jobs' processes, and the ``targets`` map picks who the host tracepoints follow.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from .discovery import LibraryFile
from .errors import TracingError
from .events import RawEvent
from .uprobes import Uprobes

log = logging.getLogger("ingerod")

PACKAGE_BPF = Path(__file__).resolve().parent / "bpf"
BPF_DIR = Path(os.environ.get("INGERO_BPF_DIR", PACKAGE_BPF))
# The program's parts in the order they are joined, listed in package data of their own so
# that `ingero version` reads the list without importing ingerod.
PARTS = tuple((PACKAGE_BPF / "parts").read_text().split())


@dataclass(frozen=True)
class Probe:
    library: str          # discovery kind whose files carry the symbol
    symbol: str
    entry: str | None     # BPF function on entry
    ret: str | None = None  # BPF function on return
    hot: bool = False     # called per kernel launch: counted in the kernel, may be duty-cycled


NCCL = [
    Probe("nccl", "ncclCommInitRank", "nccl_comm_init_rank", "nccl_comm_init_return"),
    Probe("nccl", "ncclCommInitRankConfig", "nccl_comm_init_rank_config",
          "nccl_comm_init_return"),
    Probe("nccl", "ncclCommInitRankScalable", "nccl_comm_init_rank_scalable",
          "nccl_comm_init_return"),
    Probe("nccl", "ncclCommInitAll", "nccl_comm_init_all", "nccl_comm_init_return"),
    Probe("nccl", "ncclCommSplit", "nccl_comm_split", "nccl_comm_init_return"),
    Probe("nccl", "ncclCommShrink", "nccl_comm_shrink", "nccl_comm_init_return"),
    Probe("nccl", "ncclCommFinalize", "nccl_comm_finalize"),
    Probe("nccl", "ncclCommDestroy", "nccl_comm_destroy"),
    Probe("nccl", "ncclCommAbort", "nccl_comm_abort"),
    Probe("nccl", "ncclAllReduce", "nccl_all_reduce"),
    Probe("nccl", "ncclAllGather", "nccl_all_gather"),
    Probe("nccl", "ncclReduceScatter", "nccl_reduce_scatter"),
    Probe("nccl", "ncclReduce", "nccl_reduce"),
    Probe("nccl", "ncclBroadcast", "nccl_broadcast"),
    Probe("nccl", "ncclBcast", "nccl_bcast"),
    Probe("nccl", "ncclSend", "nccl_send"),
    Probe("nccl", "ncclRecv", "nccl_recv"),
    Probe("nccl", "ncclAlltoAll", "nccl_all_to_all"),
    Probe("nccl", "ncclGather", "nccl_gather"),
    Probe("nccl", "ncclScatter", "nccl_scatter"),
    Probe("nccl", "ncclGroupStart", "nccl_group_start"),
    Probe("nccl", "ncclGroupEnd", "nccl_group_end"),
]

CUDART = [
    Probe("cudart", "cudaLaunchKernel", "runtime_launch", hot=True),
    Probe("cudart", "cudaLaunchKernelExC", "runtime_launch", hot=True),
    Probe("cudart", "cudaStreamSynchronize", "stream_sync_enter", "runtime_sync_return"),
    Probe("cudart", "cudaEventRecord", "event_record"),
    Probe("cudart", "cudaEventRecordWithFlags", "event_record"),
    Probe("cudart", "cudaStreamWaitEvent", "stream_wait_event"),
    Probe("cudart", "cudaStreamBeginCapture", "capture_begin"),
    Probe("cudart", "cudaStreamEndCapture", "capture_end", "capture_end_return"),
    Probe("cudart", "cudaGraphInstantiate", "graph_instantiate", "graph_instantiate_return"),
    Probe("cudart", "cudaGraphLaunch", "runtime_graph_launch"),
    Probe("cudart", "cudaEventSynchronize", "event_sync_enter", "runtime_sync_return"),
    Probe("cudart", "cudaDeviceSynchronize", "device_sync_enter", "runtime_sync_return"),
    Probe("cudart", "cudaMalloc", "cuda_malloc_enter", "runtime_alloc_return"),
    Probe("cudart", "cudaMallocManaged", "cuda_malloc_managed_enter", "runtime_alloc_return"),
    Probe("cudart", "cudaFree", "cuda_free_enter", "runtime_free_return"),
    Probe("cudart", "cudaMemcpy", "memcpy_enter", "memcpy_return"),
    Probe("cudart", "cudaMemcpy2D", "memcpy_2d_enter", "memcpy_return"),
    Probe("cudart", "cudaMemcpyPeer", "memcpy_peer_enter", "memcpy_return"),
    Probe("cudart", "cudaMemcpyAsync", "memcpy_async_enter"),
    Probe("cudart", "cudaMemcpy2DAsync", "memcpy_2d_async_enter"),
    Probe("cudart", "cudaMemcpyPeerAsync", "memcpy_peer_async_enter"),
]

DRIVER = [
    Probe("cuda", "cuLaunchKernel", "driver_launch", hot=True),
    Probe("cuda", "cuLaunchKernelEx", "driver_launch", hot=True),
    Probe("cuda", "cuGraphLaunch", "driver_graph_launch"),
    Probe("cuda", "cuCtxSynchronize", "ctx_sync_enter", "driver_sync_return"),
    Probe("cuda", "cuMemAlloc_v2", "cu_mem_alloc_enter", "driver_alloc_return"),
    Probe("cuda", "cuMemFree_v2", "cu_mem_free_enter", "driver_free_return"),
]

PROBES = NCCL + CUDART + DRIVER


def program_text(bpf_dir: Path = BPF_DIR) -> str:
    return "\n".join((bpf_dir / part).read_text() for part in PARTS)


def probes_for(library: LibraryFile) -> list[Probe]:
    """libtorch_cuda.so may carry NCCL linked in statically: it gets the NCCL probes."""
    kind = "nccl" if library.kind == "torch_cuda" else library.kind
    return [p for p in PROBES if p.library == kind]


class Tracer:
    """The loaded program, its attachments and its maps."""

    def __init__(self, on_event, bpf_dir: Path = BPF_DIR, cflags: list[str] | None = None):
        try:
            from bcc import BPF  # Debian's bcc; imported here so the rest of ingerod needs none
        except (ImportError, OSError):     # OSError: its libbcc.so.0 missing or mismatched
            raise TracingError("tracing needs Debian's bcc (apt-get install python3-bpfcc), "
                               "seen by this Python") from None
        try:
            self.bpf = BPF(text=program_text(bpf_dir), cflags=cflags or [])
        except Exception as exc:  # bcc raises plain Exception for compile and load failures
            raise TracingError(f"cannot load the BPF program ({exc}); eBPF needs root, or "
                               "CAP_BPF and CAP_PERFMON, and kernel headers") from None
        self.attached: dict[LibraryFile, list[Probe]] = {}
        self.missing: dict[LibraryFile, list[str]] = {}
        self.detaching: dict[LibraryFile, list[Probe]] = {}   # files whose probes come off
        self.hot_attached: set[tuple[str, str]] = set()
        self.cuda_texts: dict[int, tuple[tuple[int, int], ...]] = {}
        self._on_event = on_event
        self.uprobes = Uprobes(self.bpf)
        self.bpf["events"].open_ring_buffer(self._receive)

    def _receive(self, _ctx, data, size) -> None:
        self._on_event(ctypes.cast(data, ctypes.POINTER(RawEvent)).contents)

    def attach(self, library: LibraryFile) -> list[Probe]:
        """Attach every probe the file has a symbol for; log the symbols it lacks, once."""
        if library in self.attached:
            return self.attached[library]
        while library in self.detaching:    # mapped again while its probes came off
            self.detach_next(library)
        done, missing = [], []
        for probe in probes_for(library):
            try:
                self._attach_one(library.path, probe)
                done.append(probe)
            except Exception:  # bcc raises plain Exception for a missing symbol
                missing.append(probe.symbol)
        self.attached[library] = done
        if missing:
            self.missing[library] = missing
            log.info("%s: no symbol for %s; attached the other %d probes", library.path,
                     ", ".join(missing), len(done))
        else:
            log.info("%s: attached %d probes", library.path, len(done))
        return done

    def _attach_one(self, path: str, probe: Probe) -> None:
        if probe.entry:
            self.uprobes.attach(path, probe.symbol, probe.entry)
            if probe.hot:
                self.hot_attached.add((path, probe.symbol))
        if probe.ret:
            self.uprobes.attach(path, probe.symbol, probe.ret, ret=True)

    def detach(self, library: LibraryFile) -> None:
        """Mark a file's probes to come off (no traced process maps it any more): one at a
        time, by ``detach_next``, for each may take ~0.1 s (as perf events, on kernels without
        uprobe_multi links: a file's ~16, 1.6 s, more on a busy machine), and the agent must
        go on reading events between them."""
        probes = self.attached.pop(library, None)
        if probes is not None:
            self.detaching[library] = list(probes)

    def detach_next(self, library: LibraryFile | None = None) -> None:
        """Take one probe off a file being detached (the first, unless named); say so when
        it is bare."""
        if library is None:
            library = next(iter(self.detaching), None)
        probes = self.detaching.get(library)
        if probes is None:
            return
        if probes:
            self._detach_one(library.path, probes.pop())
        if not probes:
            del self.detaching[library]
            self.missing.pop(library, None)
            log.info("%s: detached (no traced process maps it)", library.path)

    def _detach_one(self, path: str, probe: Probe) -> None:
        try:
            if probe.entry and (not probe.hot or (path, probe.symbol) in self.hot_attached):
                self.uprobes.detach(path, probe.symbol)
            if probe.ret:
                self.uprobes.detach(path, probe.symbol, ret=True)
        except Exception:   # bcc raises plain Exception; the file may be gone
            log.debug("%s: could not detach %s", path, probe.symbol)
        self.hot_attached.discard((path, probe.symbol))

    def set_hot(self, enabled: bool) -> None:
        """Duty-cycle the launch counters: detach them for a while, attach them again."""
        for library, probes in self.attached.items():
            for probe in (p for p in probes if p.hot):
                key = (library.path, probe.symbol)
                if enabled and key not in self.hot_attached:
                    self.uprobes.attach(library.path, probe.symbol, probe.entry)
                    self.hot_attached.add(key)
                elif not enabled and key in self.hot_attached:
                    self.uprobes.detach(library.path, probe.symbol)
                    self.hot_attached.discard(key)

    def set_pids(self, table: str, pids: set[int]) -> None:
        """Make the ``targets`` or ``excluded`` map hold exactly these processes."""
        entries = self.bpf[table]
        current = {k.value for k in entries.keys()}
        for pid in pids - current:
            entries[ctypes.c_uint32(pid)] = ctypes.c_uint32(1)
        for pid in current - pids:
            try:
                del entries[ctypes.c_uint32(pid)]
            except KeyError:
                pass

    def set_cuda_text(self, texts: dict[int, tuple[tuple[int, int], ...]]) -> None:
        """Make the ``cuda_text`` map hold these processes' CUDA code ranges, and no others'
        (cuda.bpf.c, launch_entry); only what changed is written."""
        table = self.bpf["cuda_text"]
        for pid in self.cuda_texts.keys() - texts.keys():
            try:
                del table[ctypes.c_uint32(pid)]
            except KeyError:
                pass
        for pid, ranges in texts.items():
            if self.cuda_texts.get(pid) != ranges:
                leaf = table.Leaf()
                for i, (start, end) in enumerate(ranges[:len(leaf.start)]):
                    leaf.start[i], leaf.end[i] = start, end
                table[ctypes.c_uint32(pid)] = leaf
                log.debug("pid %d: CUDA code at %s", pid,
                          ", ".join(f"{start:#x}-{end:#x}" for start, end in ranges))
        self.cuda_texts = dict(texts)

    def poll(self) -> None:
        """Deliver what is in the ring buffer now, without waiting."""
        self.bpf.ring_buffer_consume()

    def lost_events(self) -> int:
        return sum(self.bpf["lost"][ctypes.c_int(0)])

    def take(self, name: str) -> list[tuple]:
        """Read a counter map and empty it, in one batch: (key, value) pairs since the last."""
        return list(self.bpf[name].items_lookup_and_delete_batch())

    def close(self) -> None:
        self.uprobes.close()
        self.bpf.cleanup()
