"""Jobs as Slurm names them, on a real Slurm with accounting (munge, MariaDB, slurmdbd,
slurmctld, a slurmd for each of two nodes on this host), the hooks telling a node-wide ingerod
of a real stack (fleetd, echod).

An array job whose tasks run traced sim ranks, a heterogeneous job, a job of two srun steps, a
job requeued once, one cancelled and one killed by its time limit: ``ingero jobs`` shows each
with the id and state sacct shows, compared side by side; ``ingero report`` takes the ids in
every form sacct's -j does.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ingero.launch import wait_for
from ingero.stack import Stack
from tests.slurmcluster import (SlurmCluster, cluster_for_module, ingero_cli, needs_slurm,
                               stack_beside)
from tests.support import needs_ebpf

pytestmark = [pytest.mark.slow, needs_ebpf, needs_slurm]

# a requeued job waits cred_expire (120 s by default) before it may run again
EXTRA = "AuthInfo=cred_expire=10\nKillWait=2\n"


@pytest.fixture(scope="module")
def cluster():
    yield from cluster_for_module("ingero-slurmid-", accounting=True, nodes=2, extra=EXTRA)


@pytest.fixture(scope="module")
def stack(cluster):
    stack = stack_beside(cluster, echod_flags=("--slurm-interval", "1"),
                         echod_env={"SLURM_CONF": str(cluster.conf)})
    try:
        yield stack
    finally:
        statuses = stack.stop()
        assert statuses == [0, 0, 0], stack.logs()


def sbatch(cluster: SlurmCluster, *argv: str) -> str:
    done = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *argv], env=cluster.env,
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def scontrol(cluster: SlurmCluster, *argv: str) -> str:
    done = subprocess.run(["scontrol", *argv], env=cluster.env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout


def state_of(cluster: SlurmCluster, job: str) -> str:
    return cluster.sacct("-n", "-X", "-P", "-o", "State", "-j", job).stdout.split("\n")[0]


def sacct_rows(cluster: SlurmCluster, jobs: list[str]) -> set[tuple[str, str]]:
    """(JobID, State) of each allocation, as sacct prints them ("CANCELLED by 0": its word)."""
    out = cluster.sacct("-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(jobs)).stdout
    return {(i, s.split()[0]) for i, s in (line.split("|") for line in out.splitlines())}


def ingero_rows(stack: Stack, jobs: list[str]) -> set[tuple[str, str]]:
    out = ingero_cli(stack, "jobs", "-j", ",".join(jobs), "-n", "-P", "-o", "JobID,State")
    return {tuple(line.split("|")) for line in out.splitlines()}


def test_every_kind_of_slurm_job_shows_with_the_id_and_state_sacct_gives_it(cluster, stack):
    import sim

    work = cluster.root / "array"
    work.mkdir()
    rank = (f"{sim.bin_dir() / 'ingero-sim-rank'} --steps 150 --step-ms 20 "
            f"--unique-id-file {work}/uid.$SLURM_ARRAY_TASK_ID "
            f"--record {work}/ranks.$SLURM_ARRAY_TASK_ID.jsonl")
    array = sbatch(cluster, "--array=0-2", "-n", "2", "--chdir", str(work), "-o", "%a.out",
                   "--wrap", f"srun -n 2 {rank}")
    het = sbatch(cluster, "-n1", ":", "-n1", "--wrap", "srun --het-group=0,1 sleep 1")
    steps = sbatch(cluster, "--wrap", "srun sleep 1; srun sleep 1")
    requeued = sbatch(cluster, "--requeue", "--wrap", "sleep 4")
    cancelled = sbatch(cluster, "--wrap", "sleep 300")
    timed_out = sbatch(cluster, "-t", "1", "--wrap", "sleep 300")
    jobs = [array, het, steps, requeued, cancelled, timed_out]

    assert wait_for(lambda: state_of(cluster, requeued) == "RUNNING", 60), cluster.logs()
    scontrol(cluster, "requeue", requeued)
    assert wait_for(lambda: state_of(cluster, cancelled) == "RUNNING", 60), cluster.logs()
    subprocess.run(["scancel", cancelled], env=cluster.env, check=True, timeout=30)
    assert wait_for(lambda: not subprocess.run(
        ["squeue", "-h"], env=cluster.env, capture_output=True, text=True).stdout.strip(),
        240, interval=2), subprocess.run(["squeue"], env=cluster.env, capture_output=True,
                                         text=True).stdout

    slurm = sacct_rows(cluster, jobs)
    states = {job: state for job, state in slurm}
    assert {f"{array}_{t}" for t in range(3)} | {f"{het}+0", f"{het}+1"} <= set(states), slurm
    assert (states[requeued], states[cancelled], states[timed_out]) == (
        "COMPLETED", "CANCELLED", "TIMEOUT"), slurm
    # ingero names them all as sacct does once echod has asked it (and the hooks' records of
    # the requeued job's two runs have not blended: its row is the run that completed)
    assert wait_for(lambda: ingero_rows(stack, jobs) == slurm, 60), (
        sorted(ingero_rows(stack, jobs) ^ slurm),
        ingero_cli(stack, "sql", "--json", "SELECT * FROM jobs ORDER BY id"),
        stack.echod.daemon.log()[-3000:])
    rows = json.loads(ingero_cli(stack, "jobs", "-j", requeued, "--json"))
    assert [(r["job_id"], r["restarts"], r["state"]) for r in rows] == [
        (requeued, 1, "COMPLETED")], rows

    # every form of -j sacct takes: a task, the array, a component, a step
    def listed(*names: str) -> list[str]:
        out = ingero_cli(stack, "jobs", "-j", ",".join(names), "-n", "-P", "-o", "JobID")
        return sorted(out.split())

    assert listed(f"{array}_1") == [f"{array}_1"]
    assert listed(array) == [f"{array}_{t}" for t in range(3)]
    assert listed(f"{het}+1") == [f"{het}+1"]
    assert listed(f"{steps}.1", f"{steps}.batch") == [steps]

    # report: the array's traced ranks under each task's id
    report = wait_for(lambda: (out := ingero_cli(stack, "report", "-j", array, "-n", "-P",
                                                  "-o", "JobID,Rank")).count("\n") >= 6 and out,
                      60)
    assert report, ingero_cli(stack, "report", "-j", array) + "".join(
        p.read_text() for p in work.glob("*.out"))
    assert sorted(report.split()) == sorted(f"{array}_{t}|{r}" for t in range(3)
                                            for r in range(2)), report
