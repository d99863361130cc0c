"""Helpers the end-to-end tests share: reading a daemon's /metrics, producing and forwarding
batches, and echod with its API (TLS, tokens, seeded evidence)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} from /metrics; {} while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except ConnectionRefusedError:
        return {}
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return {}
        raise
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(port: int, name: str, **labels) -> float:
    return scrape(port).get((name, tuple(sorted(labels.items()))), 0.0)


class Producer:
    """A node pushing batches of events to fleetd over the real protocol, as ingerod does."""

    SIGNALS = {"throughput": 0.9, "compute": 0.9, "memory": 0.9, "cpu": 0.9}

    def __init__(self, endpoint: str, keys, node: str, cluster: str = "ingest"):
        import uuid

        import zmq

        from ingero import curve

        self.node, self.cluster, self.boot = node, cluster, uuid.uuid4().hex[:8]
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.DEALER)
        self.socket.linger = 0
        curve.connect_curve(self.socket, curve.load_keypair(keys.agent_secret),
                            curve.load_public(keys.fleet_public))
        self.socket.connect(endpoint)
        self.seq = self.next_event = 0
        self.acked: set[int] = set()

    def push(self, events: int, **attrs) -> None:
        import time

        from ingero import wire

        batch = [{"id": f"{self.node}:{self.boot}:{self.next_event + i}", "t": time.time(),
                  "kind": "collective", "attrs": {"op": "ncclAllReduce", "bytes": 4096, **attrs}}
                 for i in range(events)]
        self.next_event += events
        message = wire.Push(self.seq, self.node, self.cluster, self.boot, 0.9, self.SIGNALS,
                            "active", time.time(), 1.0, None, None, batch)
        self.socket.send_multipart(wire.encode(message))
        self.seq += 1

    def collect_acks(self, timeout: float) -> int:
        """Read replies for up to ``timeout`` seconds; returns how many pushes are acked."""
        import time

        from ingero import wire

        deadline = time.monotonic() + timeout
        while len(self.acked) < self.seq and time.monotonic() < deadline:
            if self.socket.poll(50):
                reply = wire.decode(self.socket.recv_multipart())
                if isinstance(reply, wire.Reply):
                    self.acked.add(reply.ack)
        return len(self.acked)

    def close(self) -> None:
        self.socket.close()
        self.context.term()


def forward(keys, endpoint, message):
    """Send one batch as fleetd would, and wait for echod's acknowledgement."""
    import zmq

    from ingero import curve, wire

    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    curve.connect_curve(socket, curve.load_keypair(keys.fleet_secret),
                        curve.load_public(keys.echod_public))
    socket.connect(endpoint)
    try:
        socket.send_multipart(wire.encode(message))
        assert socket.poll(30_000), "echod did not acknowledge"
        return wire.decode(socket.recv_multipart())
    finally:
        socket.close()
        context.term()


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, and its key (openssl, as an operator would)."""
    cert, key = directory / "echod.crt", directory / "echod.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2", "-subj",
                    "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


class EchodApi:
    """echod with its HTTP API on an embedded PostgreSQL, TLS, and tokens made with
    'echod token create'; ``stop()`` takes it all down."""

    def __init__(self, keys, *flags: str, tokens: dict[str, tuple[str, str]]):
        from ingero.launch import Daemon, free_port, wait_for

        self.root = Path(tempfile.mkdtemp(prefix="echod-api-test-"))
        self.root.chmod(0o755)
        self.keys = keys
        self.cert, self.key = self_signed(self.root)
        self.tokens_file = self.root / "tokens.yaml"
        self.audit_log = self.root / "audit.jsonl"
        self.tokens = {name: self.create_token(name, clusters, capabilities)
                       for name, (clusters, capabilities) in tokens.items()}
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.ingest = f"tcp://127.0.0.1:{free_port()}"
        self.daemon = Daemon.module("echod", "echod", [
            "--ingest-bind", self.ingest, "--state-dir", str(self.root / "state"),
            "--metrics-addr", "none", "--api-bind", f"127.0.0.1:{self.port}",
            "--tls-cert", str(self.cert), "--tls-key", str(self.key),
            "--tokens-file", str(self.tokens_file), "--audit-log", str(self.audit_log),
            *keys.echod_flags(), *flags], self.root)
        if not wait_for(lambda: "ingest listening" in self.daemon.log()
                        or not self.daemon.alive(), 120) or not self.daemon.alive():
            log = self.daemon.log()
            self.stop()
            raise AssertionError(f"echod did not start:\n{log}")

    def echod(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "echod", "--tokens-file",
                               str(self.tokens_file), *args], capture_output=True, text=True,
                              timeout=60)

    def create_token(self, name: str, clusters: str, capabilities: str) -> str:
        done = self.echod("token", "create", name, "--clusters", clusters, "--capabilities",
                          capabilities)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def request(self, method: str, path: str, token: str | None = None, **kw):
        import requests

        headers = kw.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return requests.request(method, self.url + path, headers=headers,
                                verify=str(self.cert), timeout=60, **kw)

    def audit(self) -> list[dict]:
        import json

        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines()]

    def hup(self) -> None:
        os.kill(self.daemon.process.pid, signal.SIGHUP)

    def stop(self) -> int:
        from echod.embedded import EmbeddedPostgres

        status = self.daemon.stop(60)
        EmbeddedPostgres(self.root / "state" / "postgres").stop()
        shutil.rmtree(self.root, ignore_errors=True)
        return status
