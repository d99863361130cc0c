"""fleetd sharded by job: two fleetds (--shard 0/2 and 1/2), node-wide ingerods given both
endpoints, each job's events sent to the shard that owns it, both shards forwarding to one echod.

The end-to-end test runs two sim jobs traced with real bcc, one owned by each shard, a late rank
in each, and reads the verdicts back over echod's API, as a user would. The others check what
the shard split rests on: every node computes the same owner, a fleetd sent a job it does not
own keeps the events and says so, and bad shard settings are refused at start.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import sim
from ingero import shards
from stack.launch import free_port, wait_for
from ingero.settings import shard, zmq_endpoints
from stack.local import Stack
from ingerod.queue import PUSH
from sim import scenario as scenarios
from sim.cluster import Cluster

from .support import Producer, metric, needs_ebpf, said

PUSH_S = 1.0


def owned_by(k: int, n: int, cluster: str = "sim", start: int = 3000) -> str:
    return next(str(j) for j in range(start, start + 100) if shards.owner(cluster, str(j), n) == k)


def test_the_owner_of_a_job_is_the_same_on_every_node_and_every_version():
    # Agents and fleetds of different releases must agree on who owns a job: the hash is
    # CRC32 of "cluster/job", pinned here.
    assert [shards.owner("sim", str(j), 2) for j in range(3001, 3009)] == [1, 1, 1, 0, 0, 0, 0, 1]
    assert shards.owner("prod", "123456", 4) == 824667449 % 4
    assert shards.owner("prod", None, 4) == 0 and shards.owner("prod", "7", 1) == 0
    owners = {shards.owner("c", str(j), 8) for j in range(1000)}
    assert owners == set(range(8))          # every shard gets jobs


def test_shard_and_endpoint_lists_are_checked():
    assert shard("1/4") == (1, 4) and shard(" 0 / 1 ") == (0, 1)
    for bad in ("4/4", "1", "-1/2", "0/0", "a/b"):
        with pytest.raises(ValueError):
            shard(bad)
    assert zmq_endpoints("tcp://a:1,tcp://b:2") == ["tcp://a:1", "tcp://b:2"]
    assert zmq_endpoints(["tcp://a:1"]) == ["tcp://a:1"]
    with pytest.raises(ValueError, match="twice"):
        zmq_endpoints("tcp://a:1,tcp://a:1")
    with pytest.raises(ValueError):
        zmq_endpoints("tcp://a:1,http://b")
    refused = subprocess.run([sys.executable, "-m", "fleetd", "--config", "/dev/null",
                              "--shard", "2/2"], capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "0 <= K < N" in refused.stderr, refused.stderr


def test_a_shard_sent_a_job_it_does_not_own_keeps_the_events_counts_and_says_so(
        spawn, keys, endpoint):
    port = free_port()
    fleetd = spawn("fleetd", "fleetd", [
        "--config", "/dev/null", "--bind", endpoint, "--shard", "1/2",
        "--metrics-addr", f"127.0.0.1:{port}", *keys.fleetd_flags()])
    assert wait_for(lambda: "listening" in fleetd.log(), 60), fleetd.log()
    producer = Producer(endpoint, keys, "stray", cluster="sim")
    try:
        producer.push(4, job=owned_by(1, 2), rank=0)      # its own: fine
        producer.push(4, job=owned_by(0, 2), rank=0)      # shard 0's
        assert producer.collect_acks(10) == 2              # both kept, both answered
    finally:
        producer.close()
    assert metric(port, "ingero_fleet_events_accepted_total") == 8
    assert metric(port, "ingero_fleet_misrouted_pushes_total") == 1
    assert f"job sim/{owned_by(0, 2)}, which shard 0 owns, to shard 1 of 2" in fleetd.log()


def scenario(job_id: str, late_rank: int) -> scenarios.Scenario:
    return scenarios.parse({"name": f"job-{job_id}", "job": {
        "nodes": 2, "ranks_per_node": 4, "steps": 30, "step_ms": 20, "allreduce_bytes": 1 << 20,
        "timeout_s": 30, "job_id": job_id}, "stragglers": [
        {"rank": late_rank, "kind": "host_delay", "delay_ms": 200, "from_step": 5}]})


@pytest.mark.slow
@needs_ebpf
def test_two_shards_each_judge_their_own_jobs_and_echod_has_every_event(tmp_path):
    sim.build()
    stack = Stack(tmp_path, 2, push_s=PUSH_S, shards=2,
                  echod_root=Path(tempfile.mkdtemp(prefix="echod-shards-")))
    jobs = {owned_by(0, 2): 5, owned_by(1, 2): 2}       # job → its late rank; one a shard
    try:
        for job, late in jobs.items():
            with Cluster(scenario(job, late), tmp_path / f"job-{job}") as cluster:
                result = cluster.wait()
            assert result.ok, result.describe()
            assert stack.wait_judged(job, result), stack.logs()
        for k, job in enumerate(jobs):
            verdicts = stack.tool("find_stragglers", job=job)["verdicts"]
            assert {v["rank"] for v in verdicts} == {jobs[job]}, \
                "\n".join([f"job {job}", *said(verdicts), stack.logs()])
            assert verdicts[0]["cause"] == "host_work", verdicts[0]
            # every collective of the job stored, though its nodes pushed to two fleetds
            assert stack.tool("job_report", job=job)["collectives"] == 30 * 8, stack.logs()
            # the owner judged it; the other shard never saw it
            owner_log = stack.fleetds[k].log()
            other_log = stack.fleetds[1 - k].log()
            assert f"straggler job {job} rank {jobs[job]} " in owner_log, owner_log[-3000:]
            assert f"job {job} " not in other_log
        for port in stack.fleet_ports:
            assert metric(port, "ingero_fleet_misrouted_pushes_total") == 0
            assert metric(port, "ingero_fleet_events_accepted_total") > 30 * 4
        # each agent moved its score to the shard of the job it ran, and heard its verdicts
        for agent in stack.agents:
            moves = re.findall(r"node score now goes to fleetd shard (\d)", agent.log())
            assert moves and moves[-1] == "1", agent.log()[-3000:]
        for agent, rank in ((stack.agents[1], 5), (stack.agents[0], 2)):
            assert wait_for(lambda: f"fleetd: rank straggler [{rank}]" in agent.log(), 10), \
                agent.log()[-3000:]
    finally:
        statuses = stack.stop()
    assert statuses == [0, 0, 0, 0, 0], stack.logs()


def test_a_lapsed_verdict_of_an_ended_job_does_not_pull_the_node_score_back(tmp_path):
    """The node's score goes to the shard of the job its events are of. When a shard's verdict
    lapses (the agent pushed no more to it) the agent says so in an event of that job, and that
    echo must not count as the job's: counted, it pulled the score back to shard 0 once the
    job of shard 1 had ended, and shard 0 named its old job's rank again (CI under load)."""
    from ingero.settings import load
    from ingerod.agent import Agent, named
    from ingerod.config import SETTINGS

    old, new = owned_by(0, 2), owned_by(1, 2)
    agent = Agent(load(SETTINGS, "INGEROD", None, {
        "fleet": f"tcp://127.0.0.1:{free_port()},tcp://127.0.0.1:{free_port()}",
        "source": "synthetic", "node": next(f"n{i}" for i in range(100)
                                            if shards.home(f"n{i}", 2) == 0),
        "cluster": "sim", "queue_dir": str(tmp_path / "queue"), "metrics_addr": "none",
        "control_socket": "none", "jobs_dir": "none", "insecure_plaintext_zmq": True}, {}))

    def ran(job: str | None) -> None:
        events = [] if job is None else [{"kind": "collective", "t": time.time(), "attrs": {
            "op": "ncclAllReduce", "job": job, "rank": 4}}]
        agent.add_events(events)
        agent.tick(agent.clock())
        agent.cycle(agent.clock())

    try:
        agent.heard[0] = [(old, 5)]              # shard 0 named rank 5 of the old job
        agent.heard_ranks(named(agent.heard))
        ran(old)
        assert agent.home == 0
        ran(new)
        assert agent.home == 1
        agent.heard[0] = []                       # shard 0's word lapses after the new job
        agent.heard_ranks(named(agent.heard))
        assert agent.pending[0][-1]["kind"] == "rank_resolved"      # still told, to shard 0
        ran(None)
        assert agent.home == 1
    finally:
        agent.close()


def test_a_job_record_waits_for_its_shard_across_an_agent_kill_and_is_delivered(
        spawn, keys, tmp_path):
    """Shard 1 is down while a job it owns starts: the record's push waits in the agent's
    shard-1 queue on disk, survives kill -9, and reaches shard 1 once it is up (echod keeps a
    record resent after a restart once: its event id is stable)."""
    from ingero import slurmhook
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    ports = [free_port() for _ in range(2)]

    def fleetd(k):
        daemon = spawn(f"fleetd-{k}", "fleetd", [
            "--config", "/dev/null", "--bind", endpoints[k], "--shard", f"{k}/2",
            "--metrics-addr", f"127.0.0.1:{ports[k]}", "--recompute-interval", "0.1",
            *keys.fleetd_flags()])
        assert wait_for(lambda: "listening" in daemon.log(), 60), daemon.log()
        return daemon

    node = next(f"solo{i}" for i in range(100) if shards.home(f"solo{i}", 2) == 0)
    jobs, score = tmp_path / "jobs", tmp_path / "score"
    jobs.mkdir()
    score.write_text("0.9\n")
    agent_flags = ["--config", "/dev/null", "--source", "synthetic", "--score-file", str(score),
                   "--node", node, "--cluster", "sim", "--fleet", ",".join(endpoints),
                   "--push-interval", "0.2", "--heartbeat-interval", "0.1",
                   "--reconnect-max", "0.25", "--warmup", "1", "--metrics-addr", "none",
                   "--jobs-dir", str(jobs), "--control-socket", "none",
                   "--queue-dir", str(tmp_path / "queue"), *keys.ingerod_flags()]
    fleetd(0)
    agent = spawn("ingerod", "ingerod", agent_flags)
    assert wait_for(lambda: metric(ports[0], "ingero_fleet_batches_accepted_total") >= 2, 30), \
        agent.log()
    job = owned_by(1, 2, "sim")
    slurmhook.write_record(jobs, slurmhook.start_record({
        "SLURM_JOB_ID": job, "SLURM_JOB_NUM_NODES": "1", "SLURMD_NODENAME": node}, 1.0))
    waiting = tmp_path / "queue" / node / "node" / "shard-1"
    # a push whole on disk (its name final: a temporary one is not restored after kill -9)
    assert wait_for(lambda: waiting.is_dir() and any(
        PUSH.match(p.name) for p in waiting.iterdir()), 30), agent.log()
    assert "node score now goes to fleetd shard 1" in agent.log()
    agent.kill()
    agent = spawn("ingerod-again", "ingerod", agent_flags)
    assert wait_for(lambda: "sending them again" in agent.log(), 30), agent.log()
    fleetd(1)
    assert wait_for(lambda: metric(ports[1], "ingero_fleet_events_accepted_total") >= 1, 30), \
        agent.log()
    assert wait_for(lambda: not any(jobs.iterdir()), 30), agent.log()    # record delivered
    for port in ports:
        assert metric(port, "ingero_fleet_misrouted_pushes_total") == 0


def test_a_restarted_agent_goes_on_with_its_stream_though_only_shard_1_heard_it(
        spawn, keys, tmp_path):
    """A per-job agent whose job shard 1 owns never pushes to shard 0: its stream (boot id,
    numbers, the restart gap) is kept by shard 1's queue. A changed --fleet list starts a new
    stream instead, so no fleetd is sent new pushes under numbers it already took."""
    endpoints = [f"tcp://127.0.0.1:{free_port()}" for _ in range(2)]
    ports = [free_port() for _ in range(2)]
    for k in range(2):
        daemon = spawn(f"fleetd-{k}", "fleetd", [
            "--config", "/dev/null", "--bind", endpoints[k], "--shard", f"{k}/2",
            "--metrics-addr", f"127.0.0.1:{ports[k]}", *keys.fleetd_flags()])
        assert wait_for(lambda: "listening" in daemon.log(), 60), daemon.log()
    score = tmp_path / "score"
    score.write_text("0.9\n")

    def agent(name, fleet):
        return spawn(name, "ingerod", [
            "--config", "/dev/null", "--source", "synthetic", "--score-file", str(score),
            "--node", "n1", "--cluster", "sim", "--job", owned_by(1, 2), "--fleet", fleet,
            "--push-interval", "0.2", "--warmup", "1", "--metrics-addr", "none",
            "--jobs-dir", "none", "--control-socket", "none",
            "--queue-dir", str(tmp_path / "queue"), *keys.ingerod_flags()])

    def boot(daemon):
        found = wait_for(lambda: re.search(r"\(boot (\w+)\)", daemon.log()), 30)
        assert found, daemon.log()
        return found.group(1)

    first = agent("first", ",".join(endpoints))
    assert wait_for(lambda: metric(ports[1], "ingero_fleet_batches_accepted_total") >= 3, 30), \
        first.log()
    assert metric(ports[0], "ingero_fleet_batches_accepted_total") == 0
    assert first.stop(10) == 0
    again = agent("again", ",".join(endpoints))
    assert boot(again) == boot(first)
    assert wait_for(lambda: "restarted: nothing traced" in again.log(), 30), again.log()
    before = metric(ports[1], "ingero_fleet_batches_accepted_total")
    assert wait_for(lambda: metric(ports[1], "ingero_fleet_batches_accepted_total")
                    >= before + 3, 30), again.log()
    assert metric(ports[1], "ingero_fleet_batches_resent_total") == 0   # none taken as resent
    assert again.stop(10) == 0
    swapped = agent("swapped", ",".join(reversed(endpoints)))
    assert boot(swapped) != boot(first)
    assert "--fleet changed since the last run" in swapped.log()
