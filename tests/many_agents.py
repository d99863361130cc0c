"""N agents' connections to fleetd from one process, for the descriptor drill: each a DEALER
socket with the agents' CURVE key that says Hello and waits for fleetd's Welcome. Prints the
number welcomed, then holds every connection open until its standard input closes.

    python -m tests.many_agents ENDPOINT AGENT_SECRET FLEET_PUBLIC N
"""

from __future__ import annotations

import resource
import sys
import time
import uuid
from pathlib import Path

import zmq

from ingero import __version__, curve, wire


def main(endpoint: str, secret: str, public: str, count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 2 descriptors a socket
    context = zmq.Context()
    context.max_sockets = count + 16
    keypair, server = curve.load_keypair(Path(secret)), curve.load_public(Path(public))
    poller = zmq.Poller()
    sockets = []
    for i in range(count):
        socket = context.socket(zmq.DEALER)
        socket.linger = 0
        curve.connect_curve(socket, keypair, server)
        socket.connect(endpoint)
        node = f"many-{uuid.uuid4().hex[:8]}-{i}"
        socket.send_multipart(wire.encode(wire.Hello(node, "many", uuid.uuid4().hex[:16], [],
                                                     1.0, __version__)), zmq.NOBLOCK)
        poller.register(socket, zmq.POLLIN)
        sockets.append(socket)
    welcomed, deadline = set(), time.monotonic() + 240
    while len(welcomed) < count and time.monotonic() < deadline:
        for socket, _ in poller.poll(1000):
            if isinstance(wire.decode(socket.recv_multipart()), wire.Welcome):
                welcomed.add(socket)
                poller.unregister(socket)
    print(len(welcomed), flush=True)
    sys.stdin.read()                      # hold the connections until told to go
    for socket in sockets:
        socket.close(linger=0)
    context.term()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
