"""Rank verdicts end to end: sim ranks traced by node-wide ingerods (real bcc), fleetd's online
analysis, echod's store, read back over echod's HTTPS API.

One stack serves the module, and test_cli and test_retention beside it (conftest's
``two_nodes``, ``stack.local`` as the demo runs it): echod (embedded PostgreSQL, TLS, a
token), fleetd forwarding to it, and two ingerods as the shipped unit runs them (no --job), one
per simulated node (each traces the ranks of its sim host label, standing in for two hosts).
node1's ingerod runs under faketime 250 ms ahead, so every verdict here is also a verdict made
through a corrected clock. Each test runs its own sim job (its own Slurm job id) and asserts on
what the API answers about that job.
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest

from stack.launch import wait_for
from sim import scenario as scenarios
from sim.cluster import Cluster
from sim.records import entry_lags, read_record

from .support import LATE_IN_RECORD_S, TwoNodes, metric, needs_ebpf, said, why

pytestmark = [pytest.mark.slow, needs_ebpf]

SKEW_S, PUSH_S, HANG_TIMEOUT_S = TwoNodes.SKEW_S, TwoNodes.PUSH_S, TwoNodes.HANG_TIMEOUT_S


@pytest.fixture(scope="module")
def stack(two_nodes):
    return two_nodes


def scenario(job_id: str, stragglers=(), **fields) -> scenarios.Scenario:
    base = {"nodes": 2, "ranks_per_node": 4, "steps": 40, "step_ms": 20,
            "allreduce_bytes": 1 << 20, "timeout_s": 30, "job_id": job_id}
    return scenarios.parse({"name": f"job-{job_id}", "job": base | fields,
                            "stragglers": list(stragglers)})


def told(found: dict[int, dict], stack: TwoNodes) -> str:
    """What a failed assertion on the verdicts shows: each as the product says it, then the
    daemons' logs."""
    return "\n".join([*said(found), stack.logs()])


def named(verdicts: list[dict]) -> dict[int, dict]:
    """The latest verdict of each rank."""
    return {v["rank"]: v for v in verdicts}


def test_a_rank_late_on_the_host_is_named_with_its_lag_onset_and_own_host_work(stack):
    late, delay_ms, onset_step = 5, 290, 12
    # With a ring of Send/Recv every step: their own sequence never shifts the collectives'.
    result = stack.run(scenario("1001", steps=30, extra_collectives=["sendrecv"], stragglers=[
        {"rank": late, "kind": "host_delay", "delay_ms": delay_ms, "from_step": onset_step}]))
    assert result.ok, result.describe()
    found = named(stack.verdicts("1001"))
    assert set(found) == {late}, told(found, stack)
    verdict = found[late]
    assert verdict["node"] == "node1" and verdict["kind"] == "persistent"
    assert verdict["cause"] == "host_work", verdict
    assert abs(verdict["lag_p50_ms"] - delay_ms) <= 0.1 * delay_ms, verdict
    assert abs(verdict["step"] - onset_step) <= 3, verdict
    assert verdict["severity"] == "critical" and verdict["cost_gpu_seconds"] > 0
    assert verdict["cost_usd"] == pytest.approx(verdict["cost_gpu_seconds"] / 3600 * 2.49,
                                                abs=1e-3)
    # echod's own reading of the stored events agrees, node1's clock corrected there too
    computed = stack.tool("find_stragglers", job="1001")["ranks"]
    assert [r["rank"] for r in computed if r["straggler"]] == [late], computed
    assert abs(computed[0]["lag_median_ms"] - delay_ms) <= 0.1 * delay_ms, computed[0]
    # over the 30 all-reduces: the ring's sends and receives number their own calls from 0
    # too, on the same communicator, and are no instances (fleetd judges none either)
    assert {r["samples"] for r in computed} == {30}, computed
    # the agent on node1 hears it in fleetd's reply, and says so
    assert wait_for(lambda: "fleetd: rank straggler [5]" in stack.agents[1].log(), 10), \
        stack.agents[1].log()
    explained = stack.tool("explain", job="1001", rank=late)
    assert explained["cause"] == "host_work" and explained["node"] == "node1"
    assert explained["findings"][0].startswith("fleetd named it a straggler (persistent")
    # Onset to verdict: the first late entry (ground truth, this host's clock) to fleetd's raise.
    truth = read_record(result.rank(late).record_path).at_step(onset_step)
    late_at = truth["entry_ns"] / 1e9 - time.monotonic() + time.time()
    raised = datetime.fromisoformat(verdict["raised"]).timestamp()
    assert raised - late_at <= 3 * PUSH_S, (raised, late_at)


def test_clock_offset_of_the_skewed_node_is_estimated_within_5_ms(stack):
    offset = metric(stack.fleet_port, "ingero_fleet_clock_offset_seconds", node="node1")
    assert abs(offset - SKEW_S) <= 0.005, offset
    assert abs(metric(stack.fleet_port, "ingero_fleet_clock_offset_seconds", node="node0")) \
        <= 0.005


FIVE_A_STEP = ["allgather", "reducescatter", "broadcast", "reduce"]   # and the all-reduce


def test_a_healthy_job_of_2000_collectives_with_jitter_gets_no_verdict(stack):
    """400 steps of five collectives: 2,000 collective instances, 16,000 traced calls."""
    result = stack.run(scenario("1002", steps=400, step_ms=10, jitter_ms=2,
                                extra_collectives=FIVE_A_STEP))
    assert result.ok, result.describe()
    assert stack.verdicts("1002") == []
    assert stack.tool("job_report", job="1002")["collectives"] == 2000 * 8


def test_a_stall_every_k_steps_is_named_periodic_with_its_period(stack):
    result = stack.run(scenario("1003", steps=40, stragglers=[
        {"rank": 1, "kind": "hiccup", "delay_ms": 80, "every": 5}]))
    assert result.ok, result.describe()
    found = named(stack.verdicts("1003"))
    assert set(found) == {1}, told(found, stack)
    assert found[1]["kind"] == "periodic" and found[1]["period"] == 5, told(found, stack)


def test_a_slow_gpu_is_named_with_cause_slow_gpu(stack):
    result = stack.run(scenario("1004", steps=40, stragglers=[
        {"rank": 6, "kind": "slow_gpu", "factor": 1.5}]))
    assert result.ok, result.describe()
    found = named(stack.verdicts("1004"))
    assert set(found) == {6}, told(found, stack)
    assert found[6]["cause"] == "slow_gpu", told(found, stack)


def test_a_hung_rank_is_named_missing_within_the_timeout_and_two_pushes(stack):
    with Cluster(scenario("1005", steps=20, timeout_s=20, stragglers=[
            {"rank": 3, "kind": "hang", "at_step": 6}]),
            stack.root / "job-1005") as cluster:
        started = time.time()
        named_hang = wait_for(lambda: any(v["kind"] == "hang" for v in stack.verdicts("1005")),
                              HANG_TIMEOUT_S + 2 * PUSH_S + 20)
        cluster.stop()
    assert named_hang, stack.logs()
    found = named(v for v in stack.verdicts("1005") if v["kind"] == "hang")
    assert set(found) == {3}, told(found, stack)
    entered = read_record(cluster.ranks[0].record_path).at_step(6)["entry_ns"] / 1e9 \
        - time.monotonic() + time.time()
    raised = datetime.fromisoformat(found[3]["raised"]).timestamp()
    assert raised - entered <= HANG_TIMEOUT_S + 2 * PUSH_S + 1.0, (found, started)


def test_a_competing_process_on_a_rank_s_cpu_is_named_as_the_cause(stack):
    with Cluster(scenario("1006", nodes=1, steps=30, host_work_ms=2, stragglers=[
            {"rank": 2, "kind": "cpu_contention", "hogs": 3, "nice": -10}]),
            stack.root / "job-1006") as cluster:
        result = cluster.wait()
        hogs = {hog.pid for hog in cluster.hogs}
    assert result.ok, result.describe()
    assert stack.wait_judged("1006", result), stack.logs()
    found = named(stack.verdicts("1006"))
    # Idle, the hogs make rank 2 some 50 ms late a step. Beside another busy process on these
    # two cores the ranks on the other core lose about as much to it, and the job as it ran
    # (its records say) may have no clear straggler: then rank 2 need not be named, but no
    # other rank may be, and rank 2 only for its hogs.
    lags = entry_lags({r.rank: r.record_path for r in result.ranks})
    told_all = told(found, stack) + f"\nmedian lags in the records: {lags}"
    assert set(found) <= {2}, told_all
    if lags[2] < LATE_IN_RECORD_S and not found:
        return
    assert set(found) == {2}, told_all
    assert found[2]["cause"] == "host_preemption", told_all
    top = found[2]["evidence"]["preemptions"][0]
    assert top["comm"] == "ingero-hog" and top["pid"] in hogs, found[2]["evidence"]
    assert f"ingero-hog (pid {top['pid']})" in found[2]["fix"]


def test_three_of_eight_at_once_each_with_its_own_cause(stack):
    # Two cores: rank 6 and its hogs get one, the seven other ranks (and the daemons) the other.
    result = stack.run(scenario("1007", steps=80, host_work_ms=1, stragglers=[
        {"rank": 1, "kind": "host_delay", "delay_ms": 60},
        {"rank": 4, "kind": "slow_gpu", "factor": 2.0},
        {"rank": 6, "kind": "cpu_contention", "hogs": 3, "nice": -10}]))
    assert result.ok, result.describe()
    found = named(stack.verdicts("1007"))
    assert {r: v["cause"] for r, v in found.items()} == {
        1: "host_work", 4: "slow_gpu", 6: "host_preemption"}, why(*said(found)) + stack.logs()
    assert found[1]["step"] <= 3, "slow from the first step: its onset is the start"


def test_half_the_job_late_names_the_late_half(stack):
    """node1's four ranks 100 ms late every step: a MAD bar over the eight ranks' median lags
    (±100 ms) would sit at 440 ms and name nobody."""
    result = stack.run(scenario("1013", steps=30, stragglers=[
        {"rank": r, "kind": "host_delay", "delay_ms": 100, "from_step": 5} for r in range(4, 8)]))
    assert result.ok, result.describe()
    found = named(stack.verdicts("1013"))
    assert set(found) == {4, 5, 6, 7}, told(found, stack)
    assert {(v["node"], v["cause"]) for v in found.values()} == {("node1", "host_work")}
    assert all(abs(v["lag_p50_ms"] - 100) <= 15 for v in found.values()), found


def test_one_late_of_two_ranks_is_named(stack):
    result = stack.run(scenario("1014", nodes=1, ranks_per_node=2, steps=30, stragglers=[
        {"rank": 1, "kind": "host_delay", "delay_ms": 60}]))
    assert result.ok, result.describe()
    assert set(named(stack.verdicts("1014"))) == {1}


def test_two_of_five_ranks_late_are_both_named(stack):
    result = stack.run(scenario("1008", nodes=1, ranks_per_node=5, steps=30, stragglers=[
        {"rank": 0, "kind": "host_delay", "delay_ms": 40},
        {"rank": 3, "kind": "host_delay", "delay_ms": 80}]))
    assert result.ok, result.describe()
    found = named(stack.verdicts("1008"))
    assert set(found) == {0, 3}, told(found, stack)
    assert found[3]["lag_p50_ms"] > found[0]["lag_p50_ms"]


def test_a_rank_that_dies_is_named_dead(stack):
    with Cluster(scenario("1009", steps=60, timeout_s=20, stragglers=[
            {"rank": 2, "kind": "die", "at_step": 50}]), stack.root / "job-1009") as cluster:
        dead = wait_for(lambda: any(v["kind"] == "died" for v in stack.verdicts("1009")),
                        HANG_TIMEOUT_S + 2 * PUSH_S + 20)
        cluster.stop()
    assert dead, stack.logs()
    found = named(v for v in stack.verdicts("1009") if v["kind"] == "died")
    assert set(found) == {2} and found[2]["cause"] == "died", found


def test_a_healthy_job_of_2000_collectives_without_jitter_gets_no_verdict(stack):
    """400 steps of five collectives: 2,000 collective instances, 16,000 traced calls."""
    result = stack.run(scenario("1010", steps=400, step_ms=10, extra_collectives=FIVE_A_STEP))
    assert result.ok, result.describe()
    assert stack.verdicts("1010") == [], stack.verdicts("1010")


def test_two_jobs_on_one_node_wide_agent_are_analysed_and_stored_apart(stack):
    first = scenario("1011", nodes=1, steps=30, stragglers=[
        {"rank": 1, "kind": "host_delay", "delay_ms": 40}])
    second = scenario("1012", nodes=1, steps=30, stragglers=[
        {"rank": 3, "kind": "host_delay", "delay_ms": 40}])
    with Cluster(first, stack.root / "job-1011") as a, \
            Cluster(second, stack.root / "job-1012") as b:
        results = a.wait(), b.wait()
    assert all(r.ok for r in results), [r.describe() for r in results]
    assert all(stack.wait_judged(job, r) for job, r in zip(("1011", "1012"), results)), \
        stack.logs()
    assert set(named(stack.verdicts("1011"))) == {1}
    assert set(named(stack.verdicts("1012"))) == {3}
    for job, late in (("1011", 1), ("1012", 3)):
        report = stack.tool("job_report", job=job)
        assert report["ranks"] == 4 and report["collectives"] > 0, report
        assert [v["rank"] for v in report["verdicts"]] == [late]
