"""A real one-node Slurm cluster for the tests: munge, slurmctld and slurmd from Debian, with
this checkout's prolog and epilog (DESIGN.md: SlurmUser=root, proctrack/linuxproc, task/none,
state and spool under a temporary directory, munged as the munge user).

slurmd runs the hooks with a clean environment, so the drop-in ``50-ingero`` of prolog.d and
epilog.d (slurm.conf names their globs, as the Ansible role sets a site up) is a small wrapper
that points the real script at a settings file of the test's (``INGERO_SLURM_DEFAULTS``) and
notes each run's exit status and duration in ``hooks.log``; the drop-in ``00-site`` stands for
the site's own hook, and notes its runs in ``site-hooks.log``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stack.launch import free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
MUNGE_SOCKET_DIR = Path("/run/munge")
MUNGE_KEY = Path("/etc/munge/munge.key")

WRAPPER = """#!/bin/sh
export INGERO_SLURM_DEFAULTS={defaults}
start=$(date +%s.%N)
{hook}
status=$?
echo "$SLURM_SCRIPT_CONTEXT $SLURM_JOB_ID $status $start $(date +%s.%N)" >> {log}
exit $status
"""

# A site's own hook beside ingero's (a node health check, say): it notes that it ran.
SITE_HOOK = """#!/bin/sh
echo "$SLURM_SCRIPT_CONTEXT $SLURM_JOB_ID" >> {log}
"""

CONF = """ClusterName=ingerotest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
AuthType=auth/munge
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
Prolog={root}/prolog.d/*
Epilog={root}/epilog.d/*
PrologFlags=Alloc
PrologEpilogTimeout=30
{nodes}PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""

# One slurmd per node name, all on this host (heterogeneous job components need nodes of
# their own); a one-node cluster's node is the host itself.
NODE = "NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=8 " \
    "RealMemory=1000 State=UNKNOWN\n"

# With accounting: slurmdbd on a private MariaDB, so that sacct answers as on a site.
ACCOUNTING_CONF = """AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort={dbd_port}
JobCompType=jobcomp/none
"""

SLURMDBD_CONF = """AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={dbd_port}
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={db_port}
StorageUser=root
StorageLoc=slurm_acct_db
PidFile={root}/slurmdbd.pid
LogFile={root}/slurmdbd.log
"""


@dataclass
class HookRun:
    context: str
    job: str
    status: int
    seconds: float


class SlurmCluster:
    """slurmctld and slurmd as children of the test (munged too, unless one runs already);
    with ``accounting``, MariaDB and slurmdbd too, so that sacct answers; ``nodes`` > 1 runs
    a slurmd per node name (n0, n1, ...) on this host; ``extra`` lines go into slurm.conf."""

    def __init__(self, root: Path, accounting: bool = False, nodes: int = 1, extra: str = ""):
        self.root = root
        root.chmod(0o755)
        for sub in ("state", "spool"):
            (root / sub).mkdir()
        self.defaults = root / "ingero-slurm.defaults"
        self.defaults.write_text("")
        self.hooks_log = root / "hooks.log"
        # as a site lays them out (ingero_compute): the site's own hook, then ingero's
        self.site_log = root / "site-hooks.log"
        for hook in ("prolog", "epilog"):
            (root / f"{hook}.d").mkdir()
            for name, text in (("00-site", SITE_HOOK.format(log=self.site_log)),
                               ("50-ingero", WRAPPER.format(
                                   defaults=self.defaults, hook=REPO / "slurm" / hook,
                                   log=self.hooks_log))):
                path = root / f"{hook}.d" / name
                path.write_text(text)
                path.chmod(0o755)
        self.host = socket.gethostname().split(".")[0]
        self.nodes = [self.host] if nodes == 1 else [f"n{i}" for i in range(nodes)]
        for name in self.nodes:
            (root / "spool" / name).mkdir()
        self.conf = root / "slurm.conf"
        dbd_port = free_port()
        self.conf.write_text(CONF.format(host=self.host, root=root, ctld_port=free_port(),
                                         names=",".join(self.nodes), nodes="".join(
                                             NODE.format(name=name, host=self.host,
                                                         port=free_port())
                                             for name in self.nodes))
                             + (ACCOUNTING_CONF.format(dbd_port=dbd_port) if accounting else "")
                             + extra)
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.munged = start_munge()
        self.daemons = []
        try:
            if accounting:
                self._start_accounting(dbd_port)
            for program, name in (("slurmctld", None), *(("slurmd", n) for n in self.nodes)):
                self.daemons.append(subprocess.Popen(
                    [f"/usr/sbin/{program}", "-D", "-f", str(self.conf),
                     *(("-N", name) if name else ())], env=self.env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=open(root / f"{program}-{name or 'ctld'}.stderr", "wb")))
            if not wait_for(lambda: self.node_state() == "idle", 60):
                raise RuntimeError(f"slurm did not come up (node {self.node_state()!r}):\n"
                                   f"{self.logs()}")
        except BaseException:
            self.stop()
            raise

    def _start_accounting(self, dbd_port: int) -> None:
        """MariaDB in the cluster's directory (loopback, no grant tables: a private test
        database), then slurmdbd on it, before slurmctld registers the cluster."""
        data, sock, db_port = self.root / "mariadb", self.root / "mariadb.sock", free_port()
        subprocess.run(["mariadb-install-db", f"--datadir={data}", "--user=root",
                        "--skip-test-db", "--auth-root-authentication-method=normal"],
                       check=True, capture_output=True, timeout=120)
        self.daemons.append(subprocess.Popen(
            ["mariadbd", f"--datadir={data}", f"--socket={sock}", f"--port={db_port}",
             "--bind-address=127.0.0.1", "--user=root", "--skip-grant-tables",
             "--skip-log-bin", "--innodb-buffer-pool-size=64M",
             f"--pid-file={self.root}/mariadb.pid"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(self.root / "mariadb.stderr", "wb")))
        if not wait_for(sock.exists, 60):
            raise RuntimeError(f"mariadb did not start:\n{self.logs()}")
        conf = self.root / "slurmdbd.conf"          # found next to SLURM_CONF
        conf.write_text(SLURMDBD_CONF.format(dbd_port=dbd_port, db_port=db_port,
                                             root=self.root))
        conf.chmod(0o600)
        self.daemons.append(subprocess.Popen(
            ["/usr/sbin/slurmdbd", "-D"], env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=open(self.root / "slurmdbd.stderr", "wb")))
        if not wait_for(lambda: self.sacctmgr("show", "cluster").returncode == 0, 60):
            raise RuntimeError(f"slurmdbd did not start:\n{self.logs()}")
        for what in (["cluster", "ingerotest"], ["account", "ingero", "cluster=ingerotest"],
                     ["user", "root", "account=ingero", "cluster=ingerotest"]):
            self.sacctmgr("add", *what)

    def sacctmgr(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sacctmgr", "-i", *argv], env=self.env, capture_output=True,
                              text=True, timeout=30)

    def sacct(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(["sacct", *argv], env=self.env, capture_output=True, text=True,
                              timeout=30)

    def settings(self, **values: str) -> None:
        """What /etc/default/ingero-slurm would say, for the hooks' next runs."""
        self.defaults.write_text("".join(f"{k}={v}\n" for k, v in values.items()))

    def node_state(self) -> str:
        done = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env,
                              capture_output=True, text=True, timeout=30)
        states = set(done.stdout.split())
        return states.pop() if len(states) == 1 else " ".join(sorted(states))

    def srun(self, *argv: str, timeout: float = 180, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(["srun", *argv], env=self.env, capture_output=True, text=True,
                              timeout=timeout, **kw)

    def hook_runs(self, job: str) -> list[HookRun]:
        runs = []
        text = self.hooks_log.read_text() if self.hooks_log.exists() else ""
        for line in text.splitlines():
            context, job_id, status, start, end = line.split()
            if job_id == job:
                runs.append(HookRun(context, job_id, int(status), float(end) - float(start)))
        return runs

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.root.glob("*.log")) + sorted(
                             self.root.glob("*.stderr")))

    def stop(self) -> None:
        for daemon in reversed(self.daemons):
            daemon.send_signal(signal.SIGTERM)
        for daemon in reversed(self.daemons):
            try:
                daemon.wait(30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        if self.munged is not None:
            self.munged.kill()


class Munged:
    def __init__(self, pid: int):
        self.pid = pid

    def kill(self) -> None:
        """SIGTERM, and wait until it is gone: a next cluster's start_munge must not take a
        munged on its way out for a running one (its socket is gone a moment later)."""
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if not wait_for(lambda: not Path(f"/proc/{self.pid}").exists(), 10):
            os.kill(self.pid, signal.SIGKILL)
            wait_for(lambda: not Path(f"/proc/{self.pid}").exists(), 10)


def start_munge() -> Munged | None:
    """munged as the munge user, with the key Debian's package made (None if one runs)."""
    if subprocess.run(["pgrep", "-x", "munged"], capture_output=True).returncode == 0:
        return None
    munge = pwd.getpwnam("munge")
    if not MUNGE_KEY.exists():
        subprocess.run(["/usr/sbin/mungekey", "--create"], check=True, capture_output=True)
        os.chown(MUNGE_KEY, munge.pw_uid, munge.pw_gid)
    MUNGE_SOCKET_DIR.mkdir(exist_ok=True)
    os.chown(MUNGE_SOCKET_DIR, munge.pw_uid, munge.pw_gid)
    MUNGE_SOCKET_DIR.chmod(0o755)
    subprocess.run([shutil.which("runuser") or "/usr/sbin/runuser", "-u", "munge", "--",
                    "/usr/sbin/munged"], check=True, capture_output=True, timeout=30)
    pidfile = MUNGE_SOCKET_DIR / "munged.pid"
    if not wait_for(pidfile.exists, 10):
        raise RuntimeError("munged did not start")
    time.sleep(0.2)
    return Munged(int(pidfile.read_text().split()[0]))


def have_slurm() -> bool:
    return all(shutil.which(p) for p in ("slurmctld", "slurmd", "srun", "munged")) \
        and sys.platform == "linux"


class Syslog:
    """Listen on /dev/log for what the hooks log (only where nothing else does)."""

    PATH = Path("/dev/log")

    def __init__(self):
        self.lines: list[str] = []
        self.sock = None
        if self.PATH.exists() or self.PATH.is_symlink():
            return
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.PATH))
        self.PATH.chmod(0o666)
        self.sock.settimeout(0.2)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while self.sock is not None:
            try:
                self.lines.append(self.sock.recv(8192).decode(errors="replace"))
            except (TimeoutError, OSError):
                continue

    def close(self):
        if self.sock is not None:
            sock, self.sock = self.sock, None
            sock.close()
            self.PATH.unlink(missing_ok=True)


def cluster_for_module(prefix: str, **kw):
    """A module's Slurm cluster under a fresh directory (searchable by postgres, for the
    embedded PostgreSQL of a stack beside it), with /dev/log listened to: a generator for a
    module-scoped fixture (``kw`` as SlurmCluster takes them)."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    root.chmod(0o755)
    log = Syslog()
    (root / "slurm").mkdir()
    cluster = SlurmCluster(root / "slurm", **kw)
    cluster.syslog = log
    try:
        yield cluster
    finally:
        cluster.stop()
        log.close()


def stack_beside(cluster: SlurmCluster, **kw):
    """A one-node Stack whose node-wide ingerod (tracing the sim's libraries in every process
    of this host) the cluster's hooks tell of each job (INGERO_HOOK_AGENT=node); ``kw`` as
    Stack takes them."""
    import sim

    from stack.local import Stack

    root = cluster.root.parent
    spool, sock = root / "jobs", root / "ingerod.sock"
    cluster.settings(INGERO_PYTHON=sys.executable, INGERO_JOBS_DIR=spool,
                     INGERO_CONTROL_SOCKET=sock, INGERO_HOOK_AGENT="node")
    (root / "stack").mkdir(mode=0o755)
    stack = Stack(root / "stack", 1, push_s=0.5, sim_hosts=False, names=(cluster.host,),
                  agent_flags=("--jobs-dir", str(spool), "--control-socket", str(sock),
                               "--libraries", sim.traced_libraries()), **kw)
    if not wait_for(sock.exists, 60):
        stack.stop()
        raise RuntimeError(f"ingerod's control socket did not come up:\n{stack.logs()}")
    return stack


def ingero_run(stack, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``ingero ARGS`` as a user runs it against the stack's echod (its token, its CA)."""
    token = stack.root / "token"
    token.write_text(stack.token + "\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("INGERO_", "SLURM_"))}
    return subprocess.run([sys.executable, "-m", "ingero", *args], capture_output=True,
                          text=True, timeout=120, cwd=stack.root,
                          env={**clean, "HOME": str(stack.root), "INGERO_URL": stack.echod.url,
                               "INGERO_TOKEN_FILE": str(token),
                               "INGERO_CA_CERT": str(stack.echod.cert), **(env or {})})


def ingero_cli(stack, *args: str, env: dict | None = None) -> str:
    """``ingero_run``'s output, the command having succeeded."""
    done = ingero_run(stack, *args, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout


needs_slurm = pytest.mark.skipif(not have_slurm(), reason="Slurm and munge: make setup")
