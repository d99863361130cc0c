"""Who calls each kernel-launch entry on a real GPU stack, by library: the fact ingerod's launch
counter rests on (cuda.bpf.c, launch_entry: a launch entry called from the CUDA runtime's or
driver's own code is part of a launch counted already).

Raw perf_event_open uprobes with a small BPF program each (no bcc: GPU machines often have no
kernel headers) on cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel and
cuLaunchKernelEx; the program reads the return address at the function's entry (x86-64: the
word at the stack pointer) and counts it in a hash map. Each address is then placed in the
process's own mappings. Run on a PyTorch DDP loop (world size 1, bf16, AdamW; cuBLAS's GEMMs)
for a few steps, after warm-up; without torch, on the sim's libraries (``--sim``) with a
ctypes program, so the BPF part is checked anywhere.

    OUT=/tmp/out python3 bench/real_gpu_launches.py          # on a GPU machine, as root
    python3 bench/real_gpu_launches.py --sim                  # here (sim/build)

Writes $OUT/real_gpu_launches.json and prints a summary: per entry, its calls and their callers
by library; and the launches counted once under ingerod's rule against the entries' sum.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = Path(os.environ.get("OUT", "/tmp/out"))
ENTRIES = [("cudart", "cudaLaunchKernel"), ("cudart", "cudaLaunchKernelExC"),
           ("cuda", "cuLaunchKernel"), ("cuda", "cuLaunchKernelEx")]
CUDA_CODE = ("libcudart", "libcuda.")          # ingerod's CUDA_TEXT_KINDS, by file name

libc = ctypes.CDLL(None, use_errno=True)
NR_BPF, NR_PERF = 321, 298
SP_OFFSET = 19 * 8          # x86-64 struct pt_regs: ..., ip, cs, flags, sp


def bpf(cmd: int, attr: bytes) -> int:
    buf = ctypes.create_string_buffer(attr + b"\0" * (144 - len(attr)), 144)
    fd = libc.syscall(NR_BPF, cmd, buf, 144)
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"bpf cmd {cmd}")
    return fd


def insn(code, dst=0, src=0, off=0, imm=0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def counting_callers(map_fd: int) -> int:
    """A uprobe program: map[return address] += 1."""
    load_map = insn(0x18, dst=1, src=1, imm=map_fd) + insn(0)
    code = b"".join([
        insn(0xbf, dst=6, src=1),                       # r6 = ctx
        insn(0x79, dst=3, src=6, off=SP_OFFSET),        # r3 = ctx->sp
        insn(0xbf, dst=1, src=10), insn(0x07, dst=1, imm=-8),
        insn(0xb7, dst=2, imm=8),
        insn(0x85, imm=112),                            # probe_read_user(fp-8, 8, sp)
        load_map, insn(0xbf, dst=2, src=10), insn(0x07, dst=2, imm=-8),
        insn(0x85, imm=1),                              # map_lookup_elem
        insn(0x15, dst=0, off=4, imm=0),                # not there: to the update
        insn(0xb7, dst=1, imm=1), insn(0xdb, dst=0, src=1),   # atomic += 1
        insn(0xb7, dst=0, imm=0), insn(0x95),
        insn(0x7a, dst=10, off=-16, imm=1),             # fp-16 = 1
        load_map, insn(0xbf, dst=2, src=10), insn(0x07, dst=2, imm=-8),
        insn(0xbf, dst=3, src=10), insn(0x07, dst=3, imm=-16), insn(0xb7, dst=4, imm=0),
        insn(0x85, imm=2),                              # map_update_elem
        insn(0xb7, dst=0, imm=0), insn(0x95)])
    prog, lic = ctypes.create_string_buffer(code), ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(65536)
    attr = struct.pack("<IIQQIIQI", 2, len(code) // 8, ctypes.addressof(prog),
                       ctypes.addressof(lic), 1, 65536, ctypes.addressof(log), 0)
    try:
        return bpf(5, attr)
    except OSError as exc:
        raise OSError(f"prog load: {exc} {log.value[:600]!r}") from None


def file_offset(lib: str, symbol: str) -> int | None:
    syms = subprocess.run(["readelf", "-Ws", "--dyn-syms", lib], capture_output=True,
                          text=True).stdout
    value = next((int(p[1], 16) for p in (line.split() for line in syms.splitlines())
                  if len(p) >= 8 and p[7].split("@")[0] == symbol and p[6] != "UND"
                  and p[3] == "FUNC"), None)
    if value is None:
        return None
    for p in (line.split() for line in subprocess.run(["readelf", "-lW", lib],
                                                      capture_output=True,
                                                      text=True).stdout.splitlines()):
        if p and p[0] == "LOAD":
            off, vaddr, memsz = int(p[1], 16), int(p[2], 16), int(p[5], 16)
            if vaddr <= value < vaddr + memsz:
                return value - vaddr + off
    return None


class Callers:
    """One uprobe per entry, each counting its callers' return addresses."""

    def __init__(self, libraries: dict[str, str]):
        self.fds, self.maps, self.missing, self.keep = [], {}, [], []
        for kind, symbol in ENTRIES:
            lib = libraries.get(kind)
            off = file_offset(lib, symbol) if lib else None
            if off is None:
                self.missing.append(symbol)
                continue
            map_fd = bpf(0, struct.pack("<IIII", 1, 8, 8, 4096))   # HASH u64 → u64
            path = ctypes.create_string_buffer(lib.encode())
            self.keep.append(path)
            ptype = int(Path("/sys/bus/event_source/devices/uprobe/type").read_text())
            attr = struct.pack("<IIQQQQQIIQQ", ptype, 128, 0, 1, 0, 0, 1, 0, 0,
                               ctypes.addressof(path), off)
            a = ctypes.create_string_buffer(attr + b"\0" * (128 - len(attr)), 128)
            fd = libc.syscall(NR_PERF, a, os.getpid(), -1, -1, 8)
            if fd < 0:
                raise OSError(ctypes.get_errno(), f"perf_event_open {symbol}")
            if libc.ioctl(fd, 0x40042408, counting_callers(map_fd)) != 0:
                raise OSError(ctypes.get_errno(), f"PERF_EVENT_IOC_SET_BPF {symbol}")
            self.fds.append(fd)
            self.maps[symbol] = map_fd

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)        # a disabled event still traps: only closing removes it
        self.fds = []

    def read(self) -> dict[str, dict[int, int]]:
        out = {}
        for symbol, map_fd in self.maps.items():
            key, nxt, value = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
            found, first = {}, True
            while True:
                attr = struct.pack("<IIQQ", map_fd, 0, 0 if first else ctypes.addressof(key),
                                   ctypes.addressof(nxt))
                try:
                    bpf(4, attr)
                except OSError:
                    break
                first = False
                bpf(1, struct.pack("<IIQQ", map_fd, 0, ctypes.addressof(nxt),
                                   ctypes.addressof(value)))
                found[nxt.value] = value.value
                key.value = nxt.value
            out[symbol] = found
        return out


def mappings() -> list[tuple[int, int, str]]:
    spans = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and "x" in parts[1]:
            lo, _, hi = parts[0].partition("-")
            spans.append((int(lo, 16), int(hi, 16), os.path.basename(parts[5])))
    return spans


def placed(counts: dict[str, dict[int, int]]) -> dict:
    spans = mappings()

    def where(address: int) -> str:
        return next((name for lo, hi, name in spans if lo <= address < hi), "anonymous")
    result = {}
    for symbol, found in counts.items():
        by: dict[str, int] = {}
        for address, n in found.items():
            by[where(address)] = by.get(where(address), 0) + n
        result[symbol] = {"calls": sum(found.values()),
                          "callers": dict(sorted(by.items(), key=lambda kv: -kv[1]))}
    # ingerod's rule: an entry called from libcudart or libcuda is part of a launch counted
    counted = sum(n for entry in result.values() for name, n in entry["callers"].items()
                  if not name.startswith(CUDA_CODE))
    return {"entries": result, "counted_once": counted,
            "entries_sum": sum(entry["calls"] for entry in result.values())}


def torch_run(steps: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29561")
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, norm_first=True)
    model = DDP(nn.Sequential(nn.Embedding(32000, 512), nn.TransformerEncoder(layer, 4),
                              nn.Linear(512, 32000)).to(dev))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randint(0, 32000, (4, 256), device=dev)
    loss_of = nn.CrossEntropyLoss()

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(model(x).float().view(-1, 32000), x.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    maps = Path("/proc/self/maps").read_text().split()
    libraries = {kind: sorted({m for m in maps if os.path.basename(m).startswith(prefix)})[0]
                 for kind, prefix in (("cudart", "libcudart.so"), ("cuda", "libcuda.so"))}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        callers = Callers(libraries)
        for _ in range(steps):
            step().item()
        torch.cuda.synchronize()
        callers.close()
    launches = {e.key: e.count for e in prof.key_averages()
                if e.key in ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel",
                             "cuLaunchKernelEx")}
    dist.destroy_process_group()
    return {"libraries": libraries, "steps": steps, "missing": callers.missing,
            "machine": torch.cuda.get_device_name(0),
            "profiler_launch_calls": launches, **placed(callers.read()),
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                         "nccl": ".".join(map(str, torch.cuda.nccl.version()))}}


def sim_run() -> dict:
    """The same on the sim's libraries: each path 100 times, through ctypes."""
    lib = REPO / "sim" / "build" / "lib"
    cudart = ctypes.CDLL(str(lib / "libcudart.so.12"))
    cuda = ctypes.CDLL(str(lib / "libcuda.so.1"))

    class Dim3(ctypes.Structure):
        _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]
    kernel = (ctypes.c_uint64 * 2)(0x4B534F5245474E49, 1000)
    one = Dim3(1, 1, 1)
    cudart.cudaLaunchKernel.argtypes = [ctypes.c_void_p, Dim3, Dim3, ctypes.c_void_p,
                                        ctypes.c_size_t, ctypes.c_void_p]
    cuda.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 \
        + [ctypes.c_void_p] * 3
    assert cuda.cuInit(0) == 0
    callers = Callers({"cudart": str(lib / "libcudart.so.12"), "cuda": str(lib / "libcuda.so.1")})
    for _ in range(100):
        assert cudart.cudaLaunchKernel(kernel, one, one, None, 0, None) == 0
        assert cuda.cuLaunchKernel(kernel, 1, 1, 1, 1, 1, 1, 0, None, None, None) == 0
    cudart.cudaDeviceSynchronize()
    callers.close()
    return {"sim": True, "missing": callers.missing, **placed(callers.read())}


def summary(result: dict) -> str:
    calls = result.get("profiler_launch_calls") or {}
    return (f"{result['counted_once']:,} launches counted once by ingerod's rule over "
            f"{result.get('steps', '?')} steps, torch.profiler {sum(calls.values()):,}; "
            f"{result['entries_sum']:,} launch entries in all")


def section(result: dict) -> str:
    v = result.get("versions", {})
    rows = ["| entry | calls | callers (by library) |", "|---|---|---|"]
    rows += [f"| {symbol} | {entry['calls']:,} | "
             + (", ".join(f"{name} {n:,}" for name, n in entry["callers"].items()) or "none")
             + " |" for symbol, entry in result["entries"].items()]
    calls = result.get("profiler_launch_calls") or {}
    return "\n\n".join([
        "## Who calls each launch entry, on a lent GPU: `real_gpu_launches.py`",
        "The fact ingerod's launch counter rests on: a launch entry called from the CUDA "
        "runtime's or driver's own code is part of a launch counted already (cuda.bpf.c, "
        "launch_entry). Raw perf_event_open uprobes with a BPF program each count the return "
        "addresses at the four launch entries, placed in the process's mappings; a PyTorch "
        f"DDP loop (world size 1, bf16, AdamW) over {result.get('steps')} steps after warm-up. "
        "Run there by hand (`OUT=DIR python3 bench/real_gpu_launches.py`), not by `make "
        "bench`.",
        f"torch {v.get('torch')}, CUDA {v.get('cuda')}, NCCL {v.get('nccl')}; "
        f"{result.get('machine', 'NVIDIA H200')}.",
        "\n".join(rows),
        f"Counted once by the rule: **{result['counted_once']:,}**; torch.profiler's launch "
        f"calls: **{sum(calls.values()):,}** ("
        + ", ".join(f"{k} {n:,}" for k, n in calls.items()) + f"); the entries' sum "
        f"{result['entries_sum']:,} (every runtime launch enters the driver too). "
        "torch.profiler's cudaLaunchKernelExC calls never entered libcudart's exported "
        "symbol; the uprobes saw as many more cuLaunchKernelEx than the profiler, called "
        "from outside libcudart (most likely a runtime linked into cuDNN's graph library), "
        "and so counted once there. Where the real CUDA 13 runtime calls the driver, the "
        "caller's address is in libcudart: the rule the sim was built to (REAL-GPU.md) holds "
        "on the real stack."])


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    if "--sim" in sys.argv:
        result = sim_run()
    else:
        try:
            import torch
            if not torch.cuda.is_available():
                raise ImportError("no GPU")
        except ImportError as exc:
            print(f"real_gpu_launches: needs PyTorch and a GPU ({exc}); --sim runs it on the "
                  "sim's libraries")
            return 0
        result = torch_run(20)
    (OUT / "real_gpu_launches.json").write_text(json.dumps(result, indent=1))
    for symbol, entry in result["entries"].items():
        print(f"{symbol}: {entry['calls']} calls; callers {entry['callers']}")
    print(f"real_gpu_launches: {result['counted_once']} launches counted once by ingerod's rule, "
          f"{result['entries_sum']} entries in all; missing symbols {result['missing']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
