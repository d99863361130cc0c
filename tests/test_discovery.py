"""Which processes ingerod traces, read from a /proc tree built here (the same reader as on
/proc): a rank's identity, once read whole, survives a failed re-read of its environment, and
a reused pid is identified anew; the launcher that spawned a process speaks before Slurm's task
id, NCCL before both; a rank's forked workers are its helpers, and torchrun's agent no rank."""

from __future__ import annotations

import os

import pytest

from ingerod.discovery import scan


def fake_process(proc, pid: int, library, environ: bytes, started: int, ppid: int = 1,
                 comm: str = "ingero-sim-rank", uid: int = 0) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "status").write_text(f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "maps").write_text(f"7f00-7f01 r-xp 00000000 00:00 1 {library}\n" if library else "")
    (d / "environ").write_bytes(environ)
    (d / "comm").write_text(f"{comm}\n")
    fields = ["S", str(ppid)] + ["0"] * 17 + [str(started)] + ["0"] * 20
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(fields)}\n")
    if not (d / "root").exists():
        os.symlink("/", d / "root")


def fake_library(tmp_path, name: str):
    library = tmp_path / name
    library.write_bytes(b"\x7fELF")
    return library


def test_a_rank_stays_itself_when_its_environment_cannot_be_read_again(tmp_path):
    library = tmp_path / "lib" / "libnccl.so.2"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF")
    proc = tmp_path / "proc"
    env = b"SLURM_JOB_ID=7001\0SLURM_PROCID=3\0SLURM_STEP_ID=1\0"
    fake_process(proc, 4242, library, env, started=1000)
    first = scan(proc, own_pid=1)
    assert first[4242].job == "7001" and first[4242].rank == 3
    assert first[4242].environ["SLURM_STEP_ID"] == "1"

    fake_process(proc, 4242, library, b"", started=1000)     # the re-read fails (exiting, busy)
    again = scan(proc, own_pid=1, known=first)
    assert again[4242].job == "7001" and again[4242].environ["SLURM_STEP_ID"] == "1"
    assert scan(proc, own_pid=1)[4242].job is None           # what a fresh read would say

    fake_process(proc, 4242, library, b"SLURM_JOB_ID=9\0", started=2000)   # a new process
    reused = scan(proc, own_pid=1, known=again)
    assert reused[4242].job == "9" and "SLURM_STEP_ID" not in reused[4242].environ


def test_a_rank_reaped_between_two_reads_of_a_scan_is_gone_not_a_stranger(tmp_path):
    library, proc = fake_library(tmp_path, "libnccl.so.2"), tmp_path / "proc"
    fake_process(proc, 4242, library, b"SLURM_JOB_ID=7001\0SLURM_PROCID=3\0", started=1000)
    first = scan(proc, own_pid=1)
    assert first[4242].rank == 3
    (proc / "4242" / "stat").unlink()           # its maps were read; then it was reaped
    (proc / "4242" / "environ").write_bytes(b"")
    assert 4242 not in scan(proc, own_pid=1, known=first)
    assert 4242 not in scan(proc, own_pid=1)


def test_a_process_first_read_without_its_environment_is_read_again(tmp_path):
    library, proc = fake_library(tmp_path, "libcudart.so.12"), tmp_path / "proc"
    fake_process(proc, 77, library, b"", started=5)
    first = scan(proc, own_pid=1)
    assert first[77].job is None
    fake_process(proc, 77, library, b"SLURM_JOB_ID=12\0RANK=0\0", started=5)
    assert scan(proc, own_pid=1, known=first)[77].job == "12"


def env(**variables) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in variables.items())


SRUN_NODE_TASK = {"SLURM_JOB_ID": "88", "SLURM_STEP_ID": "0", "SLURM_PROCID": "2",
                  "SLURM_LOCALID": "0", "SLURM_NTASKS": "4"}


@pytest.mark.parametrize("launched, rank, local, world", [
    ({**SRUN_NODE_TASK}, 2, 0, 4),                                            # srun
    ({**SRUN_NODE_TASK, "RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16"}, 9, 1, 16),
    ({"SLURM_JOB_ID": "88", "SLURM_PROCID": "0", "RANK": "9", "LOCAL_RANK": "1",
      "WORLD_SIZE": "16"}, 9, 1, 16),                                         # batch step
    ({**SRUN_NODE_TASK, "OMPI_COMM_WORLD_RANK": "9", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_SIZE": "16", "PMIX_RANK": "9"}, 9, 1, 16),              # mpirun
    ({**SRUN_NODE_TASK, "PMIX_RANK": "9"}, 9, None, None),
    ({**SRUN_NODE_TASK, "PMI_RANK": "9", "MPI_LOCALRANKID": "1", "PMI_SIZE": "16"}, 9, 1, 16),
])
def test_the_launcher_that_spawned_the_process_speaks_before_slurm(tmp_path, launched, rank,
                                                                   local, world):
    library = tmp_path / "libcudart.so.12"
    library.write_bytes(b"\x7fELF")
    fake_process(tmp_path / "proc", 50, library, env(**launched), started=1)
    found = scan(tmp_path / "proc", own_pid=1)[50]
    assert (found.rank, found.local_rank, found.world_size) == (rank, local, world)
    assert found.job == "88"


def test_a_bare_metal_job_is_named_by_torchruns_run_id_when_it_has_one(tmp_path):
    library = tmp_path / "libcudart.so.12"
    library.write_bytes(b"\x7fELF")
    proc = tmp_path / "proc"
    fake_process(proc, 50, library, env(RANK=0, TORCHELASTIC_RUN_ID="exp7"), started=1)
    fake_process(proc, 51, library, env(RANK=1, TORCHELASTIC_RUN_ID="none"), started=1)
    found = scan(proc, own_pid=1)
    assert found[50].job == "exp7" and found[51].job is None


def test_nccl_says_who_a_rank_is_over_its_launchers_variables():
    from ingerod.discovery import TracedProcess

    slurm_only = TracedProcess(1, "python", rank=2, world_size=4, told_by="slurm")
    assert slurm_only.learn(1, 2) is False           # a group of the job, not the job
    assert slurm_only.learn(9, 16) and slurm_only.tags()["rank"] == 9   # mp.spawn's ranks
    torchrun = TracedProcess(2, "python", rank=9, world_size=16, told_by="torchrun")
    assert torchrun.learn(0, 2) is False and torchrun.learn(3, 32) is False
    assert torchrun.learn(9, 16) is False and torchrun.said == (9, 16)   # agreed: no change
    untold = TracedProcess(3, "python")
    assert untold.learn(0, 2) and untold.learn(5, 8) and untold.tags()["rank"] == 5
    assert untold.learn(1, 4) is False and untold.tags()["world_size"] == 8


def test_a_ranks_workers_are_its_helpers_and_torchruns_agent_is_no_rank(tmp_path):
    library = tmp_path / "libcudart.so.12"
    library.write_bytes(b"\x7fELF")
    proc = tmp_path / "proc"
    agent = {**SRUN_NODE_TASK}
    worker = {**agent, "RANK": "9", "LOCAL_RANK": "1", "WORLD_SIZE": "16"}
    fake_process(proc, 10, None, b"", started=1, comm="slurmstepd")
    fake_process(proc, 100, library, env(**agent), started=2, ppid=10, comm="torchrun")
    fake_process(proc, 200, library, env(**worker), started=3, ppid=100, comm="python")
    fake_process(proc, 300, None, env(**worker), started=4, ppid=200, comm="python")  # a pool
    fake_process(proc, 301, library, env(**worker), started=5, ppid=300,
                 comm="pt_data_worker", uid=1000)
    fake_process(proc, 302, library, env(**worker), started=5, ppid=200,
                 comm="pt_data_worker", uid=1000)
    found = scan(proc, own_pid=1)
    assert set(found) == {100, 200, 301, 302}
    assert found[100].role == "launcher" and "rank" not in found[100].tags()
    assert found[200].role == "rank" and found[200].tags()["rank"] == 9
    for pid in (301, 302):
        helper = found[pid]
        assert helper.role == "helper" and helper.owner == 200
        assert helper.tags(found[200]) == {"pid": pid, "uid": 1000, "job": "88", "step": "0",
                                           "requeue": None, "restart": None, "rank": 9,
                                           "local_rank": 1, "world_size": 16,
                                           "role": "helper"}
    found[301].learn(9, 16)                            # NCCL says it is a rank after all
    assert scan(proc, own_pid=1, known=found)[301].role == "rank"


def test_a_requeue_and_an_elastic_restart_are_part_of_who_a_process_is(tmp_path):
    library = tmp_path / "libcudart.so.12"
    library.write_bytes(b"\x7fELF")
    fake_process(tmp_path / "proc", 60, library, env(
        SLURM_JOB_ID=5, SLURM_STEP_ID=1, SLURM_RESTART_COUNT=2, RANK=3,
        TORCHELASTIC_RESTART_COUNT=1), started=1)
    tags = scan(tmp_path / "proc", own_pid=1)[60].tags()
    assert (tags["job"], tags["step"], tags["requeue"], tags["restart"]) == ("5", "1", 2, 1)


def test_a_launchers_child_read_between_fork_and_exec_is_read_again_once_it_has_exec_d(
        tmp_path):
    """torchrun's agent maps libcudart, so its child does too from fork to exec, with the
    agent's environment: read then, it is the agent's helper with Slurm's task id (node1's
    agent is task 1: it would pass for rank 1). Once exec'd (the same pid and start time),
    its environment says who it is."""
    library = tmp_path / "libcudart.so.12"
    library.write_bytes(b"\x7fELF")
    proc = tmp_path / "proc"
    agent = {**SRUN_NODE_TASK, "SLURM_PROCID": "1"}
    fake_process(proc, 100, library, env(**agent), started=2, comm="torchrun")
    fake_process(proc, 200, library, env(**agent), started=3, ppid=100, comm="torchrun")
    forked = scan(proc, own_pid=1)
    assert forked[200].role == "helper" and forked[200].tags(forked[100])["rank"] == 1
    worker = {**agent, "RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "16"}
    fake_process(proc, 200, library, env(**worker), started=3, ppid=100, comm="python")
    exec_d = scan(proc, own_pid=1, known=forked)
    assert exec_d[200].role == "rank" and exec_d[200].tags()["rank"] == 5
    assert exec_d[100].role == "launcher" and "rank" not in exec_d[100].tags()


@pytest.mark.parametrize("value", ["--1", "-1", "²", "٣", "99999999999999999999", "1048576",
                                   " 3", "3\n", "0x3", ""])
def test_a_rank_that_does_not_parse_as_a_plain_number_in_range_reads_as_unset(tmp_path,
                                                                               value):
    """A user chooses their processes' environment: what int() or str.isdigit would take
    ('²', a rank past 2^64 that msgpack cannot carry) must not stop the agent or name a rank."""
    library, proc = fake_library(tmp_path, "libcudart.so.12"), tmp_path / "proc"
    fake_process(proc, 70, library, env(SLURM_JOB_ID=5, RANK=value, WORLD_SIZE=value,
                                        SLURM_PROCID=2, SLURM_NTASKS=4), started=1)
    found = scan(proc, own_pid=1)[70]
    assert (found.rank, found.world_size, found.told_by) == (2, 4, "slurm")   # the next one
    assert ("RANK" in found.unparsed) == (not value.isascii() or not value.isdigit()
                                          or len(value) > 10)


def test_identity_texts_of_the_wrong_shape_read_as_unset(tmp_path):
    library, proc = fake_library(tmp_path, "libcudart.so.12"), tmp_path / "proc"
    fake_process(proc, 71, library, env(SLURM_JOB_ID="7" * 300, SLURM_STEP_ID="0; rm",
                                        TORCHELASTIC_RUN_ID="x" * 65, RANK=0), started=1)
    found = scan(proc, own_pid=1)[71]
    assert (found.job, found.step, found.rank) == (None, None, 0)
    assert found.unparsed == ("SLURM_JOB_ID", "SLURM_STEP_ID", "TORCHELASTIC_RUN_ID")


def test_of_a_huge_environment_only_the_head_is_read_and_only_the_variables_used_kept(
        tmp_path):
    library, proc = fake_library(tmp_path, "libcudart.so.12"), tmp_path / "proc"
    head = env(SLURM_JOB_ID=5, RANK=3, HOME="/home/u")
    tail = b"".join(f"PAD{k}=".encode() + b"x" * 4000 + b"\0" for k in range(1500))
    fake_process(proc, 72, library, head + tail + env(WORLD_SIZE=8), started=1)
    found = scan(proc, own_pid=1, names=frozenset({"HOME"}))[72]
    assert (found.job, found.rank, found.world_size) == ("5", 3, None)   # past the read
    assert found.environ == {"SLURM_JOB_ID": "5", "RANK": "3", "HOME": "/home/u"}


@pytest.mark.parametrize("cgroup, job", [
    ("0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n", "77"),     # v2
    ("0::/slurmstepd.scope/job_77/step_batch/user/task_0\n", "77"),   # slurmd in no slice
    ("4:freezer:/slurm/uid_1000/job_77/step_0/task_0\n0::/user.slice\n", "77"),  # v1
    ("4:freezer:/slurm_node3/uid_1000/job_77/step_0\n", "77"),        # several slurmds
    # a user's delegated subtree may hold any directory names: never a Slurm cgroup
    ("0::/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_9/\n",
     "5"),
    ("0::/user.slice/user-1000.slice/user@1000.service/slurm/uid_0/job_9/\n", "5"),
    ("4:freezer:/docker/abc/slurm/uid_0/job_9\n", "5"),
    ("0::/\n", "5"),
])
def test_the_job_is_the_slurm_cgroups_and_the_environment_only_where_there_is_none(
        tmp_path, cgroup, job):
    library, proc = fake_library(tmp_path, "libcudart.so.12"), tmp_path / "proc"
    fake_process(proc, 73, library, env(SLURM_JOB_ID=5, RANK=0), started=1)
    (proc / "73" / "cgroup").write_text(cgroup)
    assert scan(proc, own_pid=1)[73].job == job
