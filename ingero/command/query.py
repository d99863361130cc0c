"""The commands that ask echod: report, jobs, nodes, stragglers, explain, sql and export.

Each reads the API's settings (``ingero.command.client``), calls echod's tools over HTTPS and prints
what they answer; every failure is one line on standard error and exit status 1.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from datetime import datetime
from functools import wraps
from pathlib import Path

import click

from ingero import __version__
from ingero.command import client, perfetto, sacct
from ingero.errors import IngeroError
from ingero.slurmcommand import SlurmUnavailable, run_slurm
from ingero.command.report import (JOB_DEFAULT, JOB_FIELDS, NODE_DEFAULT, NODE_FIELDS, REPORT_DEFAULT,
                     REPORT_FIELDS, job_rows, report_rows, window_args)
from ingero.analysis.causes import CAUSE_WORDS
from ingero.command.words import cost, verdict_summary


def api_command(group: click.Group, name: str):
    """A command over echod's API: the client options, the client made, errors as one line."""
    def decorate(function):
        @group.command(name)
        @client.client_options
        @click.pass_context
        @wraps(function)
        def command(ctx, config, **flags):
            settings = {s.name: flags.pop(s.name) for s in client.SETTINGS}
            try:
                # the fields are the command's own: listing them asks no server
                echod = (None if flags.get("helpformat")
                         else client.connect(client.settings(config, settings)))
                return function(echod, **flags)
            except (IngeroError, ValueError) as exc:
                raise click.ClickException(str(exc)) from None
        return command
    return decorate


def colour_enabled() -> bool:
    """Colour on a terminal, unless NO_COLOR is set (https://no-color.org)."""
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def parse_window(starttime: str | None, endtime: str | None, default_start: str | None):
    """-S and -E as times; without -S the default start is taken on the day of -E (or
    today), so that -E alone never ends the window before it begins."""
    now = datetime.now().astimezone()
    end = sacct.parse_time(endtime, now) if endtime else None
    start = starttime or default_start
    return (sacct.parse_time(start, end if end and not starttime else now) if start else None,
            end)


def table_options(fields: dict, default: str):
    """sacct's options for what is printed: format, layouts, header, JSON."""
    def decorate(function):
        for option in reversed([
            click.option("-S", "--starttime", metavar="TIME",
                         help="Window start, sacct's time grammar (now-1hour, today, "
                              "2026-11-21T10:00, midnight ...)"),
            click.option("-E", "--endtime", metavar="TIME", help="Window end [default: now]"),
            click.option("-o", "--format", "fmt", default=None, metavar="FIELD[%WIDTH],...",
                         help=f"Fields to print [default: {default}]"),
            click.option("-e", "--helpformat", is_flag=True,
                         help="List the fields and exit (asks no server)"),
            click.option("-p", "--parsable", is_flag=True,
                         help="Fields separated by '|', one at the end of each line too"),
            click.option("-P", "--parsable2", is_flag=True,
                         help="Fields separated by '|', none at the end of the line"),
            click.option("--delimiter", default="|", show_default=True, metavar="CHARS",
                         help="What separates the fields with -p or -P"),
            click.option("-n", "--noheader", is_flag=True, help="No header lines"),
            click.option("--json", "as_json", is_flag=True,
                         help="One JSON object, as sacct --json: meta (the command, ingero's "
                              "version, the window) and the rows"),
        ]):
            function = option(function)
        return function
    return decorate


def print_document(key: str, rows: list[dict], since: datetime | None,
                   until: datetime | None) -> None:
    """What --json prints, shaped as sacct's: ``meta`` says what asked and over which
    window, ``key`` holds the rows."""
    meta = {"command": ["ingero", *sys.argv[1:]], "ingero": {"version": __version__},
            "window": {"start": since.isoformat() if since else None,
                       "end": until.isoformat() if until else None},
            "generated": datetime.now().astimezone().isoformat(timespec="seconds")}
    click.echo(json.dumps({"meta": meta, key: rows}, indent=2))


def print_rows(rows: list[dict], fields: dict, fmt: str, *, key: str, window: tuple,
               as_json: bool, parsable: bool, parsable2: bool, noheader: bool,
               delimiter: str = "|") -> None:
    """The rows in sacct's layouts, or with --json as one document under ``key``."""
    if as_json:
        print_document(key, rows, *window)
        return
    columns = sacct.parse_format(fmt, fields)
    text = sacct.render(columns, rows, parsable=parsable, parsable2=parsable2,
                        noheader=noheader, delimiter=delimiter)
    if text:
        click.echo(text)


def job_list(jobs: str | None) -> list[str] | None:
    """A comma list (-j, -A, -M, -r) as its items; None for none."""
    return [j.strip() for j in jobs.split(",") if j.strip()] if jobs else None


def cluster_list(clusters: str | None) -> list[str | None]:
    """-M: the clusters to ask one by one; ``all`` (or none given) asks once, over every
    cluster the caller may see."""
    named = job_list(clusters)
    return [None] if not named or "all" in named else named


def each_cluster(clusters: str | None, ask) -> list[dict]:
    """``ask(args)``'s rows for each cluster of -M, in order."""
    return [row for cluster in cluster_list(clusters)
            for row in ask({"cluster": cluster} if cluster else {})]


def clusters_option(command):
    return click.option("-M", "--clusters", "--cluster", "clusters", metavar="NAME[,NAME...]",
                        help="Only these clusters ('all': every cluster you may see) "
                             "[default: all]")(command)


@click.group("query", hidden=True)
def commands() -> None:
    """The commands over echod's API (added to ``ingero``)."""


def whose(command):
    """sacct's -M, -r, -u, -A, -s and -a, for the commands that list jobs."""
    for option in reversed((
            click.option("-r", "--partition", "partitions", metavar="PART[,PART...]",
                         help="Only jobs run in these partitions"),
            click.option("-u", "--user", metavar="USER", help="Only this user's jobs"),
            click.option("-A", "--accounts", metavar="ACCOUNT[,ACCOUNT...]",
                         help="Only jobs charged to these accounts"),
            click.option("-s", "--state", "states", metavar="STATE[,STATE...]",
                         help="Only jobs whose latest run is in these states, as sacct -s "
                              "names them (CA, CD, F, TO, PR, OOM, NF, RQ, R; or the names)"),
            click.option("-a", "--allusers", is_flag=True,
                         help="Every user's jobs (with MUNGE, for root and echod's admin "
                              "group; a token sees them anyway) [default: your own, with "
                              "MUNGE]"))):
        command = option(command)
    return clusters_option(command)


def listed_jobs(echod, jobs, since, until, clusters, partitions, user, accounts, allusers,
                states) -> list[dict]:
    """The job rows that -j, the window and whose's options select."""
    return each_cluster(clusters, lambda where: job_rows(
        echod, job_list(jobs), since, until, user, job_list(accounts), allusers,
        sacct.parse_states(states) if states else None, partitions=job_list(partitions),
        **where))


def named_jobs(echod, jobs: str | None, clusters: str | None) -> tuple[list[dict], list[str]]:
    """-j's names as the jobs each names (an array's id: each of its tasks), in -M's
    clusters: list_jobs's rows, in the order named, and the names that name none."""
    rows: dict[tuple[str, str], dict] = {}
    unknown = []
    for name in job_list(jobs) or []:
        found = each_cluster(clusters, lambda where: job_rows(echod, [name], None, None,
                                                               **where))
        unknown += [] if found else [name]
        rows.update(((row["cluster"], row["job"]), row) for row in found)
    return list(rows.values()), unknown


def named_steps(jobs: str | None) -> dict[str, set[str]]:
    """-j's steps (1234.1, 1234_7.batch) by the job each is of; a job also named whole is
    left out: all its steps are wanted."""
    steps: dict[str, set[str]] = {}
    whole = set()
    for name in job_list(jobs) or []:
        job, dot, step = name.rpartition(".")
        if dot:
            steps.setdefault(job, set()).add(step)
        else:
            whole.add(name)
    return {job: wanted for job, wanted in steps.items() if job not in whole}


def in_steps(row: dict, steps: dict[str, set[str]]) -> bool:
    """Whether a rank's row is of a step -j named, or of a job -j named whole."""
    wanted = steps.get(row.get("job_id") or row["job"], steps.get(row["job"]))
    return wanted is None or str(row.get("step")) in wanted


def job_where(row: dict) -> dict:
    """A tool's arguments for one job of list_jobs: its id as Slurm prints it (an array's raw
    id is also its last task's, so the raw id could name the whole array), in its cluster."""
    return {"job": row["job_id"], "cluster": row["cluster"]}


@api_command(commands, "report")
@click.option("-j", "--jobs", metavar="JOBID[,JOBID...]",
              help="These jobs, as sacct -j takes them (1234, 1234_7, 1234+1; 1234.0: "
                   "that step's ranks only) [default: every job seen in the window]")
@click.option("-X", "--allocations", is_flag=True, help="One line per job, not per rank")
@whose
@table_options(REPORT_FIELDS, REPORT_DEFAULT)
def report_command(echod, jobs, allocations, partitions, user, accounts, states, allusers,
                   clusters, starttime, endtime, fmt, helpformat, parsable, parsable2,
                   delimiter, noheader, as_json) -> None:
    """One row per rank of each job: lag, how often last, self-work against its peers,
    fleetd's verdict, the cause and the cost, in sacct's layouts.

    Without -j, every job seen since -S (default: midnight today). With -j, each job over
    its whole run, or over -S/-E when given; a step (1234.1) shows that step's ranks only
    (each srun step's ranks are its own, numbered from 0). A job echod does not know prints
    no row.

    Example: ingero report -j 4242 -o JobID,Rank,LagP50%10,Cause -P
    """
    fields, default = (JOB_FIELDS, JOB_DEFAULT) if allocations else (REPORT_FIELDS,
                                                                     REPORT_DEFAULT)
    if helpformat:
        click.echo(sacct.helpformat(fields))
        return
    since, until = parse_window(starttime, endtime, None if jobs else "midnight")
    rows = listed_jobs(echod, jobs, since, until, clusters, partitions, user, accounts,
                       allusers, states)
    if not allocations:
        steps = named_steps(jobs)
        ranks = [rank for rank in report_rows(echod, rows, since, until)
                 if in_steps(rank, steps)]
        if as_json:     # each job with its ranks, as sacct --json nests a job's steps
            per_job: dict[tuple[str, str], list[dict]] = {}
            for rank in ranks:
                per_job.setdefault((rank["cluster"], rank["job"]), []).append(
                    {k: v for k, v in rank.items() if k not in ("cluster", "job", "job_id")})
            for job in rows:
                job["per_rank"] = per_job.get((job["cluster"], job["job"]), [])
        else:
            rows = ranks
    print_rows(rows, fields, fmt or default, key="jobs", window=(since, until),
               as_json=as_json, parsable=parsable, parsable2=parsable2, noheader=noheader,
               delimiter=delimiter)


@api_command(commands, "jobs")
@click.option("-j", "--jobs", metavar="JOBID[,JOBID...]",
              help="Only these jobs, as sacct -j takes them (1234, 1234_7, 1234+1, 1234.0)")
@whose
@table_options(JOB_FIELDS, JOB_DEFAULT)
def jobs_command(echod, jobs, partitions, user, accounts, states, allusers, clusters,
                 starttime, endtime, fmt, helpformat, parsable, parsable2, delimiter, noheader,
                 as_json) -> None:
    """The jobs seen in the window: user, nodes, ranks, start, end, stragglers, cost.

    The window starts at midnight today unless -S says otherwise.

    Example: ingero jobs -S now-2days -u alice
    """
    if helpformat:
        click.echo(sacct.helpformat(JOB_FIELDS))
        return
    since, until = parse_window(starttime, endtime, None if jobs else "midnight")
    rows = listed_jobs(echod, jobs, since, until, clusters, partitions, user, accounts,
                       allusers, states)
    print_rows(rows, JOB_FIELDS, fmt or JOB_DEFAULT, key="jobs", window=(since, until),
               as_json=as_json, parsable=parsable, parsable2=parsable2, noheader=noheader,
               delimiter=delimiter)


HARDWARE_CAUSES = "slow_gpu,hang,died"
REASON_PREFIX = "ingero:"


def drained_by_ingero(timeout_s: float = 10.0) -> dict[str, tuple[str, str]] | None:
    """node → (since, reason) of the nodes Slurm has drained with ingero's reason, as
    ``sinfo -R`` shows them; None where sinfo cannot say (not installed, no controller)."""
    try:
        out = run_slurm(["sinfo", "-h", "-N", "-R", "-o", "%N|%H|%E"], timeout_s)
    except SlurmUnavailable:
        return None
    drained = {}
    for line in out.splitlines():
        node, _, rest = line.partition("|")
        since, _, reason = rest.partition("|")
        if reason.startswith(REASON_PREFIX):
            drained[node] = (since, reason)
    return drained


@api_command(commands, "nodes")
@clusters_option
@click.option("--causes", default=HARDWARE_CAUSES, show_default=True, metavar="CAUSE[,CAUSE...]",
              help="Count verdicts with these causes ('all': every cause)")
@table_options(NODE_FIELDS, NODE_DEFAULT)
def nodes_command(echod, clusters, causes, starttime, endtime, fmt, helpformat, parsable,
                  parsable2, delimiter, noheader, as_json) -> None:
    """Nodes by the evidence against them, as sinfo -R lists drained nodes: the verdicts
    fleetd gave their ranks in the window (default: the last 7 days) with a hardware-side
    cause, in how many distinct jobs, and, where this host's sinfo answers, since when Slurm
    has them drained by ingero (fleetd --drain-after) and why.

    To put a node back: scontrol update NodeName=NODE State=RESUME (fleetd drains it again
    only on new jobs).

    Example: ingero nodes -S now-30days --causes slow_gpu
    """
    if helpformat:
        click.echo(sacct.helpformat(NODE_FIELDS))
        return
    since, until = parse_window(starttime, endtime, "now-7days")
    args = window_args(since, until)
    if causes != "all":
        args["causes"] = [c.strip() for c in causes.split(",") if c.strip()]
    rows = each_cluster(clusters, lambda where: echod.call("list_nodes",
                                                           {**args, **where})["nodes"])
    drained = drained_by_ingero()
    if drained is not None:
        listed = {row["node"] for row in rows}
        rows += [{"cluster": None, "node": node, "verdicts": 0, "jobs": [], "causes": {},
                  "last": None} for node in sorted(set(drained) - listed)]
    for row in rows:
        since_reason = None if drained is None else drained.get(row["node"])
        row["drained_since"], row["reason"] = since_reason or (None, None)
    print_rows(rows, NODE_FIELDS, fmt or NODE_DEFAULT, key="nodes", window=(since, until),
               as_json=as_json, parsable=parsable, parsable2=parsable2, noheader=noheader,
               delimiter=delimiter)


@api_command(commands, "stragglers")
@clusters_option
@click.option("-j", "--jobs", "--job", "jobs", metavar="JOBID[,JOBID...]",
              help="Only these jobs, as sacct -j takes them (an array's id: its tasks)")
@click.option("-S", "--starttime", metavar="TIME", help="Window start [default: now-1hour]")
@click.option("-E", "--endtime", metavar="TIME", help="Window end [default: now]")
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: meta and fleetd's verdicts")
def stragglers_command(echod, clusters, jobs, starttime, endtime, as_json) -> None:
    """fleetd's current and recent verdicts, live ones first, across the clusters the token
    may see.

    Example: ingero stragglers -S now-1day
    """
    since, until = parse_window(starttime, endtime, None if jobs else "now-1hour")
    window = window_args(since, until)
    if jobs:
        verdicts = [verdict for row in named_jobs(echod, jobs, clusters)[0]
                    for verdict in echod.call("find_stragglers",
                                              {**window, **job_where(row)})["verdicts"]]
    else:
        verdicts = each_cluster(clusters, lambda where: echod.call(
            "find_stragglers", {**window, **where})["verdicts"])
    if as_json:
        print_document("verdicts", verdicts, since, until)
        return
    for v in verdicts:
        state = "cleared" if v.get("cleared") else "LIVE"
        line = f"{state:<7} {v['cluster']}/{v['job']} {verdict_summary(v)}"
        click.echo(click.style(line, fg="red") if state == "LIVE" and colour_enabled()
                   else line)
    if not verdicts:
        click.echo("no straggler verdict in the window")


@api_command(commands, "explain")
@click.option("-j", "--jobs", "--job", "jobs", required=True, metavar="JOBID[,JOBID...]",
              help="The jobs, as sacct -j takes them (an array's id: its tasks)")
@click.option("--rank", type=int, default=None, metavar="R",
              help="This rank [default: every rank fleetd named in each job]")
@clusters_option
@click.option("--json", "as_json", is_flag=True,
              help="One JSON object: meta and explain's answers")
def explain_command(echod, jobs, rank, clusters, as_json) -> None:
    """Why a rank is slow: severity first, then the evidence in plain words, then what to do.

    Example: ingero explain -j 4242 --rank 5
    """
    rows, unknown = named_jobs(echod, jobs, clusters)
    answers = []
    for row in rows:
        where, job = job_where(row), row["job_id"]
        verdicts = echod.call("find_stragglers", where)["verdicts"]
        ranks = [rank] if rank is not None else sorted({v["rank"] for v in verdicts})
        found = [echod.call("explain", {**where, "rank": r}) for r in ranks]
        answers += found
        if as_json:
            continue
        if not found:
            click.echo(f"job {job}: fleetd named no rank; 'ingero report -j {job}' shows "
                       "every rank's lag")
        for answer in found:
            click.echo(explanation(answer, [v for v in verdicts
                                            if v["rank"] == answer["rank"]]))
    for name in unknown if not as_json else []:
        click.echo(f"job {name}: echod knows no such job (in the clusters you may see)")
    if as_json:
        print_document("explanations", answers, None, None)


def explanation(answer: dict, verdicts: list[dict]) -> str:
    """explain's answer in words: severity and verdict first, then the evidence, then what to
    do."""
    verdict = verdicts[0] if verdicts else None
    severity = (verdict or {}).get("severity") or ("minor" if answer["cause"] == "none"
                                                   else "unjudged")
    head = (f"{severity.upper()}: job {answer['job']} rank {answer['rank']} on "
            f"{answer['node'] or '?'}: "
            + (verdict_summary(verdict) if verdict else f"cause {answer['cause']}"))
    colour = {"critical": "red", "major": "yellow"}.get(severity)
    lines = [sacct.colour(head, colour or "bold", colour_enabled())]
    lines.append(f"  why: {CAUSE_WORDS.get(answer['cause'], answer['cause'])} "
                 f"(confidence {answer['confidence']})")
    lines += [f"  - {finding}" for finding in answer["findings"]]
    if verdict is not None:
        lines.append(f"  cost: {cost(verdict['cost_gpu_seconds'], verdict['cost_usd'])}")
    if answer.get("fix"):
        lines.append(f"  what to do: {answer['fix']}")
    return "\n".join(lines) + "\n"


@api_command(commands, "sql")
@click.argument("statement")
@click.option("--json", "as_json", is_flag=True, help="Columns and rows as JSON")
@click.option("--csv", "as_csv", is_flag=True, help="CSV with a header line")
@click.option("--row-cap", type=click.IntRange(1, 10_000), default=None,
              help="At most this many rows [default: the server's cap]")
def sql_command(echod, statement, as_json, as_csv, row_cap) -> None:
    """One read-only SQL statement over the ingero tables of your clusters.

    Example: ingero sql "SELECT job, rank, cause FROM straggler_verdicts LIMIT 5"
    """
    answer = echod.sql(statement, **({"row_cap": row_cap} if row_cap else {}))
    if as_json:
        click.echo(json.dumps(answer, indent=2))
        return
    if as_csv:
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(answer["columns"])
        writer.writerows(answer["rows"])
        click.echo(out.getvalue(), nl=False)
    else:
        click.echo(sql_table(answer["columns"], answer["rows"]))
    if answer["truncated"]:
        click.echo(f"(cut at {len(answer['rows'])} rows)", err=True)


def sql_table(columns: list[str], rows: list[list]) -> str:
    cells = [["" if v is None else v if isinstance(v, str) else json.dumps(v) for v in row]
             for row in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    fields = [sacct.Field(c, w, lambda row, i=i: row[i]) for i, (c, w) in
              enumerate(zip(columns, widths))]
    return sacct.render([sacct.Column(f, f.width, f.align) for f in fields], cells)


@api_command(commands, "export")
@click.option("-j", "--jobs", "--job", "jobs", required=True, metavar="JOBID[,JOBID...]",
              help="The jobs, as sacct -j takes them (an array's id: its tasks); several "
                   "need %j in --output")
@clusters_option
@click.option("--format", "fmt", type=click.Choice(["perfetto"]), default="perfetto",
              help="perfetto: Chrome trace-event JSON, which ui.perfetto.dev opens "
                   "[default: perfetto]")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="File to write ('-' for standard output); %j in it is the job's id, "
                   "as in sbatch -o")
@click.option("-S", "--starttime", metavar="TIME", help="Window start [default: the job's]")
@click.option("-E", "--endtime", metavar="TIME", help="Window end [default: the job's]")
def export_command(echod, jobs, clusters, fmt, output, starttime, endtime) -> None:
    """A job's collectives, waits and verdicts as a trace: a process per node, a track per
    rank, each node's clock corrected.

    Example: ingero export -j 4242,4243 --format perfetto -o job-%j.json
    """
    since, until = parse_window(starttime, endtime, None)
    rows, unknown = named_jobs(echod, jobs, clusters)
    if unknown:
        raise IngeroError(f"echod knows no job {', '.join(unknown)} (in the clusters you may "
                          "see): nothing written")
    if len(rows) > 1 and "%j" not in str(output):
        raise click.UsageError(f"-j names {len(rows)} jobs, which need one file each: put %j "
                               "in --output (job-%j.json), as sbatch -o does")
    for row in rows:
        trace = json.dumps(perfetto.to_trace(echod.call(
            "job_timeline", {**job_where(row), **window_args(since, until)})))
        if str(output) == "-":
            click.echo(trace)
            continue
        path = Path(str(output).replace("%j", row["job_id"]))
        path.write_text(trace)
        click.echo(f"wrote {path}: open it in ui.perfetto.dev", err=True)
