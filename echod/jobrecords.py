"""The ``jobs`` table, filled from the job_start and job_end events that the Slurm hooks leave
for ingerod (``ingero.slurmhook``, ``ingerod.jobs``).

Every node of a job sends its own start and end: a job's row is their union, whatever order they
come in and however often they are replayed. The start is the earliest prolog, the end the
latest epilog (with its state and exit status); the nodes are the prolog's node list expanded,
plus every node that reported; the GPUs are the most a node reported times the job's nodes.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, and_, case, func, literal_column, or_
from sqlalchemy.dialects.postgresql import insert

from ingero.hostlist import BadHostList, expand

from .models import Job

JOB_KINDS = ("job_start", "job_end")
TEXT_FIELDS = ("user", "account", "partition")
JOBS_PER_STATEMENT = 2000       # 12 parameters each, under PostgreSQL's 65535


def job_fields(kind: str, node: str, t: datetime, attrs: dict) -> dict:
    """One record's contribution to its job's row; ``node`` is the agent's name for its node,
    which Slurm's (``slurm_node``) overrides."""
    if isinstance(attrs.get("slurm_node"), str) and attrs["slurm_node"]:
        node = attrs["slurm_node"]
    fields = {name: attrs.get(name) for name in TEXT_FIELDS}
    fields["ntasks"] = _count(attrs.get("ntasks"))
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


def merge(old: dict, new: dict) -> dict:
    """Two contributions to one job's row, as the upsert below merges them."""
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
        else:
            merged[name] = value
    return merged


NODES_UNION = literal_column(
    "ARRAY(SELECT DISTINCT n FROM unnest(jobs.nodes || excluded.nodes) AS n ORDER BY n)")
COLUMNS = ("user", "account", "partition", "ntasks", "nodes", "gpus", "start", "end", "state",
           "exit_code")


def upsert_jobs(connection: Connection, jobs: dict[tuple[str, str], dict]) -> None:
    """Merge the batch's job rows into the table (replays change nothing)."""
    values = [{"cluster": cluster, "id": job, **{c: row.get(c) for c in COLUMNS}}
              for (cluster, job), row in sorted(jobs.items())]
    for first in range(0, len(values), JOBS_PER_STATEMENT):
        statement = insert(Job).values(values[first:first + JOBS_PER_STATEMENT])
        new = statement.excluded
        newer_end = or_(Job.end.is_(None), and_(new.end.isnot(None), new.end >= Job.end))
        connection.execute(statement.on_conflict_do_update(
            index_elements=[Job.cluster, Job.id],
            set_={**{c: func.coalesce(getattr(new, c), getattr(Job, c))
                     for c in ("user", "account", "partition", "ntasks")},
                  "nodes": NODES_UNION,
                  "gpus": func.greatest(Job.gpus, new.gpus),
                  "start": func.least(Job.start, new.start),
                  "end": func.greatest(Job.end, new.end),
                  **{c: case((newer_end, func.coalesce(getattr(new, c), getattr(Job, c))),
                             else_=getattr(Job, c)) for c in ("state", "exit_code")}}))
