"""A one-shot client for fleetd's threshold query, for the CLI, the demo and scripts."""

from __future__ import annotations

import time

import zmq

from ingero import curve, wire
from ingero.errors import IngeroError


class FleetUnreachable(IngeroError):
    """fleetd did not answer in time."""


def query(endpoint: str, cohort: str, keys: tuple[tuple[bytes, bytes], bytes] | None,
          timeout: float = 2.0, context: zmq.Context | None = None) -> wire.Status:
    """Ask fleetd for one cohort's threshold and stragglers; ``keys`` None means plaintext."""
    context = context or zmq.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    try:
        if keys is not None:
            curve.connect_curve(socket, *keys)
        socket.connect(endpoint)
        socket.send_multipart(wire.encode(wire.Query(cohort)))
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not socket.poll(int(left * 1000) + 1, zmq.POLLIN):
                break
            message = wire.decode(socket.recv_multipart())
            if isinstance(message, wire.Status):
                return message
        raise FleetUnreachable(f"fleetd at {endpoint} did not answer within {timeout:g}s")
    finally:
        socket.close()
