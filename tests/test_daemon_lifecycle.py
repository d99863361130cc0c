"""systemd readiness and watchdog over a real NOTIFY_SOCKET; SIGTERM drains and exits 0."""

import socket
import time

import pytest

from stack.launch import wait_for


@pytest.fixture
def notify_socket(tmp_path):
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.1)
    yield path, sock
    sock.close()


def received(sock) -> list[str]:
    messages = []
    while True:
        try:
            messages += sock.recv(4096).decode().splitlines()
        except (socket.timeout, BlockingIOError):
            return messages


def lifecycle(spawn, name, module, args, notify_socket):
    path, sock = notify_socket
    daemon = spawn(name, module, args, env={"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "400000"})
    seen = []
    assert wait_for(lambda: (seen.extend(received(sock)) or "READY=1" in seen), 20), daemon.log()
    time.sleep(0.7)
    seen += received(sock)
    assert seen.count("WATCHDOG=1") >= 2, seen
    assert daemon.stop() == 0, daemon.log()
    seen += received(sock)
    assert seen.index("READY=1") < seen.index("STOPPING=1")
    return daemon


def test_fleetd_notifies_and_stops_cleanly(spawn, keys, endpoint, notify_socket):
    daemon = lifecycle(spawn, "fleetd", "fleetd", ["--bind", endpoint, "--metrics-addr", "none",
                                                   *keys.fleetd_flags()], notify_socket)
    assert "drained; exiting" in daemon.log()


def test_ingerod_notifies_and_drains_on_sigterm(spawn, keys, endpoint, notify_socket):
    spawn("fleetd", "fleetd", ["--bind", endpoint, "--metrics-addr", "none",
                               *keys.fleetd_flags()])
    daemon = lifecycle(spawn, "ingerod", "ingerod", [
        "--source", "synthetic", "--fleet", endpoint, "--push-interval", "0.2",
        "--metrics-addr", "none", *keys.ingerod_flags()], notify_socket)
    assert "stopping: all acked" in daemon.log()


def test_without_notify_socket_nothing_is_sent(spawn, keys, endpoint):
    daemon = spawn("fleetd", "fleetd", ["--bind", endpoint, "--metrics-addr", "none",
                                        *keys.fleetd_flags()])
    assert wait_for(lambda: "listening on" in daemon.log(), 20)
    assert daemon.stop() == 0


def test_echod_migrating_a_store_with_data_keeps_systemd_waiting(spawn, keys, endpoint, engine,
                                                                 notify_socket):
    """Under Type=notify, a migration longer than TimeoutStartSec would be killed and tried
    again forever: echod asks for more time (EXTEND_TIMEOUT_USEC) before it migrates, and
    says READY only once the store, its rows kept, is at the head revision."""
    from alembic import command
    from sqlalchemy import text

    from echod.store.db import alembic_config, head_revision, status
    from echod.store.writer import write_batch

    now = time.time()
    write_batch(engine, {"events": [{
        "id": "n1:slurm:77:job_start", "t": now - 60, "kind": "job_start", "cluster": "alpha",
        "node": "n1", "job": "77", "attrs": {"user": "alice", "ntasks": 8}}]})
    with engine.begin() as connection:
        command.downgrade(alembic_config(connection), "0010")
    assert status(engine)[0] == "0010"
    path, sock = notify_socket
    daemon = spawn("echod", "echod", [
        "--dsn", engine.url.render_as_string(hide_password=False), "--ingest-bind", endpoint,
        "--api-bind", "none", "--metrics-addr", "none", *keys.echod_flags()],
        env={"NOTIFY_SOCKET": str(path)})
    seen = []
    assert wait_for(lambda: (seen.extend(received(sock)) or "READY=1" in seen), 60), daemon.log()
    extend = next(i for i, line in enumerate(seen) if line.startswith("EXTEND_TIMEOUT_USEC="))
    assert int(seen[extend].partition("=")[2]) >= 10_000_000, seen
    assert seen[extend + 1] == f"STATUS=migrating the schema to {head_revision()}", seen
    assert extend < seen.index("READY=1"), seen
    assert status(engine)[0] == head_revision()
    with engine.connect() as connection:
        assert connection.execute(text(
            'SELECT "user", ntasks, restarts FROM jobs WHERE id = \'77\'')).one() == (
            "alice", 8, 0)
    assert daemon.stop() == 0, daemon.log()
