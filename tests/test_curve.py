"""CurveZMQ by default: unknown keys and plaintext are refused; the opt-out is a named flag."""

import subprocess
import sys

from ingero import curve
from stack.launch import KeyRing, free_port, wait_for

from .support import metric


def agent(spawn, name, endpoint, metrics_port, *security):
    return spawn(name, "ingerod", [
        "--source", "synthetic", "--node", name, "--cluster", "sec", "--fleet", endpoint,
        "--push-interval", "0.2", "--heartbeat-interval", "0.1", "--reconnect-max", "0.5",
        "--metrics-addr", f"127.0.0.1:{metrics_port}", *security])


def fleetd(spawn, endpoint, metrics_port, *security):
    return spawn("fleetd", "fleetd", ["--bind", endpoint,
                                      "--metrics-addr", f"127.0.0.1:{metrics_port}", *security])


def test_authorised_agent_is_served_and_unknown_key_is_refused(spawn, keys, endpoint, tmp_path):
    fleet_port, good_port, bad_port = free_port(), free_port(), free_port()
    server = fleetd(spawn, endpoint, fleet_port, *keys.fleetd_flags())
    stranger_public, stranger_secret = curve.generate(tmp_path / "stranger", "stranger")
    agent(spawn, "good", endpoint, good_port, *keys.ingerod_flags())
    stranger = agent(spawn, "stranger", endpoint, bad_port, "--secret-key", str(stranger_secret),
                     "--fleet-public-key", str(keys.fleet_public))

    assert wait_for(lambda: metric(good_port, "ingero_agent_fleet_reachable") == 1, 20)
    assert wait_for(lambda: metric(fleet_port, "ingero_fleet_auth_refused_total") >= 1, 20)
    assert wait_for(lambda: metric(bad_port, "ingero_agent_handshake_failures_total") >= 1, 20)
    assert metric(bad_port, "ingero_agent_fleet_reachable") == 0
    assert metric(bad_port, "ingero_agent_queue_depth") > 0, "nothing of the stranger's was acked"
    assert "refused this agent's key" in stranger.log()
    assert "hello from node stranger" not in server.log()
    assert "hello from node good" in server.log()


def test_a_key_speaks_only_for_the_node_and_cluster_it_is_authorised_as(
        spawn, endpoint, tmp_path):
    """n1's key, stolen, pushes as n3, and n2's (authorised as n2@sec) as n2 of another
    cluster: both refused and counted, while each key's own node is served."""
    keys = KeyRing.create(tmp_path / "keys", nodes=("n1", "n2@sec"))
    fleet_port = free_port()
    server = fleetd(spawn, endpoint, fleet_port, *keys.fleetd_flags())
    assert "--insecure-any-node-key" not in keys.fleetd_flags()
    ports = {name: free_port() for name in ("n1", "n3", "n2", "n2-other")}
    for name, node, cluster, key in (("n1", "n1", "sec", "n1"), ("n3", "n3", "sec", "n1"),
                                     ("n2", "n2", "sec", "n2@sec"),
                                     ("n2-other", "n2", "other", "n2@sec")):
        spawn(name, "ingerod", [
            "--source", "synthetic", "--node", node, "--cluster", cluster, "--fleet", endpoint,
            "--push-interval", "0.2", "--reconnect-max", "0.5",
            "--metrics-addr", f"127.0.0.1:{ports[name]}", *keys.ingerod_flags(key)])

    def heard(name: str) -> bool:
        return metric(ports[name], "ingero_agent_fleet_reachable") == 1
    assert wait_for(lambda: heard("n1") and heard("n2"), 30), server.log()
    assert wait_for(lambda: metric(fleet_port, "ingero_fleet_frames_rejected_total",
                                   reason="key_not_node") >= 4, 20), server.log()
    assert not heard("n3") and not heard("n2-other")
    assert metric(ports["n3"], "ingero_agent_queue_depth") > 0, "nothing of n3's was acked"
    log = server.log()
    assert "hello from node n1 " in log and "hello from node n2 (cluster sec" in log, log
    assert "hello from node n3" not in log and "(cluster other" not in log, log
    assert "the key authorised as n1 sent a Hello as node n3 of cluster sec" in log, log


def test_plaintext_agent_is_refused_by_a_curve_fleetd(spawn, keys, endpoint):
    fleet_port, plain_port = free_port(), free_port()
    server = fleetd(spawn, endpoint, fleet_port, *keys.fleetd_flags())
    plain = agent(spawn, "plain", endpoint, plain_port, "--insecure-plaintext-zmq")
    assert wait_for(lambda: metric(plain_port, "ingero_agent_handshake_failures_total") >= 1, 20)
    assert metric(plain_port, "ingero_agent_fleet_reachable") == 0
    assert "hello from node plain" not in server.log()
    assert "handshake with fleetd" in plain.log()


def test_plaintext_only_with_the_named_flag_on_both_ends(spawn, endpoint):
    fleet_port, agent_port = free_port(), free_port()
    server = fleetd(spawn, endpoint, fleet_port, "--insecure-plaintext-zmq")
    agent(spawn, "plain", endpoint, agent_port, "--insecure-plaintext-zmq")
    assert wait_for(lambda: metric(agent_port, "ingero_agent_fleet_reachable") == 1, 20)
    assert "neither authenticated nor encrypted" in server.log()


def run(module, *args):
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True,
                          timeout=30)


def test_without_keys_the_daemons_refuse_to_start_and_name_the_flag(tmp_path, endpoint):
    fleet = run("fleetd", "--bind", endpoint, "--metrics-addr", "none",
                "--secret-key", str(tmp_path / "missing.key_secret"))
    assert fleet.returncode != 0
    assert "missing.key_secret does not exist" in fleet.stderr and "keygen" in fleet.stderr
    node = run("ingerod", "--source", "synthetic", "--fleet", endpoint, "--metrics-addr", "none",
               "--secret-key", str(tmp_path / "missing.key_secret"))
    assert node.returncode != 0 and "does not exist" in node.stderr


def test_keygen_refuses_to_overwrite(tmp_path):
    first = run("fleetd", "keygen", "--dir", str(tmp_path), "--name", "f")
    assert first.returncode == 0 and (tmp_path / "f.key_secret").stat().st_mode & 0o077 == 0
    again = run("fleetd", "keygen", "--dir", str(tmp_path), "--name", "f")
    assert again.returncode != 0 and "--force" in again.stderr


def test_sighup_rereads_the_authorised_keys(spawn, keys, endpoint, tmp_path):
    import signal

    fleet_port, late_port = free_port(), free_port()
    server = fleetd(spawn, endpoint, fleet_port, *keys.fleetd_flags())
    late_public, late_secret = curve.generate(tmp_path / "late", "late")
    late = agent(spawn, "late", endpoint, late_port, "--secret-key", str(late_secret),
                 "--fleet-public-key", str(keys.fleet_public))
    assert wait_for(lambda: metric(fleet_port, "ingero_fleet_auth_refused_total") >= 1, 20)
    (keys.authorized / "late.key").write_bytes(late_public.read_bytes())
    server.process.send_signal(signal.SIGHUP)
    assert wait_for(lambda: metric(late_port, "ingero_agent_fleet_reachable") == 1, 20), late.log()
    assert "SIGHUP: 2 authorised agent key(s) loaded" in server.log()

    # revoked: its key out of the directory and SIGHUP, the connection it has goes unheard
    # (and its next handshake is refused), while an agent still authorised goes on
    good_port = free_port()
    agent(spawn, "good", endpoint, good_port, *keys.ingerod_flags())
    assert wait_for(lambda: metric(good_port, "ingero_agent_fleet_reachable") == 1, 20)
    refused = metric(fleet_port, "ingero_fleet_auth_refused_total")
    (keys.authorized / "late.key").unlink()
    server.process.send_signal(signal.SIGHUP)
    assert wait_for(lambda: metric(fleet_port, "ingero_fleet_frames_rejected_total",
                                   reason="revoked") >= 1, 20), server.log()
    assert wait_for(lambda: metric(late_port, "ingero_agent_fleet_reachable") == 0, 30), late.log()
    assert wait_for(lambda: metric(fleet_port, "ingero_fleet_auth_refused_total") > refused, 30)
    assert "no longer in" in server.log()
    assert metric(good_port, "ingero_agent_fleet_reachable") == 1      # heard all along
