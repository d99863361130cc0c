"""The API's audit log: one JSON line per request, refused ones included, with the token's hash
and name, never the token. ``init_app`` writes the line of each request of a Flask app."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from flask import Flask, current_app, g, request

from .principal import RAW_TOKEN

log = logging.getLogger("echod.api")


class AuditLog:
    """JSON lines, one per request, appended by every worker process to the same file: each line
    is one write() to a file opened O_APPEND, so lines from several processes do not mix."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time):
        self.path = Path(path)
        self.clock = clock
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
        self._fd = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self, **fields: Any) -> None:
        """Append ``{"ts": <ISO 8601 UTC>, **fields}``; refuses (ValueError) a record that would
        hold anything shaped like a token, so a caller's mistake cannot leak one."""
        if "ts" in fields:
            raise ValueError("the audit log stamps 'ts' itself")
        for name, value in fields.items():
            if RAW_TOKEN.search(json.dumps({name: value}, default=str)):
                raise ValueError(f"audit field {name!r} holds what looks like a bearer token; "
                                 "log its token_hash() instead")
        stamp = datetime.fromtimestamp(self.clock(), timezone.utc)
        record = {"ts": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"), **fields}
        line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
        with self._lock:
            written = os.write(self._fd, line)
            while written < len(line):            # only on a full disk or a signal
                written += os.write(self._fd, line[written:])

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def init_app(app: Flask) -> None:
    """Write one line per request once its answer is made: its id, caller, path, status and
    error code (``g.request_id``, ``g.started``, ``g.code``, ``g.extra``, set by the API's
    envelope and error handler) and the token's hash and name (``g.principal`` or
    ``g.refused``, set by ``auth.init_app``)."""
    audit = AuditLog(app.config["ECHOD_SETTINGS"].audit_log)
    app.extensions["echod.audit"] = audit

    @app.after_request
    def record(response):
        principal = g.get("principal")
        token_sha256, token = (principal.token_sha256, principal.name) if principal \
            else g.get("refused") or (None, None)
        started = g.get("started", time.monotonic())
        line = dict(request_id=g.get("request_id"), remote=request.remote_addr,
                    method=request.method, path=request.path, status=response.status_code,
                    code=g.get("code"), duration_ms=round((time.monotonic() - started) * 1000, 3),
                    token_sha256=token_sha256, token=token, **g.get("extra", {}))
        try:
            try:
                audit.write(**line)
            except ValueError:  # something in the request looked like a token: not in the log
                audit.write(**{**line, "path": "(withheld: looked like a token)"})
        except (OSError, ValueError) as exc:
            current_app.extensions["echod"].metrics.audit_failures.inc()
            log.error("cannot write the audit log: %s", exc)
        return response
