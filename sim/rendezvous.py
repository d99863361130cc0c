"""The TCP rendezvous coordinator, for ranks that live in different network namespaces.

Each rank's libnccl opens one connection per communicator and speaks text lines (see
sim/src/rdv_tcp.c): JOIN, then ARRIVE <key> <arrival_ns> <payload> whenever its virtual GPU
reaches a collective or a transfer. When every participant of a key has arrived the coordinator
answers DONE <key> <latest arrival> [payloads by rank] to each of them. It keeps no clock of
its own: arrival times are the ranks' CLOCK_MONOTONIC, shared by all namespaces of a machine.

Run as `python -m sim.rendezvous --listen 127.0.0.1:0`; it prints `listening tcp://HOST:PORT`.
"""

from __future__ import annotations

import argparse
import selectors
import signal
import socket
import sys
from dataclasses import dataclass, field

POLL_SECONDS = 0.5


@dataclass
class Member:
    """One rank's connection for one communicator."""
    sock: socket.socket
    buffer: bytes = b""
    comm_hash: str | None = None
    rank: int = -1


@dataclass
class Communicator:
    nranks: int
    members: dict[int, Member] = field(default_factory=dict)
    arrivals: dict[str, list[tuple[int, int, int]]] = field(default_factory=dict)

    def participants(self, key: str) -> list[int]:
        """Who must arrive at a key: every rank for c<seq>, the two ends for p<src>.<dst>.<seq>."""
        if key.startswith("p"):
            src, dst, _ = key[1:].split(".")
            return [int(src), int(dst)]
        return list(range(self.nranks))


class Coordinator:
    """A single-threaded selector loop; each message is small and handled at once."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.listener = socket.create_server((host, port), reuse_port=False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.communicators: dict[str, Communicator] = {}
        self.stopping = False

    @property
    def address(self) -> str:
        host, port = self.listener.getsockname()[:2]
        return f"{host}:{port}"

    def serve(self) -> None:
        while not self.stopping:
            for key, _ in self.selector.select(timeout=POLL_SECONDS):
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._read(key.data)
        self.selector.close()
        self.listener.close()

    def _accept(self) -> None:
        sock, _ = self.listener.accept()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.selector.register(sock, selectors.EVENT_READ, Member(sock))

    def _read(self, member: Member) -> None:
        try:
            data = member.sock.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(member)
            return
        member.buffer += data
        *lines, member.buffer = member.buffer.split(b"\n")
        for line in lines:
            self._dispatch(member, line.decode(errors="replace").split())

    def _dispatch(self, member: Member, words: list[str]) -> None:
        handlers = {"JOIN": self._join, "ARRIVE": self._arrive}
        handler = handlers.get(words[0]) if words else None
        if handler is None:
            self._send(member, f"ERROR unknown message {' '.join(words)[:80]!r}")
            return
        try:
            handler(member, words[1:])
        except (ValueError, IndexError, KeyError) as exc:
            self._send(member, f"ERROR malformed {words[0]}: {exc}")

    def _join(self, member: Member, args: list[str]) -> None:
        comm_hash, nranks, rank = args[0], int(args[1]), int(args[2])
        comm = self.communicators.setdefault(comm_hash, Communicator(nranks))
        if comm.nranks != nranks or not 0 <= rank < nranks or rank in comm.members:
            self._send(member, f"ERROR rank {rank} of {nranks} does not fit communicator "
                               f"{comm_hash} ({comm.nranks} ranks, joined {sorted(comm.members)})")
            return
        member.comm_hash, member.rank = comm_hash, rank
        comm.members[rank] = member
        if len(comm.members) == comm.nranks:
            for peer in comm.members.values():
                self._send(peer, "READY")

    def _arrive(self, member: Member, args: list[str]) -> None:
        comm = self.communicators[member.comm_hash]
        key, arrival, payload = args[0], int(args[1]), int(args[2])
        arrived = comm.arrivals.setdefault(key, [])
        arrived.append((member.rank, arrival, payload))
        participants = comm.participants(key)
        if len(arrived) < len(participants):
            return
        del comm.arrivals[key]
        latest = max(a for _, a, _ in arrived)
        message = f"DONE {key} {latest}"
        if key.startswith("c"):
            message += "".join(f" {p}" for _, _, p in sorted(arrived))
        for rank in sorted(set(participants)):
            if rank in comm.members:
                self._send(comm.members[rank], message)

    def _send(self, member: Member, line: str) -> None:
        try:
            member.sock.sendall(line.encode() + b"\n")
        except OSError:
            self._drop(member)

    def _drop(self, member: Member) -> None:
        try:
            self.selector.unregister(member.sock)
        except (KeyError, ValueError):
            return
        member.sock.close()
        comm = self.communicators.get(member.comm_hash or "")
        if comm and comm.members.get(member.rank) is member:
            del comm.members[member.rank]
            if not comm.members:
                del self.communicators[member.comm_hash]


def split_address(text: str) -> tuple[str, int]:
    host, _, port = text.removeprefix("tcp://").rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sim.rendezvous",
        description="TCP rendezvous coordinator for sim ranks in separate network namespaces.",
        epilog="example: python -m sim.rendezvous --listen 127.0.0.1:0")
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on")
    args = parser.parse_args(argv)
    coordinator = Coordinator(*split_address(args.listen))

    def stop(signum, frame):
        coordinator.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"listening tcp://{coordinator.address}", flush=True)
    coordinator.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
