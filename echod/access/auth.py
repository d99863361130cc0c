"""Who may use echod's HTTP API, at each request: ``init_app`` puts authentication in front of a
Flask app's views. Each view says who may call it (``access``); a token is checked by the
``TokenStore`` (``echod.access.tokens``), a MUNGE credential by ``MungeUsers``
(``echod.access.munge_users``), and a request that presents a bad one counts against its
address's rate limit (``echod.access.ratelimit``), so that guessing is slowed down. The audit
log is ``echod.access.audit``.
"""

from __future__ import annotations

import math
import time

from flask import Flask, g, request

from ingero import munge

from .munge_users import MungeUsers, munge_scheme, raw_target
from .principal import AuthError, TokenRefused
from .ratelimit import worker_share
from .tokens import CHALLENGE, TokenStore



# Who may call a view: anyone, anyone (a token, if given, must be good), or a token holder.
PUBLIC, OPTIONAL, TOKEN = "public", "optional", "token"


def access(level: str):
    """Mark a view with who may call it (TOKEN when unmarked)."""
    def mark(view):
        view.access = level
        return view
    return mark


def init_app(app: Flask) -> None:
    """Authenticate each request its view asks it of: ``g.principal`` is the caller, None for
    an anonymous call. A refused token counts against its client address's share of the rate
    limit, so that an address that keeps guessing gets 429 instead of 401."""
    settings = app.config["ECHOD_SETTINGS"]
    tokens = TokenStore(settings.tokens_file, settings.retired_file, settings.token_grace)
    tokens.load()
    users = MungeUsers(settings.munge_socket, settings.munge_admin_group)
    guessing = worker_share(settings.rate_limit, settings.rate_burst, app.config["ECHOD_WORKERS"])
    munging = worker_share(settings.rate_limit, settings.rate_burst, app.config["ECHOD_WORKERS"])

    @app.before_request
    def authenticate():
        g.principal = None
        view = app.view_functions.get(request.endpoint)
        level = getattr(view, "access", TOKEN) if view else PUBLIC
        header = request.headers.get("Authorization")
        if level == PUBLIC or (level == OPTIONAL and header is None):
            return
        try:
            if munge_scheme(header):
                if not users.enabled():
                    raise TokenRefused("this echod takes bearer tokens only (its "
                                       "--munge-socket is none)", code="unauthorized",
                                       headers={"WWW-Authenticate": CHALLENGE})
                # each credential costs an unmunge: an address's share first, as a token's
                munging.check(f"address:{request.remote_addr}")
                from ..api.jsonio import read_body     # the api package imports this one
                g.principal = users.authenticate(header, munge.request_payload(
                    request.method, request.host, raw_target(request),
                    read_body(app.config["MAX_CONTENT_LENGTH"])))
            else:
                g.principal = tokens.authenticate(header)
        except AuthError as exc:
            g.refused = (exc.token_sha256, exc.token)
            guessing.check(f"address:{request.remote_addr}")
            raise

    @app.after_request
    def say_retiring(response):
        principal = g.get("principal")
        if principal is not None and principal.retiring_until is not None:
            response.headers["X-Token-Retiring-In"] = str(
                max(0, math.ceil(principal.retiring_until - time.time())))
        return response
