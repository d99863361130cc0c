"""What ingerod's bcc-free code makes of a real GPU stack: libraries, discovery, GPU memory.

The one script run on a lent GPU machine (PyTorch with CUDA and NCCL, root, but no bcc and no
kernel headers, so the agent's probes cannot load there). It imports ingerod's own modules from
this checkout (``discovery``, ``gpumem``, ``probes``: none of them imports bcc when imported;
``probes`` imports it only inside ``Tracer``) and checks, against the real files:

    libraries  each CUDA/NCCL library found (torch/lib, the nvidia wheels' lib folders, the
               driver's libcuda as this process maps it after CUDA starts, else ldconfig):
               whether discovery classifies it, and for every symbol of the probe set its
               kind gets (``probes.probes_for``) whether the file's dynamic symbol table
               defines it (``nm -D``, else a small ELF reader), with its version; and which
               calls PyTorch makes (REAL-GPU.md, and libtorch_cuda's own NCCL imports) that no
               probe covers
    discovery  ``discovery.scan`` over the real /proc while a one-rank torchrun job (NCCL, a
               DataLoader with two workers) trains for about 30 s: each candidate's comm,
               role, rank, local rank, world size, launcher and library kinds, against the
               roles its place in the process tree calls for
    gpumem     ``gpumem.device_memory`` (NVML), beside what torch reports
    machine    torch, CUDA and NCCL versions, the GPU, whether bcc and kernel headers exist

Every part records its error and the next one runs. Without torch or a GPU it says so and
exits 0; with no real library found it checks the sim's libraries (labelled ``sim``) instead,
so every part but discovery runs anywhere. It is not one of ``bench/all.py``'s benchmarks.

Run (under six minutes on one GPU; results in $OUT/real_gpu.json, a summary on stdout):

    OUT=/tmp/out python3 bench/real_gpu.py
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import json
import os
import platform
import re
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.elfsymbols import Symbols, command_output, elf_symbols, nm_symbols  # noqa: E402
from bench.real_gpu_job import scan_job, start_job, stop_job, wait_ready  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/out"))
RESULT = "real_gpu.json"
SIM_LIBRARIES = REPO / "sim" / "build" / "lib"

BUDGET_S = 330             # the whole run; the machine gives the script about six minutes
READY_TIMEOUT_S = 150      # torchrun up to the rank's first step: imports, CUDA and NCCL init
DISCOVERY_NEEDS_S = 90     # left in the budget, or the torchrun part is skipped

# A library by its file name, as a person names it: independent of ingerod's own matching, so
# a file it would not classify still shows up (as unclassified) with the kind it should be.
WANTED = re.compile(r"^lib(cudart|nccl|cuda|torch_cuda)\.so")

# Calls PyTorch 2.11 makes, measured on an H200 (shared/REAL-GPU.md, beside the checkout): the
# NCCL symbols libtorch_cuda.so imports, and the CUDA runtime and driver calls seen per training
# step, under the profiler and under CUDA graphs.
PYTORCH_NCCL_IMPORTS = (
    "ncclAllGather ncclAllReduce ncclAlltoAll ncclBcast ncclBroadcast ncclCommAbort "
    "ncclCommCount ncclCommDeregister ncclCommDestroy ncclCommFinalize ncclCommGetAsyncError "
    "ncclCommInitAll ncclCommInitRank ncclCommInitRankConfig ncclCommInitRankScalable "
    "ncclCommRegister ncclCommShrink ncclCommSplit ncclCommUserRank ncclCommWindowDeregister "
    "ncclCommWindowRegister ncclDevCommCreate ncclDevCommDestroy ncclGetErrorString "
    "ncclGetLastError ncclGetUniqueId ncclGetVersion ncclGroupEnd ncclGroupSimulateEnd "
    "ncclGroupStart ncclMemAlloc ncclMemFree ncclRecv ncclRedOpCreatePreMulSum "
    "ncclRedOpDestroy ncclReduce ncclReduceScatter ncclSend").split()
PYTORCH_CUDA_CALLS = (
    "cudaLaunchKernel cuLaunchKernel cuLaunchKernelEx cudaMemcpyAsync cudaEventRecord "
    "cudaEventRecordWithFlags cudaStreamSynchronize cudaEventSynchronize cudaDeviceSynchronize "
    "cudaStreamIsCapturing cudaMemsetAsync cudaEventQuery cudaStreamWaitEvent cudaGraphLaunch "
    "cuGraphLaunch").split()

# -- the run: sections, errors, the result file ---------------------------------------------


class Run:
    """The result being built, written after every section so that a run cut short by the
    machine's time limit still leaves what it had measured."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.started = time.monotonic()
        self.report: dict[str, Any] = {"machine": {}, "gpumem": {}, "libraries": {},
                                       "discovery": {}, "errors": [], "seconds": {},
                                       "measured": {"date": time.strftime("%Y-%m-%d")}}

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def error(self, where: str, exc: BaseException) -> None:
        """Record a failure with where it happened and the end of its traceback."""
        trace = traceback.format_exception(type(exc), exc, exc.__traceback__)
        self.report["errors"].append({"where": where, "error": repr(exc)[:500],
                                      "traceback": "".join(trace)[-1500:]})

    def section(self, name: str, measure: Callable[[], dict]) -> None:
        """Run one part; its failure becomes an error entry, never the end of the run."""
        began = time.monotonic()
        try:
            self.report[name] = measure()
        except Exception as exc:  # any failure of one part is recorded and the next runs
            self.report[name] = {"error": repr(exc)[:500]}
            self.error(name, exc)
        self.report["seconds"][name] = round(time.monotonic() - began, 2)
        self.save()

    def save(self) -> None:
        """Write the result as it stands; a failure to write is printed, not raised."""
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / RESULT).write_text(json.dumps(self.report, indent=1, default=str))
        except OSError as exc:
            print(f"cannot write {self.out / RESULT}: {exc}", file=sys.stderr)


# -- imports: ingerod from this checkout, torch where there is one -------------------------


@dataclasses.dataclass
class Ingerod:
    """ingerod's bcc-free modules, each None where it could not be imported."""

    discovery: ModuleType | None = None
    gpumem: ModuleType | None = None
    probes: ModuleType | None = None
    imports_bcc: bool = False


def load_ingerod(run: Run) -> Ingerod:
    """Import discovery, gpumem and probes from the repository, and note whether doing so
    pulled in bcc (it must not: the GPU machine has none)."""
    sys.path.insert(0, str(REPO))
    had_bcc = "bcc" in sys.modules
    found = Ingerod()
    for name in ("discovery", "gpumem", "probes"):
        try:
            setattr(found, name, importlib.import_module(f"ingerod.{name}"))
        except Exception as exc:  # a module that fails to import leaves the others usable
            run.error(f"import ingerod.{name}", exc)
    found.imports_bcc = not had_bcc and "bcc" in sys.modules
    return found


def load_torch(run: Run) -> tuple[ModuleType | None, str | None]:
    """torch and, where it is missing or has no GPU, why not ("no torch", "no GPU")."""
    try:
        import torch
    except Exception as exc:  # no torch, or a broken one: both mean nothing to measure on
        return None, f"no torch ({exc!r})"
    try:
        if not torch.cuda.is_available():
            return torch, "no GPU (torch.cuda.is_available() is False)"
        torch.cuda.init()
    except Exception as exc:  # the driver is missing or refuses: still a machine without GPU
        run.error("torch.cuda.init", exc)
        return torch, f"no GPU ({exc!r})"
    return torch, None


# -- machine ------------------------------------------------------------------------------


def nccl_version(torch: ModuleType) -> str | None:
    """NCCL's version as torch reports it (a tuple in recent releases, an int before)."""
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def measure_machine(torch: ModuleType | None, no_gpu: str | None, ingerod: Ingerod) -> dict:
    """Versions and the facts that decide what can run here: GPU, bcc, kernel headers."""
    release = platform.release()
    facts: dict[str, Any] = {
        "python": sys.version.split()[0], "kernel": release, "torch": None,
        "gpu": no_gpu is None, "why_no_gpu": no_gpu,
        "bcc_importable": importlib.util.find_spec("bcc") is not None,
        "kernel_headers": Path(f"/lib/modules/{release}/build").exists(),
        "btf": Path("/sys/kernel/btf/vmlinux").exists(),
        "ingerod_imports_bcc": ingerod.imports_bcc,
        "ingerod_modules": {name: getattr(ingerod, name) is not None
                            for name in ("discovery", "gpumem", "probes")}}
    smi = command_output(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                          "--format=csv,noheader"])
    facts["nvidia_smi"] = smi.strip().splitlines() if smi else None
    if torch is None:
        return facts
    facts.update(torch=torch.__version__, cuda=torch.version.cuda)
    facts["nccl"] = nccl_version(torch) if torch.distributed.is_nccl_available() else None
    if no_gpu is None:
        facts["devices"] = [torch.cuda.get_device_name(i)
                            for i in range(torch.cuda.device_count())]
    return facts


# -- gpumem -------------------------------------------------------------------------------


def measure_gpumem(torch: ModuleType | None, no_gpu: str | None, ingerod: Ingerod) -> dict:
    """What ingerod's NVML query answers, timed, beside torch's total for device 0."""
    if ingerod.gpumem is None:
        return {"skipped": "ingerod.gpumem did not import"}
    began = time.monotonic()
    total = ingerod.gpumem.device_memory()
    result = {"nvml_total_bytes": total, "nvml_ms": round(1000 * (time.monotonic() - began), 1),
              "torch_total_bytes": None}
    if torch is not None and no_gpu is None:
        result["torch_total_bytes"] = torch.cuda.mem_get_info(0)[1]
    return result


# -- symbols: nm -D, else the ELF file's .dynsym --------------------------------------------

def read_symbols(path: str, run: Run) -> tuple[Symbols, dict]:
    """nm's reading where nm works, else the ELF reader's; and whether the two agree on the
    defined names (a check of the fallback reader on real files)."""
    by_nm = nm_symbols(path)
    try:
        by_elf: Symbols | None = elf_symbols(path)
    except (OSError, ValueError, struct.error) as exc:
        run.error(f"elf reader {path}", exc)
        by_elf = None
    chosen = by_nm or by_elf
    if chosen is None:
        raise RuntimeError(f"{path}: neither nm nor the ELF reader could read it")
    check: dict[str, Any] = {"compared": by_nm is not None and by_elf is not None}
    if check["compared"]:
        only_nm = sorted(set(by_nm.defined) - set(by_elf.defined))
        only_elf = sorted(set(by_elf.defined) - set(by_nm.defined))
        spelled = {n: sorted(v) for n, v in by_nm.defined.items()}
        differ = sorted(n for n, v in by_elf.defined.items()
                        if n in spelled and sorted(v) != spelled[n])
        check.update(agree=not only_nm and not only_elf and not differ,
                     only_nm=only_nm[:10], only_elf=only_elf[:10],
                     versions_differ=[(n, spelled[n], by_elf.defined[n]) for n in differ[:10]])
    return chosen, check


# -- libraries: finding them, and what ingerod would attach to each -------------------------


@dataclasses.dataclass
class Library:
    """A library file found on this machine and where: mapped (this process, after CUDA
    started), torch, nvidia-wheel, ldconfig, or sim (the fallback set)."""

    path: str
    source: str


def name_kind(path: str) -> str | None:
    """The kind a file's name says it is (``WANTED``), whatever ingerod makes of it."""
    match = WANTED.match(os.path.basename(path))
    return match[1] if match else None


def mapped_here() -> list[str]:
    """The wanted libraries this process maps now, from /proc/self/maps."""
    paths = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/") and name_kind(parts[5]):
            paths.append(parts[5].removesuffix(" (deleted)"))
    return paths


def site_folders(torch: ModuleType | None) -> list[Path]:
    """Where Python packages live: torch's own site-packages first, then sys.path."""
    folders = [Path(torch.__file__).resolve().parent.parent] if torch is not None else []
    folders += [Path(entry) for entry in sys.path if entry and Path(entry).is_dir()]
    return list(dict.fromkeys(folders))


def wheel_libraries(torch: ModuleType | None) -> list[str]:
    """The wanted files of the nvidia wheels (``nvidia/<name>/lib/``, and one folder deeper
    for the CUDA 13 wheels' ``nvidia/cu13/lib``)."""
    found = []
    for folder in site_folders(torch):
        for pattern in ("nvidia/*/lib*/lib*", "nvidia/*/*/lib*/lib*"):
            found += [str(p) for p in sorted(folder.glob(pattern))
                      if name_kind(p.name) and p.is_file()]
    return found


def ldconfig_libcuda() -> list[str]:
    """libcuda.so.1 as the dynamic linker's cache names it (the driver's file)."""
    out = command_output(["ldconfig", "-p"]) or ""
    return [line.split("=>")[-1].strip() for line in out.splitlines()
            if line.strip().startswith("libcuda.so.1 ") and "=>" in line]


def find_libraries(torch: ModuleType | None) -> list[Library]:
    """Every wanted library found, one entry per file (by its resolved path); the sim's
    libraries when no real runtime or NCCL library turns up."""
    seen: dict[str, Library] = {}

    def add(paths: list[str], source: str) -> None:
        for path in paths:
            seen.setdefault(os.path.realpath(path), Library(path, source))

    add(mapped_here(), "mapped")
    if torch is not None:
        add([str(Path(torch.__file__).resolve().parent / "lib" / "libtorch_cuda.so")], "torch")
    add(wheel_libraries(torch), "nvidia-wheel")
    if not any(name_kind(lib.path) == "cuda" for lib in seen.values()):
        add(ldconfig_libcuda(), "ldconfig")
    found = [lib for lib in seen.values() if os.path.isfile(lib.path)]
    if not any(name_kind(lib.path) in ("cudart", "nccl") for lib in found):
        found += [Library(str(p), "sim") for p in sorted(SIM_LIBRARIES.glob("lib*.so.*"))
                  if not p.is_symlink() and name_kind(p.name)]
    return found


def probe_table_from_source() -> list[dict]:
    """The probe table read from ingerod/probes.py's text (its ``Probe(...)`` calls), for
    when the module cannot be imported; the same rows ``probes.PROBES`` holds."""
    rows = []
    tree = ast.parse((REPO / "ingerod" / "probes.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Probe":
            args = [ast.literal_eval(a) for a in node.args]
            kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
            args += [None] * (4 - len(args))
            rows.append({"library": args[0], "symbol": args[1], "entry": args[2],
                         "ret": kw.get("ret", args[3]), "hot": kw.get("hot", False)})
    return rows


def probe_rows(ingerod: Ingerod, library: Any, kind: str) -> list[dict]:
    """The probes ingerod would attach to this library: ``probes.probes_for`` where the
    module imports, else the source's table with its rule (libtorch_cuda gets NCCL's)."""
    if ingerod.probes is not None:
        return [dataclasses.asdict(p) for p in ingerod.probes.probes_for(library)]
    want = "nccl" if kind == "torch_cuda" else kind
    return [row for row in probe_table_from_source() if row["library"] == want]


def all_probed(ingerod: Ingerod) -> set[str]:
    """Every symbol of the probe set, whatever library it is for."""
    if ingerod.probes is not None:
        return {p.symbol for p in ingerod.probes.PROBES}
    return {row["symbol"] for row in probe_table_from_source()}


def library_coverage(library: Library, ingerod: Ingerod, run: Run) -> dict:
    """One library: its kind as ingerod's discovery sees it, and each probe's symbol in it."""
    name = os.path.basename(library.path)
    should_be = name_kind(name)
    entry: dict[str, Any] = {"path": library.path, "realpath": os.path.realpath(library.path),
                             "source": library.source, "size": os.path.getsize(library.path),
                             "name_says": should_be, "kind": None, "classified": False}
    found = None
    if ingerod.discovery is not None:
        entry["kind"] = ingerod.discovery.library_kind(library.path)
        entry["classified"] = entry["kind"] is not None
        found = ingerod.discovery.library_file(library.path)
    kind = entry["kind"] or should_be
    stand_in = found or (ingerod.discovery.LibraryFile(kind, library.path, 0, 0)
                         if ingerod.discovery is not None else None)
    rows = probe_rows(ingerod, stand_in, kind)
    symbols, entry["reader_check"] = read_symbols(library.path, run)
    entry.update(reader=symbols.reader, defined=len(symbols.defined),
                 undefined=len(symbols.undefined))
    entry["probes"] = [{"symbol": r["symbol"], "present": r["symbol"] in symbols.defined,
                        "versioned": symbols.defined.get(r["symbol"], []), "hot": r["hot"],
                        "return_probe": r["ret"] is not None} for r in rows]
    entry["missing"] = [p["symbol"] for p in entry["probes"] if not p["present"]]
    probed = all_probed(ingerod)
    entry["used_by_pytorch_unprobed"] = sorted(
        s for s in PYTORCH_NCCL_IMPORTS + PYTORCH_CUDA_CALLS
        if s in symbols.defined and s not in probed)
    if kind == "torch_cuda":
        entry["nccl_defined"] = sorted(s for s in symbols.defined if s.startswith("nccl"))[:50]
        entry["nccl_imports"] = sorted(s for s in symbols.undefined if s.startswith("nccl"))
        entry["nccl_imports_unprobed"] = [s for s in entry["nccl_imports"] if s not in probed]
    return entry


def unprobed_calls(ingerod: Ingerod, entries: list[dict]) -> list[dict]:
    """The calls PyTorch makes that no probe covers, and which found library defines each."""
    probed = all_probed(ingerod)
    imports = {s for e in entries for s in e.get("nccl_imports", [])}
    calls = sorted(set(PYTORCH_NCCL_IMPORTS + PYTORCH_CUDA_CALLS) | imports)
    return [{"symbol": s, "seen_in": "libtorch_cuda imports" if s in imports else "REAL-GPU.md",
             "defined_in": [os.path.basename(e["path"]) for e in entries
                            if s in e.get("used_by_pytorch_unprobed", [])]}
            for s in calls if s not in probed]


def ingerod_view_of_self(ingerod: Ingerod) -> list[dict]:
    """What ingerod's discovery reads from this very process's maps (a torch process here)."""
    if ingerod.discovery is None:
        return []
    found = ingerod.discovery.mapped_libraries(Path("/proc"), os.getpid())
    return sorted(({"kind": lib.kind, "path": lib.path} for lib in found),
                  key=lambda d: (d["kind"], d["path"]))


def measure_libraries(torch: ModuleType | None, ingerod: Ingerod, run: Run) -> dict:
    """Every library found, the probe set against its symbols, and PyTorch's unprobed calls."""
    entries = []
    for library in find_libraries(torch):
        try:
            entries.append(library_coverage(library, ingerod, run))
        except Exception as exc:  # one unreadable file leaves the others to report
            run.error(f"library {library.path}", exc)
            entries.append({"path": library.path, "source": library.source,
                            "error": repr(exc)[:300]})
    good = [e for e in entries if "error" not in e]
    return {"sim_fallback": any(e["source"] == "sim" for e in entries),
            "probe_table_from": "ingerod.probes" if ingerod.probes else "probes.py source",
            "files": entries, "ingerod_sees_in_this_process": ingerod_view_of_self(ingerod),
            "unprobed_pytorch_calls": unprobed_calls(ingerod, good)}


# -- discovery: a real torchrun job read from the real /proc -------------------------------

def measure_discovery(torch: ModuleType | None, no_gpu: str | None, ingerod: Ingerod,
                      run: Run) -> dict:
    """A one-rank torchrun job read by ``discovery.scan`` while it trains, then after."""
    if torch is None or no_gpu is not None:
        return {"skipped": no_gpu or "no torch"}
    if ingerod.discovery is None:
        return {"skipped": "ingerod.discovery did not import"}
    left = BUDGET_S - run.elapsed()
    if left < DISCOVERY_NEEDS_S:
        return {"skipped": f"only {left:.0f} s of the budget left"}
    with tempfile.TemporaryDirectory(prefix="ingero-real-gpu-") as name:
        folder = Path(name)
        log = folder / "job.log"
        job = start_job(folder, log)
        result: dict[str, Any] = {"launcher_pid": job.pid}
        try:
            began = time.monotonic()
            result["ready"] = wait_ready(job, log, min(READY_TIMEOUT_S, left - 60))
            result["ready_s"] = round(time.monotonic() - began, 1)
            if result["ready"]:
                result["scans"] = scan_job(ingerod.discovery, job)
        finally:
            result["exit_code"] = stop_job(ingerod.discovery, job)
            result["log_tail"] = log.read_text(errors="replace").splitlines()[-20:]
        job_pids = {r["pid"] for s in result.get("scans", []) for r in s["candidates"]
                    if r["in_job"]}
        left_over = set(ingerod.discovery.scan(Path("/proc"))) & job_pids
        result["still_candidates_after_stop"] = sorted(left_over)
    scans = result.get("scans") or [{}]
    result["as_expected"] = bool(scans[-1].get("candidates")) and not any(
        s["mismatches"] for s in result.get("scans", []))
    return result


# -- the summary ----------------------------------------------------------------------------


def summary_lines(report: dict) -> list[str]:
    """A few lines a person reads first; the JSON has the rest."""
    m, g, libs, d = (report[k] for k in ("machine", "gpumem", "libraries", "discovery"))
    lines = [f"machine: torch {m.get('torch')} cuda {m.get('cuda')} nccl {m.get('nccl')}; "
             f"{m.get('why_no_gpu') or m.get('devices')}; bcc {m.get('bcc_importable')}, "
             f"headers {m.get('kernel_headers')}, ingerod imports bcc "
             f"{m.get('ingerod_imports_bcc')}",
             f"gpumem: NVML {g.get('nvml_total_bytes')} B, torch {g.get('torch_total_bytes')} B"]
    for f in libs.get("files", []):
        if "error" in f:
            lines.append(f"  {f['path']}: {f['error']}")
            continue
        have = sum(p["present"] for p in f["probes"])
        lines.append(f"  [{f['source']}] {os.path.basename(f['path'])}: kind {f['kind']} "
                     f"({f['reader']}), {have}/{len(f['probes'])} probe symbols"
                     + (f", missing {' '.join(f['missing'])}" if f["missing"] else ""))
    unprobed = [u["symbol"] for u in libs.get("unprobed_pytorch_calls", [])]
    lines.insert(2, f"libraries ({'sim' if libs.get('sim_fallback') else 'real'}):")
    lines.append(f"unprobed PyTorch calls ({len(unprobed)}): {' '.join(unprobed)}")
    if "scans" in d:
        lines.append(f"discovery: ready in {d.get('ready_s')} s, {len(d['scans'])} scans, "
                     f"as expected: {d.get('as_expected')}")
        for r in d["scans"][-1]["candidates"] if d["scans"] else []:
            lines.append(f"  pid {r['pid']} {r['comm']}: {r['role']} (want "
                         f"{r.get('expected_role', '-')}) rank {r['rank']} local "
                         f"{r['local_rank']} world {r['world_size']} by {r['told_by']} "
                         f"libs {','.join(r['libraries'])}")
    else:
        lines.append(f"discovery: {d.get('skipped') or d.get('error') or d}")
    lines.append(f"errors: {len(report['errors'])}; "
                 + ", ".join(e["where"] for e in report["errors"][:8]))
    return lines


def summary(result: dict) -> str:
    """The one line docs/benchmarks.md's readers and the README quote."""
    m, libs, d = result["machine"], result["libraries"], result["discovery"]
    found = ", ".join(f"{os.path.basename(f['path'])} {sum(p['present'] for p in f['probes'])}"
                      f"/{len(f['probes'])}" for f in libs.get("files", []) if "probes" in f)
    return (f"torch {m.get('torch')}, NCCL {m.get('nccl')}, CUDA {m.get('cuda')}: "
            f"probe symbols defined: {found}; "
            f"{len(libs.get('unprobed_pytorch_calls', []))} calls PyTorch makes unprobed, "
            f"discovery {'as expected' if d.get('as_expected') else 'NOT as expected'}")


def section(result: dict) -> str:
    """docs/benchmarks.md's section: what ingerod's bcc-free code made of the real stack."""
    m, g, libs, d = (result[k] for k in ("machine", "gpumem", "libraries", "discovery"))
    rows = ["| library | discovery's kind | probe symbols defined | missing |", "|---|---|---|---|"]
    for f in libs.get("files", []):
        if "probes" not in f:
            continue
        have = sum(p["present"] for p in f["probes"])
        rows.append(f"| `{os.path.basename(f['path'])}` | {f['kind']} | {have}/{len(f['probes'])} "
                    f"| {', '.join(f['missing']) or '-'} |")
    unprobed = ", ".join(u["symbol"] for u in libs.get("unprobed_pytorch_calls", []))
    scans = d.get("scans") or [{}]
    found = ["| pid | comm | role | rank | world | told by |", "|---|---|---|---|---|---|"] + [
        f"| {r['pid']} | {r['comm']} | {r['role']} | {r['rank']} | {r['world_size']} "
        f"| {r['told_by']} |" for r in scans[-1].get("candidates", [])]
    return "\n\n".join([
        "## The real NVIDIA stack, on a lent GPU: `real_gpu.py`",
        "What ingerod's own code (discovery, the probe table, NVML) makes of a real GPU "
        "machine, where bcc cannot load (no kernel headers): which of the probe set's symbols "
        "each real library defines, which calls PyTorch makes that no probe covers, and how "
        "discovery reads a real torchrun job (a DataLoader with 2 workers). Run there by hand "
        "(`OUT=DIR python3 bench/real_gpu.py`), not by `make bench`.",
        f"torch {m.get('torch')}, CUDA {m.get('cuda')}, NCCL {m.get('nccl')}, "
        f"{', '.join(m.get('nvidia_smi') or m.get('devices') or [])}; kernel {m.get('kernel')}, "
        f"BTF {m.get('btf')}, kernel headers {m.get('kernel_headers')}, bcc "
        f"{m.get('bcc_importable')}. NVML: {g.get('nvml_total_bytes')} bytes of GPU memory "
        f"(torch: {g.get('torch_total_bytes')}).",
        "\n".join(rows),
        f"Calls PyTorch makes that no probe covers ({unprobed.count(',') + 1 if unprobed else 0}):"
        f" {unprobed or 'none'}.",
        f"Discovery over the real /proc, {len(d.get('scans', []))} scans ("
        + ("every role as the process tree calls for" if d.get("as_expected")
           else "roles NOT as expected") + "):",
        "\n".join(found),
        f"Measured {result.get('measured', {}).get('date', 'on the lent machine')}: "
        f"`bench/real_gpu.py`, {result['seconds'].get('total')} s."])


def main() -> int:
    """Every part in turn, each under its own guard; always exit 0 (the JSON says how it went)."""
    run = Run(OUT)
    ingerod = load_ingerod(run)
    torch, no_gpu = load_torch(run)
    run.section("machine", lambda: measure_machine(torch, no_gpu, ingerod))
    run.section("gpumem", lambda: measure_gpumem(torch, no_gpu, ingerod))
    run.section("libraries", lambda: measure_libraries(torch, ingerod, run))
    run.section("discovery", lambda: measure_discovery(torch, no_gpu, ingerod, run))
    run.report["seconds"]["total"] = round(run.elapsed(), 1)
    run.save()
    try:
        print("\n".join(summary_lines(run.report)))
    except Exception as exc:  # a summary that cannot be built must not hide the JSON
        print(f"summary failed: {exc!r}")
    print(f"results: {OUT / RESULT} ({run.report['seconds']['total']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
