"""The ``jobs`` table, filled from the job_start and job_end events that the Slurm hooks leave
for ingerod (``ingero.slurmhook``, ``ingerod.jobs``).

Every node of a job sends its own start and end: a job's row is their union, whatever order they
come in and however often they are replayed. The start is the earliest prolog, the end the
latest epilog (with its state and exit status); the nodes are the prolog's node list expanded,
plus every node that reported; the GPUs are the most a node reported times the job's nodes.

A job Slurm requeued runs again under the same id with a higher restart count: the row is the
job's latest run (as sacct shows a job without ``-D``), so a record of a later run replaces the
run's start, end and state, and a record of an earlier run, come late, changes none of them.
Where the hook's environment named the job's array task or heterogeneous component, the row
keeps the id Slurm prints (``slurm_id``); ``echod.slurmjobs`` fills it in otherwise.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, and_, case, func, literal_column, or_
from sqlalchemy.dialects.postgresql import insert

from ingero.hostlist import BadHostList, expand

from .models import Job

JOB_KINDS = ("job_start", "job_end")
TEXT_FIELDS = ("user", "account", "partition", "slurm_cluster")
JOBS_PER_STATEMENT = 2000       # 12 parameters each, under PostgreSQL's 65535


def job_fields(kind: str, node: str, t: datetime, attrs: dict) -> dict:
    """One record's contribution to its job's row; ``node`` is the agent's name for its node,
    which Slurm's (``slurm_node``) overrides."""
    if isinstance(attrs.get("slurm_node"), str) and attrs["slurm_node"]:
        node = attrs["slurm_node"]
    fields = {name: attrs.get(name) for name in TEXT_FIELDS}
    fields["ntasks"] = _count(attrs.get("ntasks"))
    fields["restarts"] = _number(attrs.get("restart_count")) or 0
    fields["slurm_id"] = slurm_id(attrs)
    if kind == "job_end":
        return {"end": t, "state": attrs.get("state"), "exit_code": attrs.get("exit_code"),
                "nodes": [node], **fields}
    nodes = [node]
    try:
        nodes += expand(attrs["nodelist"]) if isinstance(attrs.get("nodelist"), str) else []
    except BadHostList:
        pass            # the reporting nodes still say where it ran
    node_count = _count(attrs.get("node_count")) or len(set(nodes))
    gpus = _count(attrs.get("gpus"))
    return {"start": t, "nodes": nodes, "gpus": gpus * node_count if gpus else None, **fields}


def _count(value) -> int | None:
    return value if type(value) is int and 0 < value < 2**31 else None


def _number(value) -> int | None:
    return value if type(value) is int and 0 <= value < 2**31 else None


def slurm_id(attrs: dict) -> str | None:
    """``A_T`` for task T of array job A, ``H+O`` for component O of heterogeneous job H, as
    far as the record says (None: the raw id stands, or echod.slurmjobs will know)."""
    array, task = _number(attrs.get("array_job_id")), _number(attrs.get("array_task_id"))
    if array is not None and task is not None:
        return f"{array}_{task}"
    het, offset = _number(attrs.get("het_job_id")), _number(attrs.get("het_job_offset"))
    if het is not None and offset is not None:
        return f"{het}+{offset}"
    return None


RUN_FIELDS = ("start", "end", "state", "exit_code")


def merge(old: dict, new: dict) -> dict:
    """Two contributions to one job's row, as the upsert below merges them."""
    if new.get("restarts", 0) > old.get("restarts", 0):         # a later run: its own times
        old = {k: v for k, v in old.items() if k not in RUN_FIELDS}
    elif new.get("restarts", 0) < old.get("restarts", 0):       # an earlier run's, come late
        new = {k: v for k, v in new.items() if k not in RUN_FIELDS and k != "restarts"}
    merged = {**old}
    for name, value in new.items():
        if value is None:
            continue
        if name == "nodes":
            merged[name] = sorted(set(old.get(name, [])) | set(value))
        elif name == "start":
            merged[name] = min(old.get(name) or value, value)
        elif name == "gpus":
            merged[name] = max(old.get(name) or 0, value)
        elif name in ("state", "exit_code"):
            if old.get("end") is None or new.get("end") is None or new["end"] >= old["end"]:
                merged[name] = value
        elif name == "end":
            merged[name] = max(old.get(name) or value, value)
        elif name == "restarts":
            merged[name] = max(old.get(name) or 0, value)
        elif name == "user":
            merged[name] = old.get(name) or value
        else:
            merged[name] = value
    return merged


NODES_UNION = literal_column(
    "ARRAY(SELECT DISTINCT n FROM unnest(jobs.nodes || excluded.nodes) AS n ORDER BY n)")
COLUMNS = ("user", "account", "partition", "ntasks", "nodes", "gpus", "start", "end", "state",
           "exit_code", "restarts", "slurm_cluster", "slurm_id")


def upsert_jobs(connection: Connection, jobs: dict[tuple[str, str], dict]) -> None:
    """Merge the batch's job rows into the table (replays change nothing)."""
    values = [{"cluster": cluster, "id": job, **{c: row.get(c) for c in COLUMNS}}
              for (cluster, job), row in sorted(jobs.items())]
    for first in range(0, len(values), JOBS_PER_STATEMENT):
        statement = insert(Job).values(values[first:first + JOBS_PER_STATEMENT])
        new = statement.excluded
        later_run, same_run = new.restarts > Job.restarts, new.restarts == Job.restarts
        newer_end = or_(Job.end.is_(None), and_(new.end.isnot(None), new.end >= Job.end))
        connection.execute(statement.on_conflict_do_update(
            index_elements=[Job.cluster, Job.id],
            set_={**{c: func.coalesce(getattr(new, c), getattr(Job, c))
                     for c in ("account", "partition", "ntasks", "slurm_cluster",
                               "slurm_id")},
                  # the first record's user stands: a later one (forged with a stolen agent
                  # key, say) would hand the job's events to whoever it names
                  "user": func.coalesce(Job.user, new.user),
                  "nodes": NODES_UNION,
                  "gpus": func.greatest(Job.gpus, new.gpus),
                  "restarts": func.greatest(Job.restarts, new.restarts),
                  "start": case((later_run, new.start),
                                (same_run, func.least(Job.start, new.start)), else_=Job.start),
                  "end": case((later_run, new.end),
                              (same_run, func.greatest(Job.end, new.end)), else_=Job.end),
                  **{c: case((later_run, getattr(new, c)),
                             (and_(same_run, newer_end),
                              func.coalesce(getattr(new, c), getattr(Job, c))),
                             else_=getattr(Job, c)) for c in ("state", "exit_code")},
                  # Slurm's word on a run is asked again for a later one
                  **{c: case((later_run, None), else_=getattr(Job, c))
                     for c in ("slurm_state", "slurm_exit_code", "slurm_checked")},
                  "slurm_tries": case((later_run, 0), else_=Job.slurm_tries)}))
