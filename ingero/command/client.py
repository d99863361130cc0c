"""echod's HTTP API as the command line reaches it: where it is, who asks (a token, or the
user's MUNGE credential), the CA to trust.

The settings are declared once (``SETTINGS``) and layered like the daemons' (``ingero.settings``):
their defaults, then the site's client file (``/etc/ingero/ingero.yaml``), then over it the
user's (``~/.config/ingero/ingero.yaml``, or ``--config``), then ``INGERO_*`` variables, then
flags.
``EchodClient`` makes the calls; every failure is an ``ApiCallError`` with one line to say.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import click

from ingero import __version__, httpclient, munge
from ingero.errors import ApiCallError, ConfigError
from ingero.settings import (Setting, boolean, choice, click_options, load, number, optional,
                       optional_text, path, text)

TIMEOUT_S = 120            # the API's own SQL limit is 60 s; leave it room to answer
AUTH_MODES = ("auto", "token", "munge")
USER_CONFIG = Path("~/.config/ingero/ingero.yaml")
SITE_CONFIG = Path("/etc/ingero/ingero.yaml")

SETTINGS = [
    Setting("url", None, optional_text, "echod's API, https://HOST:PORT [default: none].",
            "URL"),
    Setting("token", None, optional_text,
            "Bearer token (make one with 'echod token create'); prefer token_file or "
            "$INGERO_TOKEN to a flag, which other users can read in the process list.", "TOKEN",
            hidden=True),
    Setting("token_file", None, optional(path), "File holding the bearer token.", "FILE"),
    Setting("auth", "auto", choice(*AUTH_MODES),
            "How to prove who asks: token (--token-file or $INGERO_TOKEN), munge (a MUNGE "
            "credential from the local munged, as Slurm's commands do: you see your own "
            "jobs), or auto (the token when one is given, else MUNGE).", "MODE"),
    Setting("munge_socket", munge.DEFAULT_SOCKET, text, "The local munged's socket.", "PATH"),
    Setting("ca_cert", None, optional(path),
            "PEM CA (or echod's own certificate) to verify echod by [default: the system's "
            "CAs].", "FILE"),
    Setting("timeout", float(TIMEOUT_S), number(1.0, 3600.0),
            "Seconds to wait for each API answer.", "SECONDS"),
    Setting("insecure_no_tls", False, boolean,
            "Allow an http:// URL: the token and every answer cross the network unencrypted, "
            "and nothing proves the server is echod.", is_flag=True),
]


def client_options(command):
    """The API's settings as options of a command, and --config for the user's client file."""
    command = click_options(SETTINGS)(command)
    return click.option("--config", "config", default=None, metavar="FILE",
                        help=f"Your client file, read over the site's {SITE_CONFIG} "
                             f"[default: {USER_CONFIG}, where it exists]")(command)


def settings(config: str | None, flags: dict, environ=None, site: Path = SITE_CONFIG,
             user: Path = USER_CONFIG) -> SimpleNamespace:
    """The client settings: the site's file where it exists, then over it the user's (the
    explicit one, which must exist, else the default where it exists), then INGERO_*
    variables, then flags."""
    mine = Path(config) if config else user.expanduser()
    # a site file this user may not read is not for them (a site keeps its token there)
    files = [site] if os.access(site, os.R_OK) and site != mine else []
    files += [mine] if config or mine.exists() else []
    given = {s.name: flags.get(s.name) for s in SETTINGS}
    return load(SETTINGS, "INGERO", files, given, environ)


def connect(cfg: SimpleNamespace) -> "EchodClient":
    """A client for the settings, or ConfigError saying what is missing or unsafe."""
    if not cfg.url:
        raise ConfigError("no echod URL: give --url, set INGERO_URL, or put 'url: "
                          f"https://HOST:7472' in {USER_CONFIG}")
    scheme = urllib.parse.urlsplit(cfg.url).scheme.lower()
    if scheme == "http" and not cfg.insecure_no_tls:
        raise ConfigError("refusing a plain http:// URL: the token would cross the network "
                          "unencrypted (--insecure-no-tls to allow it)")
    if scheme not in ("https", "http"):
        raise ConfigError(f"the URL must be https://HOST:PORT, not {cfg.url!r}")
    return EchodClient(cfg.url, credentials(cfg), str(cfg.ca_cert) if cfg.ca_cert else None,
                       cfg.timeout)


def credentials(cfg: SimpleNamespace) -> str | Callable[[], str]:
    """The token, or what makes a fresh MUNGE Authorization header for each request. In
    auto, a token file this user may not read (the site's, on a head node) is no token: the
    user proves who they are with MUNGE instead."""
    def proven(method: str, url: str, body: bytes) -> str:
        return f"{munge.SCHEME} {_credential(cfg.munge_socket, method, url, body)}"

    if cfg.auth == "munge":
        return proven
    unreadable = None
    try:
        token = read_token(cfg)
    except ConfigError as exc:
        if cfg.auth == "token":
            raise
        token, unreadable = None, exc
    if token:
        return token
    if cfg.auth == "token":
        raise ConfigError("no token: give --token-file FILE or set INGERO_TOKEN (make one "
                          "with 'echod token create')")
    if shutil.which("munge") is None or not Path(cfg.munge_socket).exists():
        if unreadable is not None:
            raise unreadable
        raise ConfigError("no token, and no munged here to prove who you are: give "
                          "--token-file FILE, set INGERO_TOKEN, or run where munge runs")
    return proven


def _credential(socket: str, method: str, url: str, body: bytes) -> str:
    try:
        return munge.credential(socket, payload=munge.payload_for_url(method, url, body))
    except munge.MungeError as exc:
        raise ConfigError(f"no MUNGE credential: {exc}") from None


def read_token(cfg: SimpleNamespace) -> str | None:
    token = cfg.token
    if cfg.token_file is not None:
        try:
            token = cfg.token_file.read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read the token file {cfg.token_file}: "
                              f"{exc.strerror}") from None
    return token.strip() if token and token.strip() else None


class EchodClient:
    """echod's HTTP API with one bearer token (or, given a function of a request's method, URL
    and body, the Authorization header it makes for it), TLS verified against ``ca_cert`` (the
    system's CAs when None), every request bounded by ``timeout`` seconds."""

    def __init__(self, url: str, token: str | Callable[[], str], ca_cert: str | None = None,
                 timeout: float = TIMEOUT_S):
        self.url, self.timeout = url.rstrip("/"), timeout
        try:
            context = ssl.create_default_context(cafile=ca_cert)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"cannot use the CA file {ca_cert}: {exc}") from None
        self.opener = httpclient.opener(urllib.request.HTTPSHandler(context=context))
        self.authorization = token if callable(token) else \
            lambda method, url, body: f"Bearer {token}"
        self.headers = {"Accept": "application/json", "User-Agent": f"ingero/{__version__}"}

    def tools(self) -> list[dict]:
        """The tools this token may call, as echod lists them."""
        listing = self._request("GET", "/api/v1/tools")
        return [tool for tool in listing["tools"] if tool.get("allowed")]

    def call(self, name: str, arguments: dict) -> dict:
        return self._request("POST", f"/api/v1/tools/{name}", arguments)

    def sql(self, statement: str, **limits) -> dict:
        return self._request("POST", "/api/v1/sql", {"sql": statement, **limits})

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        headers = {**self.headers,
                   "Authorization": self.authorization(method, self.url + path, data or b""),
                   **({} if data is None else {"Content-Type": "application/json"})}
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with self.opener.open(request, timeout=self.timeout) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as answer:
            raise _refusal(answer.code, answer.headers.get("Retry-After"),
                           answer.read()) from None
        except OSError as exc:                    # URLError, TLS, refused, timed out
            raise ApiCallError(f"cannot reach echod at {self.url}: "
                               f"{getattr(exc, 'reason', exc)}", "unreachable") from None
        except ValueError:
            raise ApiCallError(f"echod at {self.url} answered {path} with no JSON",
                               "bad_answer") from None


def _refusal(status: int, retry_after: str | None, body: bytes) -> ApiCallError:
    """echod's {"error", "code"} answer (or whatever else answered) as an ApiCallError."""
    try:
        error = json.loads(body)
    except ValueError:
        error = None
    error = error if isinstance(error, dict) else {}
    return ApiCallError(error.get("error") or f"echod answered HTTP {status}",
                        error.get("code") or "http_error", status, _seconds(retry_after))


def _seconds(header: str | None) -> int | None:
    try:
        return max(1, math.ceil(float(header))) if header else None
    except ValueError:
        return None
