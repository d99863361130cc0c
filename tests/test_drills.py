"""Fault drills on the real product: a sim job traced by a node-wide ingerod (real bcc), fleetd
spooling to echod on its private PostgreSQL, and, while the job runs, kill -9 of fleetd, then of
echod, then of PostgreSQL, each brought back (by the test, as systemd would; PostgreSQL by
echod itself). Every collective the ranks made is stored exactly once, nothing is counted as
dropped, and detection and storage resume after each fault. The network drills put a node's
agent in a namespace of its own and cut its link: its backlog arrives after, stored once, and a
clock fleetd has not measured yet is never taken for lateness.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import text

import sim
from echod.store.db import make_engine
from echod.embedded import EmbeddedPostgres
from ingero.errors import ApiCallError
from stack.launch import Daemon, wait_for
from stack.local import Stack
from sim import scenario as scenarios
from sim.cluster import Cluster
from sim.records import read_record

from .support import metric, needs_ebpf, scrape, why

pytestmark = [pytest.mark.slow, needs_ebpf]

PUSH_S = 1.0
RESEND_S = 1.0
LATE_RANK, DELAY_MS = 3, 40


def kill_and_restart(daemon: Daemon, down_s: float = 2.0) -> tuple[Daemon, float]:
    """kill -9, a pause, the same command again; returns the new daemon and when it started."""
    return daemon.restarted(down_s), time.time()


def stored(engine, job: str) -> int:
    with engine.connect() as c:
        return c.scalar(text("SELECT count(*) FROM events WHERE job = :job "
                             "AND kind = 'collective'"), {"job": job})


def test_kill_9_of_fleetd_echod_and_postgres_loses_and_doubles_nothing(tmp_path):
    sim.build()
    root = Path(tempfile.mkdtemp(prefix="ingero-drill-"))
    root.chmod(0o755)
    stack = Stack(root, 1, push_s=PUSH_S, fleet_flags=("--forward-resend-after", str(RESEND_S)),
                  echod_root=root / "echod")
    postgres = EmbeddedPostgres(root / "echod" / "state" / "postgres")
    engine = make_engine(postgres.start())
    job = "7001"
    spec = scenarios.parse({"name": "drill", "job": {
        "nodes": 1, "ranks_per_node": 4, "steps": 1200, "step_ms": 20, "timeout_s": 240,
        "allreduce_bytes": 1 << 20, "job_id": job}, "stragglers": [
        {"rank": LATE_RANK, "kind": "host_delay", "delay_ms": DELAY_MS}]})
    resumed = {}
    try:
        with Cluster(spec, root / "job") as cluster:
            assert wait_for(lambda: stored(engine, job) > 0, 60), stack.logs()

            # 1. fleetd: the agent's unacknowledged pushes and fleetd's spool both come back
            stack.fleetd, back = kill_and_restart(stack.fleetd)
            stack.daemons[0] = stack.fleetd
            assert wait_for(lambda: metric(stack.fleet_port,
                                           "ingero_fleet_events_accepted_total") > 0, 30), \
                stack.logs()
            resumed["fleetd"] = time.time() - back
            fleetd_back = back

            # 2. echod (its API with it): fleetd keeps the batches and sends them again
            before = stored(engine, job)
            listening = stack.echod.daemon.log().count("ingest listening")   # one log, appended
            stack.echod.daemon, back = kill_and_restart(stack.echod.daemon)
            assert wait_for(lambda: stack.echod.daemon.log().count("ingest listening")
                            > listening, 120), stack.echod.daemon.log()
            assert wait_for(lambda: stored(engine, job) > before, 60), stack.logs()
            resumed["echod"] = time.time() - back

            # 3. PostgreSQL: echod starts it again, and ingest picks up where it stopped
            before = stored(engine, job)
            postmaster = int((postgres.data_dir / "postmaster.pid").read_text().split()[0])
            os.kill(postmaster, signal.SIGKILL)
            assert wait_for(lambda: "PostgreSQL is back" in stack.echod.daemon.log(), 60), \
                stack.echod.daemon.log()
            back = time.time()
            engine.dispose()
            assert wait_for(lambda: stored(engine, job) > before, 60), stack.logs()
            resumed["postgres"] = time.time() - back
            result = cluster.wait()
        assert result.ok, result.describe()
        issued = sum(len(read_record(r.record_path).collectives) for r in result.ranks)
        assert wait_for(lambda: stored(engine, job) >= issued, 60), (stored(engine, job), issued)
        time.sleep(2 * PUSH_S)
        assert stored(engine, job) == issued, "every collective once, none twice"
        with engine.connect() as c:
            scores, pushes = c.execute(text(
                "SELECT count(*), count(DISTINCT (boot_id, seq)) FROM health_scores "
                "WHERE node = 'node0'")).one()
        assert scores == pushes > 0, "a push resent to the restarted fleetd is one score"
        assert [spool_drops(stack, c) for c in ("events", "health", "verdicts")] == [0, 0, 0]
        # detection resumed: the new fleetd named the late rank again, from what came after
        verdicts = stack.tool("find_stragglers", job=job)["verdicts"]
        raised = [datetime.fromisoformat(v["raised"]).timestamp() for v in verdicts
                  if v["rank"] == LATE_RANK]
        assert any(t > fleetd_back for t in raised), why(verdicts, stack.logs())
        # How soon each resumed is a measurement (bench/drills.py), not asserted here: beside
        # a busy loop echod's restart took 4.3 s, over two push-and-resend intervals.
        print(f"drill: kill -9 fleetd, echod, postgres | produced {issued} | stored "
              f"{stored(engine, job)} | dropped 0 | resumed after {resumed['fleetd']:.1f} s, "
              f"{resumed['echod']:.1f} s, {resumed['postgres']:.1f} s")
    finally:
        engine.dispose()
        stack.stop()


@pytest.fixture
def cut_off_node():
    """A network namespace joined to this host by a veth pair (10.231.7.1 here, .2 there):
    (namespace, host side's link, namespace side's link). Either link going down cuts the
    namespace off; the host side's address stays this host's while the namespace's is down."""
    token = uuid.uuid4().hex[:6]
    ns, host_link, ns_link = f"ingero-cut-{token}", f"ic{token}h", f"ic{token}n"
    for argv in (["netns", "add", ns], ["link", "add", host_link, "type", "veth", "peer", "name",
                                         ns_link],
                 ["link", "set", ns_link, "netns", ns],
                 ["addr", "add", "10.231.7.1/30", "dev", host_link],
                 ["link", "set", host_link, "up"],
                 ["-n", ns, "addr", "add", "10.231.7.2/30", "dev", ns_link],
                 ["-n", ns, "link", "set", ns_link, "up"], ["-n", ns, "link", "set", "lo", "up"]):
        subprocess.run(["ip", *argv], check=True, capture_output=True)
    yield ns, host_link, ns_link
    subprocess.run(["ip", "link", "del", host_link], capture_output=True)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


CUT_S = 30


def test_a_node_cut_off_for_30_s_delivers_its_batches_after_and_none_twice(cut_off_node):
    """node1's ingerod runs in a network namespace of its own (nsenter, not ip netns exec, which
    mounts a fresh /sys and hides tracefs from bcc); its link goes down for 30 s in
    the middle of a 2-node job. Its pushes wait in its queue and arrive after, and every
    collective of every rank is stored once."""
    ns, host_link, _ = cut_off_node
    sim.build()
    root = Path(tempfile.mkdtemp(prefix="ingero-cut-"))
    root.chmod(0o755)
    stack = Stack(root, 2, push_s=PUSH_S, fleet_host="10.231.7.1",
                  fleet_flags=("--forward-resend-after", str(RESEND_S)),
                  agent_prefix={1: ("nsenter", f"--net=/run/netns/{ns}")}, echod_root=root / "echod")
    engine = make_engine(EmbeddedPostgres(root / "echod" / "state" / "postgres").start())
    job = "7002"
    spec = scenarios.parse({"name": "cut", "job": {
        "nodes": 2, "ranks_per_node": 2, "steps": 2500, "step_ms": 20, "timeout_s": 240,
        "allreduce_bytes": 1 << 16, "job_id": job}})

    def stored_from(node: str) -> int:
        with engine.connect() as c:
            return c.scalar(text("SELECT count(*) FROM events WHERE job = :job AND node = :node "
                                 "AND kind = 'collective'"), {"job": job, "node": node})
    try:
        with Cluster(spec, root / "job") as cluster:
            assert wait_for(lambda: stored_from("node1") > 0, 60), stack.logs()
            subprocess.run(["ip", "link", "set", host_link, "down"], check=True)
            time.sleep(2 * PUSH_S)                           # what was on its way lands
            during = stored_from("node1")
            time.sleep(CUT_S - 2 * PUSH_S)
            assert stored_from("node1") == during, "node1 was not cut off"
            assert stored_from("node0") > 0
            subprocess.run(["ip", "link", "set", host_link, "up"], check=True)
            assert wait_for(lambda: stored_from("node1") > during, 60), stack.logs()
            result = cluster.wait()
        assert result.ok, result.describe()
        issued = {node: sum(len(read_record(r.record_path).collectives) for r in result.ranks
                            if r.node == index) for index, node in enumerate(("node0", "node1"))}
        assert wait_for(lambda: stored_from("node1") >= issued["node1"], 60), \
            (stored_from("node1"), issued)
        time.sleep(2 * PUSH_S)
        assert {n: stored_from(n) for n in issued} == issued, "each collective once"
        print(f"drill: node1's link down {CUT_S} s | produced {sum(issued.values())} | stored "
              f"{sum(stored_from(n) for n in issued)} | dropped 0 | node1's backlog of "
              f"{issued['node1'] - during} arrived after")
        assert "dropped" not in stack.agents[1].log(), stack.agents[1].log()[-3000:]
    finally:
        engine.dispose()
        stack.stop()


AHEAD_S = 0.02


def stored_collectives(stack: Stack, job: str) -> int:
    """What echod has of the job's collectives (0 while it knows no such job)."""
    try:
        return stack.tool("job_report", job=job)["collectives"]
    except ApiCallError:
        return 0


def test_a_node_20_ms_ahead_is_judged_with_no_other_until_its_offset_is_known(cut_off_node):
    """node1's clock runs 20 ms ahead (faketime) and its link to fleetd is down as the job
    starts (a head node back after the job began would see the same): its first pushes reach
    fleetd full of the job's events and with no push/reply exchange, so no offset. Taken raw,
    all four of its ranks would enter every collective 20 ms late. fleetd compares them with no
    other node's until an exchange gives the offset; then it judges the whole job, on its own
    clock, and names the one rank that falls late later, by its own lag."""
    ns, _, ns_link = cut_off_node
    sim.build()
    root = Path(tempfile.mkdtemp(prefix="ingero-clock-"))
    root.chmod(0o755)
    down = ["ip", "-n", ns, "link", "set", ns_link]
    subprocess.run([*down, "down"], check=True)
    stack = Stack(root, 2, push_s=PUSH_S, fleet_host="10.231.7.1", skew={1: AHEAD_S},
                  agent_flags=("--reconnect-max", "0.5"),
                  agent_prefix={1: ("nsenter", f"--net=/run/netns/{ns}")}, echod_root=root / "echod")
    job, late, delay_ms = "7004", 6, 60
    spec = scenarios.parse({"name": "clock", "job": {
        "nodes": 2, "ranks_per_node": 4, "steps": 400, "step_ms": 50, "timeout_s": 120,
        "allreduce_bytes": 1 << 16, "job_id": job}, "stragglers": [
        {"rank": late, "kind": "host_delay", "delay_ms": delay_ms, "from_step": 300}]})
    try:
        with Cluster(spec, root / "job") as cluster:
            # The job runs (node0's collectives are stored, and node1's ranks are in the same
            # all-reduces), and node1's agent has queued a push of them, with no exchange.
            assert wait_for(lambda: stored_collectives(stack, job) >= 80, 60), stack.logs()
            time.sleep(2 * PUSH_S)
            subprocess.run([*down, "up"], check=True)
            result = cluster.wait()
        assert result.ok, result.describe()
        assert stack.wait_judged(job, result), stack.logs()
        assert "node node1's clock is not known yet" in stack.fleetd.log(), \
            "node1's events all came after its first exchange: nothing was judged unclocked"
        offset = metric(stack.fleet_port, "ingero_fleet_clock_offset_seconds", node="node1")
        assert abs(offset - AHEAD_S) <= 0.005, offset
        verdicts = stack.tool("find_stragglers", job=job)["verdicts"]
        assert [(v["rank"], v["node"], v["cause"]) for v in verdicts] == \
            [(late, "node1", "host_work")], why(verdicts, stack.logs())
        assert abs(verdicts[0]["lag_p50_ms"] - delay_ms) <= 0.15 * delay_ms, verdicts[0]
    finally:
        stack.stop()


@pytest.fixture
def small_filesystem():
    """A 256 KiB tmpfs, where fleetd's spool will live."""
    root = Path(tempfile.mkdtemp(prefix="ingero-full-"))
    root.chmod(0o755)
    (root / "fleetd-spool").mkdir(mode=0o700)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs",
                    str(root / "fleetd-spool")], check=True)
    yield root
    subprocess.run(["umount", "-l", str(root / "fleetd-spool")], capture_output=True)
    shutil.rmtree(root, ignore_errors=True)


def spool_drops(stack: Stack, cls: str) -> float:
    """Rows fleetd's spool dropped of class ``cls``, for every reason."""
    return sum(value for (name, labels), value in scrape(stack.fleet_port).items()
               if name == "ingero_fleet_spool_dropped_rows_total" and dict(labels)["class"] == cls)


def test_a_full_spool_drops_events_first_keeps_verdicts_and_the_daemons_run(small_filesystem):
    """echod is down while a job with a late rank runs, and fleetd's spool sits on a 256 KiB
    filesystem: it fills, raw events are dropped and counted, the verdicts are kept, fleetd and
    the agent keep running; when echod comes back the spool drains and the verdict is there."""
    root = small_filesystem
    sim.build()
    stack = Stack(root, 1, push_s=PUSH_S, fleet_flags=("--forward-resend-after", str(RESEND_S)),
                  echod_root=root / "echod")
    job = "7003"
    spec = scenarios.parse({"name": "full", "job": {
        "nodes": 1, "ranks_per_node": 4, "steps": 700, "step_ms": 20, "timeout_s": 240,
        "allreduce_bytes": 1 << 20, "job_id": job}, "stragglers": [
        {"rank": LATE_RANK, "kind": "host_delay", "delay_ms": DELAY_MS}]})
    try:
        echod = stack.echod.daemon
        echod.process.kill()
        echod.process.wait()
        with Cluster(spec, root / "job") as cluster:
            assert wait_for(lambda: spool_drops(stack, "events") > 0, 120), stack.logs()
            result = cluster.wait()
        assert result.ok, result.describe()
        time.sleep(3 * PUSH_S)
        assert stack.fleetd.alive() and stack.agents[0].alive(), stack.logs()
        dropped = {cls: spool_drops(stack, cls) for cls in ("events", "health", "verdicts")}
        assert dropped["events"] > 0 and dropped["verdicts"] == 0, dropped
        listening = stack.echod.daemon.log().count("ingest listening")   # one log, appended
        stack.echod.daemon, _ = kill_and_restart(echod, 0)
        assert wait_for(lambda: stack.echod.daemon.log().count("ingest listening") > listening,
                        120), stack.echod.daemon.log()
        assert wait_for(lambda: LATE_RANK in {v["rank"] for v in stack.tool(
            "find_stragglers", job=job)["verdicts"]}, 60), stack.logs()
        print(f"drill: spool on a full 256 KiB tmpfs, echod down | dropped {dropped['events']:.0f}"
              f" event rows, {dropped['health']:.0f} health rows, 0 verdict rows | fleetd and "
              f"ingerod up | the verdict stored once echod was back")
    finally:
        stack.stop()
