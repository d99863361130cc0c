"""fleetd's Slurm actions on a real one-node Slurm (munge, slurmctld, slurmd from Debian), each
turned on as an operator would: a verdict's line in the job's AdminComment (which slurmdbd
keeps, as sacct -o AdminComment shows), the verdict on the
user's terminal (scontrol notify, which srun prints), and node
reputation (--drain-after 2): a node whose GPU is slow in one job stays up, in two jobs it is
drained with a reason naming the cause and the jobs, unless that would drain more of its
partition than --drain-max-fraction allows; an operator resumes it, and the same evidence
never drains it again. ``ingero nodes`` shows the evidence and the drain as sinfo -R does.

The jobs are `srun -n 4` of the sim's rank driver, rank 2's GPU three times slower, traced by
one node-wide ingerod; fleetd runs with SLURM_CONF pointing at the test's cluster.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from stack.launch import Daemon, wait_for
from stack.local import Stack
from tests.slurmcluster import (SlurmCluster, cluster_for_module, ingero_cli, needs_slurm,
                               stack_beside)
from tests.support import needs_ebpf, scrape

pytestmark = [pytest.mark.slow, needs_ebpf, needs_slurm]

STEPS = 150
SLOW_RANK = 2


@pytest.fixture(scope="module")
def slurm():
    yield from cluster_for_module("ingero-slurm-actions-", accounting=True)


@pytest.fixture(scope="module")
def stack(slurm):
    stack = stack_beside(slurm, journal=True, fleet_env={"SLURM_CONF": str(slurm.conf)},
                         fleet_flags=("--slurm-admin-comment", "--slurm-notify",
                                      "--drain-after", "2", "--drain-max-fraction", "0.5"))
    yield stack
    subprocess.run(["scontrol", "update", f"NodeName={slurm.host}", "State=RESUME"],
                   env=slurm.env, capture_output=True, timeout=30)
    assert stack.stop() == [0, 0, 0], stack.logs()


def slow_gpu_job(slurm: SlurmCluster, name: str) -> tuple[str, str]:
    """`srun -n 4` of the sim, rank 2's GPU three times as slow; returns its job id and
    what srun printed on standard error."""
    import sim

    work = slurm.root / name
    work.mkdir()
    rank = (f'[ "$SLURM_PROCID" = {SLOW_RANK} ] && export INGERO_SIM_GPU_SLOWDOWN=3; '
            f'exec {sim.bin_dir() / "ingero-sim-rank"} --steps {STEPS} --step-ms 20 '
            f'--unique-id-file {work / "unique-id"} --record {work / "ranks.jsonl"}')
    done = slurm.srun("-n", "4", "-J", name, "--chdir", str(work), "sh", "-c", rank)
    assert done.returncode == 0, done.stderr + slurm.logs()
    job = subprocess.run(["squeue", "-h", "-a", "-t", "all", "-n", name, "-o", "%i"],
                         env=slurm.env, capture_output=True, text=True, timeout=30).stdout
    assert job.split(), f"no job named {name}:\n{slurm.logs()}"
    return job.split()[-1], done.stderr


def scontrol_show_job(slurm: SlurmCluster, job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", job], env=slurm.env, capture_output=True,
                          text=True, timeout=30).stdout


def node_reason(slurm: SlurmCluster) -> tuple[str, str]:
    """(state, reason) of the one node, as sinfo shows them."""
    done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T|%E"], env=slurm.env,
                          capture_output=True, text=True, timeout=30)
    state, _, reason = done.stdout.strip().partition("|")
    return state, reason


def ingero(stack: Stack, slurm: SlurmCluster, *args: str) -> str:
    return ingero_cli(stack, *args, env={"SLURM_CONF": str(slurm.conf)})


def test_slow_gpu_jobs_note_their_admin_comment_and_drain_the_node_within_the_cap(slurm, stack):
    host = slurm.host
    # One job with a slow GPU: its AdminComment says so; one job is not enough to drain
    first, said = slow_gpu_job(slurm, "slow-one")
    shown = wait_for(lambda: re.search(r"AdminComment=(ingero: .*)$",
                                       scontrol_show_job(slurm, first), re.M), 60, 0.5)
    assert shown, (scontrol_show_job(slurm, first), stack.fleetd.log()[-3000:])
    comment = shown[1].strip()
    assert f"rank {SLOW_RANK} on {host} slow_gpu" in comment, comment
    assert comment.endswith(f"ingero explain -j {first}"), comment
    # and slurmdbd keeps it with the job, where sacct shows it after the job is gone
    kept = wait_for(lambda: slurm.sacct("-j", first, "-X", "-n", "-P", "-o",
                                        "AdminComment").stdout.strip() == comment, 60, 0.5)
    assert kept, (slurm.sacct("-j", first, "-X", "-P", "-o", "JobID,State,AdminComment"),
                  comment)
    # --slurm-notify: srun showed the user the verdict while the job ran
    assert f"ingero: straggler: job {first} " in said and f"rank {SLOW_RANK} on {host}" in said, \
        said
    time.sleep(3)
    assert node_reason(slurm)[0] in ("idle", "mixed", "allocated"), node_reason(slurm)

    # A second job: two jobs name the node, but drained it would be all of its partition, over
    # the cap of half: it stays up, and fleetd says why
    second, _ = slow_gpu_job(slurm, "slow-two")
    assert wait_for(lambda: "not drained" in stack.fleetd.log(), 60, 0.5), \
        stack.fleetd.log()[-3000:]
    assert f"over --drain-max-fraction 0.5" in stack.fleetd.log()
    assert scrape(stack.fleet_port)[("ingero_fleet_node_drains_total", (("outcome", "cap"),))] \
        >= 1
    assert "drain" not in node_reason(slurm)[0], node_reason(slurm)

    # The operator raises the cap: fleetd, restarted with it, drains on the evidence it kept
    old = stack.fleetd
    old.stop()
    at = old.argv.index("--drain-max-fraction") + 1
    argv = [*old.argv[:at], "1", *old.argv[at + 1:]]
    stack.fleetd = stack.fleetds[0] = Daemon(old.name, argv, old.log_path.parent, env=old.env,
                                             module="fleetd")
    stack.daemons[stack.daemons.index(old)] = stack.fleetd
    drained = wait_for(lambda: "drain" in node_reason(slurm)[0] and node_reason(slurm), 60, 0.5)
    assert drained, (node_reason(slurm), stack.fleetd.log()[-3000:])
    assert drained[1] == f"ingero: slow_gpu in jobs {first},{second} (ingero nodes)", drained
    assert re.search(rf"^<4>fleetd: WARNING node {host} drained: ", stack.fleetd.log(), re.M)

    # ingero nodes: the evidence, and the drain as sinfo -R shows it
    table = ingero(stack, slurm, "nodes", "-P", "-o", "NodeName,Jobs,JobIDs,Causes,DrainedSince,Reason")
    lines = table.splitlines()
    assert lines[0] == "NodeName|Jobs|JobIDs|Causes|DrainedSince|Reason", table
    node, jobs, ids, causes, since, reason = lines[1].split("|")
    assert (node, jobs, ids, causes) == (host, "2", f"{first},{second}", "slow_gpu:2"), table
    assert since and reason == drained[1], table

    # Resumed by the operator: the same evidence never drains it again, nor does one new job
    subprocess.run(["scontrol", "update", f"NodeName={host}", "State=RESUME"], env=slurm.env,
                   check=True, timeout=30)
    assert wait_for(lambda: node_reason(slurm)[0] == "idle", 30), node_reason(slurm)
    third, _ = slow_gpu_job(slurm, "slow-three")
    assert wait_for(lambda: "slow_gpu" in scontrol_show_job(slurm, third), 60, 0.5), \
        stack.fleetd.log()[-3000:]
    time.sleep(3)
    assert node_reason(slurm)[0] == "idle", (node_reason(slurm), stack.fleetd.log()[-3000:])
