"""Helpers the end-to-end tests share: reading a daemon's /metrics."""

from __future__ import annotations

import urllib.error
import urllib.request

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
