"""Jobs as Slurm names them, on a real Slurm with accounting (munge, MariaDB, slurmdbd,
slurmctld, a slurmd for each of two nodes on this host), the hooks telling a node-wide ingerod
of a real stack (fleetd, echod).

An array job whose tasks run traced sim ranks, a heterogeneous job, a job of two srun steps of
traced sim ranks (ranked from 0 in each, rank 1 late in the second only), a job requeued once,
one cancelled and one killed by its time limit: ``ingero jobs`` shows each with the id and
state sacct shows, compared side by side; ``ingero report`` takes the ids in every form
sacct's -j does, and shows each step's ranks apart. Two Unix users each run a job and ask with
their MUNGE credential, no token: each sees their own job only, in reports and in SQL (row-level security),
every user's jobs only root does; a forged,
expired or replayed credential is refused with one line.
"""

from __future__ import annotations

import json
import os
import pwd
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from ingero import munge, wire
from stack.launch import wait_for
from stack.local import Stack
from ingerod.jobs import record_event
from tests.slurmcluster import (SlurmCluster, cluster_for_module, ingero_cli,
                               ingero_run, needs_slurm, stack_beside)
from tests.support import Producer, forward, needs_ebpf

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
    # two srun steps of four traced ranks each, ranked from 0 in each; step 1's rank 1 late.
    # After the array: ten ranks at once on two CPUs would make noise of their own.
    late = '[ "$SLURM_STEP_ID.$SLURM_PROCID" = 1.1 ] && set -- --delay ms=80,from=10'
    step = (f"{sim.bin_dir() / 'ingero-sim-rank'} --steps 150 --step-ms 20 "
            f"--unique-id-file {work}/uid.step$SLURM_STEP_ID "
            f"--record {work}/ranks.step$SLURM_STEP_ID.jsonl")
    script = work / "two-steps.sh"
    script.write_text("#!/bin/sh\n" + f"srun -n 4 sh -c '{late}; exec {step} \"$@\"'\n" * 2)
    steps = sbatch(cluster, "-n", "4", "--chdir", str(work), f"--dependency=afterany:{array}",
                   str(script))
    requeued = sbatch(cluster, "--requeue", "--wrap", "sleep 4")
    cancelled = sbatch(cluster, "--wrap", "sleep 300")
    timed_out = sbatch(cluster, "-t", "0:5", "--wrap", "sleep 300")   # ends at slurmctld's next check
    jobs = [array, het, steps, requeued, cancelled, timed_out]

    assert wait_for(lambda: state_of(cluster, requeued) == "RUNNING", 60), cluster.logs()
    scontrol(cluster, "requeue", requeued)
    assert wait_for(lambda: state_of(cluster, cancelled) == "RUNNING", 60), cluster.logs()
    subprocess.run(["scancel", cancelled], env=cluster.env, check=True, timeout=30)
    assert wait_for(lambda: not subprocess.run(
        ["squeue", "-h"], env=cluster.env, capture_output=True, text=True).stdout.strip(),
        240, interval=2), subprocess.run(["squeue"], env=cluster.env, capture_output=True,
                                         text=True).stdout

    # the site's own prolog and epilog ran beside ingero's, for every job (prolog.d/*)
    site = {tuple(line.split()) for line in cluster.site_log.read_text().splitlines()}
    ours = {(run.context, run.job) for job in jobs for run in cluster.hook_runs(job)}
    assert {("prolog_slurmd", j) for j in jobs} | {("epilog_slurmd", j) for j in jobs} <= ours
    assert ours <= site, ours - site

    slurm = sacct_rows(cluster, jobs)
    states = {job: state for job, state in slurm}
    assert {f"{array}_{t}" for t in range(3)} | {f"{het}+0", f"{het}+1"} <= set(states), slurm
    assert (states[requeued], states[cancelled], states[timed_out]) == (
        "COMPLETED", "CANCELLED", "TIMEOUT"), slurm
    # ingero names them all as sacct does once echod has asked it (and the hooks' records of
    # the requeued job's two runs have not blended: its row is the run that completed)
    assert wait_for(lambda: ingero_rows(stack, jobs) == slurm, 60), (
        sorted(ingero_rows(stack, jobs) ^ slurm), ingero_cli(
            stack, "sql", "SELECT id, slurm_id, restarts, state, slurm_state, slurm_tries, "
            "slurm_checked, start, \"end\" FROM jobs ORDER BY id"),
        cluster.sacct("-a", "-X", "-D", "-P", "-o", "JobIDRaw,JobID,State,Start,End").stdout,
        [line for line in stack.echod.daemon.log().splitlines() if "Slurm" in line])
    rows = json.loads(ingero_cli(stack, "jobs", "-j", requeued, "--json"))["jobs"]
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
    # sacct's -s by code, and --delimiter
    out = ingero_cli(stack, "jobs", "-j", ",".join(jobs), "-s", "CA,timeout", "-n", "-P",
                     "--delimiter", ";", "-o", "JobID,State")
    assert sorted(out.split()) == sorted([f"{cancelled};CANCELLED", f"{timed_out};TIMEOUT"])
    # sacct's -r and -M: the test Slurm's one partition and cluster, and ones it has not
    def raw_ids(*selection: str) -> list[str]:
        return sorted(ingero_cli(stack, "jobs", "-j", ",".join(jobs), *selection, "-n", "-P",
                                 "-o", "JobIDRaw").split())

    assert raw_ids("-r", "gpu,debug") == raw_ids() and len(raw_ids()) >= len(jobs)
    assert ingero_cli(stack, "jobs", "-j", ",".join(jobs), "-r", "gpu", "-n") == ""
    cluster_name = json.loads(ingero_cli(stack, "jobs", "-j", requeued, "--json"))[
        "jobs"][0]["cluster"]
    assert ingero_cli(stack, "jobs", "-j", requeued, "-M", f"elsewhere,{cluster_name}", "-n",
                      "-P", "-o", "JobID") == f"{requeued}\n"
    assert ingero_cli(stack, "jobs", "-j", requeued, "-M", "elsewhere", "-n") == ""

    # report: the array's traced ranks under each task's id
    report = wait_for(lambda: (out := ingero_cli(stack, "report", "-j", array, "-n", "-P",
                                                  "-o", "JobID,Rank")).count("\n") >= 6 and out,
                      60)
    assert report, ingero_cli(stack, "report", "-j", array) + "".join(
        p.read_text() for p in work.glob("*.out"))
    assert sorted(report.split()) == sorted(f"{array}_{t}|{r}" for t in range(3)
                                            for r in range(2)), report
    # report: the two steps' ranks apart (step 1's rank 1 is not step 0's), and a step alone
    def by_step(name: str) -> dict[tuple[str, str], str]:
        out = ingero_cli(stack, "report", "-j", name, "-n", "-P", "-o", "Step,Rank,Verdict")
        return {(s, r): v for s, r, v in (line.split("|") for line in out.splitlines())}

    whole = wait_for(lambda: len(found := by_step(steps)) == 8 and found, 60)
    assert whole and set(whole) == {(s, str(r)) for s in "01" for r in range(4)}, (
        by_step(steps), ingero_cli(stack, "report", "-j", steps))
    assert {key for key, verdict in whole.items() if verdict} == {("1", "1")}, whole
    assert by_step(f"{steps}.1") == {key: v for key, v in whole.items() if key[0] == "1"}
    assert by_step(f"{steps}.0") == {key: "" for key in whole if key[0] == "0"}

    # export: the array's id is its three tasks, a file each, named by %j as sbatch names
    one = ingero_run(stack, "export", "-j", array, "-o", str(work / "t.json"))
    assert one.returncode == 2 and "3 jobs" in one.stderr, one.stderr
    ingero_cli(stack, "export", "-j", array, "-o", str(work / "trace-%j.json"))
    assert sorted(p.name for p in work.glob("trace-*.json")) == [
        f"trace-{array}_{t}.json" for t in range(3)]


# -- users by MUNGE ----------------------------------------------------------------------------

USERS = ("ingero-alice", "ingero-bob")


def unix_user(name: str) -> pwd.struct_passwd:
    """A user of this host (made once: no home, no login shell)."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=True,
                       capture_output=True, timeout=30)
        return pwd.getpwnam(name)


def as_user(stack: Stack, code, user: str, *args: str) -> subprocess.CompletedProcess:
    """``ingero ARGS`` run by ``user`` from ``code`` (``for_others``: where the user may read
    it): no token, so it proves who it is with MUNGE."""
    home = stack.root / f"home-{user}"
    home.mkdir(exist_ok=True)
    entry = unix_user(user)
    os.chown(home, entry.pw_uid, entry.pw_gid)
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "INGERO_URL": stack.echod.url,
           "INGERO_CA_CERT": str(stack.echod.cert)}
    return subprocess.run(["runuser", "-u", user, "--", "env", "-i",
                           *(f"{k}={v}" for k, v in env.items()), str(code.python), "-m",
                           "ingero", *args], capture_output=True, text=True, timeout=120,
                          cwd=code.checkout)


def munge_as(user: str, payload: bytes) -> str:
    """A MUNGE credential minted by ``user``, carrying ``payload``."""
    done = subprocess.run(["runuser", "-u", user, "--", "munge", "--input", "-"],
                          input=payload, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode().strip()


def minted_for(stack: Stack, tool: str = "list_jobs", args: dict | None = None) -> bytes:
    """What a credential for ``refusal``'s request of that tool carries."""
    return munge.payload_for_url("POST", stack.echod.url + f"/api/v1/tools/{tool}",
                                 json.dumps(args or {}).encode())


def refusal(stack: Stack, authorization: str, tool: str = "list_jobs",
            args: dict | None = None) -> tuple[int, dict]:
    """A tool's answer over HTTP as echod gives it to this Authorization: (status, body)."""
    request = urllib.request.Request(
        stack.echod.url + f"/api/v1/tools/{tool}", json.dumps(args or {}).encode(), {
            "Authorization": authorization, "Content-Type": "application/json"}, method="POST")
    context = ssl.create_default_context(cafile=str(stack.echod.cert))
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as answer:
        return answer.code, json.loads(answer.read())


def test_each_user_sees_their_own_jobs_by_munge_and_only_an_admin_sees_everyones(
        cluster, stack, for_others):
    jobs = {}
    for user in USERS:
        entry = unix_user(user)
        work = cluster.root / user
        work.mkdir()
        os.chown(work, entry.pw_uid, entry.pw_gid)
        done = subprocess.run(
            ["runuser", "-u", user, "--", "sbatch", "--parsable", "-o", "/dev/null", "-n", "2",
             "--chdir", str(work), "--wrap",
             f"srun -n 2 {for_others.sim_bin / 'ingero-sim-rank'} --steps 150 --step-ms 20 "
             f"--unique-id-file {work}/uid --record {work}/ranks.jsonl"],
            env=cluster.env, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        jobs[user] = done.stdout.strip()
    assert wait_for(lambda: not subprocess.run(
        ["squeue", "-h"], env=cluster.env, capture_output=True, text=True).stdout.strip(),
        120, interval=1)

    def own_report(user: str) -> set[str] | None:
        done = as_user(stack, for_others, user, "report", "-n", "-P", "-o", "JobID,Rank")
        assert done.returncode == 0, done.stderr
        rows = set(done.stdout.split())
        return rows if len(rows) >= 2 else None

    for user in USERS:
        mine = {f"{jobs[user]}|0", f"{jobs[user]}|1"}
        assert wait_for(lambda: own_report(user) == mine, 60), own_report(user)
        other = jobs[USERS[1 - USERS.index(user)]]
        assert as_user(stack, for_others, user, "report", "-j", other, "-n").stdout == ""
        listed = as_user(stack, for_others, user, "jobs", "-n", "-P", "-o", "JobID,User")
        assert listed.stdout.split() == [f"{jobs[user]}|{user}"], listed

        # every user's jobs: refused with one line
        every = as_user(stack, for_others, user, "jobs", "-a")
        assert every.returncode == 1 and len(every.stderr.strip().splitlines()) == 1, every
        assert "own jobs only" in every.stderr, every.stderr
        # SQL: their own jobs' rows only (row-level security by user), no node's
        def sql(statement: str) -> list[str]:
            done = as_user(stack, for_others, user, "sql", "--csv", statement)
            assert done.returncode == 0, done.stderr
            return done.stdout.split()[1:]

        assert sql("SELECT DISTINCT job FROM events ORDER BY 1") == [jobs[user]]
        assert sql('SELECT DISTINCT "user" FROM jobs') == [user]
        assert int(sql("SELECT count(*) FROM peer_lag")[0]) > 0
        assert sql(f"SELECT count(*) FROM peer_lag WHERE job = '{other}'") == ["0"]
        # what belongs to no job, of a cluster they ran in (sinfo's nodes, the cluster's
        # bar): theirs to read; another job's cohort bar is not
        assert sql("SELECT DISTINCT cluster FROM nodes") == ["sim"]
        assert sql(f"SELECT count(*) FROM thresholds WHERE cohort = 'job:{other}'") == ["0"]
        # a tool about no job reads theirs only, under the same claim as their SQL
        credential = munge_as(user, minted_for(stack, "find_stragglers", {}))
        status, body = refusal(stack, f"MUNGE {credential}", "find_stragglers", {})
        assert status == 200 and {b["job"] for b in body["jobs"]} == {jobs[user]}, body

    # root (an admin by MUNGE, no token): everyone's
    admin = as_user(stack, for_others, "root", "jobs", "-a", "-n", "-P", "-o", "JobID,User")
    assert admin.returncode == 0, admin.stderr
    assert {f"{jobs[u]}|{u}" for u in USERS} <= set(admin.stdout.split()), admin.stdout

    # the same job id in another cluster is another user's: alice's question about her job
    # reads her cluster only (a cluster's job ids are its own)
    alice, bob = USERS
    forward(stack.keys, stack.echod.ingest, wire.Forward(0, "other-cluster", [{
        "id": "o1:slurm:start", "t": time.time() - 30, "kind": "job_start", "node": "o1",
        "cluster": "other", "boot_id": "b", "job": jobs[alice], "attrs": {"user": bob}}]))
    seen = ingero_cli(stack, "sql", "--csv", f"SELECT DISTINCT cluster FROM events WHERE job = "
                      f"'{jobs[alice]}' ORDER BY 1")
    assert seen.split()[-2:] == ["other", "sim"], seen
    asked = {"job": jobs[alice]}
    mine = munge_as(alice, minted_for(stack, "event_history", asked))
    status, body = refusal(stack, f"MUNGE {mine}", "event_history", asked)
    assert status == 200 and body["events"], body
    assert {e["cluster"] for e in body["events"]} == {"sim"}, body
    # how long a statement took, to a user who sees their own rows only, in tenths of a second
    # (a scan's time tells how many rows of others' it passed over)
    query = {"sql": "SELECT count(*) FROM events"}
    sql_alice = munge_as(alice, minted_for(stack, "run_analysis", query))
    status, body = refusal(stack, f"MUNGE {sql_alice}", "run_analysis", query)
    assert status == 200 and body["elapsed_ms"] > 0 and body["elapsed_ms"] % 100 == 0, body
    assert as_user(stack, for_others, alice, "sql", "--csv", "SELECT DISTINCT cluster FROM "
                   "events ORDER BY 1").stdout.split() == ["cluster", "sim"]

    # forged, expired, replayed, minted for something else or for another request (seen on
    # the way, and sent with another body): 401 and one line
    listing = minted_for(stack)
    expired = munge.credential(ttl=1, payload=listing)
    time.sleep(2)
    fresh = munge.credential(payload=listing)
    refusal(stack, f"MUNGE {fresh}")
    other = subprocess.run(["munge", "-n"], capture_output=True, text=True).stdout.strip()
    elsewhere = munge_as(alice, minted_for(stack, "event_history", {"job": jobs[alice]}))
    good = munge.credential(payload=listing)
    middle = len(good) // 2
    forged = good[:middle] + ("A" if good[middle] != "A" else "B") + good[middle + 1:]
    for credential, reason in (("MUNGE:AAAAforged0000:", "Failed to base64-decode"),
                               (forged, "Invalid credential"),
                               (expired, "Expired credential"),
                               (fresh, "Replayed credential"),
                               (other, "minted for something other than echod"),
                               (elsewhere, "minted for another request")):
        status, body = refusal(stack, f"MUNGE {credential}")
        message = body["error"]
        assert status == 401 and reason in message and "\n" not in message, (status, body)


def test_a_job_record_forged_with_a_stolen_node_key_yields_to_slurms_word(
        cluster, stack, for_others):
    """Root on the node holds its agent's key and, before alice's next job starts, pushes
    that job's start record (the id Slurm will hand out next) naming bob. The record echod
    stores first stands over the prolog's, until echod asks sacct whose job it is: alice's,
    in her list, never in bob's; a later forged record (a requeued run's) changes nothing."""
    alice, bob = USERS
    done = subprocess.run(["squeue", "-h", "-a", "-t", "all", "-o", "%A"], env=cluster.env,
                          capture_output=True, text=True, timeout=30)
    last = max([int(x) for x in done.stdout.split()] + [int(x) for x in subprocess.run(
        ["sacct", "-n", "-X", "-a", "-P", "-o", "JobIDRaw"], env=cluster.env,
        capture_output=True, text=True, timeout=30).stdout.split() if x.isdigit()], default=0)
    job = str(last + 1)
    key = stack.keys.node_secrets[stack.key_name(cluster.host)]

    def forge(**record) -> None:
        forger = Producer(stack.endpoint, stack.keys, cluster.host, cluster="sim", secret=key)
        event = record_event(cluster.host, {"job": job, "event": "job_start", "t": time.time(),
                                            "user": bob, "uid": unix_user(bob).pw_uid,
                                            **record})
        try:
            forger.send(wire.encode(wire.Push(0, cluster.host, "sim", forger.boot, 0.9,
                                              Producer.SIGNALS, "active", time.time(), 1.0,
                                              events=[event])))
            assert forger.collect_acks(10) == 1, "a node may say which jobs run on it"
        finally:
            forger.close()
    forge()
    work = cluster.root / "forged"
    work.mkdir()
    os.chown(work, unix_user(alice).pw_uid, unix_user(alice).pw_gid)
    done = subprocess.run(["runuser", "-u", alice, "--", "sbatch", "--parsable", "-o",
                           "/dev/null", "--chdir", str(work), "--wrap", "sleep 1"],
                          env=cluster.env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == job, (done, job)

    def listed(user: str) -> list[str]:
        out = as_user(stack, for_others, user, "jobs", "-n", "-P", "-o", "JobID,User")
        return out.stdout.split()

    def whose() -> str:
        return ingero_cli(stack, "sql", "SELECT id, \"user\", slurm_id, slurm_tries FROM jobs "
                          f"WHERE id = '{job}'")
    assert wait_for(lambda: f"{job}|{alice}" in listed(alice), 90), (listed(alice), whose())
    assert not [line for line in listed(bob) if line.startswith(f"{job}|")]
    forge(restart_count=1)
    time.sleep(3)                 # echod has stored it, and asked Slurm again
    assert f"{job}|{alice}" in listed(alice), whose()
    assert not [line for line in listed(bob) if line.startswith(f"{job}|")], whose()
