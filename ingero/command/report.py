"""What ``ingero report`` and ``ingero jobs`` print: their fields, and their rows from the API.

A report row is one rank of one job (``job_report``'s ``per_rank``, the job id added); a job
row is one job (``list_jobs``). Each field is declared once with its header, width and how to
read it, so ``--format``, ``--helpformat`` and the default layouts all come from one table.
"""

from __future__ import annotations

from datetime import datetime

from ingero.command import sacct
from ingero.errors import ApiCallError


def _ms(key: str):
    return lambda row: None if row.get(key) is None else f"{row[key]:.1f}"


def _time(key: str):
    def read(row: dict) -> str | None:
        value = row.get(key)
        if not value:
            return None
        return datetime.fromisoformat(value).astimezone().strftime("%Y-%m-%dT%H:%M:%S")
    return read


def _share(row: dict) -> str | None:
    return None if row.get("last_share") is None else f"{row['last_share'] * 100:.0f}%"


def _number(key: str, digits: int):
    return lambda row: None if row.get(key) is None else f"{row[key]:.{digits}f}"


def _elapsed(row: dict) -> str | None:
    if not row.get("start") or not row.get("end"):
        return None
    seconds = int((datetime.fromisoformat(row["end"])
                   - datetime.fromisoformat(row["start"])).total_seconds())
    days, rest = divmod(max(seconds, 0), 86400)
    clock = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{clock}" if days else clock


F = sacct.Field
def _job_id(row: dict) -> str:
    return row.get("job_id") or row["job"]


# Which job a row is about, as sacct names it; both tables lead with them.
JOB_ID_FIELDS = (
    F("Cluster", 10, lambda r: r["cluster"]),
    F("JobID", 12, _job_id),
    F("JobIDRaw", 10, lambda r: r["job"]),
)

REPORT_FIELDS = {f.name.lower(): f for f in (
    *JOB_ID_FIELDS,
    F("Step", 6, lambda r: r.get("step")),
    F("Node", 12, lambda r: r.get("node")),
    F("Rank", 5, lambda r: r["rank"]),
    F("Colls", 7, lambda r: r.get("collectives")),
    F("LagP50", 8, _ms("lag_median_ms")),
    F("LagP99", 8, _ms("lag_p99_ms")),
    F("Last", 5, _share),
    F("SelfWork", 9, _ms("self_work_ms")),
    F("PeerWork", 9, _ms("peers_self_work_ms")),
    F("Verdict", 10, lambda r: r.get("verdict") or r.get("note")
      or ("straggler" if r.get("straggler") else None)),
    F("Cause", 15, lambda r: r.get("cause")),
    F("CostGPUs", 9, _number("cost_gpu_seconds", 1)),
    F("CostUSD", 9, _number("cost_usd", 4)),
)}
REPORT_DEFAULT = ("JobID,Step,Node,Rank,Colls,LagP50,LagP99,Last,SelfWork,PeerWork,Verdict,"
                  "Cause,CostUSD")

JOB_FIELDS = {f.name.lower(): f for f in (
    *JOB_ID_FIELDS,
    F("Restarts", 8, lambda r: r.get("restarts")),
    F("User", 9, lambda r: r.get("user")),
    F("Account", 10, lambda r: r.get("account")),
    F("Partition", 9, lambda r: r.get("partition")),
    F("NNodes", 6, lambda r: len(r.get("nodes") or []) or None),
    F("NodeList", 20, lambda r: ",".join(r.get("nodes") or []) or None),
    F("Ranks", 5, lambda r: r.get("ranks")),
    F("Start", 19, _time("start")),
    F("End", 19, _time("end")),
    F("Elapsed", 10, _elapsed),
    F("NGPUs", 5, lambda r: r.get("gpus")),
    F("State", 10, lambda r: r.get("state")),
    F("ExitCode", 8, lambda r: r.get("exit_code")),
    F("Stragglers", 10, lambda r: r.get("stragglers")),
    F("CostGPUs", 9, _number("cost_gpu_seconds", 1)),
    F("CostUSD", 9, _number("cost_usd", 4)),
)}
JOB_DEFAULT = "JobID,User,Account,NNodes,Ranks,Start,End,State,Stragglers,CostGPUs,CostUSD"


NODE_FIELDS = {f.name.lower(): f for f in (
    F("Cluster", 10, lambda r: r.get("cluster")),
    F("NodeName", 15, lambda r: r["node"]),
    F("Verdicts", 8, lambda r: r.get("verdicts")),
    F("Jobs", 5, lambda r: len(r["jobs"]) if r.get("jobs") is not None else None),
    F("JobIDs", 20, lambda r: ",".join(r.get("jobs") or []) or None),
    F("Causes", 24, lambda r: ",".join(f"{k}:{v}" for k, v in (r.get("causes") or {}).items())
      or None),
    F("Last", 19, _time("last")),
    F("DrainedSince", 19, lambda r: r.get("drained_since")),
    F("Reason", 40, lambda r: r.get("reason")),
)}
NODE_DEFAULT = "NodeName,Verdicts,Jobs,Causes,Last,DrainedSince,Reason"


def report_rows(client, jobs: list[dict], since: datetime | None,
                until: datetime | None) -> list[dict]:
    """One row per rank of each job (rows of list_jobs); a job echod does not know has none
    (as in sacct)."""
    window = window_args(since, until)
    rows = []
    for job in jobs:
        try:
            # by Slurm's id: an array's raw id is also its last task's, which names the array
            report = client.call("job_report", {"job": _job_id(job), "cluster": job["cluster"],
                                                **window})
        except ApiCallError as exc:
            if exc.code == "not_found":
                continue
            raise
        rows += [{"cluster": report["cluster"], "job": report["job"],
                  "job_id": job.get("job_id"), **rank} for rank in report["per_rank"]]
    return rows


def job_rows(client, jobs: list[str] | None, since: datetime | None,
             until: datetime | None, user: str | None = None,
             accounts: list[str] | None = None, all_users: bool = False,
             states: list[str] | None = None, cluster: str | None = None,
             partitions: list[str] | None = None) -> list[dict]:
    """One row per job seen in the window (or per job named): a user's, these accounts',
    partitions' and states', or every user's (as sacct's -u, -A, -r, -s and -a), in one
    cluster or all."""
    args = {**window_args(since, until), **({"jobs": jobs} if jobs else {}),
            **({"cluster": cluster} if cluster else {}),
            **({"partitions": partitions} if partitions else {}),
            **({"user": user} if user else {}), **({"accounts": accounts} if accounts else {}),
            **({"states": states} if states else {}),
            **({"all_users": True} if all_users else {})}
    return client.call("list_jobs", args)["jobs"]


def window_args(since: datetime | None, until: datetime | None) -> dict:
    """The tools' since/until arguments for a window (either end may be open)."""
    return {**({"since": since.isoformat()} if since else {}),
            **({"until": until.isoformat()} if until else {})}


def report_table(per_rank: list[dict], job: str, cluster: str = "") -> str:
    """A job's rank rows in the default layout (what the demo shows)."""
    rows = [{"cluster": cluster, "job": job, **rank} for rank in per_rank]
    return sacct.render(sacct.parse_format(REPORT_DEFAULT, REPORT_FIELDS), rows)
