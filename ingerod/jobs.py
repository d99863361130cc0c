"""What the Slurm hooks tell ingerod: the job spool and the local control socket.

The prolog and epilog write one JSON record per job start and end into the spool directory
(``ingero.slurmhook``). The agent turns each record into a ``job_start``/``job_end`` event and
deletes the file once fleetd has acknowledged the push that carried it, so a record written
while ingerod or fleetd was down is sent when they are back. A per-job agent (``--job``) takes
its own job's records only, and stops after it has sent its job's end.

The node-wide agent also listens on a Unix socket (root only): a hook connects, sends one JSON
line ``{"job": ID, "event": "start"|"end"}`` and reads ``{"ok": true, "agent": ...}`` back; that
is how the prolog knows a node-wide agent is watching, and it makes the agent read the spool at
once. The socket is served from a thread that only hands the nudge to the agent's loop.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import socketserver
import threading
from pathlib import Path

from ingero.errors import ConfigError
from ingero.slurmhook import JOB_ID, RECORD_NAME, HookError, read_record

log = logging.getLogger("ingerod")

MAX_RECORDS_PER_SCAN = 256
REQUEST_BYTES = 1024
CONNECTION_TIMEOUT_S = 1.0

# record field → event attribute (the names echod's jobs table reads)
RECORD_ATTRS = ("user", "uid", "account", "partition", "nodelist", "node_count", "ntasks", "gpus",
                "gpu_ids", "exit_code", "state", "slurm_cluster", "restart_count",
                "array_job_id", "array_task_id", "het_job_id", "het_job_offset")


def record_event(node: str, record: dict) -> dict:
    """The event a job record becomes: its id is stable, so a resent record is stored once
    (and each run of a requeued job is a record of its own)."""
    attrs = {"job": record["job"], "slurm_node": record.get("node"),
             **{k: record[k] for k in RECORD_ATTRS if isinstance(record.get(k), (str, int))}}
    restart = record.get("restart_count") or 0
    return {"id": f"{node}:slurm:{record['job']}:{record['event']}"
                  + (f":r{restart}" if restart else ""),
            "t": float(record["t"]), "kind": record["event"], "attrs": attrs}


class JobSpool:
    """The spool directory's records not yet handed to the agent, oldest first."""

    def __init__(self, directory: Path | None, job: str | None, metrics):
        self.directory, self.job, self.metrics = directory, job, metrics
        self.taken: set[Path] = set()        # handed over, waiting for fleetd's ack

    def scan(self, node: str) -> list[dict]:
        """New records as events; each carries its file under ``spool`` until it is sent."""
        if self.directory is None:
            return []
        try:
            names = sorted(os.listdir(self.directory))
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot read the job spool %s: %s", self.directory, exc)
            return []
        events = []
        for path in (self.directory / name for name in names if self._ours(name)):
            if path in self.taken or len(events) >= MAX_RECORDS_PER_SCAN:
                continue
            self.taken.add(path)
            try:
                record = read_record(path)
            except HookError as exc:
                log.warning("%s; left in place", exc)
                self.metrics.job_records_rejected.inc()
                continue
            log.info("job %s: %s recorded at %s", record["job"], record["event"], path)
            events.append({**record_event(node, record), "spool": str(path)})
        return events

    def _ours(self, name: str) -> bool:
        found = RECORD_NAME.fullmatch(name)
        return found is not None and (self.job is None or found["job"] == self.job)

    def sent(self, paths: list[str]) -> bool:
        """fleetd acknowledged the push carrying these records: they are done. True when the
        end of this agent's own job was among them."""
        for path in map(Path, paths):
            path.unlink(missing_ok=True)
            self.taken.discard(path)
            self.metrics.job_records_sent.inc()
        ends = (RECORD_NAME.fullmatch(Path(p).name) for p in paths)
        return self.job is not None and any(
            end is not None and end["event"] == "job_end" and end["job"] == self.job
            for end in ends)

    def unsent(self, paths: list[str]) -> None:
        """Their push was dropped unacknowledged: read them again at the next scan."""
        self.taken.difference_update(map(Path, paths))


class ControlSocket:
    """The node-wide agent's Unix socket for the Slurm hooks."""

    def __init__(self, path: Path, describe: str, metrics):
        self.path, self.nudged = path, threading.Event()
        self.server = _bind(path, self._answer)
        self.describe, self.metrics = describe, metrics
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.2,),
                                       name="ingerod-control", daemon=True)
        self.thread.start()
        log.info("control socket for the Slurm hooks at %s", path)

    def _answer(self, line: bytes) -> dict:
        try:
            request = json.loads(line)
            if (not isinstance(request, dict) or request.get("event") not in ("start", "end")
                    or not JOB_ID.fullmatch(str(request.get("job")))):
                raise ValueError("expected {\"job\": ID, \"event\": \"start\"|\"end\"}")
        except ValueError as exc:
            self.metrics.control_rejected.inc()
            return {"ok": False, "error": str(exc)}
        self.nudged.set()
        return {"ok": True, "agent": self.describe}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.path.unlink(missing_ok=True)


def _bind(path: Path, answer) -> socketserver.UnixStreamServer:
    """Listen at ``path`` (0600); a stale socket is replaced, a live one is another agent's."""
    class Handler(socketserver.StreamRequestHandler):
        timeout = CONNECTION_TIMEOUT_S

        def handle(self):
            try:
                reply = answer(self.rfile.readline(REQUEST_BYTES))
                self.wfile.write(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass

    if path.exists():
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            if probe.connect_ex(str(path)) == 0:
                raise ConfigError(f"control_socket: another ingerod listens on {path}")
        path.unlink()
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    old = os.umask(0o177)
    try:
        return socketserver.UnixStreamServer(str(path), Handler)
    finally:
        os.umask(old)
