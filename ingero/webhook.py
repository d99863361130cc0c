"""fleetd's verdict webhook, as a receiver sees it: the JSON schema of a notice and the
signature that proves fleetd sent it.

Each POST carries ``X-Ingero-Signature: t=<unix seconds>,v1=<hex>``, where the hex is
HMAC-SHA256 of ``<t>.<body>`` under the secret fleetd and the receiver share: the time is
signed with the body, so a notice captured once cannot be replayed later. ``verify`` checks
it; a receiver in another language does the same in a few lines (ingero-monitoring(7)).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from importlib import resources

SIGNATURE = "X-Ingero-Signature"
SCHEMA_ID = "ingero.verdict-notice/1"
TOLERANCE_S = 300.0


def schema() -> dict:
    """The notice's JSON schema (draft 2020-12), shipped with the package."""
    return json.loads(resources.files("ingero").joinpath("verdict-notice.schema.json")
                      .read_text())


def sign(secret: bytes, body: bytes, now: float | None = None) -> str:
    """The signature header's value for ``body`` sent now."""
    t = int(time.time() if now is None else now)
    mac = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


class BadSignature(ValueError):
    """A notice that fleetd did not sign with this secret, or signed too long ago."""


def verify(secret: bytes, header: str | None, body: bytes, now: float | None = None,
           tolerance_s: float = TOLERANCE_S) -> None:
    """Raise BadSignature unless ``header`` signs ``body`` under ``secret`` within
    ``tolerance_s`` of now; a header of any other shape raises BadSignature too, never
    another error."""
    if not header or not isinstance(header, str):
        raise BadSignature(f"no {SIGNATURE} header")
    fields = {}
    for part in header.split(","):
        key, sep, value = part.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    t_text, given = fields.get("t", ""), fields.get("v1", "")
    if not (t_text.isascii() and t_text.isdigit() and len(t_text) <= 12
            and given.isascii() and len(given) == 64):
        raise BadSignature(f"malformed {SIGNATURE} header")
    t = int(t_text)
    now = time.time() if now is None else now
    if abs(now - t) > tolerance_s:
        raise BadSignature(f"signed {now - t:.0f} s from now, beyond {tolerance_s:.0f} s")
    expected = hmac.new(secret, f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given):
        raise BadSignature("signature does not match the body")
