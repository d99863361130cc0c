"""The ROUTER socket a daemon serves its peers on: CURVE by default, peers admitted by an
authorised-keys directory (fleetd's socket for agents, echod's for fleetd)."""

from __future__ import annotations

import logging

import zmq

from . import curve
from .errors import IngeroError

HWM = 10_000
# Connections the kernel queues for accept (capped by net.core.somaxconn, 4096 on Debian 12).
# ZeroMQ's default of 100 overflows when a fleet reconnects at once (after a restart of the
# daemon): the kernel drops the rest's SYNs and each retries a second, then 3, 7, 15 s later.
BACKLOG = 4096


class SecureRouter:
    def __init__(self, context: zmq.Context, cfg, peers: str, on_refused,
                 log: logging.Logger):
        """``cfg`` gives secret_key, authorized_keys, insecure_plaintext_zmq, max_frame_bytes;
        ``peers`` names who connects, for the logs."""
        self.context = context
        self.cfg = cfg
        self.peers = peers
        self.on_refused = on_refused
        self.log = log
        self.auth = None
        self.socket = None

    def open(self, bind: str) -> str:
        """Bind; returns the endpoint bound. Key and bind errors stop the daemon at start."""
        self.socket = socket = self.context.socket(zmq.ROUTER)
        socket.linger = 1000
        socket.sndhwm = socket.rcvhwm = HWM
        socket.backlog = BACKLOG
        socket.setsockopt(zmq.MAXMSGSIZE, self.cfg.max_frame_bytes + 1024)
        if self.cfg.insecure_plaintext_zmq:
            self.log.warning("--insecure-plaintext-zmq: %s connections are neither authenticated "
                             "nor encrypted", self.peers)
        else:
            keypair = curve.load_keypair(self.cfg.secret_key)
            self.auth = curve.FleetAuthenticator(self.context, self.on_refused)
            self.auth.start()
            count = self.auth.load(self.cfg.authorized_keys)
            self.log.info("CURVE on: %d authorised %s key(s) in %s", count, self.peers,
                          self.cfg.authorized_keys)
            curve.serve_curve(socket, keypair)
        try:
            socket.bind(bind)
        except zmq.ZMQError as exc:
            raise IngeroError(f"cannot bind {bind}: {exc}") from None
        return socket.getsockopt_string(zmq.LAST_ENDPOINT)

    def reload(self) -> None:
        """SIGHUP: re-read the authorised keys; on failure keep the ones loaded."""
        if self.auth is None:
            return
        try:
            count = self.auth.load(self.cfg.authorized_keys)
            self.log.info("SIGHUP: %d authorised %s key(s) loaded", count, self.peers)
        except IngeroError as exc:
            self.log.error("SIGHUP: could not reload authorised keys: %s", exc)

    def receive(self) -> tuple[list[bytes], str | None]:
        """One waiting message (zmq.Again when none) and the name its sender's key is
        authorised as (``curve.bound_to`` reads it): '' without CURVE, where anyone may send;
        None when its key is no longer authorised (taken out, then SIGHUP: that ends the say
        of the connection it already has, not only its next handshake). The first frame, the
        peer's routing id of a few bytes, is read as a zmq.Frame for its User-Id; the others
        are copied once."""
        first = self.socket.recv(zmq.NOBLOCK, copy=False)
        frames = [first.bytes]
        while self.socket.rcvmore:
            frames.append(self.socket.recv())
        return frames, self.sender(first)

    def sender(self, frame: zmq.Frame) -> str | None:
        if self.auth is None:
            return ""
        try:
            return self.auth.name_of(frame.get("User-Id"))
        except zmq.ZMQError:           # no User-Id: not a message ZAP let through
            return None

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close()
        if self.auth is not None:
            self.auth.stop()
