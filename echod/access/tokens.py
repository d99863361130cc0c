"""Bearer tokens: the tokens file, and the store of those a process accepts, with rotation.

A token is ``ingero_`` and 43 URL-safe characters; only its sha256 is kept, in --tokens-file,
each with the clusters and capabilities (read, sql, admin) it grants. On SIGHUP the supervising
process calls ``TokenStore.rotate()``: a token gone from the file keeps working for the grace
window, recorded with the time in a JSON file (the retired file) so that every API worker
process, restarted or not, honours it too. ``TokenFileError``: --tokens-file (or the retired
file) cannot be used as written.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from ..errors import EchodError
from ..registry import CAPABILITIES, Scope
from .principal import RAW_TOKEN, TOKEN_PREFIX, Principal, TokenRefused, token_hash

log = logging.getLogger("echod.auth")

MAX_AUTHORIZATION = 512                    # longest Authorization header looked at
_B64TOKEN = re.compile(r"[A-Za-z0-9._~+/-]+=*", re.ASCII)  # RFC 6750's b64token
_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}", re.ASCII)
_FIELDS = ("name", "sha256", "clusters", "capabilities", "expires")
CHALLENGE = 'Bearer realm="echod"'
_BAD_TOKEN = {"WWW-Authenticate": CHALLENGE + ', error="invalid_token"'}


class TokenFileError(EchodError):
    """--tokens-file cannot be used as written (the message names the file and the entry), or
    the retired-tokens file cannot be written."""


@dataclass(frozen=True)
class TokenEntry:
    """One accepted token as declared (its hash, never the token); ``retiring_until`` is set
    while it lives on in the grace window after a rotation removed it."""

    name: str
    sha256: str
    clusters: frozenset[str] | None
    capabilities: frozenset[str]
    expires: float | None = None
    retiring_until: float | None = None

    def principal(self) -> Principal:
        return Principal(self.name, self.sha256, Scope(self.clusters), self.capabilities,
                         self.retiring_until)

    def retired_record(self, retired_at: float) -> dict:
        return {"name": self.name, "clusters": Scope(self.clusters).describe(),
                "capabilities": ordered(self.capabilities), "expires": self.expires,
                "retired_at": retired_at}


@dataclass(frozen=True)
class DeclaredTokens:
    entries: tuple[TokenEntry, ...] = ()
    revoked: frozenset[str] = frozenset()

    def by_hash(self) -> dict[str, TokenEntry]:
        return {e.sha256: e for e in self.entries}


def ordered(capabilities) -> list[str]:
    return [c for c in CAPABILITIES if c in capabilities]


def parse_name(value: Any) -> str:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise ValueError("name must be 1 to 64 letters, digits or _.@- starting with a letter "
                         "or digit")
    if RAW_TOKEN.fullmatch(value):
        raise ValueError("name looks like a token; a name is a label such as 'ops'")
    return value


def parse_sha256(value: Any) -> str:
    if isinstance(value, str) and value.startswith(TOKEN_PREFIX):
        raise ValueError("sha256 holds a token, not its hash; store only the hash")
    if not isinstance(value, str) or not _SHA256.fullmatch(value.lower()):
        raise ValueError("sha256 must be 64 hexadecimal digits (the sha256 of the token)")
    return value.lower()


def parse_clusters(value: Any) -> frozenset[str] | None:
    """A list of cluster names, or ``["*"]`` (or ``"*"``) for every cluster: None."""
    if value == "*" or value == ["*"]:
        return None
    if not isinstance(value, list) or not value:
        raise ValueError("clusters must be a list of cluster names, or ['*'] for all")
    for cluster in value:
        if cluster == "*":
            raise ValueError("clusters: '*' means every cluster and stands alone")
        if not isinstance(cluster, str) or not cluster.strip() or "," in cluster \
                or cluster != cluster.strip():
            raise ValueError(f"clusters: {cluster!r} is not a cluster name")
    return frozenset(value)


def parse_capabilities(value: Any) -> frozenset[str]:
    """A non-empty list of read, sql, admin; admin implies the others."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"capabilities must be a non-empty list of {', '.join(CAPABILITIES)}")
    for capability in value:
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r} ({', '.join(CAPABILITIES)})")
    return frozenset(CAPABILITIES) if "admin" in value else frozenset(value)


def parse_expires(value: Any) -> float | None:
    """An ISO 8601 date (midnight UTC) or time (UTC unless it gives an offset)."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if moment is None:
        raise ValueError(f"expires: {value!r} is not an ISO 8601 date or time "
                         "(such as 2027-01-01 or 2027-01-01T00:00:00Z)")
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


def format_time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def parse_entry(item: Any, origin: str, number: int) -> TokenEntry:
    """The ``number``th ``tokens:`` entry of ``origin``; errors name it by its name if it has
    a valid one, else by its number."""
    where = f"{origin}: entry {number}"
    if not isinstance(item, dict):
        raise TokenFileError(f"{where}: expected a mapping with {', '.join(_FIELDS[:4])}")
    try:
        name = parse_name(item.get("name"))
    except ValueError as exc:
        raise TokenFileError(f"{where}: {exc}") from None
    where = f"{origin}: token {name!r}"
    unknown = sorted(set(map(str, item)) - set(_FIELDS))
    missing = [f for f in _FIELDS[:4] if f not in item]
    try:
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)} ({', '.join(_FIELDS)})")
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        return TokenEntry(name, parse_sha256(item["sha256"]), parse_clusters(item["clusters"]),
                          parse_capabilities(item["capabilities"]),
                          parse_expires(item.get("expires")))
    except ValueError as exc:
        raise TokenFileError(f"{where}: {exc}") from None


def parse_tokens(document: dict, origin: str) -> DeclaredTokens:
    """Check a tokens file's content, every field; duplicate names or hashes are refused."""
    unknown = sorted(set(map(str, document)) - {"tokens", "revoked"})
    if unknown:
        raise TokenFileError(f"{origin}: unknown key(s) {', '.join(unknown)} (tokens, revoked)")
    items, revoked = document.get("tokens") or [], document.get("revoked") or []
    if not isinstance(items, list) or not isinstance(revoked, list):
        raise TokenFileError(f"{origin}: tokens and revoked must be lists")
    entries = [parse_entry(item, origin, i) for i, item in enumerate(items, 1)]
    for key, label in ((lambda e: e.name, "name"), (lambda e: e.sha256, "sha256")):
        seen: dict[str, str] = {}
        for entry in entries:
            if key(entry) in seen:
                raise TokenFileError(f"{origin}: token {entry.name!r}: same {label} as token "
                                     f"{seen[key(entry)]!r}")
            seen[key(entry)] = entry.name
    try:
        hashes = frozenset(parse_sha256(h) for h in revoked)
    except ValueError as exc:
        raise TokenFileError(f"{origin}: revoked: {exc}") from None
    return DeclaredTokens(tuple(entries), hashes)


class _Loader(yaml.SafeLoader):
    """YAML without implicit timestamps: ``expires`` stays the text the file gives."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def read_tokens_document(path: Path) -> dict | None:
    """The tokens file's YAML mapping; None when there is no file."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise TokenFileError(f"cannot read {path}: {exc.strerror}") from None
    try:
        document = yaml.load(text, Loader=_Loader) or {}
    except yaml.YAMLError as exc:
        raise TokenFileError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise TokenFileError(f"{path} must hold a mapping with 'tokens:' (and 'revoked:')")
    return document


def read_tokens(path: Path) -> DeclaredTokens:
    document = read_tokens_document(path)
    if document is None:
        log.warning("tokens file %s does not exist: every API request will be refused "
                    "(create a token with 'echod token create')", path)
        return DeclaredTokens()
    return parse_tokens(document, str(path))


def write_atomically(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` in one rename; a new file gets ``mode``, an existing one keeps its mode
    and, where permitted, its owner and group."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    try:
        previous = path.stat()
    except FileNotFoundError:
        previous = None
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temporary, stat.S_IMODE(previous.st_mode) if previous else mode)
        if previous is not None:
            try:
                os.chown(temporary, previous.st_uid, previous.st_gid)
            except PermissionError:
                pass
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise


# -- the store ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenSummary:
    """For the log line after a load or a rotation."""

    active: int
    in_grace: int
    added: int = 0
    retired: int = 0
    revoked: int = 0

    def __str__(self) -> str:
        return (f"{self.active} API token(s) active, {self.in_grace} in their grace window "
                f"({self.added} added, {self.retired} retired, {self.revoked} revoked)")


class TokenStore:
    """The tokens a process accepts: those in ``tokens_file`` and, for ``grace_s`` after a
    rotation removed them, those recorded in ``retired_file``. Call ``load()`` at start;
    the supervising process calls ``rotate()`` on SIGHUP, before restarting the workers."""

    def __init__(self, tokens_file: Path, retired_file: Path, grace_s: float = 300.0,
                 clock: Callable[[], float] = time.time):
        self.tokens_file = Path(tokens_file)
        self.retired_file = Path(retired_file)
        self.grace_s = grace_s
        self.clock = clock
        self._lock = threading.Lock()
        self._declared = DeclaredTokens()
        # (accepted entries, revoked hashes): replaced whole, so read without the lock
        self._snapshot: tuple[tuple[TokenEntry, ...], frozenset[str]] = ((), frozenset())

    def load(self) -> TokenSummary:
        """Read both files as they are now (a worker's start)."""
        with self._lock:
            declared = read_tokens(self.tokens_file)
            retired = self._in_grace(self._read_retired(), declared, self.clock())
            return self._install(declared, retired)

    def rotate(self) -> TokenSummary:
        """Re-read the tokens file; record the tokens it dropped in the retired file, with the
        time, and prune those past their grace. A bad tokens file, or a retired file that cannot
        be written, changes nothing and raises TokenFileError."""
        with self._lock:
            declared, now = read_tokens(self.tokens_file), self.clock()
            before, after = self._declared.by_hash(), declared.by_hash()
            accepted_before = {e.sha256 for e in self._snapshot[0]}
            records = self._read_retired()
            removed = set(before) - set(after)
            for sha256 in removed:          # in use until now, whatever an older record says
                records[sha256] = before[sha256].retired_record(now)
            records = self._in_grace(records, declared, now)
            try:
                write_atomically(self.retired_file,
                                 json.dumps(records, indent=1, sort_keys=True).encode() + b"\n")
            except OSError as exc:
                raise TokenFileError(f"cannot write {self.retired_file}: {exc.strerror}") from None
            summary = self._install(declared, records)
            return TokenSummary(summary.active, summary.in_grace,
                                added=len(set(after) - set(before)),
                                retired=len(removed - declared.revoked),
                                revoked=len(accepted_before & declared.revoked))

    def _read_retired(self) -> dict[str, dict]:
        """{sha256: record}; an unreadable file is logged and read as empty (no grace)."""
        try:
            records = json.loads(self.retired_file.read_text())
            if not isinstance(records, dict):
                raise ValueError("not a JSON object")
            for sha256, record in records.items():
                self._retired_entry(sha256, record)
            return records
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("ignoring retired-tokens file %s (no grace for rotated tokens): %s",
                        self.retired_file, exc)
            return {}

    def _retired_entry(self, sha256: str, record: dict) -> TokenEntry:
        expires = record.get("expires")
        return TokenEntry(parse_name(record["name"]), parse_sha256(sha256),
                          parse_clusters(record["clusters"]),
                          parse_capabilities(record["capabilities"]),
                          None if expires is None else float(expires),
                          float(record["retired_at"]) + self.grace_s)

    def _in_grace(self, records: dict[str, dict], declared: DeclaredTokens,
                  now: float) -> dict[str, dict]:
        """The records still in grace, neither back in the file nor revoked."""
        current = declared.by_hash()
        return {h: r for h, r in records.items()
                if float(r["retired_at"]) + self.grace_s > now
                and h not in current and h not in declared.revoked}

    def _install(self, declared: DeclaredTokens, records: dict[str, dict]) -> TokenSummary:
        active = [e for e in declared.entries if e.sha256 not in declared.revoked]
        retiring = [self._retired_entry(h, r) for h, r in sorted(records.items())]
        self._declared = declared
        self._snapshot = (tuple(active + retiring), declared.revoked)
        return TokenSummary(len(active), len(retiring))

    def authenticate(self, authorization: str | None) -> Principal:
        """The Principal of an ``Authorization: Bearer <token>`` header, or AuthError. The hash
        is compared with every accepted one, so the time taken does not say which matched."""
        digest = token_hash(bearer_token(authorization))
        accepted, revoked = self._snapshot
        match = None
        for entry in accepted:
            if hmac.compare_digest(entry.sha256, digest) and match is None:
                match = entry
        if match is None:
            reason = "token revoked" if digest in revoked else "unknown token"
            raise TokenRefused(reason, code="invalid_token", token_sha256=digest,
                               headers=_BAD_TOKEN)
        self._check_live(match, self.clock())
        return match.principal()

    @staticmethod
    def _check_live(entry: TokenEntry, now: float) -> None:
        if entry.expires is not None and now >= entry.expires:
            reason = f"token {entry.name!r} expired at {format_time(entry.expires)}"
        elif entry.retiring_until is not None and now >= entry.retiring_until:
            reason = (f"token {entry.name!r} was rotated out; its grace ended at "
                      f"{format_time(entry.retiring_until)}")
        else:
            return
        raise TokenRefused(reason, code="token_expired", token_sha256=entry.sha256,
                           token=entry.name, headers=_BAD_TOKEN)


def bearer_token(authorization: str | None) -> str:
    """The token of ``Bearer <token>`` (scheme in any case), or a 401 "unauthorized"."""
    if not authorization or not authorization.strip():
        problem = "an 'Authorization: Bearer <token>' header is required"
    elif len(authorization) > MAX_AUTHORIZATION:
        problem = f"the Authorization header is longer than {MAX_AUTHORIZATION} characters"
    else:
        parts = authorization.split()
        if len(parts) == 2 and parts[0].lower() == "bearer" and _B64TOKEN.fullmatch(parts[1]):
            return parts[1]
        problem = "the Authorization header must be 'Bearer <token>'"
    raise TokenRefused(problem, headers={"WWW-Authenticate": CHALLENGE})
