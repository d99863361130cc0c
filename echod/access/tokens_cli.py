"""``echod token``: create, list and revoke the HTTP API's bearer tokens in --tokens-file.

The file holds hashes only; a token is printed once, when it is made. echod reads the file
again on SIGHUP (``systemctl reload echod``).
"""

from __future__ import annotations

import time
from pathlib import Path

import click
import yaml

from ingero.cli_common import load_settings

from .principal import new_token, token_hash
from .tokens import (TokenFileError, format_time, ordered, parse_capabilities, parse_clusters,
                     parse_expires, parse_name, parse_tokens, read_tokens_document,
                     write_atomically)
from ..config import DEFAULT_CONFIG, SETTINGS

HEADER = ("# echod's API tokens: sha256 hashes only, never the tokens. Manage them with\n"
          "# 'echod token'; echod reads this file again on SIGHUP.\n")


def _settings():
    """echod's settings, from the root command's --config and flags (as 'echod db' reads them)."""
    root = click.get_current_context().find_root()
    config, flags = root.obj if root.obj else (None, {})
    return load_settings(SETTINGS, "ECHOD", config, DEFAULT_CONFIG, flags)


def _read(path: Path) -> dict:
    """The tokens file's mapping, checked whole; {} when there is none yet."""
    try:
        document = read_tokens_document(path)
        if document is not None:
            parse_tokens(document, str(path))
    except TokenFileError as exc:
        raise click.ClickException(str(exc)) from None
    return document or {}


def _write(path: Path, document: dict) -> None:
    """Replace the file (tokens first, then revoked), having checked that it will load."""
    document = {"tokens": document.get("tokens") or [],
                **({"revoked": document["revoked"]} if document.get("revoked") else {})}
    try:
        parse_tokens(document, str(path))
        text = HEADER + yaml.safe_dump(document, sort_keys=False, default_flow_style=None)
        write_atomically(path, text.encode())
    except TokenFileError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot write {path}: {exc.strerror}") from None


def _checked(parse):
    """A click callback running one of auth's field parsers on a comma-separated value."""
    def callback(ctx, param, value):
        if value is None:
            return None
        try:
            return parse(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
    return callback


def _clusters(value: str) -> list[str]:
    names = [c.strip() for c in value.split(",")]
    parse_clusters(["*"] if names == ["*"] else names)
    return names


def _capabilities(value: str) -> list[str]:
    return ordered(parse_capabilities([c.strip() for c in value.split(",")]))


def _expires(value: str) -> str:
    moment = parse_expires(value.strip())
    if moment <= time.time():
        raise ValueError(f"{value} is in the past")
    return format_time(moment)


@click.group("token")
def token_group() -> None:
    """The HTTP API's bearer tokens, kept hashed in --tokens-file.

    Each token grants some clusters and capabilities: read (the tools), sql (run_analysis) and
    admin (implies both). echod reads the file again on SIGHUP; a removed token keeps working
    for --token-grace seconds after it.

    Example: TOKEN=$(echod token create ops --clusters '*' --capabilities admin)
    """


@token_group.command("create")
@click.argument("name", callback=_checked(parse_name))
@click.option("--clusters", required=True, metavar="CLUSTER[,CLUSTER...]|*",
              callback=_checked(_clusters),
              help="Clusters the token may see, or * for all.")
@click.option("--capabilities", required=True, metavar="CAP[,CAP...]",
              callback=_checked(_capabilities),
              help="read, sql and/or admin (admin implies read and sql).")
@click.option("--expires", default=None, metavar="DATE",
              callback=_checked(_expires),
              help="ISO 8601 date or time after which the token is refused (UTC unless it "
                   "gives an offset).")
def create(name: str, clusters: list[str], capabilities: list[str], expires: str | None) -> None:
    """Make a token and print it, once, on standard output; only its hash is stored.

    Example: TOKEN=$(echod token create alice --clusters a100,h100 --capabilities read,sql)
    """
    path = _settings().tokens_file
    document = _read(path)
    tokens = list(document.get("tokens") or [])
    if any(entry.get("name") == name for entry in tokens):
        raise click.ClickException(f"{path} already has a token named {name!r}; revoke it first "
                                   "or choose another name")
    token = new_token()
    entry = {"name": name, "sha256": token_hash(token), "clusters": clusters,
             "capabilities": capabilities}
    if expires is not None:
        entry["expires"] = expires
    _write(path, {**document, "tokens": tokens + [entry]})
    click.echo(token)
    click.echo(f"echod: token {name!r} added to {path}; it works once echod has had SIGHUP "
               "(systemctl reload echod). This is the only time it is shown.", err=True)


@token_group.command("list")
def list_tokens() -> None:
    """Print each token's name, clusters, capabilities, expiry and hash prefix (never the token).

    Example: echod token list
    """
    path = _settings().tokens_file
    try:
        declared = parse_tokens(_read(path), str(path))
    except TokenFileError as exc:
        raise click.ClickException(str(exc)) from None
    if not declared.entries:
        click.echo(f"echod: no tokens in {path}", err=True)
        return
    rows = [("NAME", "CLUSTERS", "CAPABILITIES", "EXPIRES", "SHA256")]
    now = time.time()
    for e in declared.entries:
        expiry = "-" if e.expires is None else format_time(e.expires) + \
            (" (expired)" if e.expires <= now else "")
        rows.append((e.name, ",".join(sorted(e.clusters)) if e.clusters else "*",
                     ",".join(ordered(e.capabilities)), expiry, e.sha256[:12]))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[4])
    if declared.revoked:
        click.echo(f"echod: {len(declared.revoked)} hash(es) revoked", err=True)


@token_group.command("revoke")
@click.argument("name")
@click.option("--now", "at_once", is_flag=True,
              help="Also list its hash under revoked:, so that it is refused from the next "
                   "SIGHUP on, without the grace window.")
def revoke(name: str, at_once: bool) -> None:
    """Remove a token; it stops working --token-grace seconds after the next SIGHUP.

    Example: echod token revoke alice --now && systemctl reload echod
    """
    cfg = _settings()
    path = cfg.tokens_file
    document = _read(path)
    tokens = list(document.get("tokens") or [])
    entry = next((e for e in tokens if e.get("name") == name), None)
    if entry is None:
        known = ", ".join(e.get("name") for e in tokens) or "none"
        raise click.ClickException(f"no token named {name!r} in {path} (tokens: {known})")
    revoked = list(document.get("revoked") or [])
    if at_once and entry["sha256"].lower() not in revoked:
        revoked.append(entry["sha256"].lower())
    _write(path, {**document, "tokens": [e for e in tokens if e is not entry],
                  "revoked": revoked})
    when = ("from the next SIGHUP on" if at_once else
            f"{cfg.token_grace:g} s after the next SIGHUP (--now: at once)")
    click.echo(f"echod: token {name!r} removed from {path}; it is refused {when} "
               "(systemctl reload echod)", err=True)
