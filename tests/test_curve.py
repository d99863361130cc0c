"""CurveZMQ by default: unknown keys and plaintext are refused; the opt-out is a named flag."""

import subprocess
import sys

from ingero import curve
from ingero.stack.launch import free_port, wait_for

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
