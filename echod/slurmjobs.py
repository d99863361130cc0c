"""Slurm's own word on the jobs the hooks recorded: the id it prints and how each run ended.

The epilog knows only the exit status its environment gives, which cannot tell a job
cancelled from one its time limit killed, nor see array tasks or heterogeneous components
(Slurm 22.05 gives a prolog only the raw id). Slurm advises against Slurm commands in a
prolog or epilog, so echod asks instead, off the job's path: every ``--slurm-interval``
seconds, one ``sacct`` call for the jobs whose id or ended run Slurm has not yet named
(``-D``: a requeued job's earlier runs are lines of their own, REQUEUED, in order) and one
``squeue`` for their ids while slurmctld holds them, or where no accounting answers, one
``scontrol show job`` (the jobs slurmctld still holds). Each job is
asked at most ``MAX_TRIES`` times, for a week at most after it was seen; a run still shown
running is asked again later. What sacct or scontrol say goes to ``slurm_id``,
``slurm_state`` and ``slurm_exit_code``; the reports show those over the hook's. The user
Slurm names replaces the one the records gave (``user``), for a job recorded under its Slurm
cluster: a record comes from a compute node, whose agent key may be stolen; Slurm's word on
whose job it is stands over it. slurmctld's word (squeue, scontrol) is taken over
accounting's: sacct shows a job's user as root for seconds after it starts or ends (seen
with Debian's Slurm 22.05), so its root is never taken.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text

from ingero.slurmcommand import SlurmUnavailable, run_slurm

log = logging.getLogger("echod")

MODES = ("auto", "sacct", "scontrol", "off")
BATCH = 500                    # jobs per question (sacct -j takes a list)
MAX_TRIES = 60
KEEP_ASKING = timedelta(days=7)
COMMAND_TIMEOUT_S = 30.0
# a run in one of these has not ended, whatever the epilog said
ACTIVE = {"PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "CONFIGURING", "RESIZING",
          "SIGNALING", "STAGE_OUT", "STOPPED", "REQUEUE_FED", "REQUEUE_HOLD"}
# sacct: "CANCELLED by 1000"; scontrol's base state never has more than the word
STATE_WORD = re.compile(r"[A-Z_]+")

UNASKED = """
SELECT cluster, id, restarts, slurm_cluster, "end" IS NOT NULL, coalesce(start, "end")
FROM jobs
WHERE id ~ '^[0-9]{1,10}$' AND slurm_tries < :max_tries
  AND (slurm_id IS NULL OR ("end" IS NOT NULL AND slurm_state IS NULL))
  AND (slurm_checked IS NULL OR slurm_checked < :again)
  AND coalesce("end", start) > :oldest
ORDER BY slurm_checked NULLS FIRST, start
LIMIT :batch
"""

ANSWERED = """
UPDATE jobs SET slurm_id = coalesce(:slurm_id, slurm_id),
                "user" = coalesce(:user, "user"),
                slurm_state = coalesce(:state, slurm_state),
                slurm_exit_code = coalesce(:exit_code, slurm_exit_code),
                slurm_checked = :now, slurm_tries = slurm_tries + 1
WHERE cluster = :cluster AND id = :id AND restarts = :restarts
"""


@dataclass(frozen=True)
class Run:
    """What Slurm says about one run of a job."""

    slurm_id: str
    state: str
    exit_code: str | None
    user: str | None = None


class SlurmStates:
    """The pass above, started from echod's ingest loop (``tick``), one at a time, in a thread
    of its own: a slow slurmctld or slurmdbd never holds up ingest."""

    def __init__(self, engine: Engine, mode: str, interval: float, metrics=None,
                 environ: dict | None = None):
        self.engine, self.mode, self.interval = engine, mode, interval
        self.metrics, self.environ = metrics, environ
        self.next_pass = 0.0
        self.thread: threading.Thread | None = None
        self.complained = False
        self.local: str | None = None

    def tick(self, now: float) -> None:
        if self.mode == "off" or now < self.next_pass or (
                self.thread is not None and self.thread.is_alive()):
            return
        self.next_pass = now + self.interval
        self.thread = threading.Thread(target=self._pass, name="echod-slurm", daemon=True)
        self.thread.start()

    def _pass(self) -> None:
        try:
            asked = self.ask_once()
        except SlurmUnavailable as exc:
            if not self.complained:
                log.warning("cannot ask Slurm how jobs ended (%s); the reports show what the "
                            "epilog saw until it answers", exc)
                self.complained = True
            self._count("unavailable")
            return
        except Exception as exc:      # the database may be down; ingest goes on regardless
            log.warning("asking Slurm about jobs failed: %s", exc)
            self._count("error")
            return
        if asked:
            self.complained = False

    def _count(self, result: str, n: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.slurm_lookups.labels(result).inc(n)

    def ask_once(self, now: datetime | None = None) -> int:
        """One pass: the jobs to ask about, Slurm's answer, the rows updated; how many."""
        now = now or datetime.now(UTC)
        with self.engine.begin() as conn:
            jobs = conn.execute(text(UNASKED), {
                "max_tries": MAX_TRIES, "again": now - timedelta(seconds=self.interval),
                "oldest": now - KEEP_ASKING, "batch": BATCH}).all()
        if not jobs:
            return 0
        answers = self.ask(jobs)
        with self.engine.begin() as conn:
            for cluster, job, restarts, slurm_cluster, ended, _ in jobs:
                run = answers.get((slurm_cluster, job, restarts))
                final = run is not None and ended and run.state not in ACTIVE
                conn.execute(text(ANSWERED), {
                    "cluster": cluster, "id": job, "restarts": restarts, "now": now,
                    "slurm_id": run.slurm_id if run else None,
                    "user": run.user if run and slurm_cluster else None,
                    "state": run.state if final else None,
                    "exit_code": run.exit_code if final else None})
                self._count("named" if final else "known" if run else "unknown")
        return len(jobs)

    def ask(self, jobs) -> dict[tuple[str | None, str, int], Run]:
        """(Slurm cluster, raw id, run) → Run, from sacct, else scontrol. slurmdbd learns a
        heterogeneous component's offset only after the job has run (sacct shows 1234+1 as
        1235 until then), so the ids slurmctld still holds are taken from squeue."""
        if self.mode in ("auto", "sacct"):
            try:
                runs = self.sacct(jobs)
            except SlurmUnavailable:
                if self.mode == "sacct":
                    raise
            else:
                return self.named_by_slurmctld(jobs, runs)
        return self.scontrol()

    def named_by_slurmctld(self, jobs, runs: dict) -> dict:
        """The runs, with the id and user slurmctld gives the jobs it still holds."""
        try:
            local = self.local_cluster()
            out = self.run(["squeue", "-h", "-a", "-t", "all", "-o", "%A|%i|%u", "-j",
                            ",".join(sorted({job for _, job, *_ in jobs}, key=int))])
        except SlurmUnavailable:
            return runs          # squeue -j of one job slurmctld no longer holds fails too
        held = {raw: (name, user) for raw, name, user in
                (line.split("|", 2) for line in out.splitlines() if line.count("|") == 2)}
        return {(cluster, raw, run): replace(answer, slurm_id=held[raw][0],
                                             user=held[raw][1] or None)
                if raw in held and cluster in (None, local) else answer
                for (cluster, raw, run), answer in runs.items()}

    def local_cluster(self) -> str | None:
        """This host's Slurm cluster (scontrol show config's ClusterName), asked once."""
        if self.local is None:
            for line in self.run(["scontrol", "show", "config"]).splitlines():
                name, _, value = line.partition("=")
                if name.strip() == "ClusterName":
                    self.local = value.strip()
        return self.local

    def run(self, argv: list[str]) -> str:
        return run_slurm(argv, COMMAND_TIMEOUT_S, self.environ)

    def sacct(self, jobs) -> dict:
        clusters = sorted({c for _, _, _, c, _, _ in jobs if c})
        # from a day before the earliest: a job id Slurm handed out again (after its
        # counter was reset) names an older job too, whose runs would count as this one's
        earliest = min((t for *_, t in jobs if t is not None), default=None)
        since = () if earliest is None else (
            "-S", (earliest - timedelta(days=1)).astimezone().strftime("%Y-%m-%dT%H:%M:%S"))
        out = self.run(["sacct", "-n", "-P", "-X", "-D", "-a", *since,
                        *(("-M", ",".join(clusters)) if clusters else ()),
                        "-j", ",".join(sorted({job for _, job, *_ in jobs}, key=int)),
                        "-o", "Cluster,JobIDRaw,JobID,State,ExitCode,User"])
        return parse_sacct(out)

    def scontrol(self) -> dict:
        local = self.local_cluster()
        return parse_scontrol(self.run(["scontrol", "show", "job", "-o"]), local)


def parse_sacct(out: str) -> dict:
    """sacct -n -P -X -D -o Cluster,JobIDRaw,JobID,State,ExitCode,User: a job's lines come in
    the order of its runs (the earlier ones REQUEUED). Each run under its Slurm cluster, and
    under None for a job recorded without one."""
    runs: dict[tuple[str | None, str, int], Run] = {}
    seen: dict[tuple[str | None, str], int] = {}
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 6 or not fields[1].isdigit():
            continue
        cluster, raw, slurm_id, state, exit_code, user = fields
        index = seen.get((cluster, raw), 0)
        seen[(cluster, raw)] = index + 1
        word = STATE_WORD.match(state)
        user = None if user in ("", "root") else user      # accounting's root: not yet known
        run = Run(slurm_id, word.group() if word else state, exit_code or None, user)
        runs[(cluster, raw, index)] = runs[(None, raw, index)] = run
    return runs


def parse_scontrol(out: str, cluster: str | None) -> dict:
    """scontrol show job -o: one line a job, KEY=VALUE fields; only the current run."""
    runs = {}
    for line in out.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        raw = fields.get("JobId", "")
        if not raw.isdigit():
            continue
        if fields.get("ArrayTaskId", "N/A").isdigit():
            slurm_id = f"{fields['ArrayJobId']}_{fields['ArrayTaskId']}"
        elif fields.get("HetJobOffset", "").isdigit():
            slurm_id = f"{fields['HetJobId']}+{fields['HetJobOffset']}"
        else:
            slurm_id = raw
        restarts = int(fields["Restarts"]) if fields.get("Restarts", "").isdigit() else 0
        word = STATE_WORD.match(fields.get("JobState", ""))
        user = fields.get("UserId", "").partition("(")[0]      # alice(1000)
        run = Run(slurm_id, word.group() if word else "UNKNOWN", fields.get("ExitCode"),
                  user or None)
        runs[(cluster, raw, restarts)] = runs[(None, raw, restarts)] = run
    return runs

