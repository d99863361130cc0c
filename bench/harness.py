"""The shape every benchmark takes, and what runs it.

A benchmark is a module of ``bench/`` with:

    NAME          its results file, ``bench/results/NAME.json``
    ROOT_BECAUSE  why it needs root (a sentence), or None
    add_arguments(parser)   its own options; ``--smoke`` and ``--json`` come from here
    run(args) -> dict       measure; ``args.smoke`` asks for the smallest size that still
                            exercises every part (CI runs that, so the benchmark keeps working)
    summary(result) -> str  one line: the figure a reader wants first
    section(result) -> str  its part of docs/benchmarks.md (Markdown, from the result alone)

``main(module)`` is each script's entry point: it parses, checks root, runs, writes the
result (with when, where and how it was measured) and prints the summary line last. Figures
are ratios within one run or counts: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

RESULTS = Path(__file__).resolve().parent / "results"


def parser_for(module: ModuleType) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"bench/{module.NAME}.py",
                                     description=(module.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run that exercises every part (what CI runs)")
    parser.add_argument("--json", type=Path, default=None,
                        help=f"write the result here (default: bench/results/{module.NAME}"
                        ".json, none for --smoke or a part of the run, --only)")
    module.add_arguments(parser)
    return parser


def machine() -> dict:
    """Where a result was measured."""
    return {"date": datetime.date.today().isoformat(), "cpus": os.cpu_count(),
            "kernel": platform.release(), "python": platform.python_version(),
            "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
                                / 2**30)}


def main(module: ModuleType, argv: list[str] | None = None) -> int:
    args = parser_for(module).parse_args(argv)
    if module.ROOT_BECAUSE and os.geteuid() != 0:
        sys.exit(f"bench/{module.NAME}.py needs root: {module.ROOT_BECAUSE}")
    result = module.run(args)
    result["measured"] = {**machine(), "smoke": args.smoke,
                          "command": " ".join(["python -m bench." + module.NAME,
                                               *(argv if argv is not None else sys.argv[1:])])}
    partial = args.smoke or getattr(args, "only", None)   # never over the whole run's result
    target = args.json or (None if partial else RESULTS / f"{module.NAME}.json")
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{module.NAME}: {module.summary(result)}", flush=True)
    return 0


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int, leave_out: int | None = None) -> float:
    """CPU time of a process and all its descendants, living or reaped (reaped children count
    through the parent's cutime and cstime), less the subtree of ``leave_out``."""
    parents: dict[int, int] = {}
    stats: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue            # gone meanwhile
            parents[int(entry.name)], stats[int(entry.name)] = int(fields[1]), fields
    tick = os.sysconf("SC_CLK_TCK")
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        if current == leave_out or current not in stats:
            continue
        fields = stats[current]
        total += sum(int(fields[i]) for i in (11, 12, 13, 14)) / tick
        todo += [child for child, parent in parents.items() if parent == current]
    return total


def profile(pid: int, seconds: float, out: Path) -> subprocess.Popen:
    """Start sampling a Python process's stacks with py-spy (without pausing it) for ``seconds``
    into ``out``; ``profile_shares`` reads the file once the returned process has exited."""
    return subprocess.Popen(
        [str(Path(sys.executable).with_name("py-spy")), "record", "--nonblocking", "--format",
         "raw", "--duration", str(max(1, round(seconds))), "--pid", str(pid), "--output",
         str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def profile_shares(out: Path, top: int = 12, idle: str = "poll") -> list[dict]:
    """The functions a profile spent most of its busy samples in (with what they called),
    largest first, leaving out the wrappers that are on nearly every stack (the main loop).
    A sample waiting in a function named ``idle`` (a poller) is not busy: py-spy, told not to
    pause the process, cannot always tell a thread waiting in C from one working there."""
    samples, inclusive = 0, {}
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or stack.rsplit(";", 1)[-1].split(" ")[0].split(".")[-1] == idle:
            continue
        samples += int(count)
        for frame in set(map(_frame, stack.split(";"))):
            inclusive[frame] = inclusive.get(frame, 0) + int(count)
    shares = sorted(((n / samples, frame) for frame, n in inclusive.items()), reverse=True)
    return [{"function": frame, "share": round(share, 3)}
            for share, frame in shares if share < 0.9][:top]


def _frame(frame: str) -> str:
    """``tick (/work/main/fleetd/ranks.py:134)`` → ``tick (fleetd/ranks.py)``."""
    match = re.fullmatch(r"(.*) \((.*?)(?::\d+)?\)", frame)
    if not match:
        return frame
    return f"{match[1]} ({'/'.join(match[2].split('/')[-2:])})"


def peak_rss_mib(pid: int) -> float:
    """The most resident memory a process has held so far."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def against(what: str, value: float, target: float, unit: str, higher_is_better: bool) -> str:
    """A sentence: the figure against its target, and by how much it misses."""
    met = value >= target if higher_is_better else value <= target
    if met:
        return f"Target met: {what} {value:,.6g} {unit} (target {target:,.6g} {unit})."
    factor = target / value if higher_is_better else value / target
    return (f"Target missed: {what} {value:,.6g} {unit} against {target:,.6g} {unit}, "
            f"{factor:,.1f}× off.")


def ratio(value: float) -> str:
    return f"{value:.3f}×"


def table(header: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def measured_line(result: dict) -> str:
    m = result.get("measured", {})
    return (f"Measured {m.get('date', '?')} on {m.get('cpus', '?')} CPUs, "
            f"{m.get('memory_gib', '?')} GiB, Linux {m.get('kernel', '?')}"
            + (" (smoke size: not a measurement)" if m.get("smoke") else "")
            + f": `{m.get('command', '?')}`.")
