"""Who a request comes from (``Principal``: a token's holder, or a Unix user proven by MUNGE)
and the refusals of a request for who made it:

    HttpError (echod.errors)
    └── AuthError       a request is refused, with whose request it was
        ├── TokenRefused    401 (also Unauthorized): unauthorized, invalid_token,
        │                   token_expired
        └── NotAllowed      403 (also Forbidden): forbidden, forbidden_cluster

The floor of ``echod.access``: imports only ``echod.errors`` and ``echod.registry``.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from ..errors import Forbidden, HttpError, Unauthorized
from ..registry import CAPABILITIES, Scope

TOKEN_PREFIX = "ingero_"
RAW_TOKEN = re.compile(r"ingero_[A-Za-z0-9_-]{40,}")   # what a token looks like, anywhere


class AuthError(HttpError):
    """A request refused for who made it or what it holds; ``token_sha256`` and ``token`` (the
    name) say whose request it was, where known, for the audit log."""

    def __init__(self, message: str, *, code: str | None = None, headers: dict | None = None,
                 token_sha256: str | None = None, token: str | None = None):
        super().__init__(message, code=code, headers=headers)
        self.token_sha256 = token_sha256
        self.token = token


class TokenRefused(AuthError, Unauthorized):
    """401: no token, not a bearer token, or one that is unknown, revoked or expired."""


class NotAllowed(AuthError, Forbidden):
    """403: a good token that may not use this capability or see this cluster."""


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """Who a request comes from: a token's name, hash, clusters and capabilities; or a Unix
    user proven by MUNGE (``user``), who reads their own jobs only unless ``every_user``."""

    name: str
    token_sha256: str
    scope: Scope
    capabilities: frozenset[str]
    retiring_until: float | None = None     # unix seconds its grace ends, once rotated out
    user: str | None = None
    every_user: bool = True

    def own_jobs_only(self) -> bool:
        return self.user is not None and not self.every_user

    def may(self, capability: str) -> bool:
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}")
        return capability in self.capabilities or "admin" in self.capabilities

    def require(self, capability: str) -> None:
        if not self.may(capability):
            whose = f"{self.user!r} (a MUNGE user)" if self.user else f"token {self.name!r}"
            raise NotAllowed(f"{whose} may not use {capability}",
                             token_sha256=self.token_sha256, token=self.name)

    def require_cluster(self, cluster: str) -> None:
        if not self.scope.allows(cluster):
            raise NotAllowed(f"token {self.name!r} may not see cluster {cluster!r}",
                             code="forbidden_cluster", token_sha256=self.token_sha256,
                             token=self.name)
