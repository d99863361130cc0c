"""The one error shape: every answer other than 200 is ``{"error": ..., "code": ...}`` with the
status and headers of an ``HttpError``. What is not one yet is translated here, and only here:
Flask's and werkzeug's own HTTP errors, an error of a library that carries ``status`` and
``code`` (``registry.ToolError``, ``sandbox.check.SqlError``), a lost database (503), and anything
else (500, logged with its traceback under the request id)."""

from __future__ import annotations

import logging

import sqlalchemy.exc
from flask import Flask, g, jsonify
from werkzeug.exceptions import HTTPException

from ..errors import HTTP_ERRORS, HttpError, TooLarge, Unavailable, http_error
from .jsonio import drain_body

log = logging.getLogger("echod.api")

DB_RETRY_AFTER_S = 5


def init_app(app: Flask, drain_limit: int) -> None:
    """Answer every exception of a request in the one shape; a body refused for its size is
    read and dropped first, up to ``drain_limit`` bytes (past it the sender sees the
    connection close)."""

    @app.errorhandler(Exception)
    def answer(exc: Exception):
        error = as_http_error(exc)
        if isinstance(error, TooLarge):
            drain_body(drain_limit)
        g.code = error.code
        response = jsonify(error=str(error), code=error.code)
        response.status_code = error.status
        response.headers.update(error.headers)
        return response


def as_http_error(exc: Exception) -> HttpError:
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, HTTPException):
        return _framework_error(exc)
    status, code = getattr(exc, "status", None), getattr(exc, "code", None)
    if isinstance(status, int) and isinstance(code, str):
        return http_error(status, code, str(exc))
    if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
        log.warning("database unavailable: %s", str(exc).splitlines()[0])
        return Unavailable("the database is unavailable; try again shortly",
                           code="database_unavailable", retry_after=DB_RETRY_AFTER_S)
    log.exception("request %s failed", g.get("request_id"))
    return HttpError(f"internal error (request {g.get('request_id')})")


def _framework_error(exc: HTTPException) -> HttpError:
    """Flask's own: its status, the code of our class for it (http_error where none)."""
    status = exc.code or 500
    known = HTTP_ERRORS.get(status)
    allowed = getattr(exc, "valid_methods", None)
    return http_error(status, known.code if known else "http_error",
                      exc.description or exc.name,
                      {"Allow": ", ".join(allowed)} if allowed else None)
