"""The Slurm hooks on a real one-node Slurm (munge, slurmctld, slurmd), as operators run them.

With ingero's daemons down, `srun -n 4` of a sim job runs and finishes, both hooks exit 0 well
within two seconds, and the prolog's detached ingerod is started and stopped; the job's records
wait in the spool. Then echod, fleetd and a node-wide ingerod come up (no --job, as the shipped
unit runs it): the waiting records are delivered, and a second `srun -n 4` is traced, its
events in echod under its Slurm job id with ranks 0-3 from SLURM_PROCID, its start, end, user
and account in `ingero jobs`, read over echod's API as a user would.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys

import pytest

from stack.launch import free_port, wait_for
from stack.local import Stack
from tests.slurmcluster import SlurmCluster, cluster_for_module, ingero_cli, needs_slurm
from tests.support import needs_ebpf

pytestmark = [pytest.mark.slow, needs_ebpf, needs_slurm]

STEPS = 40
HOOK_LIMIT_S = 2.0


@pytest.fixture(scope="module")
def cluster():
    yield from cluster_for_module("ingero-slurm-")


def sim_job(slurm: SlurmCluster, name: str,
            account: str) -> tuple[str, subprocess.CompletedProcess]:
    """`srun -n 4` of the sim's rank driver; returns (job id, srun's result)."""
    import sim

    work = slurm.root / name
    work.mkdir()
    done = slurm.srun("-n", "4", "-A", account, "-J", name, "--chdir", str(work),
                      str(sim.bin_dir() / "ingero-sim-rank"), "--steps", str(STEPS),
                      "--step-ms", "20", "--unique-id-file", str(work / "unique-id"),
                      "--record", str(work / "ranks.jsonl"))   # one line per write
    job = wait_for(lambda: _job_id(slurm, name), 30)
    return job, done


def _job_id(slurm: SlurmCluster, name: str) -> str | None:
    done = subprocess.run(["squeue", "-h", "-a", "-t", "all", "-n", name, "-o", "%i"],
                          env=slurm.env, capture_output=True, text=True, timeout=30)
    ids = done.stdout.split()
    if ids:
        return ids[-1]
    for line in (slurm.root / "slurmctld.log").read_text(errors="replace").splitlines():
        if f"JobName={name}" in line and "JobId=" in line:
            return line.split("JobId=")[1].split()[0]
    return None


def hooks_ok(slurm: SlurmCluster, job: str) -> None:
    runs = wait_for(lambda: len(slurm.hook_runs(job)) >= 2 and slurm.hook_runs(job), 60)
    assert runs, f"the hooks did not run for job {job}:\n{slurm.logs()}"
    assert sorted(r.context for r in runs) == ["epilog_slurmd", "prolog_slurmd"], runs
    for run in runs:
        assert run.status == 0, run
        assert run.seconds < HOOK_LIMIT_S, run
    assert wait_for(lambda: slurm.node_state() == "idle", 30), slurm.logs()   # not drained


def ingero(stack: Stack, *args: str) -> str:
    return ingero_cli(stack, *args)


def job_row(stack: Stack, job: str) -> dict | None:
    rows = json.loads(ingero(stack, "jobs", "-j", job, "--json"))["jobs"]
    return next((r for r in rows if r["job"] == job and r.get("state")), None)   # epilog's


def test_jobs_run_with_ingero_down_then_are_traced_and_recorded_when_it_is_up(cluster):
    import sim

    root = cluster.root.parent
    spool, sock = root / "jobs", root / "ingerod.sock"
    dead_fleet = f"tcp://127.0.0.1:{free_port()}"
    cluster.settings(
        INGERO_PYTHON=sys.executable, INGERO_JOBS_DIR=spool, INGERO_CONTROL_SOCKET=sock,
        INGERO_RUN_DIR=root / "run", INGERO_LOG_DIR=root / "log",
        INGERO_INGEROD_ARGS=f'"--config /dev/null --fleet {dead_fleet} --insecure-plaintext-zmq '
                            f'--metrics-addr none --source synthetic --jobs-dir {spool} '
                            f'--queue-dir {root / "queue"} '
                            f'--drain-timeout 1"')

    # 1. fleetd, echod and ingerod down: the job runs, the hooks exit 0 within 2 s
    down_job, done = sim_job(cluster, "while-down", "acct-down")
    assert done.returncode == 0, done.stderr + cluster.logs()
    hooks_ok(cluster, down_job)
    detached_log = root / "log" / f"ingerod-{down_job}.log"
    assert detached_log.exists(), "the prolog did not start a detached ingerod"
    assert wait_for(lambda: "stopping" in detached_log.read_text(), 30), \
        detached_log.read_text()
    assert not (root / "run" / f"ingerod-{down_job}.pid").exists()
    assert sorted(p.name for p in spool.iterdir()) == [
        f"{down_job}.job_end.json", f"{down_job}.job_start.json"]

    # 2. ingero up, node-wide: the waiting records go, and the next job is traced
    (root / "stack").mkdir(mode=0o755)
    stack = Stack(root / "stack", 1, push_s=0.5, sim_hosts=False, names=(cluster.host,),
                  agent_flags=("--jobs-dir", str(spool), "--control-socket", str(sock),
                               "--libraries", sim.traced_libraries()))
    try:
        assert wait_for(lambda: not any(spool.iterdir()), 30), list(spool.iterdir())
        up_job, done = sim_job(cluster, "while-up", "acct-up")
        assert done.returncode == 0, done.stderr + cluster.logs()
        hooks_ok(cluster, up_job)
        assert "the node-wide ingerod" in " ".join(cluster.syslog.lines) or \
            cluster.syslog.sock is None

        ranks = wait_for(lambda: _traced_ranks(stack, up_job) == [0, 1, 2, 3], 60)
        assert ranks, _traced_ranks(stack, up_job)
        user = pwd.getpwuid(os.getuid()).pw_name
        for job, account in ((down_job, "acct-down"), (up_job, "acct-up")):
            row = wait_for(lambda: job_row(stack, job), 30)
            assert row, ingero(stack, "jobs", "-j", job)
            assert row["user"] == user and row["account"] == account, row
            assert row["nodes"] == [cluster.host] and row["state"] == "COMPLETED", row
            assert row["start"] < row["end"], row
        table = ingero(stack, "jobs", "-j", up_job)
        assert up_job in table and user in table and "COMPLETED" in table, table
    finally:
        statuses = stack.stop()
    assert statuses == [0, 0, 0], stack.logs()
    if cluster.syslog.sock is not None:
        said = " ".join(cluster.syslog.lines)
        assert f"job {down_job} start recorded" in said and "ingero-epilog" in said, said


def _traced_ranks(stack: Stack, job: str) -> list[int]:
    answer = json.loads(ingero(stack, "sql", "--json",
                               f"SELECT DISTINCT rank FROM events WHERE job = '{job}' "
                               "AND kind = 'collective' ORDER BY rank"))
    return [row[0] if isinstance(row, list) else row["rank"] for row in answer["rows"]]
