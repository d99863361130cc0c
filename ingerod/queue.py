"""The pushes fleetd has not acknowledged, kept on disk so that a restarted agent sends them again.

One file per push (``ingero.framefile``), removed when fleetd acknowledges it, and the agent's
identity (its stream id, the next push and event numbers) beside them: a restarted agent goes
on with the same stream, so fleetd takes the old pushes as what they are, not yet seen, and
every event keeps a unique id. The files are not fsynced: they outlive the agent (kill -9
included), not the node's power. Nothing is read back from the disk while the agent runs.
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from pathlib import Path

from ingero.framefile import decode, encode, write_file
from ingero.runtime import RateLimitedLog

log = logging.getLogger("ingerod")

PUSH = re.compile(r"^push-(\d{12})$")
IDENTITY = "identity.json"


class PushQueue:
    def __init__(self, directory: Path | None, node: str, metrics):
        self.directory = directory
        self.node = node
        self.metrics = metrics
        self.complaints = RateLimitedLog(log, 30.0)

    def restore(self) -> tuple[dict | None, OrderedDict[int, list[bytes]]]:
        """The last run's identity (None: start a new stream) and its unacknowledged pushes."""
        pushes: OrderedDict[int, list[bytes]] = OrderedDict()
        if self.directory is None:
            return None, pushes
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            identity = json.loads((self.directory / IDENTITY).read_text())
        except FileNotFoundError:
            return None, pushes
        except (OSError, ValueError) as exc:
            log.warning("queue: cannot read %s (%s); starting a new stream", IDENTITY, exc)
            identity = None
        if not isinstance(identity, dict) or identity.get("node") != self.node:
            self._clear("it was another node's" if isinstance(identity, dict)
                        else "its identity did not read back")
            return None, pushes
        for path in sorted(self.directory.iterdir()):
            if (match := PUSH.match(path.name)) is None:
                continue
            try:
                pushes[int(match.group(1))] = decode(path.read_bytes())
            except (OSError, ValueError) as exc:
                log.warning("queue: dropped unreadable push %s: %s", path.name, exc)
                self.metrics.dropped.inc()
                path.unlink(missing_ok=True)
        self.metrics.restored.inc(len(pushes))
        if pushes:
            log.info("queue: %d push(es) the last run sent and fleetd did not acknowledge; "
                     "sending them again", len(pushes))
        return identity, pushes

    def _clear(self, why: str) -> None:
        lost = [p for p in self.directory.iterdir() if PUSH.match(p.name)]
        if lost:
            log.warning("queue: dropped %d push(es) of the last run: %s", len(lost), why)
            self.metrics.dropped.inc(len(lost))
        for path in lost:
            path.unlink(missing_ok=True)

    def keep(self, seq: int, frames: list[bytes], identity: dict) -> None:
        """Before the push is sent: it, and where the stream stands."""
        if self._write(seq, f"push-{seq:012d}", encode(frames)):
            self._write(seq, IDENTITY, json.dumps({**identity, "node": self.node}).encode())

    def rewrite(self, seq: int, frames: list[bytes]) -> None:
        """The same push in another form (as maps, for an older fleetd)."""
        self._write(seq, f"push-{seq:012d}", encode(frames))

    def _write(self, seq: int, name: str, data: bytes) -> bool:
        if self.directory is None:
            return False
        try:
            write_file(self.directory / name, data, sync=False)
        except OSError as exc:   # the push still goes; only a restart would lose it
            self.complaints.warning("write", "queue: cannot keep push %d: %s", seq, exc)
            return False
        return True

    def forget(self, seq: int) -> None:
        if self.directory is not None:
            (self.directory / f"push-{seq:012d}").unlink(missing_ok=True)
