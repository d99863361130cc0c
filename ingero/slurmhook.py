"""The Slurm prolog and epilog (``slurm/prolog``, ``slurm/epilog`` run ``python -m
ingero.slurmhook``); documented in ingero-slurm(8).

The prolog records the job (id, user, account, partition, nodes, GPUs, start) as a file in this
node's job spool, then makes sure an ingerod watches the job: it tells the node-wide ingerod over
its local control socket; where none answers it starts ``ingerod@JOB`` with ``systemctl start
--no-block`` (systemd) or a fully detached per-job instance (its own session and pidfile).
slurmd kills the prolog's process group when the script exits and drains the node when a prolog
fails, so nothing here waits on the network, and every failure is logged and swallowed.

The epilog records the end (time, exit status, state), tells the node-wide ingerod, and stops a
per-job instance (which sends the end record before it exits). ingerod forwards both records to
fleetd and echod, which fills its ``jobs`` table, and deletes a record once fleetd has
acknowledged it: a record written while ingerod, fleetd or echod is down is sent later.

Standard library only, so that a hook starts fast and a broken dependency cannot break it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import syslog
import time
from pathlib import Path

# name → (default, what it is): read from the environment, which slurm/prolog fills from
# /etc/default/ingero-slurm.
SETTINGS = {
    "INGERO_JOBS_DIR": ("/var/lib/ingero/jobs", "the job spool ingerod reads"),
    "INGERO_CONTROL_SOCKET": ("/run/ingero/ingerod.sock",
                              "the node-wide ingerod's local control socket"),
    "INGERO_HOOK_AGENT": ("auto", "how to make sure an ingerod watches the job: auto (the "
                          "node-wide ingerod, else systemd's ingerod@JOB, else a detached "
                          "instance), node (only tell the node-wide one), systemd, detached, "
                          "or none (only record the job)"),
    "INGERO_HOOK_CPU_JOBS": ("auto", "whether to start a per-job ingerod for a job given no "
                             "GPUs: no, yes, or auto (no on a node with NVIDIA GPUs, which "
                             "such a job cannot use; yes elsewhere, as for the sim)"),
    "INGERO_INGEROD": ("", "the ingerod program of a detached instance [default: the one next "
                       "to the hook's Python]"),
    "INGERO_INGEROD_ARGS": ("", "extra arguments of a detached instance, split on spaces"),
    "INGERO_RUN_DIR": ("/run/ingero", "where a detached instance's pidfile goes"),
    "INGERO_LOG_DIR": ("/var/log/ingero", "where a detached instance's log goes"),
    "INGERO_HOOK_VERBOSE": ("", "when set, also say what happens on standard error"),
}
AGENT_MODES = ("auto", "node", "systemd", "detached", "none")
SOCKET_TIMEOUT_S = 0.5
SYSTEMCTL_TIMEOUT_S = 0.8
RECORD_VERSION = 1
JOB_ID = re.compile(r"[A-Za-z0-9_.+-]{1,64}")


def setting(name: str, environ=os.environ) -> str:
    return environ.get(name) or SETTINGS[name][0]


# -- the records -------------------------------------------------------------------------------

def start_record(environ, now: float) -> dict:
    """What the prolog knows about the job, from the variables slurmd gives it."""
    gpus = environ.get("SLURM_JOB_GPUS") or environ.get("CUDA_VISIBLE_DEVICES") or ""
    gpu_ids = [g for g in gpus.split(",") if g.strip()]
    return _record("job_start", environ, now, {
        **slurm_identity(environ),
        "user": environ.get("SLURM_JOB_USER"),
        "uid": _int(environ.get("SLURM_JOB_UID")),
        "account": environ.get("SLURM_JOB_ACCOUNT"),
        "partition": environ.get("SLURM_JOB_PARTITION"),
        "nodelist": environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST"),
        "node_count": _int(environ.get("SLURM_JOB_NUM_NODES")),
        "ntasks": _int(environ.get("SLURM_JOB_NTASKS")),
        "gpus": len(gpu_ids) if gpus else None,
        "gpu_ids": ",".join(gpu_ids) or None,
    })


def end_record(environ, now: float) -> dict:
    """The epilog's: when, and how the job ended as far as its environment tells
    (SLURM_JOB_EXIT_CODE2 is exit:signal). Only slurmctld knows whether a job killed by a
    signal was cancelled, timed out, preempted or requeued, and a hook must not ask it (Slurm's
    advice: no Slurm commands in a prolog or epilog); echod asks sacct later, off the job's
    path (``echod.slurmjobs``), and its answer replaces this one."""
    code, signal_number = _exit_status(environ)
    state = None if code is None else (
        "COMPLETED" if code == 0 and signal_number == 0 else "FAILED")
    exit_code = None if code is None else f"{code}:{signal_number}"
    return _record("job_end", environ, now, {"exit_code": exit_code, "state": state})


def slurm_identity(environ) -> dict:
    """The job's place among Slurm's ids, as far as the hook's environment says: an array
    task's array job and index (Slurm 23.02 on), a heterogeneous component's leader and offset
    (the leader's prolog has no offset: Slurm gives it only SLURM_HET_JOB_ID)."""
    return {"array_job_id": _int(environ.get("SLURM_ARRAY_JOB_ID")),
            "array_task_id": _int(environ.get("SLURM_ARRAY_TASK_ID")),
            "het_job_id": _int(environ.get("SLURM_HET_JOB_ID")),
            "het_job_offset": _int(environ.get("SLURM_HET_JOB_OFFSET"))}


def _record(event: str, environ, now: float, fields: dict) -> dict:
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID") or ""
    if not JOB_ID.fullmatch(job):
        raise HookError(f"no usable SLURM_JOB_ID ({job!r})")
    fields = {"slurm_cluster": environ.get("SLURM_CLUSTER_NAME"),
              "restart_count": _int(environ.get("SLURM_JOB_RESTART_COUNT")), **fields}
    return {"version": RECORD_VERSION, "event": event, "job": job, "t": now,
            "node": environ.get("SLURMD_NODENAME") or socket.gethostname(),
            **{k: v for k, v in fields.items() if v is not None}}


def _exit_status(environ) -> tuple[int | None, int]:
    text = environ.get("SLURM_JOB_EXIT_CODE2")
    if text and ":" in text:
        code, _, sig = text.partition(":")
        if code.isdigit() and sig.isdigit():
            return int(code), int(sig)
    status = _int(environ.get("SLURM_JOB_EXIT_CODE"))
    if status is None:
        return None, 0
    return (status >> 8) & 0xFF, status & 0x7F        # a wait(2) status


def _int(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None


# JOB.EVENT.json for a job's first run, JOB.EVENT.rN.json for its run after N requeues
RECORD_NAME = re.compile(r"(?P<job>[A-Za-z0-9_+-]{1,64})\.(?P<event>job_start|job_end)"
                         r"(?:\.r(?P<restart>[1-9][0-9]{0,8}))?\.json")


def record_path(jobs_dir: Path, record: dict) -> Path:
    restart = record.get("restart_count") or 0
    run = f".r{restart}" if restart else ""
    return jobs_dir / f"{record['job']}.{record['event']}{run}.json"


def own_directory(path: Path, mode: int) -> Path:
    """``path``, made with ``mode`` if missing, as a directory of this process's user (root,
    in a hook) that no one else may write; HookError if it is a link, another user's, or
    writable by group or others: a root hook writing there could be led to write elsewhere."""
    path.mkdir(mode=mode, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise HookError(f"{path} is not a directory of uid {os.geteuid()} that only it may "
                        "write; not writing there")
    return path


def open_own(path: Path, flags: int, mode: int) -> int:
    """``os.open`` that never follows a link at ``path``."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def write_record(jobs_dir: Path, record: dict) -> Path:
    """Atomically (a whole file or none), readable by root only."""
    path = record_path(own_directory(jobs_dir, 0o700), record)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)
    fd = open_own(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(record, out)
    os.replace(partial, path)
    return path


def read_record(path: Path) -> dict:
    """A spooled record, checked enough to be trusted as an event; HookError if not."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise HookError(f"unreadable job record {path}: {exc}") from None
    if (not isinstance(record, dict) or record.get("event") not in ("job_start", "job_end")
            or not JOB_ID.fullmatch(str(record.get("job", "")))
            or type(record.get("t")) not in (int, float)
            or type(record.get("restart_count", 0)) is not int):
        raise HookError(f"not a job record: {path}")
    return record


class HookError(Exception):
    """A hook could not do part of its work; logged, never fatal to the job."""


# -- telling an ingerod ------------------------------------------------------------------------

def tell_node_agent(path: str, job: str, event: str) -> str | None:
    """The node-wide ingerod's answer to "this job started/ended", or None if none answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(SOCKET_TIMEOUT_S)
            conn.connect(path)
            conn.sendall(json.dumps({"job": job, "event": event}).encode() + b"\n")
            answer = json.loads(conn.makefile("rb").readline() or b"{}")
    except (OSError, ValueError):
        return None
    return answer.get("agent") if answer.get("ok") else None


def systemd_running() -> bool:
    return os.path.isdir("/run/systemd/system")


def systemctl(verb: str, job: str) -> bool:
    """``systemctl VERB --no-block ingerod@JOB.service``: queued, never waited for."""
    try:
        done = subprocess.run(["systemctl", verb, "--no-block", f"ingerod@{job}.service"],
                              stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=SYSTEMCTL_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise HookError(f"systemctl {verb} ingerod@{job}: {exc}") from None
    if done.returncode != 0:
        raise HookError(f"systemctl {verb} ingerod@{job}: "
                        f"{done.stderr.decode(errors='replace').strip()}")
    return True


def pidfile(environ, job: str) -> Path:
    return Path(setting("INGERO_RUN_DIR", environ)) / f"ingerod-{job}.pid"


def start_detached(environ, record: dict) -> int:
    """A per-job ingerod in a session of its own (slurmd kills the prolog's process group),
    its pid in a pidfile for the epilog."""
    program = setting("INGERO_INGEROD", environ) or str(Path(sys.executable).with_name("ingerod"))
    argv = [program, "--job", record["job"], *setting("INGERO_INGEROD_ARGS", environ).split()]
    if record.get("node_count"):
        argv += ["--job-nodes", str(record["node_count"])]
    log_dir = own_directory(Path(setting("INGERO_LOG_DIR", environ)), 0o750)
    env = {k: v for k, v in environ.items() if not k.startswith("SLURM")}
    log = open_own(log_dir / f"ingerod-{record['job']}.log",
                   os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    try:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 start_new_session=True, close_fds=True, env=env)
    finally:
        os.close(log)
    path = pidfile(environ, record["job"])
    own_directory(path.parent, 0o755)
    fd = open_own(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(fd, "w") as out:
        out.write(f"{child.pid}\n")
    return child.pid


def stop_detached(environ, job: str) -> int | None:
    """SIGTERM the job's detached instance, if its pidfile names a live ingerod of this job."""
    path = pidfile(environ, job)
    try:
        pid = int(path.read_text().split()[0])
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError, IndexError):
        path.unlink(missing_ok=True)
        return None
    path.unlink(missing_ok=True)
    if not any(arg.endswith(b"ingerod") for arg in cmdline) or job.encode() not in cmdline:
        return None
    os.kill(pid, signal.SIGTERM)
    return pid


# -- the hooks ---------------------------------------------------------------------------------

def prolog(environ, say) -> None:
    record = start_record(environ, time.time())
    job, mode, agent = spool_and_tell(environ, record, "start", say)
    if mode == "none":
        return
    if agent is not None:
        say(f"job {job}: the node-wide ingerod ({agent}) watches it")
    elif mode == "node":
        say(f"job {job}: no node-wide ingerod answered; the job runs untraced")
    elif not record.get("gpus") and not cpu_jobs_traced(environ):
        say(f"job {job}: no GPUs, so no per-job ingerod (INGERO_HOOK_CPU_JOBS)")
    elif uses_systemd(mode):
        systemctl("start", job)
        say(f"job {job}: started ingerod@{job}.service")
    else:
        say(f"job {job}: no node-wide ingerod answered; started a detached ingerod "
            f"(pid {start_detached(environ, record)})")


def epilog(environ, say) -> None:
    record = end_record(environ, time.time())
    job, mode, agent = spool_and_tell(environ, record, "end", say)
    if mode == "none":
        return
    if agent is not None:
        say(f"job {job}: told the node-wide ingerod ({agent})")
    pid = stop_detached(environ, job)
    if pid is not None:
        say(f"job {job}: stopping its detached ingerod (pid {pid})")
    elif agent is None and uses_systemd(mode):
        systemctl("stop", job)
        say(f"job {job}: stopping ingerod@{job}.service")


def spool_and_tell(environ, record: dict, event: str, say) -> tuple[str, str, str | None]:
    """Write the record, then ask the node-wide agent: (job, mode, the agent's answer)."""
    path = write_record(Path(setting("INGERO_JOBS_DIR", environ)), record)
    job, mode = record["job"], agent_mode(environ)
    said = ", ".join(f"{k} {record[k]}" for k in ("user", "nodelist", "gpus", "state",
                                                   "exit_code") if k in record)
    say(f"job {job} {event} recorded in {path} ({said})")
    if mode == "none":
        return job, mode, None
    return job, mode, tell_node_agent(setting("INGERO_CONTROL_SOCKET", environ), job, event)


def cpu_jobs_traced(environ) -> bool:
    """Whether a job given no GPUs gets a per-job ingerod of its own."""
    choice = setting("INGERO_HOOK_CPU_JOBS", environ)
    if choice not in ("auto", "yes", "no"):
        raise HookError(f"INGERO_HOOK_CPU_JOBS={choice!r}: expected auto, yes or no")
    return choice == "yes" or (choice == "auto" and not os.path.exists("/dev/nvidiactl"))


def uses_systemd(mode: str) -> bool:
    return mode == "systemd" or (mode == "auto" and systemd_running())


def agent_mode(environ) -> str:
    mode = setting("INGERO_HOOK_AGENT", environ)
    if mode not in AGENT_MODES:
        raise HookError(f"INGERO_HOOK_AGENT={mode!r}: expected one of {', '.join(AGENT_MODES)}")
    return mode


HOOKS = {"prolog": prolog, "epilog": epilog}
CONTEXTS = {"prolog_slurmd": "prolog", "epilog_slurmd": "epilog"}


def main(argv: list[str], environ=os.environ) -> int:
    """Run the hook named by slurmd's SLURM_SCRIPT_CONTEXT (else argv[1]); always 0."""
    name = CONTEXTS.get(environ.get("SLURM_SCRIPT_CONTEXT", "")) or (argv[1] if len(argv) > 1
                                                                      else "")
    syslog.openlog(f"ingero-{name or 'hook'}", syslog.LOG_PID, syslog.LOG_DAEMON)

    def say(line: str, priority: int = syslog.LOG_INFO) -> None:
        syslog.syslog(priority, line)
        if setting("INGERO_HOOK_VERBOSE", environ):
            print(f"ingero-{name}: {line}", file=sys.stderr)

    if name not in HOOKS:
        say(f"unknown hook {name!r} (expected prolog or epilog); doing nothing",
            syslog.LOG_WARNING)
        return 0
    try:
        HOOKS[name](environ, say)
    except Exception as exc:   # a failing prolog drains the node: log it, never fail the job
        say(f"{type(exc).__name__}: {exc}", syslog.LOG_ERR)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
