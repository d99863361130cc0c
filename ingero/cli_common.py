"""Command-line pieces both daemons use: loading settings and turning errors into exits."""

from __future__ import annotations

from pathlib import Path

import click

from . import curve
from .errors import IngeroError
from .settings import Setting, load


def config_option(default: str):
    return click.option("--config", "config", default=None, metavar="FILE",
                        help=f"YAML config file [default: {default}, if it exists]")


def load_settings(table: list[Setting], prefix: str, config: str | None, default: str,
                  flags: dict, defaults: dict | None = None):
    """Settings from the explicit file (which must exist) or the default one (if it exists)."""
    path = Path(config) if config else Path(default)
    if not config and not path.exists():
        path = None
    try:
        return load(table, prefix, path, flags, defaults=defaults)
    except IngeroError as exc:
        raise click.ClickException(str(exc)) from None


def keygen_command(default_dir: str, default_name: str, what: str) -> click.Command:
    @click.command("keygen", help=f"Create {what}'s CURVE key pair.\n\nThe public half "
                   f"(NAME.key) goes to the other end; NAME.key_secret stays here.\n\n"
                   f"Example: keygen --dir {default_dir} --name {default_name}")
    @click.option("--dir", "directory", default=default_dir, show_default=True,
                  type=click.Path(file_okay=False, path_type=Path), help="Where to write the keys")
    @click.option("--name", default=default_name, show_default=True, help="Key file base name")
    @click.option("--force", is_flag=True, help="Replace existing key files")
    def keygen(directory: Path, name: str, force: bool) -> None:
        try:
            public, secret = curve.generate(directory, name, force)
        except IngeroError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"public key: {public}\nsecret key: {secret}")
    return keygen


def example_last(group: click.Group) -> None:
    """Move each command's "Example:" paragraph after its options, so --help ends with it."""
    for command in group.commands.values():
        text, _, example = (command.help or "").partition("Example:")
        if example and not command.epilog:
            command.help, command.epilog = text.rstrip(), f"Example: {example.strip()}"
