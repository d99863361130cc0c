"""How much does tracing slow the training job? A sim job run three ways, interleaved:

    none    no probes at all
    noop    a BPF program that returns at once, on exactly the functions ingerod probes
            (entry and return where ingerod uses both): the price of the uprobe traps alone
    ingerod ``ingerod trace --json`` running, with its output thrown away: the whole cost,
            probes, ring buffer and user space together

Each run's job time is the mean step time the ranks record. Results are ratios to ``none``
within one invocation (this machine is shared and noisy), medians over the repetitions.
Needs root and Debian's bcc. Run: ``.venv/bin/python bench/trace_overhead.py``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.report import run_and_report  # noqa: E402
import sim  # noqa: E402
from ingerod.probes import PROBES  # noqa: E402
from sim import scenario as scenarios  # noqa: E402
from sim.cluster import Cluster  # noqa: E402
from sim.records import read_record  # noqa: E402

NOOP = "int noop(struct pt_regs *ctx) { return 0; }"


def libraries() -> dict[str, str]:
    """Discovery kind → the sim's library file of that kind."""
    names = {"cudart": "libcudart.so.12", "nccl": "libnccl.so.2", "cuda": "libcuda.so.1"}
    return {kind: str(sim.lib_dir() / name) for kind, name in names.items()}


class NoopProbes:
    """Bare uprobes on the same functions ingerod probes, doing nothing."""

    def __enter__(self):
        from bcc import BPF

        self.bpf = BPF(text=NOOP)
        paths = libraries()
        for probe in PROBES:
            if probe.entry:
                self.bpf.attach_uprobe(name=paths[probe.library].encode(),
                                       sym=probe.symbol.encode(), fn_name=b"noop")
            if probe.ret:
                self.bpf.attach_uretprobe(name=paths[probe.library].encode(),
                                          sym=probe.symbol.encode(), fn_name=b"noop")
        return self

    def __exit__(self, *exc):
        self.bpf.cleanup()


class Ingerod:
    """``ingerod trace`` as the operator would run it, output discarded."""

    def __enter__(self):
        self.err = tempfile.TemporaryFile()
        libs = ",".join(libraries().values())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "ingerod", "trace", "--json", "--libraries", libs],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=self.err)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.err.seek(0)
            if b"tracing;" in self.err.read():
                return self
            time.sleep(0.1)
        raise RuntimeError("ingerod trace did not start")

    def __exit__(self, *exc):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        self.err.seek(0)
        self.summary = self.err.read().decode().strip().splitlines()[-1]


class Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def mean_step_ms(scenario, workdir: Path) -> float:
    with Cluster(scenario, workdir) as cluster:
        result = cluster.wait(600)
        ranks = list(cluster.ranks)
    if not result.ok:
        raise RuntimeError(result.describe())
    steps = [ns for r in ranks for ns in read_record(r.record_path).summary["step_ns"]]
    return statistics.fmean(steps) / 1e6


def workload(args) -> scenarios.Scenario:
    return scenarios.parse({"name": "overhead", "job": {
        "nodes": 1, "ranks_per_node": args.ranks, "steps": args.steps, "step_ms": args.step_ms,
        "kernels": args.kernels, "host_work_ms": args.host_work_ms,
        "allreduce_bytes": args.bytes, "timeout_s": 120}})


def run(args) -> dict:
    sim.build()
    scenario = workload(args)
    modes = {"none": Nothing, "noop": NoopProbes, "ingerod": Ingerod}
    times: dict[str, list[float]] = {mode: [] for mode in modes}
    with tempfile.TemporaryDirectory(prefix="ingero-bench-") as tmp:
        for rep in range(args.reps):
            for mode, context in modes.items():
                with context() as running:
                    times[mode].append(mean_step_ms(scenario, Path(tmp) / f"{mode}-{rep}"))
                if mode == "ingerod":
                    print(f"  ingerod trace: {running.summary}", file=sys.stderr)
                print(f"rep {rep} {mode:8} {times[mode][-1]:8.3f} ms/step", file=sys.stderr)
    base = statistics.median(times["none"])
    return {
        "workload": {"ranks": args.ranks, "steps": args.steps, "step_ms": args.step_ms,
                     "kernels_per_forward": args.kernels, "host_work_ms": args.host_work_ms,
                     "allreduce_bytes": args.bytes},
        "median_step_ms": {m: round(statistics.median(t), 3) for m, t in times.items()},
        "slowdown_vs_none": {m: round(statistics.median(t) / base, 4) for m, t in times.items()},
        "runs": {m: [round(x, 3) for x in t] for m, t in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--step-ms", type=float, default=10.0, help="GPU time per step")
    parser.add_argument("--kernels", type=int, default=16, help="kernel launches per forward")
    parser.add_argument("--host-work-ms", type=float, default=0.5)
    parser.add_argument("--bytes", type=int, default=4 << 20, help="all-reduce size")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    run_and_report(__file__, "uprobes need CAP_BPF and CAP_PERFMON", run, args)


if __name__ == "__main__":
    main()
