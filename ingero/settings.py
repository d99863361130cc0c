"""Settings: each declared once, feeding the flags, the YAML file, the environment and the man page.

A daemon lists its ``Setting``s in one table. ``load`` layers them: the declared default, then the
YAML config file, then ``<PREFIX>_<NAME>`` environment variables, then command-line flags. Every
value passes through the setting's parser, which raises ``ConfigError`` naming the setting.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import click
import yaml

from .errors import ConfigError
from .vocabulary import NAME, NAME_RULE


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    parse: Callable[[Any], Any]
    help: str
    metavar: str = "VALUE"
    is_flag: bool = False
    hidden: bool = False
    multiple: bool = False       # a flag given once per value (--on-verdict URL ...)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


# -- parsers: each takes a YAML value or a string and returns the checked value ----------------

def text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    return value.strip()


def name(value: Any) -> str:
    """A node's or cluster's name (``vocabulary.NAME``)."""
    value = text(value)
    if not NAME.fullmatch(value):
        raise ValueError(f"not a node or cluster name ({NAME_RULE})")
    return value


def optional_text(value: Any) -> str | None:
    return None if value in (None, "") else text(str(value))


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    lowered = str(value).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def number(lo: float, hi: float) -> Callable[[Any], float]:
    def parse(value: Any) -> float:
        result = float(value)
        if not lo <= result <= hi:
            raise ValueError(f"expected a number in [{lo:g}, {hi:g}]")
        return result
    return parse


def integer(lo: int, hi: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, float) or isinstance(value, bool):
            raise ValueError("expected an integer")
        result = int(value)
        if not lo <= result <= hi:
            raise ValueError(f"expected an integer in [{lo}, {hi}]")
        return result
    return parse


def optional(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def parse_optional(value: Any) -> Any:
        return None if value in (None, "", "none") else parse(value)
    return parse_optional


def choice(*options: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return value
    return parse


def path(value: Any) -> Path:
    return Path(text(str(value))).expanduser()


def path_list(value: Any) -> list[str]:
    """Comma-separated on the command line, a list in YAML."""
    items = value if isinstance(value, list) else str(value).split(",")
    return [str(path(item)) for item in items if str(item).strip()]


def text_list(value: Any) -> list[str]:
    """Words: ``A[,B...]`` on the command line, a list in YAML."""
    items = value if isinstance(value, list) else str(value).split(",")
    return [text(str(item).strip()) for item in items if str(item).strip()]


def url_list(value: Any) -> list[str]:
    """http(s) URLs: a flag given once per URL, a list in YAML, space-separated in the
    environment; none twice."""
    items = list(value) if isinstance(value, (list, tuple)) else str(value).split()
    urls = [text(str(item)).strip() for item in items if str(item).strip()]
    for url in urls:
        if not re.match(r"^https?://[^\s/]+", url):
            raise ValueError(f"{url!r} is not an http:// or https:// URL")
    if len(set(urls)) != len(urls):
        raise ValueError("a URL is listed twice")
    return urls


def pid_list(value: Any) -> list[int]:
    """Process ids: ``PID[,PID...]`` on the command line, a list in YAML."""
    items = value if isinstance(value, list) else str(value).split(",")
    return [integer(1, 2**22)(item) for item in items if str(item).strip()]


_HOST_PORT = re.compile(r"^(?P<host>\[[0-9a-fA-F:]+\]|[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")


def listen_address(value: Any) -> tuple[str, int] | None:
    """``host:port`` for an HTTP listener, or ``none`` to turn it off."""
    if value in (None, "", "none"):
        return None
    match = _HOST_PORT.match(str(value))
    if not match or int(match["port"]) > 65535:
        raise ValueError("expected HOST:PORT or none")
    return match["host"].strip("[]"), int(match["port"])


def zmq_endpoint(value: Any) -> str:
    endpoint = text(str(value))
    if not re.match(r"^(tcp|ipc|inproc)://\S+$", endpoint):
        raise ValueError("expected a ZeroMQ endpoint such as tcp://head:7470")
    return endpoint


def zmq_endpoints(value: Any) -> list[str]:
    """``ENDPOINT[,ENDPOINT...]`` on the command line, a list in YAML; no endpoint twice."""
    items = value if isinstance(value, list) else str(value).split(",")
    endpoints = [zmq_endpoint(item.strip() if isinstance(item, str) else item)
                 for item in items if str(item).strip()]
    if not endpoints:
        raise ValueError("expected at least one ZeroMQ endpoint")
    if len(set(endpoints)) != len(endpoints):
        raise ValueError("an endpoint is listed twice")
    return endpoints


def shard(value: Any) -> tuple[int, int]:
    """``K/N``: this process is shard K of N (0 <= K < N)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(value))
    if match is None:
        raise ValueError("expected K/N, e.g. 0/1 (the only fleetd) or 1/4")
    k, n = int(match.group(1)), int(match.group(2))
    if not 1 <= n <= 1024 or not 0 <= k < n:
        raise ValueError(f"{k}/{n}: need 0 <= K < N <= 1024")
    return k, n


def named_integers(name: str, unit: str, lo: int, hi: int) -> Callable[[Any], dict[str, int]]:
    """``NAME=N,...`` on the command line, or a mapping in YAML."""
    def parse(value: Any) -> dict[str, int]:
        if isinstance(value, dict):
            pairs = value.items()
        else:
            pairs = [item.split("=", 1) for item in str(value).split(",") if item.strip()]
            if any(len(p) != 2 for p in pairs):
                raise ValueError(f"expected {name}={unit}[,{name}={unit}...]")
        return {text(str(k)): integer(lo, hi)(v) for k, v in pairs}
    return parse


node_counts = named_integers("CLUSTER", "COUNT", 1, 1_000_000)
kind_days = named_integers("KIND", "DAYS", 1, 36_500)


def env_matches(value: Any) -> dict[str, str]:
    """``KEY=VALUE,...`` on the command line, a mapping in YAML."""
    if isinstance(value, dict):
        return {text(str(k)): str(v) for k, v in value.items()}
    pairs = [item.split("=", 1) for item in str(value).split(",") if item.strip()]
    if any(len(p) != 2 or not p[0].strip() for p in pairs):
        raise ValueError("expected KEY=VALUE[,KEY=VALUE...]")
    return {k.strip(): v for k, v in pairs}


def log_level(value: Any) -> str:
    return choice("debug", "info", "warning", "error")(str(value).lower())


# -- the settings every daemon has, declared once ---------------------------------------------

def secret_key(daemon: str, whose: str) -> Setting:
    """The daemon's CURVE secret key file (``whose``: how its help names the owner)."""
    return Setting("secret_key", f"/etc/ingero/keys/{daemon}.key_secret", path,
                   f"{whose} CURVE secret key file (create it with '{daemon} keygen').", "FILE")


def authorized_keys(default: str, whose: str, may: str) -> Setting:
    """The directory of the public keys of the peers (``whose``) that may connect and ``may``."""
    return Setting("authorized_keys", default, path,
                   f"Directory of the {whose} public key files (*.key) that may {may}; "
                   "re-read on SIGHUP.", "DIR")


def insecure_plaintext_zmq(help: str) -> Setting:
    """The opt-out of CURVE; ``help`` says what the daemon gives up with it."""
    return Setting("insecure_plaintext_zmq", False, boolean, help, is_flag=True)


def metrics_addr(port: int) -> Setting:
    return Setting("metrics_addr", f"127.0.0.1:{port}", listen_address,
                   "HOST:PORT for the Prometheus /metrics endpoint, or none.", "HOST:PORT")


def max_frame_bytes(default: int, most: int, what: str) -> Setting:
    return Setting("max_frame_bytes", default, integer(1024, most),
                   f"Largest {what} accepted; larger ones are dropped and counted.", "BYTES")


def log_level_setting() -> Setting:
    return Setting("log_level", "info", log_level, "debug, info, warning or error.", "LEVEL")


# -- loading -----------------------------------------------------------------------------------

def _parse_one(setting: Setting, value: Any, origin: str) -> Any:
    try:
        return setting.parse(value)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{setting.name} ({origin}): {value!r}: {exc}") from None


def read_yaml(config: Path) -> dict:
    try:
        data = yaml.safe_load(config.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {config}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {config} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {config} must hold a mapping of setting names to values")
    return data


def load(table: list[Setting], prefix: str, config: Path | list[Path] | None,
         flags: dict[str, Any], environ: dict[str, str] | None = None,
         defaults: dict[str, Any] | None = None) -> SimpleNamespace:
    """Layer default, YAML file(s), environment and flags; ``flags`` holds only the flags
    given. Several files are layers too, the later over the earlier (a site's, then a user's).

    ``defaults`` replaces declared defaults with ones found at run time (a Slurm job id, say):
    still the lowest layer, so the file, the environment and the flags override them.
    """
    environ = os.environ if environ is None else environ
    by_name = {s.name: s for s in table}
    values = {s.name: s.parse(s.default) if s.default is not None else None for s in table}
    for name, value in (defaults or {}).items():
        values[name] = _parse_one(by_name[name], value, "default")
    for config in [] if config is None else config if isinstance(config, list) else [config]:
        data = read_yaml(config)
        unknown = sorted(set(data) - set(by_name))
        if unknown:
            raise ConfigError(f"config file {config}: unknown setting(s): {', '.join(unknown)}")
        for name, value in data.items():
            values[name] = _parse_one(by_name[name], value, str(config))
    for s in table:
        env_name = f"{prefix}_{s.name.upper()}"
        if env_name in environ:
            values[s.name] = _parse_one(s, environ[env_name], env_name)
    for name, value in flags.items():
        if value is not None and value != ():       # () : a repeatable flag not given
            values[name] = _parse_one(by_name[name], value, by_name[name].flag)
    return SimpleNamespace(**values)


def click_options(table: list[Setting]) -> Callable:
    """Decorate a click command with one option per setting; unset options arrive as None."""
    def decorate(command: Callable) -> Callable:
        for s in reversed(table):
            default = f" [default: {s.default}]" if s.default not in (None, False, {}, []) and "[default:" not in s.help else ""
            if s.is_flag:
                option = click.option(s.flag, s.name, is_flag=True, default=None,
                                      help=s.help, hidden=s.hidden)
            elif s.multiple:
                option = click.option(s.flag, s.name, multiple=True, metavar=s.metavar,
                                      help=s.help + " Repeatable.", hidden=s.hidden)
            else:
                option = click.option(s.flag, s.name, default=None, metavar=s.metavar,
                                      help=s.help + default, hidden=s.hidden)
            command = option(command)
        return command
    return decorate
