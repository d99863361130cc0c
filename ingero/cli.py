"""``ingero``: the operator's command line."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click

from . import __version__, curve, demo, fleetclient, mcp
from .errors import IngeroError


@click.group(context_settings={"max_content_width": 100})
@click.version_option(__version__)
def main() -> None:
    """ingero: find the slow rank of a distributed training job, and why.

    Example: ingero demo
    """


main.add_command(mcp.mcp_command)


@main.command("demo")
@click.option("--nodes", default=8, show_default=True, type=click.IntRange(5, 64),
              help="Agents to start")
@click.option("--interval", default=0.5, show_default=True, type=click.FloatRange(0.1, 10),
              help="Push interval, seconds")
@click.option("--healthy", default=0.9, show_default=True, type=click.FloatRange(0, 1),
              help="Every node's score at first")
@click.option("--slow", default=0.55, show_default=True, type=click.FloatRange(0, 1),
              help="The slowed node's score")
def demo_command(nodes: int, interval: float, healthy: float, slow: float) -> None:
    """Run fleetd and agents on loopback, slow one node down, and show fleetd flag it.

    Needs no GPU and no root. Example: ingero demo --nodes 12
    """
    code = demo.run(nodes, interval, healthy, slow, click.echo)
    if code:
        raise click.ClickException("the demo did not see the straggler flagged")


@main.command("threshold")
@click.option("--fleet", default="tcp://127.0.0.1:7470", show_default=True,
              help="fleetd's endpoint")
@click.option("--cohort", required=True, help="job:JOBID or cluster:NAME")
@click.option("--secret-key", type=click.Path(path_type=Path),
              default="/etc/ingero/keys/ingerod.key_secret", show_default=True,
              help="An authorised CURVE secret key file")
@click.option("--fleet-public-key", type=click.Path(path_type=Path),
              default="/etc/ingero/keys/fleetd.key", show_default=True,
              help="fleetd's public key file")
@click.option("--insecure-plaintext-zmq", is_flag=True,
              help="Ask without CURVE: no encryption, no authentication")
@click.option("--json", "as_json", is_flag=True, help="Print JSON")
def threshold_command(fleet, cohort, secret_key, fleet_public_key, insecure_plaintext_zmq,
                      as_json) -> None:
    """Ask fleetd for a cohort's threshold, quorum and stragglers.

    Example: ingero threshold --fleet tcp://head:7470 --cohort job:4242
    """
    try:
        keys = None if insecure_plaintext_zmq else (curve.load_keypair(secret_key),
                                                    curve.load_public(fleet_public_key))
        status = fleetclient.query(fleet, cohort, keys)
    except IngeroError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(asdict(status), indent=2))
    elif not status.known:
        raise click.ClickException(f"fleetd knows no cohort {cohort!r}")
    else:
        click.echo(describe(status))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def describe(status) -> str:
    active = str(status.active_nodes)
    if status.expected_nodes is not None:
        active += f" of {status.expected_nodes}"
    rows = [("cohort", status.cohort), ("threshold", _number(status.threshold)),
            ("median", _number(status.median)), ("mad", _number(status.mad)),
            ("active", active), ("quorum", "met" if status.quorum_met else "NOT met"),
            ("panic", "YES" if status.panic else "no"),
            ("stragglers", ", ".join(status.stragglers) or "none")]
    return "\n".join(f"{name:<11} {value}" for name, value in rows)
