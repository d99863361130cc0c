"""``ingerod``: the command line. The logic lives in agent.py."""

from __future__ import annotations

import os

import click

from ingero.cli_common import config_option, keygen_command, load_settings
from ingero.errors import IngeroError
from ingero.runtime import SignalFlags, setup_logging
from ingero.settings import click_options

from .agent import Agent
from .config import DEFAULT_CONFIG, SETTINGS


@click.group(invoke_without_command=True, context_settings={"max_content_width": 100},
             epilog="Example: ingerod --source synthetic --score 0.9 "
                    "--fleet tcp://head:7470")
@config_option(DEFAULT_CONFIG)
@click_options(SETTINGS)
@click.pass_context
def main(ctx: click.Context, config: str | None, **flags) -> None:
    """Per-node ingero agent: scores this node's health and pushes it to fleetd.

    It connects out to fleetd, never listens for it, and keeps going when fleetd is away.
    """
    if ctx.invoked_subcommand is not None:
        return
    cfg = load_settings(SETTINGS, "INGEROD", config, DEFAULT_CONFIG, flags, slurm_defaults())
    setup_logging(cfg.log_level, "ingerod")
    try:
        agent = Agent(cfg, SignalFlags().install())
        ctx.exit(agent.run())
    except IngeroError as exc:
        raise click.ClickException(str(exc)) from None


def slurm_defaults(environ=os.environ) -> dict:
    """Inside a Slurm job, its id and node count are the defaults for --job and --job-nodes."""
    found = {"job": environ.get("SLURM_JOB_ID"), "job_nodes": environ.get("SLURM_JOB_NUM_NODES")}
    return {name: value for name, value in found.items() if value}


main.add_command(keygen_command("/etc/ingero/keys", "ingerod", "this agent"))


@main.command("trace", context_settings={"max_content_width": 100})
@click.option("--job", default=None, metavar="JOBID",
              help="Only the processes of this Slurm job [default: every process that maps "
                   "CUDA or NCCL]")
@click.option("-p", "--pid", "pids", default="", metavar="PID[,PID...]",
              help="Only these processes [default: every process that maps CUDA or NCCL]")
@click.option("--libraries", default="", metavar="PATHS",
              help="Library files to attach at start, comma-separated")
@click.option("--match-env", default="", metavar="KEY=VALUE",
              help="Only processes whose environment has all of KEY=VALUE[,...]")
@click.option("--duration", type=float, default=None, metavar="SECONDS",
              help="Stop after this long [default: until interrupted]")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event")
@click.option("--ebpf", is_flag=True, hidden=True, help="Print the BPF program and exit")
def trace_command(job, pids, libraries, match_env, duration, as_json, ebpf) -> None:
    """Print the NCCL, CUDA and host events of the traced processes as they happen.

    Example: ingerod trace -p 31337,31338
    """
    from .probes import program_text
    from .trace import run_trace

    if ebpf:
        click.echo(program_text())
        return
    cfg = load_settings(SETTINGS, "INGEROD", None, DEFAULT_CONFIG,
                        {"job": job, "pids": pids or None, "libraries": libraries or None,
                         "match_env": match_env or None})
    setup_logging(cfg.log_level, "ingerod")
    try:
        run_trace(cfg, as_json, duration, SignalFlags().install())
    except IngeroError as exc:
        raise click.ClickException(str(exc)) from None
