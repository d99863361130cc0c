"""The GPU-less demo: a real fleetd and real agents on loopback, one node slowed down.

Until the simulated cluster exists, the agents use the synthetic source: every node reports a
healthy score, then one node's score is lowered and fleetd, comparing it with its peers, flags
it on its next recompute.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from . import fleetclient
from .launch import Daemon, KeyRing, free_port, stop_all, wait_for

COHORT = "cluster:demo"


def agent_args(endpoint: str, node: str, score_file: Path, interval: float,
               keys: KeyRing) -> list[str]:
    return ["--config", "/dev/null", "--source", "synthetic", "--score-file", str(score_file), "--node", node,
            "--cluster", "demo", "--fleet", endpoint, "--push-interval", str(interval),
            "--heartbeat-interval", str(interval / 5), "--warmup", "2",
            "--metrics-addr", "none", *keys.ingerod_flags()]


def run(nodes: int, interval: float, healthy: float, slow: float, say) -> int:
    with tempfile.TemporaryDirectory(prefix="ingero-demo-") as tmp:
        root = Path(tmp)
        keys = KeyRing.create(root / "keys")
        endpoint = f"tcp://127.0.0.1:{free_port()}"
        daemons = [Daemon.module("fleetd", "fleetd", [
            "--config", "/dev/null", "--bind", endpoint, "--metrics-addr", "none", "--recompute-interval",
            str(interval / 4), *keys.fleetd_flags()], root)]
        names = [f"node{i:02d}" for i in range(1, nodes + 1)]
        for name in names:
            (root / name).write_text(f"{healthy}\n")
            daemons.append(Daemon.module(name, "ingerod", agent_args(
                endpoint, name, root / name, interval, keys), root))
        say(f"fleetd on {endpoint} (CURVE), {nodes} ingerod agents pushing every {interval:g}s")
        try:
            return _story(root, names, endpoint, keys, interval, slow, say)
        finally:
            codes = stop_all(daemons[1:]) + stop_all(daemons[:1])
            say(f"stopped {len(codes)} daemons with SIGTERM; exit codes: "
                f"{', '.join(sorted(set(map(str, codes))))}")


def _status(endpoint: str, keys: KeyRing):
    try:
        return fleetclient.query(endpoint, COHORT, keys.client_keys(), timeout=1.0)
    except fleetclient.FleetUnreachable:
        return None


def _story(root: Path, names: list[str], endpoint: str, keys: KeyRing, interval: float,
           slow: float, say) -> int:
    status = wait_for(lambda: (s := _status(endpoint, keys)) and s.quorum_met
                      and s.active_nodes == len(names) and s, 30 * interval + 10)
    if status is None:
        say("fleetd never reached quorum; see the logs in " + str(root))
        return 1
    say(f"cohort {status.cohort}: {status.active_nodes} active nodes, median "
        f"{status.median:.3f}, threshold {status.threshold:.3f}, stragglers: none")
    victim = names[len(names) // 2]
    (root / victim).write_text(f"{slow}\n")
    lowered = time.monotonic()
    say(f"lowering {victim}'s score to {slow}")
    flagged = wait_for(lambda: (s := _status(endpoint, keys)) and s.stragglers and s,
                       10 * interval + 5)
    if flagged is None or flagged.stragglers != [victim]:
        say(f"fleetd did not flag {victim} alone: {flagged and flagged.stragglers}")
        return 1
    say(f"fleetd flagged {victim} after {time.monotonic() - lowered:.1f}s: score {slow} under "
        f"threshold {flagged.threshold:.3f} (median {flagged.median:.3f}); no other node flagged")
    return 0
