"""echod's HTTP API: a Flask app factory, served by gunicorn.

Every request gets an ``X-Request-Id`` (the caller's, if it sent a sane one), passes the drain
check, authentication and the per-token rate limit, and leaves one line in the audit log,
refused or not. Every error, ours or Flask's, leaves through one handler as
``{"error": ..., "code": ...}``.

Routes live in the blueprints of ``routes``; the OpenAPI document is generated from the same
tool registry that serves ``POST /api/v1/tools/<name>`` and MCP.
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
import uuid

import sqlalchemy.exc
from flask import Flask, g, jsonify, request
from werkzeug.exceptions import HTTPException

from .. import auth
from ..audit import AuditLog
from ..ratelimit import RateLimiter
from ..registry import REGISTRY
from ..sandbox import Sandbox
from .metrics import ApiMetrics
from .settings import ApiSettings

log = logging.getLogger("echod.api")

MAX_BODY_BYTES = 1024 * 1024
# An oversized body up to this size is read and dropped before the 413 goes out, so that a
# client still sending it reads the answer instead of a reset connection; past it, the
# connection is closed on the sender.
DRAIN_LIMIT_BYTES = 16 * MAX_BODY_BYTES
REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
DB_RETRY_AFTER_S = 5

# Who may call an endpoint: anyone, anyone (a token, if given, must be good), or a token holder.
PUBLIC, OPTIONAL, TOKEN = "public", "optional", "token"


class ApiError(Exception):
    """An answer other than 200, in the one error shape."""

    def __init__(self, status: int, code: str, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.code = code
        self.headers = headers or {}


def access(level: str):
    """Mark a view with who may call it (TOKEN when unmarked)."""
    def mark(view):
        view.access = level
        return view
    return mark


class ApiState:
    """What every request of one worker shares."""

    def __init__(self, settings: ApiSettings, workers: int = 1):
        self.settings = settings
        self.sandbox = Sandbox(settings.sandbox_url, settings.sandbox_key,
                               timeout_ms=settings.sql_timeout_ms, row_cap=settings.sql_row_cap,
                               pool_size=settings.threads)
        self.tokens = auth.TokenStore(settings.tokens_file, settings.retired_file,
                                      settings.token_grace)
        self.tokens.load()
        self.audit = AuditLog(settings.audit_log)
        self.limiter = RateLimiter(settings.rate_limit / workers,
                                   max(1, settings.rate_burst // workers))
        self.metrics = ApiMetrics()

    def draining(self) -> bool:
        return bool(self.settings.drain_file) and os.path.exists(self.settings.drain_file)


def create_app(settings: ApiSettings | None = None, workers: int | None = None) -> Flask:
    """The API for ``settings`` (default: those echod handed over through the environment)."""
    from . import routes

    settings = settings or ApiSettings.from_environment()
    workers = workers or int(os.environ.get("ECHOD_API_WORKERS", "1"))
    app = Flask("echod")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.json.sort_keys = False
    app.extensions["echod"] = state = ApiState(settings, workers)
    app.register_blueprint(routes.root)
    app.register_blueprint(routes.v1, url_prefix="/api/v1")

    @app.before_request
    def begin():
        g.started = time.monotonic()
        g.request_id = _request_id()
        g.principal = None
        g.code = None
        g.extra = {}
        if state.draining():
            raise ApiError(503, "draining", "echod is shutting down; try again shortly",
                           {"Retry-After": str(max(1, math.ceil(settings.drain_seconds)))})
        view = app.view_functions.get(request.endpoint)
        level = getattr(view, "access", TOKEN) if view else PUBLIC
        header = request.headers.get("Authorization")
        if level == PUBLIC or (level == OPTIONAL and header is None):
            return
        try:
            g.principal = state.tokens.authenticate(header)
        except auth.AuthError as exc:
            g.refused = (exc.token_sha256, exc.token)
            state.limiter.check(f"address:{request.remote_addr}")  # slows down guessing
            raise
        state.limiter.check(g.principal.token_sha256)

    @app.after_request
    def finish(response):
        response.headers["X-Request-Id"] = g.get("request_id") or _request_id()
        principal = g.get("principal")
        refused = g.get("refused") or (None, None)
        if principal is not None and principal.retiring_until is not None:
            response.headers["X-Token-Retiring-In"] = str(
                max(0, math.ceil(principal.retiring_until - time.time())))
        elapsed = time.monotonic() - g.get("started", time.monotonic())
        endpoint = request.url_rule.rule if request.url_rule else "unmatched"
        state.metrics.observe(endpoint, response.status_code, g.get("code"), elapsed)
        line = dict(request_id=g.get("request_id"), remote=request.remote_addr,
                    method=request.method, path=request.path, status=response.status_code,
                    code=g.get("code"), duration_ms=round(elapsed * 1000, 3),
                    token_sha256=principal.token_sha256 if principal else refused[0],
                    token=principal.name if principal else refused[1], **g.get("extra", {}))
        try:
            try:
                state.audit.write(**line)
            except ValueError:  # something in the request looked like a token: not in the log
                state.audit.write(**{**line, "path": "(withheld: looked like a token)"})
        except (OSError, ValueError) as exc:
            state.metrics.audit_failures.inc()
            log.error("cannot write the audit log: %s", exc)
        return response

    @app.errorhandler(Exception)
    def error(exc: Exception):
        status, code, message, headers = _describe(exc)
        if status == 413:
            _drain_oversized_body()
        g.code = code
        response = jsonify(error=message, code=code)
        response.status_code = status
        response.headers.update(headers)
        return response

    return app


def _drain_oversized_body() -> None:
    """Read and drop a body refused for its size, when it is not too large to bother."""
    left = request.content_length or 0
    if left > DRAIN_LIMIT_BYTES:
        return
    stream = request.environ.get("wsgi.input")
    while stream is not None and left > 0:
        chunk = stream.read(min(64 * 1024, left))
        if not chunk:
            return
        left -= len(chunk)


def _request_id() -> str:
    given = request.headers.get("X-Request-Id", "")
    return given if REQUEST_ID.match(given) else uuid.uuid4().hex


def _describe(exc: Exception) -> tuple[int, str, str, dict]:
    """(status, code, message, headers) for any exception a request can raise."""
    if isinstance(exc, HTTPException):
        code = {404: "not_found", 405: "method_not_allowed",
                413: "too_large"}.get(exc.code or 500, "http_error")
        allowed = getattr(exc, "valid_methods", None)
        headers = {"Allow": ", ".join(allowed)} if allowed else {}
        return exc.code or 500, code, exc.description or exc.name, headers
    status, code = getattr(exc, "status", None), getattr(exc, "code", None)
    if isinstance(status, int) and isinstance(code, str):
        return status, code, str(exc), dict(getattr(exc, "headers", None) or {})
    if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
        log.warning("database unavailable: %s", str(exc).splitlines()[0])
        return 503, "database_unavailable", "the database is unavailable; try again shortly", \
            {"Retry-After": str(DB_RETRY_AFTER_S)}
    log.exception("request %s failed", g.get("request_id"))
    return 500, "internal", f"internal error (request {g.get('request_id')})", {}
