"""echod's HTTP API: a Flask app factory, served by gunicorn.

``create_app`` only wires. Each concern registers its own hooks with ``init_app(app)``, in the
order a request meets them: the envelope (``X-Request-Id``, the drain check, metrics), the one
error shape, authentication (``echod.access.auth``), the per-token rate and concurrency limits
(``echod.access.ratelimit``) and the audit log (``echod.access.audit``: one line per request,
refused or not). Bodies come in and answers go out as strict JSON (``jsonio``).

Routes live in the blueprints of ``routes``; the OpenAPI document is generated from the same
tool registry that serves ``POST /api/v1/tools/<name>`` and MCP.
"""

from __future__ import annotations

import os

from flask import Flask

from ..access import audit, auth, ratelimit
from ..sandbox import Sandbox
from . import envelope, error_shape
from .jsonio import DRAIN_LIMIT_BYTES, MAX_BODY_BYTES, StrictJSONProvider
from .metrics import ApiMetrics
from .settings import ApiSettings

FRONT = "ECHOD_API_FRONT"     # "1": the app serves behind echod's front (``front``)


class ApiState:
    """What the views of one worker share: the settings, the SQL sandbox, the metrics."""

    def __init__(self, settings: ApiSettings):
        self.settings = settings
        self.sandbox = Sandbox(settings.sandbox_url, settings.sandbox_key,
                               timeout_ms=settings.sql_timeout_ms, row_cap=settings.sql_row_cap,
                               pool_size=settings.threads, byte_cap=settings.answer_cap,
                               scoped=settings.sql_scoped)
        self.metrics = ApiMetrics()

    def draining(self) -> bool:
        return bool(self.settings.drain_file) and os.path.exists(self.settings.drain_file)


def create_app(settings: ApiSettings | None = None, workers: int | None = None) -> Flask:
    """The API for ``settings`` (default: those echod handed over through the environment)."""
    from . import routes

    app = Flask("echod")
    app.json = StrictJSONProvider(app)
    app.config.update(ECHOD_SETTINGS=settings or ApiSettings.from_environment(),
                      ECHOD_WORKERS=workers or int(os.environ.get("ECHOD_API_WORKERS", "1")),
                      MAX_CONTENT_LENGTH=MAX_BODY_BYTES,
                      ECHOD_BEHIND_FRONT=os.environ.get(FRONT) == "1")
    app.extensions["echod"] = ApiState(app.config["ECHOD_SETTINGS"])
    envelope.init_app(app)
    error_shape.init_app(app, DRAIN_LIMIT_BYTES)
    auth.init_app(app)
    ratelimit.init_app(app)
    audit.init_app(app)
    app.register_blueprint(routes.root)
    app.register_blueprint(routes.v1, url_prefix="/api/v1")
    return app
