"""``fleetd``: the command line. The logic lives in server.py."""

from __future__ import annotations

import click

from ingero.cli_common import config_option, keygen_command, load_settings
from ingero.errors import IngeroError
from ingero.runtime import SignalFlags, setup_logging
from ingero.settings import click_options

from .config import DEFAULT_CONFIG, SETTINGS
from .server import FleetServer


@click.group(invoke_without_command=True, context_settings={"max_content_width": 100},
             epilog="Example: fleetd --bind tcp://0.0.0.0:7470 --quorum 5")
@config_option(DEFAULT_CONFIG)
@click_options(SETTINGS)
@click.pass_context
def main(ctx: click.Context, config: str | None, **flags) -> None:
    """Head-node straggler threshold service for ingero agents.

    Agents push health scores and events; fleetd answers each push, on the same socket, with
    its cohort's threshold (median - k*1.4826*MAD of the active nodes' scores).
    """
    if ctx.invoked_subcommand is not None:
        return
    cfg = load_settings(SETTINGS, "FLEETD", config, DEFAULT_CONFIG, flags)
    setup_logging(cfg.log_level, "fleetd")
    server = FleetServer(cfg, SignalFlags().install())
    try:
        ctx.exit(server.run())
    except IngeroError as exc:
        raise click.ClickException(str(exc)) from None


main.add_command(keygen_command("/etc/ingero/keys", "fleetd", "fleetd"))
