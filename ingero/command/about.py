"""What ``ingero version`` tells an operator about this node's installation: ingero's version,
the Python it runs on, whether Debian's bcc imports, the kernel, where ingerod finds its BPF
sources and the rate table (package data of the installed wheel), which parts this
installation can run (a compute node's ``ingero[agent]`` has no echod) and which of ingero's
daemons run here now."""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from pathlib import Path

from ingero import __version__
from ingero.rates import SHIPPED
from ingero.runtime import HEAD_MODULES


def bpf_sources() -> tuple[Path, tuple[str, ...]]:
    """Where ingerod reads its BPF sources (``INGERO_BPF_DIR`` over its package data) and the
    parts it joins, found without importing ingerod."""
    spec = importlib.util.find_spec("ingerod")
    package = Path(spec.origin).parent / "bpf" if spec and spec.origin else Path("ingerod/bpf")
    try:
        parts = tuple((package / "parts").read_text().split())
    except OSError:
        parts = ("parts",)                            # reported missing with the rest
    return Path(os.environ.get("INGERO_BPF_DIR", package)), parts


def facts() -> dict:
    source_dir, wanted = bpf_sources()
    bcc_version, bcc_error = None, None
    try:
        import bcc
        bcc_version = getattr(bcc, "__version__", "present")
    except Exception as exc:          # any failure to import is what the operator needs to see
        bcc_error = f"{type(exc).__name__}: {exc}"
    found = [part for part in wanted if (source_dir / part).is_file()]
    return {"ingero": __version__, "python": platform.python_version(),
            "python_path": sys.executable, "bcc": bcc_version, "bcc_error": bcc_error,
            "kernel": platform.release(), "bpf_dir": str(source_dir),
            "bpf_sources": found, "bpf_missing": [p for p in wanted if p not in found],
            "rates": str(SHIPPED), "rates_found": SHIPPED.is_file(),
            "parts": parts(), "running": running()}


# what echod needs beyond the agent's and the command's dependencies: the head extra
DAEMONS = ("ingerod", "fleetd", "echod")


def parts() -> dict[str, bool]:
    """What this installation can run: ingerod, fleetd and the command always; echod with
    the head extra; ingero mcp with mcp; the demo from a checkout, which has the sim."""
    def have(name: str) -> bool:
        return importlib.util.find_spec(name) is not None
    return {"ingerod": True, "fleetd": True, "echod": all(map(have, HEAD_MODULES)),
            "mcp": have("mcp"), "demo": have("sim") and have("stack")}


def running(proc: Path = Path("/proc")) -> list[dict]:
    """ingero's daemons running on this host: name, pid and the program or module run."""
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        name = _daemon(argv)
        if name:
            found.append({"daemon": name, "pid": int(entry.name), "program": argv[0]})
    return sorted(found, key=lambda d: (d["daemon"], d["pid"]))


def _daemon(argv: list[str]) -> str | None:
    for k, arg in enumerate(argv[:3]):
        if Path(arg).name in DAEMONS:
            return Path(arg).name
        if arg == "-m" and k + 1 < len(argv) and argv[k + 1] in DAEMONS:
            return argv[k + 1]
    return None


def render(f: dict) -> str:
    bcc = f['bcc'] if f["bcc"] else f"not importable ({f['bcc_error']})"
    bpf = (f"{f['bpf_dir']} ({len(f['bpf_sources'])} sources)" if not f["bpf_missing"]
           else f"{f['bpf_dir']}: missing {', '.join(f['bpf_missing'])}")
    return "\n".join([
        f"ingero {f['ingero']}",
        f"python: {f['python']} ({f['python_path']})",
        f"bcc: {bcc}",
        f"kernel: {f['kernel']}",
        f"bpf: {bpf}",
        f"rates: {f['rates']}{'' if f['rates_found'] else ' (missing)'}",
        "parts: " + ", ".join(f"{name} {'yes' if ok else 'no'}"
                              for name, ok in f["parts"].items())
        + ("" if f["parts"]["echod"] else " (echod: pip install 'ingero[head]')"),
        "running: " + (", ".join(f"{d['daemon']} (pid {d['pid']})" for d in f["running"])
                       or "none of ingerod, fleetd, echod"),
    ])
