"""``Authorization: MUNGE <credential>``: the Unix user munged says minted a credential for
this very request, as a ``Principal`` that reads their own jobs (every user's for root and the
admin group).
"""

from __future__ import annotations

import grp
import os
import pwd

from ingero import munge

from ..registry import Scope
from .principal import Principal, TokenRefused, token_hash

_MUNGE_CHALLENGE = {"WWW-Authenticate": f'{munge.SCHEME} realm="echod"'}


class MungeUsers:
    """``Authorization: MUNGE <credential>``: the Unix user munged says minted it, as a
    Principal that may read (never SQL) every cluster's jobs of that user; root and the
    members of ``admin_group`` read every user's."""

    def __init__(self, socket: str, admin_group: str | None):
        self.socket, self.admin_group = socket, admin_group

    def enabled(self) -> bool:
        return self.socket != "none"

    def authenticate(self, authorization: str, payload: bytes) -> Principal:
        """The user behind a credential minted for the request whose ``payload``
        (``munge.request_payload``) is given."""
        _, _, credential = authorization.partition(" ")
        try:
            who = munge.decode(credential.strip(), self.socket, payload)
        except munge.MungeError as exc:
            raise TokenRefused(f"MUNGE credential refused: {exc}", code="invalid_credential",
                               headers=_MUNGE_CHALLENGE) from None
        try:
            entry = pwd.getpwuid(who.uid)
        except KeyError:
            raise TokenRefused(f"MUNGE credential refused: uid {who.uid} is no user on echod's "
                               "host", code="invalid_credential",
                               headers=_MUNGE_CHALLENGE) from None
        name = entry.pw_name
        return Principal(f"munge:{name}", token_hash(f"munge:{who.uid}"), Scope(None),
                         frozenset({"read", "sql"}), user=name, every_user=self.admin(entry))

    def admin(self, entry: pwd.struct_passwd) -> bool:
        if entry.pw_uid == 0:
            return True
        if not self.admin_group:
            return False
        try:
            gid = grp.getgrnam(self.admin_group).gr_gid
        except KeyError:
            return False
        return gid in os.getgrouplist(entry.pw_name, entry.pw_gid)


def raw_target(request) -> str:
    """The request's path and query as the client wrote them (percent escapes and all)."""
    environ = request.environ
    return environ.get("RAW_URI") or environ.get("REQUEST_URI") or \
        request.full_path.removesuffix("?")


def munge_scheme(authorization: str | None) -> bool:
    return bool(authorization) and authorization.split(" ", 1)[0].upper() == munge.SCHEME
