"""echod's tools against a real PostgreSQL, read through the real SQL sandbox.

One database (tests/pg.py) holds two clusters. alpha runs job 4242: 8 ranks on 4 nodes (rank r
on a-node{r // 2}), 200 AllReduces each on one communicator, rank r entering 0.1·r ms after
rank 0 except rank 5, which enters 20 ms late every time while "ingero-hog" keeps preempting
it; with syncs, copies, allocations, health scores (a-node2 low on cpu) and thresholds. beta
runs job 777 (rank 2 late, preempted by "beta-hog"), job 778 (rank 1 late, a job fleetd
timed and named nobody in) and a job also numbered 4242. The tools
run as the sandbox role with the caller's clusters signed in, so tenancy is row-level
security's: an alpha caller must never see beta. Every answer is checked against the tool's
own output schema.
"""

from __future__ import annotations

import itertools
import json
import math
import secrets
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pytest_postgresql.janitor import DatabaseJanitor

from echod import tools
from ingero import analysis
from echod.store.db import make_engine
from echod.registry import REGISTRY, Scope, ToolContext, ToolError
from echod.sandbox import Sandbox, prepare, sandbox_url
from echod.tools.anomalies import anomaly, newest_first
from echod.store.writer import write_batch

from .pg import url_of

ROLE = "ingero_tools_test"          # roles are server-wide: this module's own
PASSWORD = secrets.token_urlsafe(24)
ALPHA = Scope(frozenset({"alpha"}))
EVERY = Scope(None)
BETA = Scope(frozenset({"beta"}))
FORMATS = Draft202012Validator.FORMAT_CHECKER

JOB, COMM = "4242", "c0ffee00c0ffee00"
RANKS, STEPS, STEP_S = 8, 200, 0.3
LATE_RANK, LATE_S = 5, 0.020
ALLREDUCE_BYTES = 64 * 2**20
GIB, MIB, KIB = 2**30, 2**20, 2**10


def node_of(rank: int) -> str:
    return f"a-node{rank // 2}"


def entry_offset(rank: int) -> float:
    """When a rank enters each collective, after the step starts."""
    return LATE_S if rank == LATE_RANK else 0.0001 * rank


def call_ns(rank: int, step: int) -> int:
    """The enqueue time of an AllReduce: alternating, so p50 and p95 differ."""
    return (20_000 if step % 2 == 0 else 30_000) + 1000 * rank


# -- the data ----------------------------------------------------------------------------------

class Batch:
    """Rows for write_batch, with node-namespaced event ids."""

    def __init__(self, cluster: str):
        self.cluster = cluster
        self.rows = {"events": [], "scores": [], "thresholds": []}
        self.seq: dict[str, int] = {}

    def event(self, node: str, t: float, kind: str, job: str | None, rank: int | None = None,
              /, **attrs) -> None:
        n = self.seq.get(node, 0)
        self.seq[node] = n + 1
        if rank is not None:
            attrs["rank"] = rank
        self.rows["events"].append({"id": f"{node}:boot-{node}:{n}", "t": t, "kind": kind,
                                    "node": node, "cluster": self.cluster, "job": job,
                                    "boot_id": f"boot-{node}", "attrs": attrs})

    def score(self, node: str, t: float, job: str, score: float, signals: dict,
              **clock) -> None:
        self.rows["scores"].append({"t": t, "cluster": self.cluster, "node": node, "job": job,
                                    "score": score, "state": "active", "signals": signals,
                                    **clock})

    def threshold(self, t: float, cohort: str, stragglers: list[str], panic: bool = False):
        self.rows["thresholds"].append({
            "t": t, "cluster": self.cluster, "cohort": cohort, "threshold": 0.8953,
            "median": 0.925, "mad": 0.01, "active": 4, "quorum_met": True, "panic": panic,
            "stragglers": stragglers})


def collectives(batch: Batch, job: str, comm: str, ranks: int, steps: int, t0: float,
                node, offset) -> None:
    for step in range(steps):
        for rank in range(ranks):
            batch.event(node(rank), t0 + step * STEP_S + offset(rank), "collective", job, rank,
                        op="ncclAllReduce", comm_hash=comm, seq=step, bytes=ALLREDUCE_BYTES,
                        duration_ns=call_ns(rank, step), comm_rank=rank, nranks=ranks,
                        count=ALLREDUCE_BYTES // 4, datatype="float32", redop="sum",
                        stream="0x7f00a000", in_group=False, pid=4000 + rank, tid=4000 + rank,
                        job=job, step=0, local_rank=rank % 2, world_size=ranks)


def alpha_rows(t0: float, now: float) -> dict:
    b = Batch("alpha")
    collectives(b, JOB, COMM, RANKS, STEPS, t0, node_of, entry_offset)
    for step in range(STEPS):
        t = t0 + step * STEP_S
        for rank in range(RANKS):
            slow = rank == 7 and step % 20 == 0
            b.event(node_of(rank), t + 0.1, "sync", JOB, rank, op="cudaStreamSynchronize",
                    duration_ns=80_000_000 if slow else 8_000_000, peer_wait=False, result=0)
            wait_ns = 500_000 if rank == LATE_RANK else int((LATE_S - 0.0001 * rank) * 1e9)
            b.event(node_of(rank), t + 0.03, "sync", JOB, rank, op="cudaStreamSynchronize",
                    duration_ns=wait_ns, peer_wait=True, comm_hash=COMM, seq=step, result=0)
    host_and_memory_rows(b, t0)
    health_rows(b, t0, now)
    return b.rows


def host_and_memory_rows(b: Batch, t0: float) -> None:
    for sample in range(20):
        b.event("a-node2", t0 + 2.5 + 5 * sample, "preempted", JOB, LATE_RANK,
                preemptor_pid=31337, preemptor_comm="ingero-hog", count=12)
    b.event("a-node2", t0 + 7.0, "preempted", JOB, 4, preemptor_pid=77,
            preemptor_comm="kworker/2:1", count=2)
    # its own threads taking turns on its CPU: not preemption, in no tool's count
    b.event("a-node2", t0 + 8.0, "preempted", JOB, LATE_RANK, preemptor_pid=31338,
            preemptor_comm="pt_autograd_0", count=500, preemptor_own=True)
    for sample in range(5):
        b.event("a-node0", t0 + 10 * sample, "blockio", JOB, 0, requests=3, bytes=12_288)
    b.event("a-node3", t0 + 60, "blockio", JOB, 6, requests=1500, bytes=200 * MIB)
    for rank in range(RANKS):
        for i in range(10):
            b.event(node_of(rank), t0 + 1 + i, "memcpy", JOB, rank, op="cudaMemcpy",
                    bytes=64 * MIB, duration_ns=10_000_000 if rank == 6 else 5_000_000,
                    direction="host_to_device")
        for i in range(5):
            b.event(node_of(rank), t0 + 20 + i, "memcpy", JOB, rank, op="cudaMemcpy",
                    bytes=MIB, duration_ns=100_000, direction="device_to_host")
    for i in range(5):
        b.event("a-node0", t0 + 30 + i, "alloc", JOB, 0, op="cudaMalloc", bytes=GIB,
                addr=f"{0x7f0000000000 + i * GIB:#x}", duration_ns=50_000, result=0)
    for i in range(3):
        b.event("a-node0", t0 + 40 + i, "free", JOB, 0, op="cudaFree", bytes=GIB,
                addr=f"{0x7f0000000000 + i * GIB:#x}", duration_ns=20_000, result=0)
    for i in range(10):
        b.event("a-node0", t0 + 30 + i, "alloc", JOB, 1, op="cudaMalloc", bytes=256 * KIB,
                addr=f"{0x7e0000000000 + i * MIB:#x}", duration_ns=10_000, result=0)
        b.event("a-node0", t0 + 31 + i, "free", JOB, 1, op="cudaFree", bytes=256 * KIB,
                addr=f"{0x7e0000000000 + i * MIB:#x}", duration_ns=5_000, result=0)
    b.event("a-node1", t0 + 30, "alloc", JOB, 2, op="cudaMalloc", bytes=80 * GIB, addr="0x0",
            duration_ns=90_000, result=2)
    for i in range(2):
        b.event("a-node1", t0 + 31 + i, "alloc", JOB, 2, op="cudaMalloc", bytes=4 * GIB,
                addr=f"{0x7d0000000000 + i * 4 * GIB:#x}", duration_ns=60_000, result=0)
    b.event("a-node2", t0 + 30, "straggler", JOB, score=0.62, threshold=0.895, mode="fleet")


SCORES = {"a-node0": (0.93, {"throughput": 0.95, "compute": 0.93, "memory": 0.9, "cpu": 0.96}),
          "a-node1": (0.94, {"throughput": 0.95, "compute": 0.94, "memory": 0.92, "cpu": 0.97}),
          "a-node2": (0.62, {"throughput": 0.9, "compute": 0.91, "memory": 0.9, "cpu": 0.55}),
          "a-node3": (0.92, {"throughput": 0.94, "compute": 0.9, "memory": 0.93, "cpu": 0.95})}


def health_rows(b: Batch, t0: float, now: float) -> None:
    t = t0
    while t < now - 5:
        for node, (score, signals) in SCORES.items():
            b.score(node, t, JOB, score, signals)
        if round(t - t0) % 10 == 0:
            b.threshold(t, f"job:{JOB}", ["a-node2"], panic=round(t - t0) == 50)
        t += 5


def beta_rows(t0: float, now: float) -> dict:
    b = Batch("beta")
    collectives(b, "777", "beef0000beef0000", 4, 50, t0, lambda r: f"b-node{r // 2}",
                lambda r: 0.050 if r == 2 else 0.0002 * r)
    collectives(b, JOB, "beef1111beef1111", 2, 20, t0, lambda r: "b-node0", lambda r: 0.0001 * r)
    for sample in range(10):
        b.event("b-node1", t0 + 5 * sample, "preempted", "777", 2, preemptor_pid=4444,
                preemptor_comm="beta-hog", count=40)
        # its node's ranks crowd each other (another process of job 777) and a program of the
        # node takes both alike: neither is what makes rank 2 late
        for rank, other in ((2, 3), (3, 2)):
            b.event("b-node1", t0 + 5 * sample + 1, "preempted", "777", rank,
                    preemptor_pid=5000 + other, preemptor_comm="ingero-sim-rank", count=100,
                    preemptor_job="777")
            b.event("b-node1", t0 + 5 * sample + 2, "preempted", "777", rank,
                    preemptor_pid=6000, preemptor_comm="python3", count=30)
    b.event("b-node1", t0 + 12, "blockio", "777", 2, requests=5000, bytes=900 * MIB)
    b.event("b-node0", t0 + 5, "alloc", "777", 0, op="cudaMalloc", bytes=3 * GIB, result=0)
    b.event("b-node0", t0 + 6, "memcpy", "777", 0, op="cudaMemcpy", bytes=MIB,
            duration_ns=1000, direction="host_to_device")
    b.event("b-node1", t0 + 9, "straggler", "777", score=0.2, threshold=0.8, mode="fleet")
    # job 778: rank 1 as late, but fleetd had its pushes (it timed its node) and named nobody
    collectives(b, "778", "beef2222beef2222", 4, 50, t0, lambda r: "b-node2",
                lambda r: 0.050 if r == 1 else 0.0002 * r)
    b.score("b-node2", t0 + 1, "778", 0.95, {"cpu": 0.95}, clock_offset=0.0002,
            clock_uncertainty=0.0001)
    # job 779: the same, on a node whose agent serves every job there (no --job): its scores
    # carry no job
    collectives(b, "779", "beef3333beef3333", 4, 50, t0, lambda r: "b-node3",
                lambda r: 0.050 if r == 1 else 0.0002 * r)
    b.score("b-node3", t0 + 1, None, 0.95, {"cpu": 0.95}, clock_offset=0.0002,
            clock_uncertainty=0.0001)
    t = t0
    while t < now - 5:
        b.score("b-node0", t, "777", 0.95, {"cpu": 0.95, "compute": 0.9})
        b.score("b-node1", t, "777", 0.3, {"cpu": 0.2, "compute": 0.9})
        b.threshold(t, "job:777", ["b-node1"], panic=True)
        t += 10
    return b.rows


@pytest.fixture(scope="module")
def world(migrated_proc):
    """One migrated database with both clusters' rows, shared: the tools only read."""
    now = float(round(time.time()))
    t0 = now - 300
    url = url_of(migrated_proc).set(database="echod_tools_tests")
    with DatabaseJanitor(user=migrated_proc.user, host=migrated_proc.host,
                         port=migrated_proc.port, password=migrated_proc.password,
                         dbname=url.database, template_dbname=migrated_proc.template_dbname):
        engine = make_engine(url)
        for rows in (alpha_rows(t0, now), beta_rows(t0, now)):
            result = write_batch(engine, rows, now=now)
            assert result.rejected == []
        key = prepare(engine, ROLE, PASSWORD)
        sandbox = Sandbox(sandbox_url(engine.url, ROLE, PASSWORD), key, timeout_ms=20_000,
                          pool_size=2)
        yield {"t0": t0, "now": now, "sandbox": sandbox}
        sandbox.dispose()
        engine.dispose()


def context(world, scope: Scope = ALPHA) -> ToolContext:
    return ToolContext(world["sandbox"], scope, world["now"])


def call(world, name: str, scope: Scope = ALPHA, **args) -> dict:
    """Run a tool with arguments its input schema accepts, formats included, and check its
    answer against its own output schema."""
    Draft202012Validator(REGISTRY[name].input_schema, format_checker=FORMATS).validate(args)
    return answer_of(world, name, scope, **args)


def answer_of(world, name: str, scope: Scope = ALPHA, **args) -> dict:
    """Run a tool as the API does (it checks the schema but not formats) and check its answer
    against its own output schema."""
    tool = REGISTRY[name]
    Draft202012Validator(tool.input_schema).validate(args)
    answer = tool.run(context(world, scope), args)
    Draft202012Validator(tool.output_schema, format_checker=FORMATS).validate(answer)
    json.dumps(answer, allow_nan=False)
    return answer


def refused(world, name: str, scope: Scope = ALPHA, **args) -> ToolError:
    with pytest.raises(ToolError) as caught:
        REGISTRY[name].run(context(world, scope), args)
    return caught.value


# -- the declarations --------------------------------------------------------------------------

EXPECTED_TOOLS = {"cluster_summary", "event_history", "find_stragglers", "find_outlier_nodes",
                  "anomalies", "collective_stats", "memcpy_bandwidth", "memory_hotspots",
                  "explain", "job_report", "get_cost", "run_analysis"}


def bounded(schema: dict, where: str) -> None:
    """Every argument is bounded: strings by length, numbers by range, or an enum (a
    boolean is one of two)."""
    if "enum" in schema or schema.get("type") == "boolean":
        return
    kind = schema.get("type")
    if kind == "string":
        assert schema.get("maxLength"), where
    elif kind in ("integer", "number"):
        assert "maximum" in schema and ("minimum" in schema or "exclusiveMinimum" in schema), where
    else:
        raise AssertionError(f"{where}: unexpected argument type {kind}")


def test_every_tool_is_declared_once_with_valid_closed_bounded_schemas():
    assert {tool.name for tool in REGISTRY} >= EXPECTED_TOOLS
    for tool in REGISTRY:
        if tool.name not in EXPECTED_TOOLS:
            continue
        Draft202012Validator.check_schema(tool.input_schema)
        Draft202012Validator.check_schema(tool.output_schema)
        assert tool.input_schema["type"] == "object"
        assert tool.input_schema["additionalProperties"] is False
        for name, schema in tool.input_schema["properties"].items():
            bounded(schema, f"{tool.name}.{name}")
        assert len(tool.description) > 200 and tool.summary
        assert tool.capability == ("sql" if tool.name == "run_analysis" else "read")
    for name in ("event_history", "find_stragglers", "explain", "get_cost"):
        assert REGISTRY[name].input_schema["properties"]["since"]["format"] == "date-time"


# -- straggler, explain, cost, report ----------------------------------------------------------

def test_find_stragglers_ranks_the_late_rank_first_with_its_host_evidence(world):
    answer = call(world, "find_stragglers", job=JOB)
    ranks = answer["ranks"]
    assert [r["rank"] for r in ranks][0] == LATE_RANK
    assert [r["rank"] for r in ranks if r["straggler"]] == [LATE_RANK]
    late = ranks[0]
    assert late["node"] == "a-node2" and late["samples"] == STEPS
    # 20 ms after the step starts; its peers' median entry is rank 3's, 0.3 ms in
    assert late["lag_median_ms"] == pytest.approx(19.7, abs=0.002)
    assert late["lag_max_ms"] == pytest.approx(19.7, abs=0.002)
    assert late["last_arrivals"] == STEPS and late["last_share"] == 1.0
    evidence = late["evidence"]
    assert evidence["preemptions"] == 20 * 12
    assert evidence["top_preemptor"] == "ingero-hog"
    assert evidence["lowest_signal"] == "cpu" and evidence["lowest_signal_value"] == 0.55
    assert evidence["score_min"] == 0.62 and evidence["threshold_listings"] >= 10
    others = {r["rank"]: r for r in ranks[1:]}
    assert sorted(others) == [0, 1, 2, 3, 4, 6, 7]
    # each against the median of the seven others (the late rank among them)
    healthy = {0: -0.4, 1: -0.3, 2: -0.2, 3: -0.1, 4: 0.1, 6: 0.3, 7: 0.4}
    for rank, r in others.items():
        assert r["lag_median_ms"] == pytest.approx(healthy[rank], abs=0.002)
        assert r["last_arrivals"] == 0 and r["idle_caused_gpu_s"] == 0
    assert others[0]["evidence"]["blockio_requests"] == 15
    assert others[4]["evidence"]["top_preemptor"] == "kworker/2:1"
    # median of the per-rank medians 0 ms, MAD 0.3 ms; the bar is fleetd's: 3·1.4826·MAD
    # (floored at 1 ms) is 4.4 ms, under 5% of the 300 ms between collectives
    [job] = answer["jobs"]
    assert job == {"cluster": "alpha", "job": JOB, "ranks": RANKS,
                   "lag_median_ms": pytest.approx(0.0, abs=1e-3),
                   "lag_mad_ms": pytest.approx(0.3, abs=1e-3),
                   "bar_ms": pytest.approx(0.05 * STEP_S * 1000, abs=1e-3), "stragglers": 1,
                   "judged_by": "events"}      # fleetd wrote nothing on it: the events' word
    assert answer["coverage"] == {"communicators": 1, "instances_total": STEPS,
                                  "instances_examined": STEPS, "stride": 1,
                                  "entries_examined": STEPS * RANKS, "source": "events"}


def test_a_job_fleetd_timed_has_no_straggler_fleetd_did_not_name(world):
    """Job 778's rank 1 enters 50 ms late by its stored events, and fleetd had the job's
    pushes (it stored a score of the job with its node's clock offset) but named nobody, as
    in a job's first seconds, before its first lag summaries: every tool says what fleetd
    said, nobody is a straggler. So too for job 779, whose node's agent serves all its jobs
    and scores the node, not the job (a poll in a job's first second called ranks stragglers
    fleetd had not named yet). Job 777, whose events came without fleetd, keeps the
    events' word."""
    for timed in ("778", "779"):     # its agent run with --job, or serving the whole node
        answer = call(world, "find_stragglers", BETA, job=timed)
        [job] = answer["jobs"]
        assert job["judged_by"] == "fleetd", timed
        late = {r["rank"]: r for r in answer["ranks"]}[1]
        assert late["over_bar"] and not late["straggler"], timed
        assert call(world, "explain", BETA, job=timed, rank=1)["cause"] == "none"
    other = call(world, "find_stragglers", BETA, job="777")
    assert [j["judged_by"] for j in other["jobs"]] == ["events"]
    assert [r["rank"] for r in other["ranks"] if r["straggler"]] == [2]


def test_find_stragglers_samples_every_kth_collective_past_max_entries(world):
    answer = call(world, "find_stragglers", job=JOB, max_entries=1000)
    assert answer["coverage"]["stride"] == 2
    assert answer["coverage"]["instances_examined"] == STEPS // 2
    assert answer["ranks"][0]["rank"] == LATE_RANK and answer["ranks"][0]["straggler"]
    assert answer["ranks"][0]["samples"] == STEPS // 2


def test_find_stragglers_in_a_window_and_with_limit(world):
    t0 = world["t0"]
    since, until = iso(t0 + 10), iso(t0 + 20)
    answer = call(world, "find_stragglers", job=JOB, since=since, until=until, limit=2)
    assert len(answer["ranks"]) == 2 and answer["ranks"][0]["rank"] == LATE_RANK
    assert answer["coverage"]["instances_examined"] == round(10 / STEP_S)
    assert answer["window"] == {"since": since, "until": until}
    # without a job: the last hour, every job of the clusters the caller sees
    recent = call(world, "find_stragglers")
    assert {(j["cluster"], j["job"]) for j in recent["jobs"]} == {("alpha", JOB)}


def test_explain_names_host_preemption_by_the_hog_and_acquits_a_punctual_rank(world):
    late = call(world, "explain", job=JOB, rank=LATE_RANK)
    assert (late["cause"], late["confidence"]) == ("host_preemption", "high")
    assert "ingero-hog" in late["fix"] and "taskset" in late["fix"]
    evidence = late["evidence"]
    assert evidence["preemptions"] == {"total": 240,
                                       "by": [{"comm": "ingero-hog", "count": 240}]}
    assert evidence["lag"]["straggler"]
    assert evidence["lag"]["lag_median_ms"] == pytest.approx(19.7, abs=0.002)
    assert evidence["lag"]["peers_lag_median_ms"] == pytest.approx(-0.1, abs=0.002)
    assert evidence["health"]["lowest_signal"] == "cpu"
    sync = evidence["sync"]
    assert sync["self_work_ms_avg"] == 8.0 and sync["peer_wait_ms_avg"] == 0.5
    assert sync["peers_peer_wait_ms_median"] == pytest.approx(19.7, abs=0.01)
    assert any("ingero-hog" in line for line in late["findings"])
    punctual = call(world, "explain", job=JOB, rank=0)
    assert (punctual["cause"], punctual["fix"]) == ("none", None)
    assert punctual["evidence"]["lag"]["straggler"] is False


def idle_per_collective() -> float:
    """Every rank but the late one waits for it: Σ (t_late − t_rank)."""
    return sum(LATE_S - entry_offset(r) for r in range(RANKS) if r != LATE_RANK)


def test_get_cost_attributes_the_idle_time_to_the_late_rank(world):
    expected = STEPS * idle_per_collective()                # 200 × 0.1377 s
    answer = call(world, "get_cost", job=JOB, gpu="H100-80GB", provider="ec2")
    assert answer["gpu_seconds_idle"] == pytest.approx(expected, abs=1e-3)
    assert answer["usd_per_gpu_hour"] == 12.29 and answer["rate_source"] == "table:H100-80GB/ec2"
    assert answer["usd"] == pytest.approx(expected / 3600 * 12.29, abs=1e-5)
    assert answer["estimated"] is False
    [culprit] = answer["by_rank"]
    assert (culprit["rank"], culprit["node"], culprit["last_arrivals"]) == (LATE_RANK, "a-node2",
                                                                            STEPS)
    assert culprit["gpu_seconds"] == pytest.approx(expected, abs=1e-3) and culprit["share"] == 1
    explicit = call(world, "get_cost", job=JOB, usd_per_gpu_hour=3600.0)
    assert explicit["usd"] == pytest.approx(expected, abs=0.01)
    assert explicit["rate_source"] == "explicit"
    unpriced = call(world, "get_cost", job=JOB, gpu="A100-80GB", provider="gcp")
    assert unpriced["usd"] is None and unpriced["usd_per_gpu_hour"] is None
    assert unpriced["gpu_seconds_idle"] == answer["gpu_seconds_idle"]


def test_job_report_agrees_with_find_stragglers_and_get_cost(world):
    report = call(world, "job_report", job=JOB)
    stragglers = call(world, "find_stragglers", job=JOB)
    cost = call(world, "get_cost", job=JOB)
    assert (report["cluster"], report["ranks"], report["collectives"]) == (
        "alpha", RANKS, RANKS * STEPS)
    assert report["nodes"] == ["a-node0", "a-node1", "a-node2", "a-node3"]
    assert report["first_event"] == iso(world["t0"])
    # collectives, two syncs each, preemptions (one by its own threads), block I/O, copies,
    # allocations, one edge
    assert (report["events"], report["events_capped"]) == (1600 + 3200 + 22 + 6 + 120 + 31 + 1,
                                                           False)
    by_rank = {r["rank"]: r for r in stragglers["ranks"]}
    for line in report["per_rank"]:
        assert line["collectives"] == STEPS
        assert line["lag_median_ms"] == by_rank[line["rank"]]["lag_median_ms"]
        assert line["straggler"] == by_rank[line["rank"]]["straggler"]
        assert line["node"] == node_of(line["rank"])
    assert report["per_rank"][LATE_RANK]["score_avg"] == 0.62
    assert [r["rank"] for r in report["top_stragglers"]] == [LATE_RANK]
    assert report["top_stragglers"][0] == by_rank[LATE_RANK]
    assert report["cost"] == {k: cost[k] for k in report["cost"]}


# -- the other tools ---------------------------------------------------------------------------

def test_collective_stats_match_the_seeded_calls(world):
    answer = call(world, "collective_stats", job=JOB, op="ncclAllReduce")
    rows = {r["rank"]: r for r in answer["collectives"]}
    assert sorted(rows) == list(range(RANKS))
    for rank, r in rows.items():
        total_ns = sum(call_ns(rank, step) for step in range(STEPS))
        assert (r["op"], r["comm_hash"], r["calls"]) == ("ncclAllReduce", COMM, STEPS)
        assert r["bytes"] == STEPS * ALLREDUCE_BYTES
        assert r["call_p50_us"] == 25 + rank and r["call_p95_us"] == 30 + rank
        assert r["enqueue_bandwidth_gbps"] == pytest.approx(STEPS * ALLREDUCE_BYTES / total_ns,
                                                            rel=1e-5)
        assert r["interval_median_ms"] == pytest.approx(STEP_S * 1000, abs=0.002)
    assert answer["coverage"] == {"communicators": 1, "instances_total": STEPS,
                                  "instances_examined": STEPS, "stride": 1,
                                  "entries_examined": STEPS * RANKS, "source": "summaries"}
    # every call is counted from the summaries: a cap on entries read changes nothing
    assert call(world, "collective_stats", job=JOB, op="ncclAllReduce",
                max_entries=1000) == answer
    one = call(world, "collective_stats", job=JOB, rank=3, comm_hash=COMM)
    assert [r["rank"] for r in one["collectives"]] == [3]
    assert call(world, "collective_stats", job=JOB, op="ncclAllGather")["collectives"] == []


def test_memcpy_bandwidth_per_node_rank_and_direction(world):
    answer = call(world, "memcpy_bandwidth", job=JOB, direction="host_to_device")
    rows = {r["rank"]: r for r in answer["copies"]}
    assert sorted(rows) == list(range(RANKS))
    assert rows[0] == {"cluster": "alpha", "node": "a-node0", "rank": 0,
                       "direction": "host_to_device", "copies": 10, "bytes": 640 * MIB,
                       "gbps_median": pytest.approx(64 * MIB / 5e6, abs=1e-3),
                       "gbps_aggregate": pytest.approx(64 * MIB / 5e6, abs=1e-3)}
    assert rows[6]["gbps_median"] == pytest.approx(64 * MIB / 10e6, abs=1e-3)
    both = call(world, "memcpy_bandwidth", job=JOB, node="a-node1")
    assert {(r["rank"], r["direction"]) for r in both["copies"]} == {
        (2, "host_to_device"), (3, "host_to_device"), (2, "device_to_host"),
        (3, "device_to_host")}


def test_memory_hotspots_outstanding_is_allocated_minus_freed(world):
    answer = call(world, "memory_hotspots", job=JOB)
    rows = {r["rank"]: r for r in answer["ranks"]}
    assert [r["rank"] for r in answer["ranks"]] == [2, 0, 1]
    assert rows[0]["bytes_outstanding"] == 5 * GIB - 3 * GIB
    assert (rows[0]["allocations"], rows[0]["frees"], rows[0]["largest_allocation"]) == (5, 3, GIB)
    assert rows[1]["bytes_outstanding"] == 0 and rows[1]["small_allocation_share"] == 1.0
    assert rows[2]["failed_allocations"] == 1 and rows[2]["bytes_outstanding"] == 8 * GIB
    for r in answer["ranks"]:
        assert r["bytes_outstanding"] == r["bytes_allocated"] - r["bytes_freed"]
    assert len(call(world, "memory_hotspots", job=JOB, limit=1)["ranks"]) == 1


def test_find_outlier_nodes_names_the_contended_node(world):
    answer = call(world, "find_outlier_nodes", job=JOB)
    [outlier] = answer["outliers"]
    assert (outlier["node"], outlier["lowest_signal"], outlier["score_median"]) == (
        "a-node2", "cpu", 0.62)
    [cohort] = answer["cohorts"]
    assert cohort["nodes"] == 4 and cohort["median"] == pytest.approx(0.925)
    assert cohort["bar"] == pytest.approx(0.925 - 2 * 1.4826 * 0.01, abs=1e-6)


def test_event_history_filters_newest_first_and_limits(world):
    answer = call(world, "event_history", job=JOB, kind="preempted", rank=LATE_RANK, limit=5)
    events = answer["events"]
    assert len(events) == 5 and answer["truncated"] is True
    assert [e["t"] for e in events] == sorted((e["t"] for e in events), reverse=True)
    assert all(e["attrs"]["preemptor_comm"] == "ingero-hog" and e["node"] == "a-node2"
               for e in events)
    assert events[0]["t"] == iso(world["t0"] + 2.5 + 5 * 19)
    allocs = call(world, "event_history", job=JOB, node="a-node1", op="cudaMalloc")
    assert len(allocs["events"]) == 3 and not allocs["truncated"]
    assert {e["bytes"] for e in allocs["events"]} == {80 * GIB, 4 * GIB}
    collective = call(world, "event_history", job=JOB, kind="collective", limit=1)["events"][0]
    assert (collective["seq"], collective["comm_hash"], collective["rank"]) == (
        STEPS - 1, COMM, LATE_RANK)
    assert collective["attrs"]["datatype"] == "float32"
    quiet = call(world, "event_history", node="a-node2",
                 since=iso(world["t0"] - 3600), until=iso(world["t0"]))
    assert quiet["events"] == []


def test_anomalies_include_the_preemption_burst_and_the_rest(world):
    answer = call(world, "anomalies", job=JOB)
    found = answer["anomalies"]
    kinds = {a["type"] for a in found}
    assert kinds == {"preemption_burst", "heavy_blockio", "failed_call", "straggler", "panic",
                     "slow_calls"}
    bursts = [a for a in found if a["type"] == "preemption_burst"]
    assert len(bursts) == 20
    assert all(a["detail"]["preemptor_comm"] == "ingero-hog" and a["rank"] == LATE_RANK
               for a in bursts)
    [slow] = [a for a in found if a["type"] == "slow_calls"]
    assert (slow["rank"], slow["detail"]["op"]) == (7, "cudaStreamSynchronize")
    [failed] = [a for a in found if a["type"] == "failed_call"]
    assert (failed["rank"], failed["detail"]["result"]) == (2, 2)
    assert [a["t"] for a in found] == sorted((a["t"] for a in found), reverse=True)
    assert len(call(world, "anomalies", job=JOB, limit=3)["anomalies"]) == 3
    on_node = call(world, "anomalies", node="a-node3")["anomalies"]
    assert sorted(a["type"] for a in on_node) == ["heavy_blockio", "slow_calls"]


def test_anomalies_of_one_time_come_in_one_order_however_the_store_returns_them():
    """A sample reports every rank of a node, and each process that preempted one, at one
    time: the answer orders those by what they say, not as the rows happened to come
    (retention rewrites a day's events, and what it answers before must equal what after)."""
    t = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
    made = [anomaly(kind, t + timedelta(seconds=s), "alpha", node, JOB, rank, kind, pid=pid)
            for kind, s, node, rank, pid in [("preemption_burst", 0, "a-node2", 1, 7),
                                             ("preemption_burst", 0, "a-node1", 3, 7),
                                             ("heavy_blockio", 0, "a-node2", 0, None),
                                             ("preemption_burst", 0, "a-node2", 1, 5),
                                             ("straggler", 1, "a-node1", None, None)]]
    answers = set()
    for order in itertools.permutations(made):
        found = list(order)
        newest_first(found)
        answers.add(tuple((a["type"], a["node"], a["rank"], a["detail"]["pid"]) for a in found))
    assert answers == {(("straggler", "a-node1", None, None), ("heavy_blockio", "a-node2", 0, None),
                        ("preemption_burst", "a-node1", 3, 7),
                        ("preemption_burst", "a-node2", 1, 5),
                        ("preemption_burst", "a-node2", 1, 7))}


def test_cluster_summary_shows_the_cohort_and_the_node_under_its_bar(world):
    [alpha] = call(world, "cluster_summary")["clusters"]
    assert alpha["cluster"] == "alpha"
    assert (alpha["nodes_known"], alpha["nodes_reporting"]) == (4, 4)
    assert alpha["jobs_recent"] == [JOB]
    [cohort] = alpha["cohorts"]
    assert cohort["cohort"] == f"job:{JOB}" and cohort["stragglers"] == ["a-node2"]
    assert [n["node"] for n in alpha["under_bar"]] == ["a-node2"]
    assert alpha["under_bar"][0]["score"] == 0.62


def test_run_analysis_answers_through_the_sandbox_and_refuses_writes(world):
    answer = call(world, "run_analysis",
                  sql="SELECT cluster, count(*) FROM nodes GROUP BY 1 ORDER BY 1", row_cap=10)
    assert answer["columns"] == ["cluster", "count"] and answer["rows"] == [["alpha", 4]]
    assert answer["truncated"] is False and answer["elapsed_ms"] >= 0
    error = refused(world, "run_analysis", sql="DELETE FROM events")
    assert error.status == 400 and error.code == "sql_refused"


# -- tenancy -----------------------------------------------------------------------------------

BROAD_CALLS = [("cluster_summary", {}), ("event_history", {"limit": 10_000}),
               ("find_stragglers", {}), ("find_outlier_nodes", {}), ("anomalies", {}),
               ("collective_stats", {}), ("memcpy_bandwidth", {}), ("memory_hotspots", {}),
               ("get_cost", {}), ("explain", {"job": JOB, "rank": 2}),
               ("job_report", {"job": JOB}),
               ("run_analysis", {"sql": "SELECT DISTINCT cluster, node FROM events"})]


@pytest.mark.parametrize("name,args", BROAD_CALLS, ids=[c[0] for c in BROAD_CALLS])
def test_an_alpha_caller_never_sees_beta(world, name, args):
    answer = json.dumps(call(world, name, **args))
    for trace in ("beta", "b-node", "beta-hog", "beef"):
        assert trace not in answer
    assert "alpha" in answer


def test_preemption_by_the_job_s_own_ranks_or_as_much_as_its_node_peers_is_no_cause(world):
    """Job 777's rank 2 is preempted 1,000 times by another rank of its job, 300 by python3
    and 400 by beta-hog; rank 3, beside it, as often by the job's rank and by python3 and
    never by beta-hog. Ranks crowding their node are the job's own doing, counted nowhere;
    python3 took both alike; beta-hog is what took rank 2 more than its node's peers."""
    said = call(world, "explain", BETA, job="777", rank=2)
    assert said["cause"] == "host_preemption", said
    assert said["evidence"]["preemptions"] == {
        "total": 700, "by": [{"comm": "beta-hog", "count": 400},
                             {"comm": "python3", "count": 300}]}
    assert "mostly beta-hog" in " ".join(said["findings"]) and "beta-hog" in said["fix"]


def test_beta_jobs_are_not_found_for_an_alpha_caller(world):
    for name, args in [("explain", {"job": "777", "rank": 2}), ("job_report", {"job": "777"}),
                       ("explain", {"job": "777", "rank": 2, "cluster": "beta"})]:
        error = refused(world, name, **args)
        assert (error.status, error.code) == (404, "not_found")
    assert call(world, "find_stragglers", job="777")["ranks"] == []
    assert call(world, "get_cost", job="777")["gpu_seconds_idle"] == 0


def test_a_caller_of_every_cluster_sees_both_and_must_name_a_shared_job_cluster(world):
    beta = call(world, "find_stragglers", EVERY, job="777")
    assert beta["ranks"][0]["rank"] == 2 and beta["ranks"][0]["straggler"]
    assert beta["ranks"][0]["evidence"]["top_preemptor"] == "beta-hog"
    error = refused(world, "explain", EVERY, job=JOB, rank=LATE_RANK)
    assert (error.status, error.code) == (400, "ambiguous")
    named = call(world, "explain", EVERY, job=JOB, rank=LATE_RANK, cluster="alpha")
    assert named["cause"] == "host_preemption"


# -- bad arguments -----------------------------------------------------------------------------

WINDOWED = [tool.name for tool in REGISTRY if "since" in tool.input_schema["properties"]]


@pytest.mark.parametrize("name", WINDOWED)
def test_a_window_that_ends_before_it_starts_is_refused(world, name):
    required = next(t for t in REGISTRY if t.name == name).input_schema.get("required", [])
    args = {key: value for key, value in {"job": JOB, "rank": 0}.items() if key in required}
    error = refused(world, name, since="2026-01-02T00:00:00Z", until="2026-01-01T00:00:00Z",
                    **args)
    assert (error.status, error.code) == (400, "bad_request")
    assert "after" in str(error)


@pytest.mark.parametrize("bad", ["yesterday", "2026-02-30T00:00:00Z", "2026-01-01T25:00:00Z",
                                 "2026-01-01T00:00:00+24:00", "2026-01-01", "٢٠٢٦-01-01T00:00:00Z"])
def test_times_that_are_no_date_time_are_refused(world, bad):
    error = refused(world, "event_history", since=bad)
    assert error.status == 400 and "since" in str(error)


def test_odd_but_valid_times_are_answered(world):
    for since in ("2016-12-31T23:59:60Z", "0000-01-01T00:00:00Z", "0001-01-01T00:00:00+01:00",
                  "2026-11-21t10:00:00.123456789z", "2026-11-21T10:00:00"):
        assert len(answer_of(world, "event_history", since=since, limit=1)["events"]) == 1
    assert answer_of(world, "event_history", until="0001-01-01T00:00:00-23:59")["events"] == []


def test_unknown_jobs_and_ranks_are_not_found(world):
    for name, args in [("explain", {"job": "no-such-job", "rank": 0}),
                       ("explain", {"job": JOB, "rank": 99}),
                       ("job_report", {"job": "no-such-job"}),
                       ("explain", {"job": "42\x00", "rank": 0})]:
        error = refused(world, name, **args)
        assert (error.status, error.code) == (404, "not_found"), args


def test_strings_postgresql_cannot_hold_match_nothing(world):
    for text in ("a\x00b", "lone \ud800 surrogate"):
        assert call(world, "event_history", job=text)["events"] == []
        assert call(world, "find_stragglers", cluster=text, job=text)["ranks"] == []
        assert call(world, "anomalies", node=text)["anomalies"] == []


# -- any schema-valid arguments ----------------------------------------------------------------

TIMES = st.one_of(
    st.datetimes(timezones=st.just(None)).map(lambda t: t.isoformat() + "Z"),
    st.sampled_from(["2016-12-31T23:59:60Z", "0000-01-01T00:00:00Z", "9999-12-31T23:59:59Z",
                     "2026-11-21T10:00:00+14:00", "not a time", ""]))


def strategy(schema: dict):
    """Values a client may send for one argument schema (schemathesis' kind of inputs)."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if schema.get("type") == "boolean":
        return st.booleans()
    if schema.get("format") == "date-time":
        return TIMES
    if schema["type"] == "string":
        return st.text(min_size=schema.get("minLength", 0), max_size=schema["maxLength"])
    if schema["type"] == "integer":
        return st.integers(schema["minimum"], schema["maximum"])
    return st.floats(schema.get("minimum", 0), schema["maximum"],
                     exclude_min="exclusiveMinimum" in schema).filter(lambda x: x > 0)


def arguments(schema: dict):
    properties = {name: strategy(s) for name, s in schema["properties"].items()
                  if name not in ("sql", "max_entries")}
    required = {name: properties.pop(name) for name in schema.get("required", ())}
    return st.fixed_dictionaries(required, optional=properties)


READERS = sorted(EXPECTED_TOOLS - {"run_analysis"})


@pytest.mark.parametrize("name", READERS)
def test_any_schema_valid_arguments_get_an_answer_or_a_tool_error(world, name):
    tool = REGISTRY[name]
    output = Draft202012Validator(tool.output_schema, format_checker=FORMATS)

    @settings(max_examples=12, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture,
                                     HealthCheck.too_slow])
    @given(arguments(tool.input_schema))
    def answers(args):
        try:
            answer = tool.run(context(world, EVERY), args)
        except ToolError as error:
            assert error.status in (400, 404)
            return
        output.validate(answer)
        json.dumps(answer, allow_nan=False)

    answers()


# -- pure parts --------------------------------------------------------------------------------

def test_entry_lags_from_arrays():
    # two instances of communicator 0 and one of communicator 1 (one rank only: dropped);
    # rank 2 is last at both; each lag is against the median of the other two ranks
    comm = np.array([0, 0, 0, 0, 0, 0, 1])
    seq = np.array([7, 7, 7, 8, 8, 8, 7])
    rank = np.array([0, 1, 2, 0, 1, 2, 0])
    t = np.array([100, 101, 103, 200, 204, 205, 150])
    stats = analysis.entry_lags(comm, seq, rank, t)
    assert stats.instances == 2
    assert stats.rank.tolist() == [0, 1, 2] and stats.samples.tolist() == [2, 2, 2]
    # seq 7: 100 - 102, 101 - 101.5, 103 - 100.5; seq 8: 200 - 204.5, 204 - 202.5, 205 - 202
    assert stats.lag_p50.tolist() == [-3.25, 0.5, 2.75]
    assert stats.lag_max.tolist() == [-2, 1.5, 3]
    assert stats.last_arrivals.tolist() == [0, 0, 2]
    assert stats.idle_caused.tolist() == [0, 0, (3 + 2) + (5 + 1)]
    assert stats.waited.tolist() == [3 + 5, 2 + 1, 0]
    assert analysis.entry_lags(np.array([0]), np.array([1]), np.array([0]), np.array([5])) is None


def test_segment_quantile_interpolates_as_percentile_cont():
    values = np.array([1.0, 2.0, 3.0, 4.0, 10.0, 20.0])
    starts, sizes = np.array([0, 4]), np.array([4, 2])
    for q in (0.5, 0.95):
        expected = [np.quantile(values[:4], q), np.quantile(values[4:], q)]
        assert analysis.segment_quantile(values, starts, sizes, q).tolist() == pytest.approx(expected)


def test_parse_time():
    assert tools.parse_time("since", "2026-11-21T10:00:00+02:00") == tools.parse_time(
        "since", "2026-11-21T08:00:00Z")
    leap = tools.parse_time("since", "2016-12-31T23:59:60Z")
    assert (leap.second, leap.microsecond) == (59, 999_999)
    assert tools.parse_time("since", "0001-01-01T00:00:00+01:00") == tools.EARLIEST
    assert tools.parse_time("since", "9999-12-31T23:59:59-05:00") == tools.LATEST
    with pytest.raises(ToolError):
        tools.parse_time("since", "2026-11-21")


def late_rank_facts(**changes) -> tools.Facts:
    lag = tools.RankLag("c", "j", 5, "n5", 100, 0.02, 0.03, 0.04, 90, 10.0, 0.0, True)
    facts = tools.Facts(lag, analysis.Bar(0.001, 0.0002, 0.002), tools.HostEvidence(),
                        tools.NodeHealth(), tools.SyncWork(100, 800_000_000, 100, 50_000_000),
                        peers_self_ms=8.0, peers_wait_ms=19.0)
    for name, value in changes.items():
        setattr(facts, name, value)
    return facts


@pytest.mark.parametrize("changes,cause,confidence", [
    ({"host": tools.HostEvidence(preemptions=40, preemptors={"hog": 40},
                                 beyond_peers={"hog": 40})}, "host_preemption", "high"),
    # as often as the job's other ranks on its node: no cause
    ({"host": tools.HostEvidence(preemptions=40, preemptors={"hog": 40})}, "host_work",
     "medium"),
    ({"host": tools.HostEvidence(blockio_requests=3000, heavy_blockio=True)}, "io", "medium"),
    ({"health": tools.NodeHealth(signals={"cpu": 0.5})}, "host_preemption", "medium"),
    ({"health": tools.NodeHealth(signals={"memory": 0.2, "cpu": 0.95})}, "memory_pressure",
     "medium"),
    ({"sync": tools.SyncWork(100, 2_000_000_000, 100, 50_000_000),
      "health": tools.NodeHealth(signals={"compute": 0.3})}, "slow_gpu", "high"),
    ({"sync": tools.SyncWork(100, 800_000_000, 100, 4_000_000_000)}, "network_or_peer", "low"),
    ({}, "host_work", "medium"),     # late, nothing else on its CPU, kernels no slower
    ({"verdict": {"kind": "persistent", "cause": "host_work", "confidence": "medium",
                  "fix": "profile its host code", "findings": ["late, nobody else on its CPU"],
                  "raised": "2026-11-24T10:00:00Z", "cleared": None, "period": None}},
     "host_work", "medium"),
])
def test_the_strongest_evidence_names_the_cause(changes, cause, confidence):
    diagnosis = tools.diagnose(late_rank_facts(**changes))
    assert (diagnosis.cause, diagnosis.confidence) == (cause, confidence)
    assert diagnosis.fix and diagnosis.findings
    if cause == "host_preemption" and confidence == "high":
        assert "hog" in diagnosis.fix


def test_a_rank_without_comparable_collectives_is_unknown():
    diagnosis = tools.diagnose(late_rank_facts(lag=None))
    assert (diagnosis.cause, diagnosis.fix) == ("unknown", None)


def test_robust_bars_ignore_the_outlier():
    lags = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 20.0, 0.6, 0.7])
    bar = analysis.upper_bar(lags, 2.0, 0.5)
    assert (bar.median, bar.mad) == pytest.approx((0.35, 0.25))
    assert bar.bar == pytest.approx(0.35 + 2 * 1.4826 * 0.5)
    assert math.isclose(tools.lower_bar(np.array([0.93, 0.94, 0.62, 0.92]), 2, 0.01).bar,
                        0.925 - 2 * 1.4826 * 0.01)


def iso(t: float) -> str:
    return tools.iso(tools.datetime.fromtimestamp(t, tools.UTC))


def test_a_weighted_quantile_counts_each_run_as_many_times_as_it_has_instances():
    from echod.tools.lag import weighted_quantile
    # a rank on time for 160 instances, then 60 ms late for 80, in runs of unequal length
    values, weights = np.array([0.0, 0.0, 60.0, 60.0, 60.0]), np.array([100, 60, 30, 30, 20])
    assert weighted_quantile(values, weights, 0.5) == 0.0     # unweighted, the runs say 60
    assert weighted_quantile(values, weights, 0.99) == 60.0
    assert weighted_quantile(np.array([3.0]), np.array([7]), 0.5) == 3.0


@pytest.mark.parametrize("instances,per_run", [(180, 20), (20_000, 20), (20_000, 200)])
def test_a_tail_pooled_from_runs_is_the_tail_of_their_instances(instances, per_run):
    """fleetd summarises each run of instances by its quantiles; a rank's 95th and 99th
    percentile from those is the one its instances have, on a short job (a run of 20 has its
    maximum for its 99th percentile) as on a long one: no bias over many draws, and no draw
    far off. The quantile of the runs' quantiles read 4-9% high on average here, up to 19%."""
    from echod.tools.lag import pooled_quantile
    rng = np.random.default_rng(instances + per_run)
    errors = {0.95: [], 0.99: []}
    for _ in range(50):
        # on time (jitter 0.5 ms) for a third of the job, then 40 ms late give or take a tail
        lag = np.r_[rng.normal(0, 0.0005, instances // 3),
                    0.040 + rng.exponential(0.002, instances - instances // 3)]
        runs = np.array_split(lag, instances // per_run)
        known = np.array([np.quantile(run, [0.5, 0.95, 0.99, 1.0]) for run in runs])
        weights = np.array([len(run) for run in runs])
        for q, found in errors.items():
            found.append(pooled_quantile(known, weights, q) / np.quantile(lag, q) - 1)
    for q, found in errors.items():
        assert abs(np.mean(found)) < 0.025, (q, np.mean(found))
        assert np.max(np.abs(found)) < 0.08, (q, found)


def test_a_pooled_quantile_of_runs_each_of_one_instance_is_theirs():
    from echod.tools.lag import pooled_quantile
    values = np.array([5.0, 1.0, 3.0, 2.0, 4.0])
    known = np.repeat(values[:, None], 4, axis=1)           # every quantile of one instance
    weights = np.ones(5, int)
    assert pooled_quantile(known, weights, 0.5) == 3.0
    assert pooled_quantile(known, weights, 0.99) == 5.0
    assert pooled_quantile(known[:1], weights[:1], 0.99) == 5.0
