"""Real fleetd, real agents, real sockets on loopback."""

import re
import subprocess
import sys
import time

from ingero.command import fleetclient
from stack.launch import free_port, wait_for

from .support import metric

PUSH = 1.0


def fleetd_args(endpoint, keys, metrics_port, *extra):
    return ["--bind", endpoint, "--metrics-addr", f"127.0.0.1:{metrics_port}",
            "--recompute-interval", "0.1", *keys.fleetd_flags(), *extra]


def agent_args(endpoint, keys, node, score_file, metrics="none", *extra):
    return ["--source", "synthetic", "--score-file", str(score_file), "--node", node,
            "--cluster", "e2e", "--fleet", endpoint, "--push-interval", str(PUSH),
            "--heartbeat-interval", "0.1", "--liveness", "3", "--reconnect-max", "0.25",
            "--warmup", "1", "--metrics-addr", metrics, *keys.ingerod_flags(), *extra]


def status(endpoint, keys):
    try:
        return fleetclient.query(endpoint, "cluster:e2e", keys.client_keys(), timeout=1.0)
    except fleetclient.FleetUnreachable:
        return None


def test_twenty_agents_one_drops_and_only_it_is_flagged(spawn, keys, endpoint, tmp_path):
    fleet_metrics = free_port()
    fleetd = spawn("fleetd", "fleetd", fleetd_args(endpoint, keys, fleet_metrics))
    names = [f"node{i:02d}" for i in range(20)]
    for i, name in enumerate(names):
        (tmp_path / name).write_text(f"{0.88 + 0.002 * i}\n")
        spawn(name, "ingerod", agent_args(endpoint, keys, name, tmp_path / name))
    ready = wait_for(lambda: (s := status(endpoint, keys)) and s.active_nodes == 20
                     and s.quorum_met and s, 60)
    assert ready, fleetd.log()
    assert ready.stragglers == [] and 0.85 < ready.threshold < ready.median

    victim = "node07"
    (tmp_path / victim).write_text("0.5\n")
    dropped = time.monotonic()
    flagged = wait_for(lambda: (s := status(endpoint, keys)) and s.stragglers and s, 10, 0.02)
    elapsed = time.monotonic() - dropped
    assert flagged and flagged.stragglers == [victim]
    assert elapsed <= 2 * PUSH, f"flagged after {elapsed:.2f}s, more than two push intervals"

    time.sleep(2 * PUSH)
    assert status(endpoint, keys).stragglers == [victim]
    assert metric(fleet_metrics, "ingero_fleet_straggler_flags_total", cluster="e2e") == 1
    flagged_lines = re.findall(r"straggler: node (\S+)", fleetd.log())
    assert flagged_lines == [victim]
    assert metric(fleet_metrics, "ingero_fleet_active_nodes", cohort="cluster:e2e") == 20
    assert metric(fleet_metrics, "ingero_fleet_stragglers", cohort="cluster:e2e") == 1

    cli = subprocess.run([sys.executable, "-m", "ingero", "threshold", "--fleet", endpoint,
                          "--cohort", "cluster:e2e", "--secret-key", str(keys.agent_secret),
                          "--fleet-public-key", str(keys.fleet_public)],
                         capture_output=True, text=True, timeout=30)
    assert cli.returncode == 0, cli.stderr
    assert re.search(r"stragglers\s+node07\n", cli.stdout) and "active      20\n" in cli.stdout
    unknown = subprocess.run([sys.executable, "-m", "ingero", "threshold", "--fleet", endpoint,
                              "--cohort", "job:nope", "--secret-key", str(keys.agent_secret),
                              "--fleet-public-key", str(keys.fleet_public)],
                             capture_output=True, text=True, timeout=30)
    assert unknown.returncode == 1 and "knows no cohort 'job:nope'" in unknown.stderr


def accepted_pushes(log: str) -> list[tuple[str, str, str]]:
    return re.findall(r"accepted push node=(\S+) boot=(\S+) seq=(\d+)", log)


def mode_of(port):
    for mode in ("fleet", "fleet-cached", "local-baseline", "none"):
        if metric(port, "ingero_agent_detection_mode", mode=mode) == 1:
            return mode


def test_kill_9_fleetd_agents_degrade_then_recover(spawn, keys, endpoint, tmp_path):
    fleet_metrics = free_port()
    fleet_args = fleetd_args(endpoint, keys, fleet_metrics, "--log-level", "debug")
    first = spawn("fleetd-1", "fleetd", fleet_args)
    ports = {}
    for i in range(6):
        name = f"node{i}"
        (tmp_path / name).write_text("0.9\n")
        ports[name] = free_port()
        spawn(name, "ingerod", agent_args(endpoint, keys, name, tmp_path / name,
                                          f"127.0.0.1:{ports[name]}"))
    assert wait_for(lambda: all(mode_of(p) == "fleet" for p in ports.values()), 60), first.log()

    first.kill()
    killed = time.monotonic()
    cached = wait_for(lambda: all(mode_of(p) == "fleet-cached" for p in ports.values()), 10, 0.02)
    assert cached and time.monotonic() - killed <= PUSH, "agents did not degrade within a push"
    time.sleep(2 * PUSH)  # agents keep pushing into their queues while fleetd is away
    assert all(mode_of(p) == "fleet-cached" for p in ports.values())

    second = spawn("fleetd-2", "fleetd", fleet_args)
    assert wait_for(lambda: metric(fleet_metrics, "ingero_fleet_frames_received_total"), 10)
    back = time.monotonic()
    recovered = wait_for(lambda: all(mode_of(p) == "fleet" for p in ports.values())
                         and (s := status(endpoint, keys)) and s.quorum_met, 10, 0.02)
    assert recovered and time.monotonic() - back <= 2 * PUSH, second.log()

    resent = sum(metric(p, "ingero_agent_batches_resent_total") for p in ports.values())
    assert resent > 0, "the batches pushed while fleetd was away were not resent"
    accepted = accepted_pushes(first.log()) + accepted_pushes(second.log())
    assert len(accepted) == len(set(accepted)), "a resent batch was counted twice"
    for name in ports:
        seqs = sorted(int(seq) for node, _boot, seq in accepted if node == name)
        assert seqs == list(range(len(seqs))), f"{name} lost a batch: {seqs}"
