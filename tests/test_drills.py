"""Fault drills on the real product: a sim job traced by a node-wide ingerod (real bcc), fleetd
spooling to echod on its private PostgreSQL, and, while the job runs, kill -9 of fleetd, then of
echod, then of PostgreSQL, each brought back (by the test, as systemd would; PostgreSQL by
echod itself). Every collective the ranks made is stored exactly once, nothing is counted as
dropped, and detection and storage resume after each fault.
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import text

import sim
from echod.db import make_engine
from echod.embedded import EmbeddedPostgres
from ingero.launch import Daemon, wait_for
from ingero.stack import Stack
from sim import scenario as scenarios
from sim.cluster import Cluster
from sim.records import read_record

from .support import metric, needs_ebpf

pytestmark = [pytest.mark.slow, needs_ebpf]

PUSH_S = 1.0
RESEND_S = 1.0
LATE_RANK, DELAY_MS = 3, 40


def kill_and_restart(daemon: Daemon, down_s: float = 2.0) -> tuple[Daemon, float]:
    """kill -9, a pause, the same command again; returns the new daemon and when it started."""
    daemon.process.kill()
    daemon.process.wait()
    time.sleep(down_s)
    return Daemon(daemon.name, daemon.argv, daemon.log_path.parent,
                  module=daemon.module), time.time()


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
            stack.echod.daemon, back = kill_and_restart(stack.echod.daemon)
            assert wait_for(lambda: "ingest listening" in stack.echod.daemon.log(), 120), \
                stack.echod.daemon.log()
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
        for dropped in ("ingero_fleet_spool_dropped_rows_total",):
            assert metric(stack.fleet_port, dropped) in (None, 0), dropped
        # detection resumed: the new fleetd named the late rank again, from what came after
        verdicts = stack.tool("find_stragglers", job=job)["verdicts"]
        raised = [datetime.fromisoformat(v["raised"]).timestamp() for v in verdicts
                  if v["rank"] == LATE_RANK]
        assert any(t > fleetd_back for t in raised), (verdicts, stack.logs())
        print(f"drill: resumed after fleetd {resumed['fleetd']:.1f}s, echod "
              f"{resumed['echod']:.1f}s, postgres {resumed['postgres']:.1f}s; "
              f"{issued} collectives stored once each")
        for what, seconds in resumed.items():   # two intervals, each a push and a resend
            assert seconds <= 2 * (PUSH_S + RESEND_S), (what, seconds)
    finally:
        engine.dispose()
        stack.stop()
