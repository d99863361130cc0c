"""MUNGE credentials, as Slurm's own commands prove who runs them: the ``ingero`` command gets
one from the local munged (``munge``) for each request, and echod has its own munged, holding
the site's key, decode it (``unmunge``): the Unix user behind a request, with no token to hand
out. The credential carries ``request_payload``: ``PAYLOAD`` (so that one minted for echod is
good for nothing else), then the request's method, the host and port it is addressed to, its
path and query, and the SHA-256 of its body; so a credential seen on the way (in a proxy's log,
say) proves nothing for another request, nor at another echod. munged refuses it when it is
expired (5 minutes by default) or decoded twice (replayed).

The ``munge`` and ``unmunge`` programs come with the munge package wherever Slurm runs.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import urllib.parse
from dataclasses import dataclass

DEFAULT_SOCKET = "/run/munge/munge.socket.2"
PAYLOAD = b"ingero:echod"
SCHEME = "MUNGE"
TIMEOUT_S = 5.0
CREDENTIAL = re.compile(r"MUNGE:[A-Za-z0-9+/=]+:", re.ASCII)
MAX_CREDENTIAL = 2048
_STATUS = re.compile(r"^STATUS:\s+(.*?)\s+\((\d+)\)$", re.MULTILINE)   # Success (0)
_FIELD = re.compile(r"^(UID|GID):\s+.*\((\d+)\)$", re.MULTILINE)        # root (0)


class MungeError(Exception):
    """No credential could be made, or one was refused: the message is one line."""


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int


def _run(argv: list[str], stdin: bytes) -> subprocess.CompletedProcess:
    if shutil.which(argv[0]) is None:
        raise MungeError(f"no {argv[0]} program (install munge)")
    try:
        return subprocess.run(argv, input=stdin, capture_output=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MungeError(f"{argv[0]}: {exc}") from None


def request_payload(method: str, host: str, target: str, body: bytes) -> bytes:
    """What a credential for one request carries, a line each: ``PAYLOAD``, the method, the
    host[:port] it is addressed to (as the Host header has it), the path and query, and the
    SHA-256 of the body."""
    return b"\n".join([PAYLOAD, method.upper().encode(), host.lower().encode(),
                       target.encode(), hashlib.sha256(body).hexdigest().encode()])


def payload_for_url(method: str, url: str, body: bytes) -> bytes:
    """``request_payload`` of a request to ``url``."""
    parts = urllib.parse.urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return request_payload(method, parts.netloc, target, body)


def credential(socket: str = DEFAULT_SOCKET, ttl: int | None = None,
               payload: bytes = PAYLOAD) -> str:
    """A fresh credential of the calling user, carrying ``payload`` (``request_payload`` of
    the one request it is for)."""
    done = _run(["munge", "--socket", socket, "--input", "-",
                 *(("--ttl", str(ttl)) if ttl else ())], payload)
    text = done.stdout.decode(errors="replace").strip()
    if done.returncode != 0 or not CREDENTIAL.fullmatch(text):
        raise MungeError(_said(done) or "munge made no credential")
    return text


def decode(text: str, socket: str = DEFAULT_SOCKET, payload: bytes = PAYLOAD) -> Identity:
    """Who minted the credential, or MungeError saying why it is refused (forged, expired,
    replayed, minted for something else than ``payload`` says, or under another key)."""
    if len(text) > MAX_CREDENTIAL or not CREDENTIAL.fullmatch(text):
        raise MungeError("not a MUNGE credential")
    done = _run(["unmunge", "--socket", socket], text.encode())
    raw_metadata, _, carried = done.stdout.partition(b"\n\n")
    metadata = raw_metadata.decode(errors="replace")
    status = _STATUS.search(metadata)
    if done.returncode != 0 or status is None or status.group(2) != "0":
        reason = status.group(1) if status and status.group(2) != "0" else _said(done)
        raise MungeError(reason or f"unmunge exited {done.returncode}")
    if carried != payload:
        raise MungeError("a credential minted for another request"
                         if carried.split(b"\n")[0] == PAYLOAD
                         else "a credential minted for something other than echod")
    ids = dict(_FIELD.findall(metadata))
    if set(ids) != {"UID", "GID"}:
        raise MungeError("unmunge gave no UID and GID")
    return Identity(int(ids["UID"]), int(ids["GID"]))


def _said(done: subprocess.CompletedProcess) -> str:
    """The last line of a munge program's complaint, without its name."""
    lines = done.stderr.decode(errors="replace").strip().splitlines()
    return re.sub(r"^\S+: (Error: )?", "", lines[-1]) if lines else ""
