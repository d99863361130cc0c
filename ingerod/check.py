"""What this node needs for eBPF tracing, each with what is there and how to fix what is not:
``ingerod check`` prints it, and the agent names, from the same list, why it cannot trace.

bcc compiles ingerod's program at start against the running kernel's headers; a node booting a
vendor or custom kernel often has none (REAL-GPU.md: BTF present, no headers, no bcc compile).
Imports nothing of the agent: reading these files needs no privilege, and the
check runs where the agent cannot.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

# Capability bits (linux/capability.h)
CAP_SYS_ADMIN, CAP_PERFMON, CAP_BPF = 21, 38, 39


def there(path: Path, directory: bool = False) -> bool:
    """Whether a path exists (is a directory); False where it cannot be looked at (tracefs is
    mode 0700: an unprivileged check sees nothing there, and must still say so)."""
    try:
        return path.is_dir() if directory else path.exists()
    except OSError:
        return False


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    found: str            # what is there
    fix: str = ""         # what to do where it is not
    needed: bool = True   # tracing cannot start without it

    def line(self) -> str:
        mark = "ok" if self.ok else ("MISSING" if self.needed else "note")
        text = f"{mark:<8}{self.name:<22}{self.found}"
        return text if self.ok or not self.fix else f"{text}\n{'':30}fix: {self.fix}"


def kernel_headers(root: Path = Path("/"), release: str | None = None,
                   environ=os.environ) -> Check:
    """The headers bcc compiles against: BCC_KERNEL_SOURCE where set, else the running
    kernel's build tree under /lib/modules, else the kernel's own (CONFIG_IKHEADERS)."""
    release = release or platform.release()
    named = environ.get("BCC_KERNEL_SOURCE")
    trees = [Path(named)] if named else [root / "lib/modules" / release / "build"]
    for tree in trees:
        if there(tree / "include", directory=True):
            return Check("kernel headers", True, f"{tree} ({release})")
    if not named and there(root / "sys/kernel/kheaders.tar.xz"):
        return Check("kernel headers", True, f"the kernel's own (kheaders, {release})")
    where = f"BCC_KERNEL_SOURCE={named}" if named else str(trees[0])
    return Check("kernel headers", False, f"none for the running kernel {release} ({where})",
                 f"install them (Debian/Ubuntu: apt-get install linux-headers-{release}; "
                 f"RHEL: dnf install kernel-devel-{release}), or load the kernel's own "
                 "(modprobe kheaders, where built with CONFIG_IKHEADERS)")


def bcc_importable() -> Check:
    try:
        import bcc  # noqa: F401  Debian's bcc
    except (ImportError, OSError):      # OSError: its libbcc.so.0 missing or mismatched
        return Check("bcc", False, "not importable by this Python",
                     "apt-get install python3-bpfcc bpfcc-tools libbpfcc (bcc from the "
                     "distribution, never from PyPI), and run ingerod with the system "
                     "Python's packages visible")
    return Check("bcc", True, f"importable ({Path(bcc.__file__).parent})")


def privileges(status: Path = Path("/proc/self/status")) -> Check:
    try:
        caps = next(int(line.split()[1], 16) for line in status.read_text().splitlines()
                    if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError, IndexError):
        caps = 0
    names = [name for name, bit in (("CAP_SYS_ADMIN", CAP_SYS_ADMIN), ("CAP_BPF", CAP_BPF),
                                    ("CAP_PERFMON", CAP_PERFMON)) if caps >> bit & 1]
    ok = bool(caps >> CAP_SYS_ADMIN & 1) or bool(caps >> CAP_BPF & 1 and caps >> CAP_PERFMON & 1)
    return Check("privileges", ok, f"uid {os.geteuid()}, {', '.join(names) or 'no BPF capability'}",
                 "run as root, or with CAP_BPF and CAP_PERFMON (the shipped unit does)")


def uprobes(root: Path = Path("/")) -> Check:
    found = there(root / "sys/bus/event_source/devices/uprobe/type")
    return Check("uprobes", found, "the uprobe PMU" if found else "no uprobe PMU",
                 "a kernel built with CONFIG_UPROBE_EVENTS")


def tracefs(root: Path = Path("/")) -> Check:
    for tree in (root / "sys/kernel/tracing", root / "sys/kernel/debug/tracing"):
        if there(tree / "uprobe_events"):
            return Check("tracefs", True, str(tree))
    return Check("tracefs", False, "not mounted",
                 "mount -t tracefs nodev /sys/kernel/tracing")


def btf(root: Path = Path("/")) -> Check:
    found = there(root / "sys/kernel/btf/vmlinux")
    return Check("BTF", found, "/sys/kernel/btf/vmlinux" if found else "none",
                 "a kernel built with CONFIG_DEBUG_INFO_BTF (not needed by bcc today)",
                 needed=False)


def lockdown(root: Path = Path("/")) -> Check:
    try:
        text = (root / "sys/kernel/security/lockdown").read_text()
    except OSError:
        return Check("lockdown", True, "not in force (no lockdown LSM)")
    mode = text[text.find("[") + 1:text.find("]")] if "[" in text else text.strip()
    return Check("lockdown", mode != "confidentiality", mode,
                 "boot without lockdown=confidentiality (Secure Boot may set it): it forbids "
                 "reading kernel memory from BPF")


def perf_event_paranoid(root: Path = Path("/")) -> Check:
    try:
        level = int((root / "proc/sys/kernel/perf_event_paranoid").read_text())
    except (OSError, ValueError):
        return Check("perf_event_paranoid", True, "unknown", needed=False)
    return Check("perf_event_paranoid", level <= 2, str(level),
                 "sysctl kernel.perf_event_paranoid=2 (root and CAP_PERFMON pass any level; "
                 "a higher level only stops an agent without them)", needed=False)


def checks(root: Path = Path("/"), environ=os.environ) -> list[Check]:
    return [bcc_importable(), privileges(), kernel_headers(root, environ=environ),
            uprobes(root), tracefs(root), btf(root), lockdown(root), perf_event_paranoid(root)]


# The agent's word for a need missing (ingero_agent_tracing{reason}); load_failed where every
# need is there and the kernel still refused the program.
REASONS = {"bcc": "no_bcc", "privileges": "not_permitted", "kernel headers": "no_kernel_headers",
           "uprobes": "no_uprobes", "tracefs": "no_tracefs", "lockdown": "lockdown"}


def reason(found: list[Check]) -> str:
    """Why tracing cannot start, as the agent's metric says it: the first need missing."""
    return next((REASONS[check.name] for check in found if check.needed and not check.ok),
                "load_failed")
