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


@main.command("check", context_settings={"max_content_width": 100})
@click.option("--no-load", is_flag=True,
              help="Only read what the node has; do not compile and load the program")
def check_command(no_load: bool) -> None:
    """Say what this node needs for eBPF tracing: bcc, privileges, the running kernel's
    headers, uprobes, tracefs, BTF, lockdown, perf_event_paranoid; each with what is there
    and how to fix what is not. Then compile and load ingerod's program, and unload it.

    Exits 0 where ingerod can trace, 1 where it cannot.

    Example: ingerod check
    """
    from .check import checks
    from .errors import TracingError
    from .probes import Tracer

    found = checks()
    for check in found:
        click.echo(check.line())
    able = all(check.ok for check in found if check.needed)
    if able and not no_load:
        try:
            Tracer(lambda _event: None).close()
            click.echo(f"{'ok':<8}{'program':<22}compiled and loaded")
        except TracingError as exc:
            click.echo(f"{'FAILED':<8}{'program':<22}{exc}")
            able = False
    click.echo("ingerod can trace on this node" if able else
               "ingerod cannot trace on this node: it runs untraced (see the fixes above)")
    raise SystemExit(0 if able else 1)
