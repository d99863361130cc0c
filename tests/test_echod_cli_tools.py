"""The tools the ingero CLI is built on (job_report's rank rows, list_jobs, job_timeline) against
a real PostgreSQL, read through the real SQL sandbox, with numbers worked out by hand.

alpha runs job 5150: 4 ranks on 2 nodes (ranks 0, 1 on c-node0; 2, 3 on c-node1, whose clock
runs 250 ms ahead of fleetd's, as its health scores say), one AllReduce a second for 100 s.
Ranks 0, 1, 2 enter 0, 1 and 2 ms into each second. Rank 3 enters 0.5 ms in for the first 50
collectives (rank 2 comes last), then 20 ms in (the last collective: 120 ms). Each rank syncs
on its own kernels once a second (rank 0: 7 ms, rank 1: 9 ms but 109 ms every tenth, rank 2:
12 ms, rank 3: 10 ms, then 6 ms from collective 50 on). fleetd named rank 2 (cleared at 40 s)
and rank 3 (an old verdict cleared, and a live one from 55 s). The jobs table lists 5150
(alice) and 7002 (bob, two hours ago); job 6001 has only health scores. beta runs job 9,
which an alpha caller must never see.
"""

from __future__ import annotations

import json
import secrets
import time
from datetime import UTC, datetime

import pytest
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pytest_postgresql.janitor import DatabaseJanitor
from sqlalchemy import text

from echod.store.db import make_engine
from echod.registry import REGISTRY, Scope, ToolError
from echod.sandbox import Sandbox, prepare, sandbox_url
from echod.store.writer import write_batch

from . import test_echod_tools as tools_tests
from .pg import url_of
from .test_echod_tools import (ALPHA, EVERY, Batch, arguments, bounded, call, iso, refused,
                               strategy)

ROLE = "ingero_cli_tools_test"      # roles are server-wide: this module's own
PASSWORD = secrets.token_urlsafe(24)

JOB, COMM = "5150", "5150c0ffee5150c0"
RANKS, STEPS = 4, 100
NODE1_AHEAD_S = 0.250
MS = 0.001
CLI_TOOLS = ("job_report", "list_jobs", "job_timeline")


def node_of(rank: int) -> str:
    return f"c-node{rank // 2}"


def clock(rank: int) -> float:
    """How far the rank's node's clock is ahead of fleetd's."""
    return NODE1_AHEAD_S if node_of(rank) == "c-node1" else 0.0


def entry_ms(rank: int, step: int) -> float:
    """When the rank enters collective ``step``, ms after the second starts (fleetd's clock)."""
    if rank < 3:
        return float(rank)
    if step < 50:
        return 0.5
    return 120.0 if step == STEPS - 1 else 20.0


def self_work_ms(rank: int, step: int) -> float:
    """How long the rank's sync on its own kernels takes at ``step``."""
    if rank == 1:
        return 109.0 if step % 10 == 0 else 9.0
    if rank == 3:
        return 10.0 if step < 50 else 6.0
    return {0: 7.0, 2: 12.0}[rank]


# -- the data ----------------------------------------------------------------------------------

def job_rows(b: Batch, t0: float) -> None:
    for step in range(STEPS):
        for rank in range(RANKS):
            at = t0 + step + clock(rank)
            slurm_step = "1"              # the job's second srun step
            b.event(node_of(rank), at + entry_ms(rank, step) * MS, "collective", JOB, rank,
                    op="ncclAllReduce", comm_hash=COMM, seq=step, bytes=4 * 2**20,
                    duration_ns=25_000, step=slurm_step, world_size=RANKS)
            b.event(node_of(rank), at + 0.1, "sync", JOB, rank, op="cudaStreamSynchronize",
                    duration_ns=3_000_000, peer_wait=True, comm_hash=COMM, seq=step)
            b.event(node_of(rank), at + 0.2, "sync", JOB, rank, op="cudaStreamSynchronize",
                    duration_ns=int(self_work_ms(rank, step) * 1e6), peer_wait=False)
    b.event("c-node0", t0 + 0.5, "alloc", JOB, 0, op="cudaMalloc", bytes=2**30,
            duration_ns=40_000, result=0)
    b.event("c-node1", t0 + 0.6 + NODE1_AHEAD_S, "memcpy", JOB, 2, op="cudaMemcpy",
            bytes=2**20, duration_ns=100_000, direction="host_to_device")
    b.event("c-node1", t0 + 0.7 + NODE1_AHEAD_S, "preempted", JOB, 3, preemptor_comm="hog",
            count=3)
    b.event("c-node0", t0 + 0.8, "sync", JOB, None, op="cudaDeviceSynchronize",
            duration_ns=1_000_000)


def scores(b: Batch, t0: float, t1: float, job: str, offsets: dict[str, float]) -> None:
    """A health score every 10 s from each node, with the clock offset fleetd estimated."""
    t = t0
    while t < t1:
        for node, offset in offsets.items():
            b.rows["scores"].append({"t": t, "cluster": b.cluster, "node": node, "job": job,
                                     "score": 0.9, "state": "active", "signals": {"cpu": 0.9},
                                     "clock_offset": offset})
        t += 10


def verdict(vid: str, revision: int, rank: int, kind: str, cause: str, raised: float,
            cleared: float | None, cost: float) -> dict:
    return {"vid": vid, "revision": revision, "cluster": "alpha", "job": JOB, "rank": rank,
            "node": node_of(rank), "kind": kind, "cause": cause, "confidence": "high",
            "severity": "major", "fix": None, "findings": [], "op": "ncclAllReduce",
            "comm_hash": COMM, "step": int(raised), "onset": raised, "first_seen": raised,
            "last_seen": cleared or raised, "cleared": cleared, "lag_p50_s": 0.019,
            "lag_p99_s": 0.02, "last_share": 1.0, "period": None, "occurrences": 10,
            "cost_gpu_s": cost, "cost_usd": cost / 100, "evidence": {}}


def peer_lag(t: float, rank: int, seq_first: int) -> dict:
    return {"t": t, "cluster": "alpha", "job": JOB, "comm_hash": COMM, "seq_first": seq_first,
            "seq_last": seq_first + 49, "rank": rank, "node": node_of(rank), "samples": 50,
            "lag_median_ns": 1_000_000, "lag_p95_ns": 2_000_000, "lag_max_ns": 3_000_000}


def batches(t0: float) -> list[dict]:
    alpha = Batch("alpha")
    job_rows(alpha, t0)
    scores(alpha, t0, t0 + STEPS, JOB, {"c-node0": 0.0, "c-node1": NODE1_AHEAD_S})
    scores(alpha, t0 + 200, t0 + 291, "6001", {"c-node2": None})
    alpha.rows["peer_lag"] = [peer_lag(t0 + 50 * i + 49, r, 50 * i)
                              for i in range(2) for r in range(RANKS)]
    first = [verdict("v-old", 0, 3, "slow_gpu", "slow_gpu", t0 + 5, t0 + 20, 0.25),
             verdict("v-late", 1, 3, "persistent", "host_work", t0 + 55, None, 1.0),
             verdict("v-io", 0, 2, "periodic", "io", t0 + 10, t0 + 40, 0.5),
             {**verdict("v-ahead", 0, 1, "ahead", "none", t0 + 30, t0 + 30, 0.0),
              "severity": "info"}]         # a note: late on the host, costing nobody
    revised = [verdict("v-late", 2, 3, "persistent", "host_preemption", t0 + 55, None, 3.0)]
    beta = Batch("beta")
    beta.event("d-node0", t0 + 1, "collective", "9", 0, op="ncclAllReduce", comm_hash="beef",
               seq=0)
    scores(beta, t0, t0 + 20, "9", {"d-node0": 0.0})
    return [alpha.rows, {"verdicts": first}, {"verdicts": revised}, beta.rows]


JOBS = """
INSERT INTO jobs (cluster, id, "user", nodes, gpus, start, "end") VALUES
    ('alpha', :job, 'alice', ARRAY['c-node0', 'c-node1'], 4, :start, :end),
    ('alpha', '7002', 'bob', ARRAY['c-node0'], 1, :old_start, :old_end),
    ('beta', '9', 'alice', ARRAY['d-node0'], 1, :start, NULL)
"""


@pytest.fixture(scope="module")
def world(migrated_proc):
    """One migrated database with both clusters' rows, shared: the tools only read."""
    now = float(round(time.time()))
    t0 = now - 300
    url = url_of(migrated_proc).set(database="echod_cli_tools_tests")
    with DatabaseJanitor(user=migrated_proc.user, host=migrated_proc.host,
                         port=migrated_proc.port, password=migrated_proc.password,
                         dbname=url.database, template_dbname=migrated_proc.template_dbname):
        engine = make_engine(url)
        for rows in batches(t0):
            assert write_batch(engine, rows, now=now).rejected == []
        with engine.begin() as conn:
            conn.execute(text(JOBS), {"job": JOB, "start": at(t0 - 10), "end": at(t0 + 110),
                                      "old_start": at(t0 - 7200), "old_end": at(t0 - 3600)})
        sandbox = Sandbox(sandbox_url(engine.url, ROLE, PASSWORD),
                          prepare(engine, ROLE, PASSWORD), timeout_ms=20_000, pool_size=2)
        yield {"t0": t0, "now": now, "sandbox": sandbox}
        sandbox.dispose()
        engine.dispose()


def at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


# -- job_report --------------------------------------------------------------------------------

def per_rank(report: dict) -> dict[int, dict]:
    return {r["rank"]: r for r in report["per_rank"]}


def test_job_report_rows_carry_what_sacct_prints_worked_out_by_hand(world):
    report = call(world, "job_report", job=JOB, usd_per_gpu_hour=3600.0)
    assert (report["user"], report["nodes"], report["ranks"]) == (
        "alice", ["c-node0", "c-node1"], RANKS)
    assert (report["start"], report["end"]) == (iso(world["t0"] - 10), iso(world["t0"] + 110))
    rows = per_rank(report)
    late = rows[3]
    assert (late["node"], late["step"], late["collectives"]) == ("c-node1", "1", STEPS)
    # against the median of its peers (1 ms): 50 × −0.5, 49 × 19, 1 × 119 ms; the median
    # lies between −0.5 and 19, the 99th percentile 1 % of the way from 19 to 119
    assert late["lag_median_ms"] == pytest.approx(9.25, abs=0.002)
    assert late["lag_p99_ms"] == pytest.approx(20.0, abs=0.002)
    assert late["last_share"] == 0.5 and rows[2]["last_share"] == 0.5
    assert rows[0]["last_share"] == rows[1]["last_share"] == 0.0
    # medians, not means: rank 1's is 9 ms though every tenth sync takes 109 ms
    assert [rows[r]["self_work_ms"] for r in range(RANKS)] == [7.0, 9.0, 12.0, 8.0]
    assert [rows[r]["peers_self_work_ms"] for r in range(RANKS)] == [9.0, 8.0, 8.0, 9.0]
    # idle it caused: 49 × (20 + 19 + 18) ms + (120 + 119 + 118) ms; rank 2: 50 × 4.5 ms
    assert late["cost_gpu_seconds"] == pytest.approx(3.15, abs=0.002)
    assert late["cost_usd"] == pytest.approx(3.15, abs=0.01)
    assert rows[2]["cost_gpu_seconds"] == pytest.approx(0.225, abs=0.002)
    assert rows[0]["cost_gpu_seconds"] == 0 and rows[0]["step"] == "1"
    # the live verdict, at its newest revision; rank 2's was cleared but is in the whole job
    assert (late["verdict"], late["cause"]) == ("persistent", "host_preemption")
    assert (rows[2]["verdict"], rows[2]["cause"]) == ("periodic", "io")
    assert rows[0]["verdict"] is None and rows[0]["cause"] is None


def test_job_report_over_a_window_measures_the_rows_there_only(world):
    t0 = world["t0"]
    report = call(world, "job_report", job=JOB, since=iso(t0 + 49.5))
    assert report["window"] == {"since": iso(t0 + 49.5), "until": None}
    rows = per_rank(report)
    late = rows[3]
    assert late["collectives"] == 50 and rows[0]["collectives"] == 50
    # 49 × 19 ms and 1 × 119 ms: the 99th percentile 51 % of the way from 19 to 119
    assert late["lag_median_ms"] == pytest.approx(19.0, abs=0.002)
    assert late["lag_p99_ms"] == pytest.approx(70.0, abs=0.002)
    assert late["last_share"] == 1.0 and rows[2]["last_share"] == 0.0
    assert late["self_work_ms"] == 6.0 and late["peers_self_work_ms"] == 9.0
    assert late["cost_gpu_seconds"] == pytest.approx(3.15, abs=0.002)
    assert rows[2]["cost_gpu_seconds"] == 0
    # rank 2's verdict was cleared before the window; no rate given: fleetd's (1 % of cost)
    assert rows[2]["verdict"] is None and late["verdict"] == "persistent"
    assert late["cost_usd"] == pytest.approx(3.15 / 3600 * 36, abs=0.01)
    assert report["first_event"] == iso(t0 + 50)
    whole = per_rank(call(world, "job_report", job=JOB))
    assert whole[3]["lag_p99_ms"] != late["lag_p99_ms"]


# -- list_jobs ---------------------------------------------------------------------------------

def test_list_jobs_in_the_last_hour_from_the_small_tables(world):
    t0 = world["t0"]
    answer = call(world, "list_jobs")
    assert answer["window"] == {"since": iso(world["now"] - 3600), "until": None}
    jobs = {j["job"]: j for j in answer["jobs"]}
    assert list(jobs) == [JOB, "6001"]                  # oldest first; 7002 ended before
    assert jobs[JOB] == {"cluster": "alpha", "job": JOB, "job_id": JOB, "restarts": 0,
                         "user": "alice",
                         "nodes": ["c-node0", "c-node1"], "ranks": RANKS,
                         "start": iso(t0 - 10), "end": iso(t0 + 110), "stragglers": 2,
                         "cost_gpu_seconds": 3.75, "cost_usd": 0.0375, "account": None,
                         "partition": None, "state": None, "exit_code": None, "gpus": 4}
    # no jobs row, no lag summaries: its nodes and span are its scores'
    assert jobs["6001"] == {"cluster": "alpha", "job": "6001", "job_id": "6001", "restarts": 0,
                            "user": None,
                            "nodes": ["c-node2"], "ranks": None, "start": iso(t0 + 200),
                            "end": iso(t0 + 290), "stragglers": 0, "cost_gpu_seconds": None,
                            "cost_usd": None, "account": None, "partition": None,
                            "state": None, "exit_code": None, "gpus": None}


def test_list_jobs_window_user_and_job_filters(world):
    t0 = world["t0"]
    old = call(world, "list_jobs", since=iso(t0 - 8000), until=iso(t0 - 3000))
    assert [j["job"] for j in old["jobs"]] == ["7002"]
    assert old["jobs"][0]["user"] == "bob" and old["jobs"][0]["ranks"] is None
    everything = call(world, "list_jobs", since=iso(t0 - 8000))
    assert [j["job"] for j in everything["jobs"]] == ["7002", JOB, "6001"]
    assert [j["job"] for j in call(world, "list_jobs", since=iso(t0 - 8000),
                                   user="bob")["jobs"]] == ["7002"]
    assert [j["job"] for j in call(world, "list_jobs", user="alice")["jobs"]] == [JOB]
    # before its scores, 6001 is not seen; 5150 ended, but fleetd's verdict on it is still open
    later = call(world, "list_jobs", since=iso(t0 + 120), until=iso(t0 + 150))
    assert [j["job"] for j in later["jobs"]] == [JOB]
    # named jobs are whole jobs, whenever they ran
    assert [j["job"] for j in call(world, "list_jobs", jobs=["7002", "6001"])["jobs"]] == [
        "7002", "6001"]
    assert call(world, "list_jobs", jobs=["no-such-job"])["jobs"] == []
    assert call(world, "list_jobs", jobs=["a\x00b"])["jobs"] == []
    assert len(call(world, "list_jobs", since=iso(t0 - 8000), limit=1)["jobs"]) == 1


def test_list_jobs_respects_tenancy(world):
    alpha = json.dumps(call(world, "list_jobs", since=iso(world["t0"] - 8000)))
    assert "beta" not in alpha and "d-node" not in alpha
    every = call(world, "list_jobs", EVERY, since=iso(world["t0"] - 8000))
    assert ("beta", "9") in {(j["cluster"], j["job"]) for j in every["jobs"]}
    assert call(world, "list_jobs", cluster="beta")["jobs"] == []


# -- a user's signed claim ---------------------------------------------------------------------

def reads(world, name: str, scope: Scope, args: dict) -> dict | str:
    """A tool's answer, run as echod runs it but with no check of echod's before it: the
    claim it reads under alone decides what it sees."""
    try:
        return REGISTRY[name].run(tools_tests.context(world, scope), args)
    except ToolError as error:
        return f"{error.status} {error.code}"


@pytest.mark.parametrize("name", sorted(t.name for t in REGISTRY if t.name != "run_analysis"))
def test_every_tool_reads_a_users_own_jobs_whole_and_nobody_elses(world, name):
    """Every tool reads under the user's signed claim, and row-level security decides: about
    alice's job, alice's answer is what a token for the cluster reads; bob, asking about it
    with no check of echod's in the way, gets not found or nothing of it; asked about no
    job, each reads only their own jobs."""
    alice, bob = (Scope(frozenset({"alpha"}), user=user) for user in ("alice", "bob"))
    properties = REGISTRY[name].input_schema["properties"]
    about = {key: value for key, value in (("job", JOB), ("rank", 3)) if key in properties}
    if about:
        assert reads(world, name, alice, about) == reads(world, name, ALPHA, about)
        told = reads(world, name, bob, about)
        assert told == "404 not_found" or JOB not in json.dumps(told), told
    if not REGISTRY[name].input_schema.get("required"):
        for user, other in ((alice, "7002"), (bob, JOB)):
            assert other not in json.dumps(reads(world, name, user, {})), (user, name)


# -- list_nodes --------------------------------------------------------------------------------

def test_list_nodes_counts_each_verdict_once_per_cause_and_its_distinct_jobs(world):
    t0 = world["t0"]
    answer = call(world, "list_nodes")
    # every verdict on c-node1 once (v-late's newest revision, host_preemption); fleetd's note
    # on rank 1 (c-node0) is no verdict
    assert answer["nodes"] == [{"cluster": "alpha", "node": "c-node1", "verdicts": 3,
                                "jobs": [JOB], "causes": {"host_preemption": 1, "io": 1,
                                                          "slow_gpu": 1},
                                "last": iso(t0 + 55)}]
    hardware = call(world, "list_nodes", causes=["slow_gpu", "hang", "died"])["nodes"]
    assert [(n["node"], n["verdicts"], n["causes"]) for n in hardware] == [
        ("c-node1", 1, {"slow_gpu": 1})]
    # a verdict belongs to the window it was live in: v-old cleared at 20 s
    later = call(world, "list_nodes", since=iso(t0 + 30))["nodes"]
    assert later[0]["causes"] == {"host_preemption": 1, "io": 1}
    assert call(world, "list_nodes", cluster="beta")["nodes"] == []
    every = call(world, "list_nodes", EVERY)["nodes"]
    assert "beta" not in json.dumps(answer) and {n["cluster"] for n in every} == {"alpha"}


# -- job_timeline ------------------------------------------------------------------------------

def test_job_timeline_puts_every_node_on_fleetds_clock(world):
    t0 = world["t0"]
    answer = call(world, "job_timeline", job=JOB)
    assert answer["nodes"] == [{"node": "c-node0", "clock_offset_ms": 0.0},
                               {"node": "c-node1", "clock_offset_ms": 250.0}]
    assert answer["ranks"] == [{"rank": r, "node": node_of(r)} for r in range(RANKS)]
    slices = answer["slices"]
    assert answer["truncated"] is False
    # 100 collectives and 200 syncs per rank, one allocation, one copy; no host events and
    # nothing without a rank
    assert len(slices) == STEPS * RANKS * 3 + 2
    assert {s["kind"] for s in slices} == {"collective", "sync", "memcpy", "alloc"}
    assert [s["t"] for s in slices] == sorted(s["t"] for s in slices)
    # c-node1's times less its 250 ms: rank 3 enters collective 0 second, not last
    first = [s for s in slices if s["kind"] == "collective"][:RANKS]
    assert [s["rank"] for s in first] == [0, 3, 1, 2]
    for s in first:
        assert s["t"] == pytest.approx(t0 + entry_ms(s["rank"], 0) * MS, abs=2e-6)
        assert (s["op"], s["comm_hash"], s["seq"], s["bytes"]) == (
            "ncclAllReduce", COMM, 0, 4 * 2**20)
        assert (s["duration_ms"], s["peer_wait"]) == (0.025, None)
    [copy] = [s for s in slices if s["kind"] == "memcpy"]
    assert copy["t"] == pytest.approx(t0 + 0.6, abs=2e-6) and copy["node"] == "c-node1"
    syncs = [s for s in slices if s["kind"] == "sync" and s["rank"] == 3]
    assert {s["peer_wait"] for s in syncs} == {True, False}
    # the live one first, then the cleared ones, newest first
    assert [(v["rank"], v["kind"]) for v in answer["verdicts"]] == [
        (3, "persistent"), (2, "periodic"), (3, "slow_gpu")]


def test_fleetds_notes_are_kept_apart_from_its_verdicts(world):
    """Rank 1 was late on the host while its GPU queue ran ahead: fleetd's note on it is no
    verdict (no straggler, no cost, not counted), and job_report and find_stragglers show it
    as a note."""
    report = call(world, "job_report", job=JOB)
    assert [(n["rank"], n["kind"], n["severity"], n["cost_gpu_seconds"])
            for n in report["notes"]] == [(1, "ahead", "info", 0.0)]
    assert 1 not in {v["rank"] for v in report["verdicts"]}
    assert per_rank(report)[1]["note"] == "ahead" and per_rank(report)[1]["verdict"] is None
    found = call(world, "find_stragglers", job=JOB)
    assert [n["kind"] for n in found["notes"]] == ["ahead"]
    assert "ahead" not in {v["kind"] for v in found["verdicts"]}


def test_job_timeline_truncates_at_max_events_and_takes_a_window(world):
    t0 = world["t0"]
    cut = call(world, "job_timeline", job=JOB, max_events=10)
    assert cut["truncated"] is True and len(cut["slices"]) == 10
    assert cut["slices"][0]["t"] == pytest.approx(t0, abs=2e-6)
    window = call(world, "job_timeline", job=JOB, since=iso(t0 + 12), until=iso(t0 + 13))
    assert window["truncated"] is False
    assert {s["seq"] for s in window["slices"] if s["kind"] == "collective"} == {12}
    assert len(window["slices"]) == RANKS * 3
    assert [v["kind"] for v in window["verdicts"]] == ["periodic", "slow_gpu"]
    # no score in that second: each node's offset is the nearest one reported
    assert [n["clock_offset_ms"] for n in window["nodes"]] == [0.0, 250.0]
    assert min(s["t"] for s in window["slices"]) == pytest.approx(t0 + 12, abs=2e-6)
    exact = call(world, "job_timeline", job=JOB, max_events=STEPS * RANKS * 3 + 2)
    assert exact["truncated"] is False


def test_job_timeline_of_an_unknown_or_hidden_job_is_not_found(world):
    for args in ({"job": "no-such-job"}, {"job": "9"}, {"job": JOB, "cluster": "beta"}):
        error = refused(world, "job_timeline", **args)
        assert (error.status, error.code) == (404, "not_found"), args
    assert call(world, "job_timeline", EVERY, job="9")["cluster"] == "beta"


# -- a drifting clock --------------------------------------------------------------------------

DRIFT = 200e-6          # c-node1's clock gains 0.2 ms a second on fleetd's: 24 ms over the job
DRIFT_STEPS = 120


@pytest.fixture(scope="module")
def drifting(migrated_proc):
    """Job 6200: 120 collectives a second apart on two nodes, ranks 0.1 ms apart and none
    late. c-node1's clock drifts from fleetd's; fleetd's scores, one a second half a second
    after each collective (as the push that carried it), say by how much."""
    now = float(round(time.time()))
    t0 = now - 200
    b = Batch("alpha")
    for step in range(DRIFT_STEPS):
        for rank in range(RANKS):
            node = node_of(rank)
            b.event(node, t0 + step + rank * 1e-4 + (DRIFT * step if node == "c-node1" else 0),
                    "collective", "6200", rank, op="ncclAllReduce", comm_hash="d" * 16,
                    seq=step, bytes=2**20, duration_ns=20_000, world_size=RANKS)
        for node, offset in (("c-node0", 0.0), ("c-node1", DRIFT * (step + 0.5))):
            b.rows["scores"].append({"t": t0 + step + 0.5, "cluster": "alpha", "node": node,
                                     "job": "6200", "score": 0.9, "state": "active",
                                     "signals": {"cpu": 0.9}, "clock_offset": offset,
                                     "clock_uncertainty": 1e-4})
    url = url_of(migrated_proc).set(database="echod_clock_drift_tests")
    with DatabaseJanitor(user=migrated_proc.user, host=migrated_proc.host,
                         port=migrated_proc.port, password=migrated_proc.password,
                         dbname=url.database, template_dbname=migrated_proc.template_dbname):
        engine = make_engine(url)
        assert write_batch(engine, b.rows, now=now).rejected == []
        sandbox = Sandbox(sandbox_url(engine.url, ROLE, PASSWORD),
                          prepare(engine, ROLE, PASSWORD), timeout_ms=20_000, pool_size=2)
        yield {"t0": t0, "now": now, "sandbox": sandbox}
        sandbox.dispose()
        engine.dispose()


def test_a_drifting_clock_is_taken_off_as_it_was_at_each_time(drifting):
    """One offset for the whole job (the median, 12 ms) would leave c-node1's ranks 12 ms
    early at the start and 12 ms late at the end; its offset at each time leaves them as they
    were: within the 0.1 ms the clock drifts between a collective and its score."""
    report = call(drifting, "job_report", job="6200")
    assert report["coverage"]["source"] == "events"
    assert [r["rank"] for r in report["per_rank"]] == list(range(RANKS))
    for r in report["per_rank"]:
        assert abs(r["lag_median_ms"]) < 0.35 and r["lag_p99_ms"] < 0.35, r
    assert report["top_stragglers"] == []
    timeline = call(drifting, "job_timeline", job="6200")
    assert [n["clock_offset_ms"] for n in timeline["nodes"]] == [0.0, 12.0]
    for s in timeline["slices"]:
        assert s["t"] == pytest.approx(drifting["t0"] + s["seq"] + s["rank"] * 1e-4,
                                       abs=DRIFT * 0.5 + 2e-6), s


# -- the declarations --------------------------------------------------------------------------

def bounded_argument(schema: dict, where: str) -> None:
    """As test_echod_tools' ``bounded``, arrays too: at most so many bounded items."""
    if schema.get("type") == "array":
        assert schema.get("maxItems"), where
        bounded(schema["items"], where)
    else:
        bounded(schema, where)


def any_arguments(schema: dict):
    """Schema-valid arguments as test_echod_tools' ``arguments`` makes them, arrays too."""
    lists = {name: s for name, s in schema["properties"].items() if s.get("type") == "array"}
    scalars = {**schema, "properties": {name: s for name, s in schema["properties"].items()
                                        if name not in lists}}
    return st.tuples(arguments(scalars), st.fixed_dictionaries({}, optional={
        name: st.lists(strategy(s["items"]), max_size=3) for name, s in lists.items()})).map(
        lambda parts: {**parts[0], **parts[1]})


@pytest.mark.parametrize("name", CLI_TOOLS)
def test_the_cli_tools_are_declared_with_closed_bounded_schemas(name):
    tool = REGISTRY[name]
    Draft202012Validator.check_schema(tool.input_schema)
    Draft202012Validator.check_schema(tool.output_schema)
    assert tool.input_schema["additionalProperties"] is False
    for argument, schema in tool.input_schema["properties"].items():
        bounded_argument(schema, f"{name}.{argument}")
    assert len(tool.description) > 200 and tool.capability == "read"


@pytest.mark.parametrize("name", CLI_TOOLS)
def test_any_schema_valid_arguments_get_an_answer_or_a_tool_error(world, name, monkeypatch):
    """test_echod_tools' property test, over these tools and with arrays among the arguments."""
    monkeypatch.setattr(tools_tests, "arguments", any_arguments)
    tools_tests.test_any_schema_valid_arguments_get_an_answer_or_a_tool_error(world, name)
