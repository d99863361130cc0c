"""``ingero``: the operator's command line."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

import click

from ingero import __version__, curve
from ingero.command import fleetclient, mcp, query
from ingero.cli_common import example_last
from ingero.errors import IngeroError


@click.group(context_settings={"max_content_width": 100})
@click.version_option(__version__)
@click.option("--no-color", is_flag=True,
              help="No colour, even on a terminal (as NO_COLOR=1 in the environment)")
def main(no_color: bool) -> None:
    """ingero: find the slow rank of a distributed training job, and why.

    The query commands (report, jobs, nodes, stragglers, explain, sql, export, mcp) ask
    echod's API: its URL, token and CA come from --url/--token-file/--ca-cert, $INGERO_URL,
    $INGERO_TOKEN, ~/.config/ingero/ingero.yaml, read over the site's
    /etc/ingero/ingero.yaml. Without a token they prove who you are with MUNGE.

    Example: ingero report -j 4242
    """
    if no_color:
        os.environ["NO_COLOR"] = "1"


main.add_command(mcp.mcp_command)
for command in query.commands.commands.values():
    main.add_command(command)


@main.command("version")
@click.option("--json", "as_json", is_flag=True, help="One JSON object")
def version_command(as_json: bool) -> None:
    """This node's ingero: its version, Python, bcc, kernel, and where ingerod finds its BPF
    sources and the rate table. Exits 0 even when bcc is missing; it says so.

    Example: ingero version --json
    """
    from ingero.command.about import facts, render

    found = facts()
    click.echo(json.dumps(found, indent=2) if as_json else render(found))


DEMO_SCENARIO = "late-rank"


@main.command("demo")
@click.option("--scenario", default=DEMO_SCENARIO, show_default=True,
              metavar="NAME|FILE", help="A scenario of sim/scenarios/ by name, or a YAML file")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON object (the job, its verdicts, the report rows) on standard "
                   "output; progress goes to standard error")
@click.option("--keep", is_flag=True,
              help="Leave the stack running at the end, and say how to query and stop it")
def demo_command(scenario: str, as_json: bool, keep: bool) -> None:
    """Run the whole product on a GPU-less job: echod, fleetd, an eBPF ingerod per simulated
    node, and a sim job with a straggler; then the report and fleetd's verdicts.

    Needs root (eBPF) and 'make setup'. Everything it starts is stopped, and its temporary
    directory removed, when it ends, fails or is interrupted (unless --keep).

    Example: ingero demo --scenario cpu-contention
    """
    from ingero.command.about import parts

    missing = [name for name, ok in parts().items() if name in ("echod", "demo") and not ok]
    if missing:
        raise click.ClickException(
            "the demo runs from a checkout of ingero, which has the sim and echod's "
            "dependencies: git clone it and run 'make demo' there (this installation lacks "
            f"{' and '.join('the sim' if m == 'demo' else m for m in missing)})")
    from stack import demo

    say = (lambda line: click.echo(line, err=True)) if as_json else click.echo
    try:
        result = demo.run(scenario, keep, say)
    except IngeroError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("interrupted: everything the demo started is stopped", err=True)
        raise SystemExit(130) from None
    click.echo(json.dumps(demo.as_json(result), indent=2) if as_json else demo.render(result))


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


example_last(main)
