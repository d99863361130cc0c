"""Verdicts on jobs as people launch them: srun, torchrun under srun, torchrun in the batch
script, mpirun, and bare metal without Slurm. Each launcher tells its ranks who they are in
its own variables (and torchrun's agent, which maps libcudart, is a process of the job that is
no rank); the verdict must name the rank by its true RANK on the right node whatever the
launcher.

One stack serves the module (``ingero.stack``): echod, fleetd and four node-wide ingerods (no
--job, as the shipped unit runs them), one per simulated node, told apart by the sim's host
label. Each test runs sim jobs of 4 nodes × 4 ranks through it and reads the answers back from
echod's API, as ``ingero report`` does.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest

import sim
from ingero import stack as stack_module
from sim import scenario as scenarios
from sim.cluster import Cluster

from .support import needs_ebpf

pytestmark = [pytest.mark.slow, needs_ebpf]

PUSH_S = 1.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sim.build()
    stack = stack_module.Stack(tmp_path_factory.mktemp("launchers"), 4, push_s=PUSH_S,
                               echod_flags=("--rate-limit", "500", "--rate-burst", "2000"),
                               echod_root=Path(tempfile.mkdtemp(prefix="echod-launchers-")))
    yield stack
    assert stack.stop() == [0] * 6, stack.logs()


def run(stack, job_id: str, launcher: str, stragglers=()) -> None:
    scenario = scenarios.parse({"name": f"job-{job_id}", "stragglers": list(stragglers), "job": {
        "nodes": 4, "ranks_per_node": 4, "steps": 30, "step_ms": 30, "launcher": launcher,
        "allreduce_bytes": 1 << 20, "timeout_s": 30, "job_id": job_id}})
    with Cluster(scenario, stack.root / f"job-{job_id}") as cluster:
        result = cluster.wait()
    assert result.ok, result.describe()
    time.sleep(3 * PUSH_S + 2)


def verdicts(stack, job: str) -> dict[int, dict]:
    """The latest verdict of each rank, as find_stragglers (and so ingero report) answers."""
    found = sorted(stack.tool("find_stragglers", job=job)["verdicts"], key=lambda v: v["raised"])
    return {v["rank"]: v for v in found}


@pytest.mark.parametrize("launcher", scenarios.LAUNCHERS)
def test_a_late_rank_is_named_by_its_true_rank_and_node_under_every_launcher(stack, launcher):
    number = 2100 + 10 * scenarios.LAUNCHERS.index(launcher)
    late, healthy = str(number), str(number + 1)
    run(stack, late, launcher, [{"rank": 9, "kind": "host_delay", "delay_ms": 80,
                                 "from_step": 8}])
    found = verdicts(stack, late)
    assert set(found) == {9}, (found, stack.logs())
    assert found[9]["node"] == "node2" and found[9]["cause"] == "host_work", found[9]
    report = stack.tool("job_report", job=late)
    assert report["ranks"] == 16, report     # no launcher counted, no two workers merged
    run(stack, healthy, launcher)
    assert verdicts(stack, healthy) == {}
    if launcher not in ("srun", "mpirun"):    # torchrun's agent imports torch: libcudart
        assert all(", launcher" in agent.log() for agent in stack.agents), stack.logs()
