"""Network namespaces, one per simulated node, joined by a bridge in the root namespace.

Each node's namespace gets loopback and one veth end (eth0) on a private /24 whose .1 sits on
the bridge; the TCP rendezvous coordinator listens there. Nothing routes beyond the bridge.
Needs root (CAP_NET_ADMIN) and iproute2.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess

from sim.errors import LaunchError

SUBNET_BASE = "10.213"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise LaunchError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result


def _free_subnet() -> str:
    """A 10.213.X.0/24 that no interface on this host uses yet."""
    used = _ip("-4", "-o", "addr", "show").stdout
    for third in range(1 + secrets.randbelow(200), 255):
        prefix = f"{SUBNET_BASE}.{third}."
        if prefix not in used:
            return prefix
    raise LaunchError("no free 10.213.X.0/24 subnet for the node namespaces")


class NodeNetworks:
    """Create with create(), remove with delete() (idempotent)."""

    def __init__(self, nodes: int):
        self.token = secrets.token_hex(3)
        self.nodes = nodes
        self.prefix = ""
        self.bridge = f"isbr{self.token}"
        self.created: list[str] = []

    @property
    def hub_address(self) -> str:
        return f"{self.prefix}1"

    def namespace(self, node: int) -> str:
        return f"ingero-sim-{self.token}-n{node}"

    def wrap(self, node: int, argv: list[str]) -> list[str]:
        """A command line that runs argv inside the node's namespace, keeping its pid."""
        return ["ip", "netns", "exec", self.namespace(node), *argv]

    def create(self) -> None:
        self.prefix = _free_subnet()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            self.created.append(self.bridge)
            _ip("addr", "add", f"{self.hub_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
            for node in range(self.nodes):
                self._add_node(node)
        except LaunchError:
            self.delete()
            raise

    def _add_node(self, node: int) -> None:
        ns, veth = self.namespace(node), f"isv{self.token}{node}"
        _ip("netns", "add", ns)
        self.created.append(ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("link", "set", veth, "master", self.bridge, "up")
        address = ipaddress.ip_address(f"{self.prefix}{node + 2}")
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def delete(self) -> None:
        """Deleting a namespace deletes its veth pair; the bridge goes last."""
        for name in reversed(self.created):
            if name == self.bridge:
                _ip("link", "del", name, check=False)
            else:
                _ip("netns", "del", name, check=False)
        self.created.clear()
