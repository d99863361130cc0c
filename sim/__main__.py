"""`python -m sim`: run or check scenarios of the GPU-less cluster."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import sim
from sim import scenario as scenarios
from sim.cluster import Cluster
from sim.errors import SimError
from sim.records import read_record


def _summarise(result, workdir: Path) -> dict:
    ranks = []
    for r in result.ranks:
        record = read_record(r.record_path)
        steps = record.summary["step_ns"] if record.summary else []
        ranks.append({"rank": r.rank, "node": r.node, "pid": r.pid, "status": r.status,
                      "exit_code": r.exit_code, "collectives": len(record.collectives),
                      "mean_step_ms": round(sum(steps) / len(steps) / 1e6, 3) if steps else None,
                      "record": str(r.record_path)})
    return {"workdir": str(workdir), "ok": result.ok, "ranks": ranks}


def run(args) -> int:
    scenario = scenarios.load(args.scenario)
    if args.build:
        sim.build()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=f"ingero-sim-{scenario.name}-"))
    with Cluster(scenario, workdir) as cluster:
        print(f"{scenario.name}: {scenario.job.world_size} ranks on {scenario.job.nodes} node(s), "
              f"records in {workdir}", file=sys.stderr)
        result = cluster.wait(args.timeout)
    if args.json:
        print(json.dumps(_summarise(result, workdir), indent=2))
    else:
        print(result.describe())
    return 0 if result.ok or args.expect_failure else 1


def check(args) -> int:
    for path in args.scenarios:
        s = scenarios.load(path)
        print(f"{path}: ok ({s.name}: {s.job.world_size} ranks, {len(s.stragglers)} straggler(s))")
    return 0


def list_scenarios(args) -> int:
    for path in sorted(scenarios.scenarios_dir().glob("*.yaml")):
        s = scenarios.load(path)
        print(f"{path.name:24} {s.description}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim",
                                     description="A GPU cluster without GPUs.",
                                     epilog="example: python -m sim run sim/scenarios/host-delay.yaml")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="run a scenario and report each rank",
                       epilog="example: python -m sim run sim/scenarios/two-nodes.yaml --json")
    p.add_argument("scenario")
    p.add_argument("--workdir", help="where records and logs go (default: a new temp dir)")
    p.add_argument("--timeout", type=float, help="seconds before hung ranks are killed")
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument("--build", action="store_true", help="run `make -C sim` first")
    p.add_argument("--expect-failure", action="store_true",
                   help="exit 0 even when ranks fail (rank-dies, rank-hangs)")
    p.set_defaults(func=run)
    p = sub.add_parser("check", help="validate scenario files",
                       epilog="example: python -m sim check sim/scenarios/*.yaml")
    p.add_argument("scenarios", nargs="+")
    p.set_defaults(func=check)
    p = sub.add_parser("list", help="list the example scenarios",
                       epilog="example: python -m sim list")
    p.set_defaults(func=list_scenarios)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except SimError as exc:
        print(f"sim: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
