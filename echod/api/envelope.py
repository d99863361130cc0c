"""What every request gets around its view: an id, the drain check, and its count and time in
the metrics; behind echod's front (``front``), the peer's address and the front's refusal of
an oversized body."""

from __future__ import annotations

import math
import re
import time
import uuid

from flask import Flask, g, request
from werkzeug.middleware.proxy_fix import ProxyFix

from ..errors import TooLarge, Unavailable

REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
REFUSED = "X-Ingero-Refused"     # set by the front only: it drops the client's X-Ingero-*


def init_app(app: Flask) -> None:
    """Give each request ``g.request_id`` (the caller's X-Request-Id if sane), ``g.started``,
    ``g.code`` (the error code, set by the error handler) and ``g.extra`` (fields for its audit
    line); refuse every request while echod drains; count and time each answer."""
    state = app.extensions["echod"]
    behind_front = app.config.get("ECHOD_BEHIND_FRONT", False)
    if behind_front:    # the front replaces any X-Forwarded-* of the client's with its own
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=1, x_proto=1)

    @app.before_request
    def begin():
        g.started = time.monotonic()
        g.request_id = _request_id()
        g.code = None
        g.extra = {}
        if behind_front and request.headers.get(REFUSED) == "too_large":
            raise TooLarge(f"the request body is over {app.config['MAX_CONTENT_LENGTH']} bytes")
        if state.draining():
            raise Unavailable("echod is shutting down; try again shortly", code="draining",
                              retry_after=max(1, math.ceil(state.settings.drain_seconds)))

    @app.after_request
    def finish(response):
        response.headers["X-Request-Id"] = g.get("request_id") or _request_id()
        elapsed = time.monotonic() - g.get("started", time.monotonic())
        endpoint = request.url_rule.rule if request.url_rule else "unmatched"
        state.metrics.observe(endpoint, response.status_code, g.get("code"), elapsed)
        return response


def _request_id() -> str:
    given = request.headers.get("X-Request-Id", "")
    return given if REQUEST_ID.match(given) else uuid.uuid4().hex
