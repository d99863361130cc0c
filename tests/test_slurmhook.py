"""The Slurm hooks' parts, run for real but without Slurm: the shell script under every way it
can go wrong (exit 0 within two seconds, whatever happens, and say so in syslog), the records,
host lists, ingerod's spool and control socket, and the jobs table echod fills from them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from itertools import permutations
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from echod.store.jobrecords import job_fields, merge
from echod.store.models import Job
from echod.store.writer import write_batch
from ingero import hostlist, slurmhook
from stack.local import AGENT_STOP_S
from ingerod.jobs import ControlSocket, JobSpool, record_event
from ingerod.metrics import AgentMetrics
from tests.slurmcluster import Syslog
from tests.support import needs_ebpf

REPO = Path(__file__).resolve().parent.parent
PROLOG = REPO / "slurm" / "prolog"
EPILOG = REPO / "slurm" / "epilog"
SLURM_ENV = {"SLURM_JOB_ID": "4242", "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1001",
             "SLURM_JOB_ACCOUNT": "physics", "SLURM_JOB_PARTITION": "gpu",
             "SLURM_NODELIST": "gpu[01-02]", "SLURM_JOB_NUM_NODES": "2",
             "SLURM_JOB_NTASKS": "16", "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
             "SLURMD_NODENAME": "gpu01", "SLURM_CLUSTER_NAME": "alpha"}


@pytest.fixture(scope="module")
def syslog():
    log = Syslog()
    yield log
    log.close()


def hook(script: Path, context: str, tmp_path: Path, **env) -> tuple[int, float]:
    """Run a hook as slurmd does: a clean environment, SLURM_* only, plus the settings file."""
    defaults = tmp_path / "defaults"
    if not defaults.exists():
        defaults.write_text("")
    environ = {**SLURM_ENV, "SLURM_SCRIPT_CONTEXT": context,
               "INGERO_SLURM_DEFAULTS": str(defaults), **env}
    start = time.monotonic()
    done = subprocess.run([str(script)], env=environ, cwd="/", capture_output=True, timeout=30)
    return done.returncode, time.monotonic() - start


def settings(tmp_path: Path, **values) -> Path:
    path = tmp_path / "defaults"
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


def base(tmp_path: Path, **more) -> dict:
    return {"INGERO_PYTHON": sys.executable, "INGERO_JOBS_DIR": tmp_path / "jobs",
            "INGERO_CONTROL_SOCKET": tmp_path / "none.sock", "INGERO_RUN_DIR": tmp_path / "run",
            "INGERO_LOG_DIR": tmp_path / "log", "INGERO_HOOK_AGENT": "node", **more}


# -- the script: exit 0 within two seconds, whatever happens -----------------------------------

def test_prolog_and_epilog_record_the_job_from_slurmds_variables(tmp_path, syslog):
    settings(tmp_path, **base(tmp_path))
    assert hook(PROLOG, "prolog_slurmd", tmp_path)[0] == 0
    assert hook(EPILOG, "epilog_slurmd", tmp_path, SLURM_JOB_EXIT_CODE2="3:0")[0] == 0
    start = json.loads((tmp_path / "jobs" / "4242.job_start.json").read_text())
    end = json.loads((tmp_path / "jobs" / "4242.job_end.json").read_text())
    assert {k: start[k] for k in ("event", "job", "user", "uid", "account", "partition",
                                  "nodelist", "node_count", "ntasks", "gpus", "gpu_ids", "node",
                                  "slurm_cluster")} == {
        "event": "job_start", "job": "4242", "user": "alice", "uid": 1001,
        "account": "physics", "partition": "gpu", "nodelist": "gpu[01-02]", "node_count": 2,
        "ntasks": 16, "gpus": 8, "gpu_ids": "0,1,2,3,4,5,6,7", "node": "gpu01",
        "slurm_cluster": "alpha"}
    assert end["state"] == "FAILED" and end["exit_code"] == "3:0" and end["t"] >= start["t"]
    assert oct((tmp_path / "jobs").stat().st_mode & 0o777) == "0o700"
    assert oct((tmp_path / "jobs" / "4242.job_end.json").stat().st_mode & 0o777) == "0o600"
    if syslog.sock is not None:
        assert wait_until(lambda: any("ingero-prolog" in line and "job 4242 start recorded" in line
                                      for line in syslog.lines)), syslog.lines


@pytest.mark.parametrize("trouble", ["no python", "python hangs", "bad defaults file",
                                     "control socket never answers", "spool unwritable",
                                     "no job id", "bad agent mode"])
def test_the_hooks_exit_0_within_two_seconds_whatever_happens(trouble, tmp_path, syslog):
    env, values = {}, base(tmp_path)
    if trouble == "no python":
        values["INGERO_PYTHON"] = tmp_path / "missing" / "python"
    elif trouble == "python hangs":
        slow = tmp_path / "slow-python"
        slow.write_text("#!/bin/sh\nsleep 30\n")
        slow.chmod(0o755)
        values["INGERO_PYTHON"] = slow
    elif trouble == "control socket never answers":
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        silent.bind(str(tmp_path / "silent.sock"))
        silent.listen(8)
        values["INGERO_CONTROL_SOCKET"] = tmp_path / "silent.sock"
    elif trouble == "spool unwritable":
        (tmp_path / "file").write_text("")
        values["INGERO_JOBS_DIR"] = tmp_path / "file" / "jobs"
    elif trouble == "no job id":
        env["SLURM_JOB_ID"] = "../../etc"
    elif trouble == "bad agent mode":
        values["INGERO_HOOK_AGENT"] = "sometimes"
    settings(tmp_path, **values)
    if trouble == "bad defaults file":
        (tmp_path / "defaults").write_text('INGERO_PYTHON="unterminated\nif then fi\n')
    for script, context in ((PROLOG, "prolog_slurmd"), (EPILOG, "epilog_slurmd")):
        status, seconds = hook(script, context, tmp_path, **env)
        assert status == 0 and seconds < 2.0, (trouble, context, status, seconds)
    if syslog.sock is not None and trouble in ("no python", "python hangs", "spool unwritable"):
        assert wait_until(lambda: any("ingero-prolog" in line and
                                      ("failed" in line or "Error" in line)
                                      for line in syslog.lines)), syslog.lines


def test_the_hooks_write_only_into_directories_of_roots_and_never_through_a_link(tmp_path):
    """The prolog runs as root: a spool that is a link, or a directory others may write, is
    not written into, and a link planted where the per-job agent's pidfile or log goes is not
    written through (the file it points to stays as it was). The job runs all the same."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    (tmp_path / "jobs").symlink_to(elsewhere)
    settings(tmp_path, **base(tmp_path, INGERO_HOOK_AGENT="detached",
                              INGERO_HOOK_CPU_JOBS="yes", INGERO_INGEROD="/bin/true"))
    assert hook(PROLOG, "prolog_slurmd", tmp_path)[0] == 0
    assert list(elsewhere.iterdir()) == [], "nothing written through the link"

    (tmp_path / "jobs").unlink()
    (tmp_path / "jobs").mkdir(mode=0o700)
    for name in ("run", "log"):
        (tmp_path / name).mkdir()
        (tmp_path / name).chmod(0o755)
    (tmp_path / "run" / "ingerod-4242.pid").symlink_to(victim)
    (tmp_path / "log" / "ingerod-4242.log").symlink_to(victim)
    assert hook(PROLOG, "prolog_slurmd", tmp_path)[0] == 0
    assert (tmp_path / "jobs" / "4242.job_start.json").exists()
    assert victim.read_text() == "untouched\n"

    (tmp_path / "log" / "ingerod-4242.log").unlink()
    (tmp_path / "log").chmod(0o777)                 # anyone may put a link there later
    assert hook(PROLOG, "prolog_slurmd", tmp_path)[0] == 0
    assert not (tmp_path / "log" / "ingerod-4242.log").exists()
    assert victim.read_text() == "untouched\n"


def wait_until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def test_a_detached_instance_leaves_the_prologs_session_and_the_epilog_stops_it(tmp_path):
    """Without a node-wide agent or systemd, the prolog starts `ingerod --job` in a session of
    its own (slurmd kills the prolog's process group); the epilog's SIGTERM stops it."""
    settings(tmp_path, **base(tmp_path, INGERO_HOOK_AGENT="auto",
                              INGERO_INGEROD_ARGS='"--config /dev/null --source synthetic '
                                                  '--insecure-plaintext-zmq --metrics-addr none '
                                                  f'--jobs-dir {tmp_path / "jobs"} '
                                                  f'--queue-dir {tmp_path / "queue"} '
                                                  '--fleet tcp://127.0.0.1:9 '
                                                  '--drain-timeout 0.5"'))
    assert hook(PROLOG, "prolog_slurmd", tmp_path)[0] == 0
    pid = int((tmp_path / "run" / "ingerod-4242.pid").read_text())
    assert os.getsid(pid) == pid and os.getpgid(pid) != os.getpgid(0)
    log = tmp_path / "log" / "ingerod-4242.log"
    assert wait_until(lambda: "pushing to" in log.read_text(), 60), log.read_text()
    assert hook(EPILOG, "epilog_slurmd", tmp_path)[0] == 0
    assert wait_until(lambda: not Path(f"/proc/{pid}").exists()
                      or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", 20)
    assert not (tmp_path / "run" / "ingerod-4242.pid").exists()
    assert "stopping" in log.read_text()


# -- records and host lists --------------------------------------------------------------------

@pytest.mark.parametrize("text, hosts", [
    ("vm", ["vm"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("a[8-11],login1", ["a8", "a9", "a10", "a11", "login1"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("n[1-2],n[2-3]", ["n1", "n2", "n3"]),
])
def test_host_lists_expand_as_slurm_writes_them(text, hosts):
    assert hostlist.expand(text) == hosts


@pytest.mark.parametrize("text", ["n[1-", "n]1[", "n[a-b]", "n[3-1]", "n[[1]]",
                                  "n[0-99999999]", "n[²-3]", "n[٣]", "n[0-99999]x[0-99999]",
                                  "n[1-" + "9" * 40 + "]"])
def test_bad_host_lists_are_refused(text):
    """Refused with BadHostList; a cross product is counted before it is built (built, the
    10^10 names of the one here would not fit in memory)."""
    with pytest.raises(hostlist.BadHostList):
        hostlist.expand(text)


@pytest.mark.parametrize("env, state, code", [
    ({"SLURM_JOB_EXIT_CODE2": "0:0"}, "COMPLETED", "0:0"),
    ({"SLURM_JOB_EXIT_CODE2": "1:0"}, "FAILED", "1:0"),
    ({"SLURM_JOB_EXIT_CODE2": "0:9"}, "FAILED", "0:9"),
    ({"SLURM_JOB_EXIT_CODE": "256"}, "FAILED", "1:0"),
    ({"SLURM_JOB_EXIT_CODE": "15"}, "FAILED", "0:15"),
    ({}, None, None),
])
def test_the_end_record_says_how_the_job_ended(env, state, code):
    record = slurmhook.end_record({"SLURM_JOB_ID": "7", **env}, 1.0)
    assert record.get("state") == state and record.get("exit_code") == code


# -- ingerod's side ----------------------------------------------------------------------------

def test_the_spool_turns_records_into_events_once_and_deletes_them_when_acknowledged(tmp_path):
    metrics = AgentMetrics()
    jobs = tmp_path / "jobs"
    for job, environ in (("11", {}), ("12", {"SLURM_JOB_EXIT_CODE2": "0:0"})):
        slurmhook.write_record(jobs, slurmhook.start_record({**SLURM_ENV, "SLURM_JOB_ID": job},
                                                            100.0))
    slurmhook.write_record(jobs, slurmhook.end_record({**SLURM_ENV, "SLURM_JOB_ID": "12",
                                                       "SLURM_JOB_EXIT_CODE2": "0:0"}, 200.0))
    (jobs / "13.job_start.json").write_text("{not json")
    (jobs / ".12.job_end.json.999").write_text("{}")        # a record being written
    spool = JobSpool(jobs, None, metrics)
    events = spool.scan("node-a")
    assert [e["id"] for e in events] == ["node-a:slurm:11:job_start",
                                         "node-a:slurm:12:job_end", "node-a:slurm:12:job_start"]
    end = events[1]
    assert end["kind"] == "job_end" and end["t"] == 200.0 and end["attrs"]["state"] == "COMPLETED"
    assert end["attrs"]["job"] == "12" and end["attrs"]["slurm_node"] == "gpu01"
    assert spool.scan("node-a") == []                        # handed over once
    assert metrics.job_records_rejected._value.get() == 1
    spool.unsent([events[0]["spool"]])
    assert [e["id"] for e in spool.scan("node-a")] == ["node-a:slurm:11:job_start"]
    assert spool.sent([e["spool"] for e in events]) is False
    assert sorted(p.name for p in jobs.iterdir()) == [".12.job_end.json.999",
                                                      "13.job_start.json"]
    own = JobSpool(jobs, "12", metrics)
    slurmhook.write_record(jobs, slurmhook.end_record({**SLURM_ENV, "SLURM_JOB_ID": "12"}, 3.0))
    slurmhook.write_record(jobs, slurmhook.end_record({**SLURM_ENV, "SLURM_JOB_ID": "14"}, 3.0))
    mine = own.scan("node-a")
    assert [e["attrs"]["job"] for e in mine] == ["12"]       # a per-job agent: its own only
    assert own.sent([mine[0]["spool"]]) is True              # its job ended: it may stop


def test_the_control_socket_answers_the_hooks_and_counts_what_it_refuses(tmp_path):
    metrics = AgentMetrics()
    path = tmp_path / "ingerod.sock"
    control = ControlSocket(path, "node a, pid 1", metrics)
    try:
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert slurmhook.tell_node_agent(str(path), "4242", "start") == "node a, pid 1"
        assert control.nudged.is_set()
        for bad in (b"hello\n", b'{"job": "../x", "event": "start"}\n', b"[1]\n"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(str(path))
                conn.sendall(bad)
                answer = json.loads(conn.makefile("rb").readline())
            assert answer["ok"] is False and answer["error"]
        assert metrics.control_rejected._value.get() == 3
        assert slurmhook.tell_node_agent(str(path), "4243", "end") == "node a, pid 1"
        with pytest.raises(Exception, match="another ingerod listens"):
            ControlSocket(path, "node a, pid 2", metrics)
    finally:
        control.close()
    assert not path.exists()
    assert slurmhook.tell_node_agent(str(path), "4242", "start") is None
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()                                            # a crashed agent's socket
    ControlSocket(path, "node a, pid 3", metrics).close()


def test_a_busy_control_socket_never_holds_a_hook_past_its_timeout(tmp_path):
    path = tmp_path / "slow.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    threading.Thread(target=lambda: server.accept(), daemon=True).start()
    start = time.monotonic()
    assert slurmhook.tell_node_agent(str(path), "1", "start") is None
    assert time.monotonic() - start < slurmhook.SOCKET_TIMEOUT_S + 0.3
    server.close()


# -- echod's jobs table ------------------------------------------------------------------------

def job_events(node: str, job: str, records: list[dict]) -> list[dict]:
    return [{**record_event(node, r), "cluster": "alpha", "node": node, "job": job}
            for r in records]


def merged_in_every_order(parts: list[dict]) -> dict:
    """The job row the parts merge into, the same whatever their order."""
    rows = set()
    for order in permutations(parts):
        row: dict = {}
        for part in order:
            row = merge(row, part)
        rows.add(json.dumps(row, default=str, sort_keys=True))
    assert len(rows) == 1
    return json.loads(rows.pop())


def test_every_nodes_records_merge_into_one_job_row_in_any_order():
    t = [datetime.fromtimestamp(s, UTC) for s in (100, 101, 300, 302)]
    attrs = {"user": "alice", "account": "physics", "nodelist": "gpu[01-02]", "node_count": 2,
             "gpus": 8, "ntasks": 16}
    parts = [job_fields("job_start", "gpu01", t[0], attrs),
             job_fields("job_start", "gpu02", t[1], {**attrs, "slurm_node": "gpu02"}),
             job_fields("job_end", "gpu01", t[2], {"state": "FAILED", "exit_code": "0:9"}),
             job_fields("job_end", "gpu02", t[3], {"state": "COMPLETED", "exit_code": "0:0"})]
    row = merged_in_every_order(parts)
    assert row["nodes"] == ["gpu01", "gpu02"] and row["gpus"] == 16
    assert row["start"] == str(t[0]) and row["end"] == str(t[3])
    assert row["state"] == "COMPLETED" and row["exit_code"] == "0:0"


def test_job_records_fill_the_jobs_table_and_a_replay_changes_nothing(engine):
    env = {**SLURM_ENV, "SLURM_JOB_EXIT_CODE2": "0:0"}
    start = slurmhook.start_record(env, time.time() - 60)
    other = slurmhook.start_record({**env, "SLURMD_NODENAME": "gpu02"}, time.time() - 59)
    end = slurmhook.end_record(env, time.time())
    first = {"events": job_events("gpu01", "4242", [start])}
    rest = {"events": job_events("gpu02", "4242", [other]) + job_events("gpu01", "4242", [end])}
    assert write_batch(engine, first).stored == 1
    assert write_batch(engine, rest).stored == 2
    for batch in (first, rest):
        assert write_batch(engine, batch).duplicates == len(batch["events"])
    with Session(engine) as session:
        job = session.scalars(select(Job)).one()
    assert (job.cluster, job.id, job.user, job.account, job.partition, job.ntasks) == (
        "alpha", "4242", "alice", "physics", "gpu", 16)
    assert job.nodes == ["gpu01", "gpu02"] and job.gpus == 16
    assert job.state == "COMPLETED" and job.exit_code == "0:0"
    assert abs(job.start.timestamp() - start["t"]) < 1e-3
    assert abs(job.end.timestamp() - end["t"]) < 1e-3


def test_a_requeued_jobs_runs_are_recorded_apart_and_its_row_is_the_latest_run(tmp_path,
                                                                                  engine):
    """Run 0 (requeued) and run 1 of job 4243: two files and two events per hook, one row
    holding run 1's start, end and state, whatever order the records come in."""
    jobs = tmp_path / "jobs"
    env = {**SLURM_ENV, "SLURM_JOB_ID": "4243"}
    records, t0 = [], float(int(time.time()) - 3600)
    for run, (began, ended, status) in enumerate(((100, 130, "0:15"), (300, 360, "0:0"))):
        at = {**env, "SLURM_JOB_RESTART_COUNT": str(run), "SLURM_JOB_EXIT_CODE2": status}
        records += [slurmhook.start_record(at, t0 + began), slurmhook.end_record(at, t0 + ended)]
    for record in records:
        slurmhook.write_record(jobs, record)
    assert sorted(p.name for p in jobs.iterdir()) == [
        "4243.job_end.json", "4243.job_end.r1.json", "4243.job_start.json",
        "4243.job_start.r1.json"]
    spool = JobSpool(jobs, "4243", AgentMetrics())
    events = spool.scan("gpu01")
    assert sorted(e["id"] for e in events) == [
        "gpu01:slurm:4243:job_end", "gpu01:slurm:4243:job_end:r1",
        "gpu01:slurm:4243:job_start", "gpu01:slurm:4243:job_start:r1"]
    assert spool.sent([e["spool"] for e in events if e["id"].endswith("job_end:r1")])

    parts = [job_fields(r["event"], "gpu01", datetime.fromtimestamp(r["t"], UTC),
                        {k: v for k, v in r.items() if k not in ("event", "t", "job")})
             for r in records]
    row = merged_in_every_order(parts)
    assert (row["restarts"], row["state"], row["exit_code"]) == (1, "COMPLETED", "0:0")
    assert row["start"] == str(datetime.fromtimestamp(t0 + 300, UTC))

    # the same in PostgreSQL, run 1's records first and run 0's late
    for batch in (records[2:], records[:2]):
        write_batch(engine, {"events": job_events("gpu01", "4243", batch)})
    with Session(engine) as session:
        job = session.scalars(select(Job).where(Job.id == "4243")).one()
    assert (job.restarts, job.state, job.exit_code, job.start.timestamp(), job.end.timestamp()
            ) == (1, "COMPLETED", "0:0", t0 + 300, t0 + 360)


def test_sacct_and_scontrol_answers_name_each_run():
    from echod.slurmjobs import Run, parse_sacct, parse_scontrol

    runs = parse_sacct("alpha|5|5|REQUEUED|0:0|alice\nalpha|5|5|COMPLETED|0:0|alice\n"
                       "alpha|10|1_0|CANCELLED by 1000|0:15|bob\nalpha|3|2+1|TIMEOUT|0:0|\n"
                       "garbage\nalpha|5|5|COMPLETED|0:0\n")
    assert runs[("alpha", "5", 0)] == Run("5", "REQUEUED", "0:0", "alice")
    assert runs[("alpha", "5", 1)] == runs[(None, "5", 1)] == Run("5", "COMPLETED", "0:0",
                                                                   "alice")
    assert runs[("alpha", "10", 0)] == Run("1_0", "CANCELLED", "0:15", "bob")
    assert runs[("alpha", "3", 0)].slurm_id == "2+1" and runs[("alpha", "3", 0)].user is None
    assert len(runs) == 8
    shown = parse_scontrol(
        "JobId=6 ArrayJobId=1 ArrayTaskId=0 JobState=COMPLETING Restarts=0 ExitCode=0:0 "
        "UserId=alice(1000)\n"
        "JobId=3 HetJobId=2 HetJobOffset=1 JobState=OUT_OF_MEMORY Restarts=2 ExitCode=0:125\n"
        "JobId=9 JobState=NODE_FAIL Restarts=0 ExitCode=0:0\n", "alpha")
    assert shown[("alpha", "6", 0)] == Run("1_0", "COMPLETING", "0:0", "alice")
    assert shown[("alpha", "3", 2)] == Run("2+1", "OUT_OF_MEMORY", "0:125")
    assert shown[(None, "9", 0)] == Run("9", "NODE_FAIL", "0:0")


def test_sighup_and_the_control_socket_make_a_running_agent_read_the_spool_at_once(spawn,
                                                                                   tmp_path):
    """With a push interval of a minute, a record still goes at once when a hook calls or
    the agent gets SIGHUP (systemctl reload)."""
    jobs, sock = tmp_path / "jobs", tmp_path / "ingerod.sock"
    agent = spawn("ingerod", "ingerod", [
        "--config", "/dev/null", "--source", "synthetic", "--insecure-plaintext-zmq",
        "--fleet", "tcp://127.0.0.1:9", "--metrics-addr", "none", "--push-interval", "60",
        "--jobs-dir", str(jobs), "--control-socket", str(sock)])
    assert wait_until(lambda: "control socket" in agent.log(), 60), agent.log()
    slurmhook.write_record(jobs, slurmhook.start_record({**SLURM_ENV, "SLURM_JOB_ID": "21"}, 1.0))
    assert slurmhook.tell_node_agent(str(sock), "21", "start")
    assert wait_until(lambda: "job 21: job_start recorded" in agent.log()), agent.log()
    slurmhook.write_record(jobs, slurmhook.start_record({**SLURM_ENV, "SLURM_JOB_ID": "22"}, 1.0))
    agent.process.send_signal(signal.SIGHUP)
    assert wait_until(lambda: "job 22: job_start recorded" in agent.log()), agent.log()
    assert agent.alive()


@needs_ebpf
def test_a_prolog_while_the_agent_compiles_its_probes_starts_no_second_agent(spawn, tmp_path):
    """At boot, slurmd may run a prolog while the node-wide ingerod is still compiling its BPF
    programs (seconds): its control socket is bound before that, so the prolog finds it
    answering, within its budget, and starts no per-job agent beside it."""
    import sim

    jobs, sock, run = tmp_path / "jobs", tmp_path / "ingerod.sock", tmp_path / "run"
    settings(tmp_path, **base(tmp_path, INGERO_CONTROL_SOCKET=sock, INGERO_HOOK_AGENT="auto",
                              INGERO_INGEROD="/bin/false", INGERO_RUN_DIR=run))
    agent = spawn("ingerod", "ingerod", [
        "--config", "/dev/null", "--source", "ebpf", "--libraries", sim.traced_libraries(),
        "--insecure-plaintext-zmq", "--fleet", "tcp://127.0.0.1:9", "--metrics-addr", "none",
        "--jobs-dir", str(jobs), "--control-socket", str(sock)])
    assert wait_until(sock.exists, 60), agent.log()
    status, seconds = hook(PROLOG, "prolog_slurmd", tmp_path)
    compiling = "pushing to" not in agent.log()
    assert status == 0 and seconds < 2.0, (status, seconds)
    assert compiling, "the probes compiled before the prolog ran: nothing was shown"
    assert not run.exists() and not (tmp_path / "log").exists()     # no detached agent
    assert (jobs / "4242.job_start.json").exists()
    assert wait_until(lambda: "job 4242: job_start recorded" in agent.log(), 60), agent.log()
    assert agent.stop(AGENT_STOP_S) == 0     # drained, then its probes detached
