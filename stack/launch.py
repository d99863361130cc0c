"""Start and stop real ingero daemons as child processes: used by the demo and the tests."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ingero import curve


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that is free now, below the kernel's ephemeral range, and never
    handed out before by this process. A daemon binds it later: a port from bind(0) is one
    the kernel hands every bind(0) and connect() meanwhile, and the next call here could get
    it again before the first daemon bound it (test_fleet_e2e's fleetd once found its metrics
    port taken so)."""
    try:
        below = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        below = 32768
    low = max(1024, below - 16384)
    for _ in range(4096):
        port = random.randrange(low, below)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port in {low}-{below - 1}")


def wait_for(predicate, timeout: float, interval: float = 0.05):
    """Poll ``predicate`` until it returns something truthy; None after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result or time.monotonic() >= deadline:
            return result or None
        time.sleep(interval)


@dataclass
class KeyRing:
    """fleetd's key pairs (one per shard, the first an unsharded fleetd's), the agents' key
    pairs and the directory that authorises agents. Agents of named ``nodes`` each have a key
    of their own, authorised as NODE.key, and fleetd takes from each only its node's pushes (as
    shipped); without them, one agent key speaks for whatever node a test makes up, and fleetd
    is told to take any node from any authorised key (--insecure-any-node-key)."""

    shards: list[tuple[Path, Path]]      # (public, secret) of each shard's fleetd
    agent_secret: Path
    agent_public: Path
    authorized: Path
    echod_secret: Path
    echod_public: Path
    authorized_fleetd: Path
    node_secrets: dict[str, Path]

    @property
    def fleet_public(self) -> Path:
        return self.shards[0][0]

    @property
    def fleet_secret(self) -> Path:
        return self.shards[0][1]

    @classmethod
    def create(cls, root: Path, shards: int = 1, nodes: tuple[str, ...] = ()) -> "KeyRing":
        pairs = [curve.generate(root / "fleet", "fleetd" if k == 0 else f"fleetd-shard{k}")
                 for k in range(shards)]
        agent_public, agent_secret = curve.generate(root / "agent", "agent")
        own = {node: curve.generate(root / "agent", node) for node in nodes}
        echod_public, echod_secret = curve.generate(root / "echod", "echod")
        authorized, authorized_fleetd = root / "authorized", root / "authorized_fleetd"
        for directory, publics in ((authorized, [agent_public, *(p for p, _ in own.values())]),
                                   (authorized_fleetd, [public for public, _ in pairs])):
            directory.mkdir(exist_ok=True)
            for public in publics:
                (directory / public.name).write_bytes(public.read_bytes())
        return cls(pairs, agent_secret, agent_public, authorized, echod_secret, echod_public,
                   authorized_fleetd, {node: secret for node, (_, secret) in own.items()})

    def echod_flags(self) -> list[str]:
        return ["--secret-key", str(self.echod_secret),
                "--authorized-keys", str(self.authorized_fleetd)]

    def forwarding_flags(self, endpoint: str, spool: Path) -> list[str]:
        """fleetd's flags to forward to echod at ``endpoint``, spooling under ``spool``."""
        return ["--echod", endpoint, "--echod-public-key", str(self.echod_public),
                "--spool-dir", str(spool)]

    def fleetd_flags(self, shard: int = 0) -> list[str]:
        return ["--secret-key", str(self.shards[shard][1]),
                "--authorized-keys", str(self.authorized),
                *(() if self.node_secrets else ("--insecure-any-node-key",))]

    def ingerod_flags(self, node: str | None = None) -> list[str]:
        """An agent's (``node``'s own key if it has one): each shard's fleetd public key, in the
        shards' order."""
        return ["--secret-key", str(self.node_secrets.get(node, self.agent_secret)),
                "--fleet-public-key", ",".join(str(public) for public, _ in self.shards)]

    def client_keys(self):
        return curve.load_keypair(self.agent_secret), curve.load_public(self.fleet_public)


def clean_environment(extra: dict | None = None) -> dict:
    """This environment without what would steer a daemon elsewhere: the daemons' own
    settings (FLEETD_*, INGEROD_*) and a surrounding Slurm job's identity."""
    kept = {k: v for k, v in os.environ.items()
            if not k.startswith(("FLEETD_", "INGEROD_", "SLURM_"))}
    return {**kept, **(extra or {})}


KEPT_STATE = (("ingerod", "--queue-dir"), ("fleetd", "--spool-dir"))


class Daemon:
    """One child process with its output in a log file."""

    def __init__(self, name: str, argv: list[str], log_dir: Path, env: dict | None = None,
                 module: str | None = None, journal: bool = False):
        """``journal``: tell the daemon its output is the journal's, as systemd does
        (JOURNAL_STREAM naming the log file), so that it leads each line with its priority."""
        self.name = name
        self.module = module
        self.terminated = False
        self.argv = argv
        self.journal = journal
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "ab")
        if journal:
            st = os.fstat(self._log.fileno())
            env = {**(env or {}), "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        self.env = env
        self.process = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, env=clean_environment(env))

    @classmethod
    def module(cls, name: str, module: str, args: list[str], log_dir: Path,
               prefix: tuple[str, ...] = (), **kw) -> "Daemon":
        """``python -m module args`` (behind ``prefix``, such as ``ip netns exec NS``); what a
        daemon keeps on disk goes under ``log_dir`` unless the arguments say where, never into
        the host's /var/lib/ingero."""
        for daemon, flag in KEPT_STATE:
            subcommand = args[:1] and not args[0].startswith("-")
            if module == daemon and flag not in args and not subcommand:
                args = [*args, flag, str(log_dir / f"{name}-{flag.removeprefix('--')}")]
        return cls(name, [*prefix, sys.executable, "-m", module, *args], log_dir, module=module,
                   **kw)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait; returns the exit status (killing it if it will not go)."""
        self.terminate()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
        finally:
            self._log.close()

    def terminate(self) -> None:
        """One SIGTERM only: a second one could land while Python is finalising, after it
        has put back the default handler, and kill a daemon that was exiting cleanly."""
        if self.alive() and not self.terminated:
            self.process.send_signal(signal.SIGTERM)
            self.terminated = True

    def kill(self) -> None:
        """kill -9: no chance to clean up."""
        self.process.kill()
        self.process.wait()
        self._log.close()

    def restarted(self, down_s: float = 0.0) -> "Daemon":
        """kill -9, a pause, and the same command in the same environment again, its output
        appended to the same log: what systemd's Restart= does after a crash."""
        self.kill()
        time.sleep(down_s)
        return Daemon(self.name, self.argv, self.log_path.parent, env=self.env,
                      module=self.module)


def stop_all(daemons: list[Daemon], timeout: float = 10.0) -> list[int]:
    """SIGTERM every daemon at once, then collect the exit statuses in order."""
    for daemon in daemons:
        daemon.terminate()
    return [daemon.stop(timeout) for daemon in daemons]
