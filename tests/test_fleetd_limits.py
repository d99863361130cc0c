"""fleetd raises its descriptor limit for a large fleet, and says when it cannot; past
saturation its tick still ends."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from fleetd.limits import HEADROOM, raise_nofile
from fleetd.server import SERVE_BATCH, SERVE_LEAST_S, SERVE_RATIO, FleetServer
from ingero.router import BACKLOG
from stack.launch import free_port, wait_for


def limits(soft, hard, fail=False):
    state = {"now": (soft, hard)}

    def get(_):
        return state["now"]

    def put(_, value):
        if fail:
            raise ValueError("not allowed")
        state["now"] = value
    return state, get, put


def test_the_soft_limit_goes_up_to_the_hard_one():
    state, get, put = limits(1024, 65536)
    assert raise_nofile(10_000, get, put) == (1024, 65536, None)
    assert state["now"] == (65536, 65536)


def test_an_unlimited_hard_limit_gives_what_the_fleet_needs():
    state, get, put = limits(1024, resource.RLIM_INFINITY)
    assert raise_nofile(10_000, get, put)[1] == 10_000 + HEADROOM


def test_a_hard_limit_short_of_the_fleet_is_named_with_its_fix():
    _, get, put = limits(1024, 4096)
    before, now, warning = raise_nofile(10_000, get, put)
    assert (before, now) == (1024, 4096)
    assert "10000 agents" in warning and "LimitNOFILE=" in warning and "10256" in warning
    _, get, put = limits(1024, 65536, fail=True)
    assert raise_nofile(10_000, get, put)[1] == 1024


def test_fleetd_under_a_low_hard_limit_raises_its_soft_one_and_warns(tmp_path):
    log = tmp_path / "fleetd.log"
    with open(log, "wb") as out:
        fleetd = subprocess.Popen(
            ["prlimit", "--nofile=512:4096", sys.executable, "-m", "fleetd", "--config",
             "/dev/null", "--bind", f"tcp://127.0.0.1:{free_port()}", "--metrics-addr", "none",
             "--insecure-plaintext-zmq"], stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: "listening on" in log.read_text(), 60), log.read_text()
        limit = open(f"/proc/{fleetd.pid}/limits").read()
        assert any(line.startswith("Max open files") and line.split()[3] == "4096"
                   for line in limit.splitlines()), limit
    finally:
        fleetd.terminate()
        assert fleetd.wait(30) == 0
    text = log.read_text()
    assert "soft limit 4096 (raised from 512)" in text
    assert "may serve 10000 agents" in text and "LimitNOFILE=" in text


AGENTS, PROCESSES = 10_000, 4


def test_fleetd_holds_10000_connected_agents_and_still_answers(tmp_path, keys):
    """fleetd started with the usual soft limit of 1024 (and the hard limit this machine allows,
    as LimitNOFILE= sets it) raises its own limit, welcomes 10,000 CURVE agents (four client
    processes of 2,500 sockets) holding their connections open, and a push from one more is
    still answered. Its listening socket queues 4,096 connections (ZeroMQ's default of 100
    overflowed as the agents connected at once: their SYNs dropped, each retried 1, 3, 7 s
    later, and the drill took four times as long)."""
    from .support import Producer

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    hard = 65536 if hard == resource.RLIM_INFINITY else hard
    assert hard >= AGENTS + HEADROOM + 64, f"this machine's hard limit {hard} is too low"

    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    log = tmp_path / "fleetd.log"
    with open(log, "wb") as out:
        fleetd = subprocess.Popen(
            ["prlimit", f"--nofile=1024:{hard}", sys.executable, "-m", "fleetd", "--config",
             "/dev/null", "--bind", endpoint, "--metrics-addr", "none", "--log-level",
             "warning", "--max-nodes", str(AGENTS + 100), *keys.fleetd_flags()],
            stdout=out, stderr=subprocess.STDOUT)
    clients = []
    try:
        queue = wait_for(lambda: accept_queue(port), 30)
        assert queue == min(BACKLOG, somaxconn()), (queue, log.read_text()[-3000:])
        for _ in range(PROCESSES):
            clients.append(subprocess.Popen(
                ["prlimit", f"--nofile={hard}:{hard}", sys.executable, "-m", "tests.many_agents",
                 endpoint, str(keys.agent_secret), str(keys.fleet_public),
                 str(AGENTS // PROCESSES)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True))
        welcomed = sum(int(client.stdout.readline() or 0) for client in clients)
        assert welcomed == AGENTS, log.read_text()[-3000:]
        assert fleetd.poll() is None, log.read_text()[-3000:]
        descriptors = len(list(Path(f"/proc/{fleetd.pid}/fd").iterdir()))
        assert descriptors > AGENTS, descriptors
        one_more = Producer(endpoint, keys, "one-more")
        try:
            one_more.push(5)
            assert one_more.collect_acks(30) == 1
        finally:
            one_more.close()
        assert "Too many open files" not in log.read_text()
        print(f"drill: {AGENTS} agents connected | fleetd descriptors {descriptors} | "
              f"welcomed {welcomed} | one more push answered")
    finally:
        for client in clients:
            client.stdin.close()
            client.wait(60)
        fleetd.terminate()
        assert fleetd.wait(60) == 0, log.read_text()[-3000:]


def somaxconn() -> int:
    return int(Path("/proc/sys/net/core/somaxconn").read_text())


def accept_queue(port: int) -> int | None:
    """The accept queue the kernel gives the socket listening on ``port`` (ss's Send-Q)."""
    fields = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True,
                            text=True).stdout.split()     # State Recv-Q Send-Q Local Peer
    return int(fields[2]) if fields else None


def serving(monkeypatch, waiting: list[int], judged_s: float = 0.0) -> list[int]:
    """A tick's stop to serve after ``judged_s`` of judging, on a server whose socket has
    ``waiting`` messages (a number per read; then always more), each read taking 1 ms of a
    clock of the test's own: what the stop asked for."""
    clock = [100.0]
    monkeypatch.setattr("fleetd.server.time", SimpleNamespace(perf_counter=lambda: clock[0]))
    server = FleetServer.__new__(FleetServer)      # no socket: only its serving loop
    asked = []

    def drain(most):
        asked.append(most)
        assert len(asked) < 10_000, "the stop never ends"
        clock[0] += 0.001
        return waiting.pop(0) if waiting else most

    server.drain, server.answer = drain, lambda: None
    server.served = clock[0] - judged_s
    server.serve_waiting()
    return asked


def test_past_saturation_a_stop_of_the_tick_serves_a_bounded_time_and_the_tick_goes_on(
        monkeypatch):
    asked = serving(monkeypatch, [])        # pushes always waiting: the fleet's too big
    assert set(asked) == {SERVE_BATCH} and len(asked) == round(SERVE_LEAST_S / 0.001)
    asked = serving(monkeypatch, [], judged_s=0.005)     # a job took 5 ms to judge
    assert len(asked) == round(0.005 * SERVE_RATIO / 0.001)
    asked = serving(monkeypatch, [SERVE_BATCH, 3, 0])    # the queue empties: it stops at once
    assert len(asked) == 3
