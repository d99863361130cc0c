"""What ``ingero version`` tells an operator about this node's installation: ingero's version,
the Python it runs on, whether Debian's bcc imports, the kernel, and where ingerod finds its BPF
sources and the rate table (package data of the installed wheel)."""

from __future__ import annotations

import platform
import sys

from . import __version__
from .rates import SHIPPED


def facts() -> dict:
    from ingerod.probes import BPF_DIR, PARTS

    bcc_version, bcc_error = None, None
    try:
        import bcc
        bcc_version = getattr(bcc, "__version__", "present")
    except Exception as exc:          # any failure to import is what the operator needs to see
        bcc_error = f"{type(exc).__name__}: {exc}"
    found = [part for part in PARTS if (BPF_DIR / part).is_file()]
    return {"ingero": __version__, "python": platform.python_version(),
            "python_path": sys.executable, "bcc": bcc_version, "bcc_error": bcc_error,
            "kernel": platform.release(), "bpf_dir": str(BPF_DIR),
            "bpf_sources": found, "bpf_missing": [p for p in PARTS if p not in found],
            "rates": str(SHIPPED), "rates_found": SHIPPED.is_file()}


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
    ])
