"""CurveZMQ keys and the authenticator that admits only authorised agents.

Keys are ZeroMQ certificate files: ``NAME.key`` holds the public key and may be copied anywhere,
``NAME.key_secret`` holds both keys and stays on its host, readable by root only. fleetd admits
an agent only if the agent's public key file is in fleetd's authorised-keys directory, and takes
from it only what that file's name says it may speak for: an agent key authorised as
``NODE.key`` pushes as node NODE, one authorised as ``NODE@CLUSTER.key`` as node NODE of cluster
CLUSTER only (``bound_to``).
"""

from __future__ import annotations

import os
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from .errors import KeyFileError


def generate(directory: Path, name: str, force: bool = False) -> tuple[Path, Path]:
    """Write ``NAME.key`` and ``NAME.key_secret`` into ``directory``; refuse to overwrite."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    public, secret = directory / f"{name}.key", directory / f"{name}.key_secret"
    if not force and (public.exists() or secret.exists()):
        raise KeyFileError(f"{public} or {secret} already exists; pass --force to replace them")
    old_umask = os.umask(0o077)
    try:
        public_path, secret_path = zmq.auth.create_certificates(str(directory), name)
    finally:
        os.umask(old_umask)
    os.chmod(public_path, 0o644)
    os.chmod(secret_path, 0o600)
    return Path(public_path), Path(secret_path)


def load_keypair(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a ``.key_secret`` file."""
    public, secret = _load(path)
    if not secret:
        raise KeyFileError(f"{path} holds no secret key; give the .key_secret file")
    return public, secret


def load_public(path: Path) -> bytes:
    public, _secret = _load(path)
    return public


def _load(path: Path) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise KeyFileError(f"key file {path} does not exist (create one with 'keygen')")
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc}") from None
    if not public:
        raise KeyFileError(f"{path} holds no public key")
    return public, secret


def bound_to(name: str) -> tuple[str, str | None]:
    """(node, cluster or None for any) that a key authorised under ``name`` speaks for."""
    node, _, cluster = name.partition("@")
    return node, cluster or None


def authorized_keys(directory: Path) -> list[Path]:
    if not directory.is_dir():
        raise KeyFileError(f"authorised-keys directory {directory} does not exist")
    return sorted(directory.glob("*.key"))


class FleetAuthenticator(ThreadAuthenticator):
    """The ZAP handler for fleetd's socket; counts the connections it refuses."""

    def __init__(self, context: zmq.Context, on_refused=None):
        super().__init__(context)
        self.on_refused = on_refused
        self.names: dict[str, str] = {}      # a public key (Z85) -> the name it is authorised as

    def load(self, directory: Path) -> int:
        """(Re)read the authorised public keys; returns how many there are."""
        keys = authorized_keys(directory)
        names = {}
        for path in keys:
            try:
                names[load_public(path).decode()] = path.stem
            except KeyFileError:
                pass                     # ZeroMQ skips it too: it admits nobody
        self.configure_curve(domain="*", location=str(directory))
        self.names = names
        return len(keys)

    def name_of(self, user_id: str | None) -> str | None:
        """The name the key a message came under is authorised as (None: not authorised)."""
        return self.names.get(user_id) if self.admits(user_id) else None

    def admits(self, user_id: str | None) -> bool:
        """Whether the peer a message came from (its ZAP User-Id: its public key in Z85) is
        still authorised: a key taken out of the directory ends the say of the connection it
        already has, not only its next handshake."""
        return user_id is not None and user_id.encode() in self.certs.get("*", {})

    def _send_zap_reply(self, request_id, status_code, status_text, user_id="anonymous"):
        if status_code != b"200" and self.on_refused is not None:
            self.on_refused(status_text.decode("utf-8", "replace"))
        super()._send_zap_reply(request_id, status_code, status_text, user_id)


def serve_curve(socket: zmq.Socket, keypair: tuple[bytes, bytes]) -> None:
    public, secret = keypair
    socket.curve_publickey = public
    socket.curve_secretkey = secret
    socket.curve_server = True


def connect_curve(socket: zmq.Socket, keypair: tuple[bytes, bytes], server_public: bytes) -> None:
    public, secret = keypair
    socket.curve_publickey = public
    socket.curve_secretkey = secret
    socket.curve_serverkey = server_public
