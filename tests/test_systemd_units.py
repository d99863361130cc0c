"""The units as an operator installs them: `systemd-analyze verify` against an install tree
(template instances included), `systemd-analyze security` under stated thresholds, the
directives the daemons rely on, and ingerod's capability set proven enough to trace."""

from __future__ import annotations

import configparser
import errno
import importlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.support import needs_ebpf

REPO = Path(__file__).resolve().parent.parent
UNITS = sorted((REPO / "systemd").glob("*.service"))
NAMES = [u.name for u in UNITS]
# What `systemd-analyze security --offline=true` may score each unit (10 = fully exposed).
# fleetd and echod are locked down hard; ingerod runs as root with the tracing capabilities
# and sees the kernel headers and tracefs that bcc needs, which costs it about two points.
EXPOSURE_LIMIT = {"fleetd.service": 2.0, "echod.service": 2.0, "ingerod.service": 4.5,
                  "ingerod@.service": 4.5}
INSTANCES = {"ingerod@.service": "ingerod@1234.service"}
# Its trace asserts on what is traced, not on when: it may run beside the Ansible stages.
pytestmark = pytest.mark.load_tolerant


def analyze(*args: str) -> subprocess.CompletedProcess:
    assert shutil.which("systemd-analyze"), "systemd-analyze missing: make setup installs it"
    return subprocess.run(["systemd-analyze", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def install_root(tmp_path_factory) -> Path:
    """A root as `make install` leaves it: the units in /etc/systemd/system, the daemons in
    /opt/ingero/venv/bin, and the system's own units, /bin/kill and /bin/rm, which the units
    need."""
    root = tmp_path_factory.mktemp("root")
    (root / "etc/systemd/system").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    for program in ("kill", "rm"):
        shutil.copy2(shutil.which(program) or f"/bin/{program}", root / "usr/bin" / program)
    shutil.copytree("/lib/systemd/system", root / "usr/lib/systemd/system", symlinks=True)
    for unit in UNITS:
        shutil.copy2(unit, root / "etc/systemd/system" / unit.name)
    venv = root / "opt/ingero/venv/bin"
    venv.mkdir(parents=True)
    for program in ("ingerod", "fleetd", "echod"):
        (venv / program).write_text("#!/bin/sh\n")
        (venv / program).chmod(0o755)
    return root


def test_every_daemon_has_its_unit():
    assert NAMES == ["echod.service", "fleetd.service", "ingerod.service", "ingerod@.service"]


@pytest.mark.parametrize("name", NAMES)
def test_unit_verifies_against_an_install_tree(name, install_root):
    done = analyze("verify", "--man=no", f"--root={install_root}", INSTANCES.get(name, name))
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr


def test_verify_catches_a_broken_unit(install_root, tmp_path):
    """The check above would fail: a unit whose program is missing does not verify."""
    broken = install_root / "etc/systemd/system/ingerod@.service"
    text = broken.read_text()
    try:
        broken.write_text(text.replace("/opt/ingero/venv/bin/ingerod", "/opt/ingero/nothing"))
        done = analyze("verify", "--man=no", f"--root={install_root}", "ingerod@1234.service")
        assert done.returncode != 0 and "not executable" in done.stderr
    finally:
        broken.write_text(text)


@pytest.mark.parametrize("name", NAMES)
def test_exposure_is_under_the_stated_threshold(name, install_root):
    done = analyze("security", "--offline=true", f"--root={install_root}",
                   INSTANCES.get(name, name))
    found = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
    assert found, done.stdout + done.stderr
    assert float(found.group(1)) <= EXPOSURE_LIMIT[name], done.stdout


def service(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string((REPO / "systemd" / name).read_text())
    return parser["Service"]


@pytest.mark.parametrize("name", NAMES)
def test_unit_declares_what_the_daemons_implement(name):
    unit = service(name)
    daemon = name.split("@")[0].removesuffix(".service")
    assert unit["Type"] == "notify" and int(unit["WatchdogSec"]) > 0
    assert unit["Restart"] == "on-failure"
    assert unit["EnvironmentFile"] == f"-/etc/default/{daemon}"
    assert unit["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert unit["ExecStart"].startswith(f"/opt/ingero/venv/bin/{daemon} --config "
                                        f"/etc/ingero/{daemon}.yaml")


def test_fleetd_and_echod_run_unprivileged_and_fleetd_can_hold_10000_agents():
    for name in ("fleetd.service", "echod.service"):
        unit = service(name)
        assert unit["User"] == "ingero" and unit["CapabilityBoundingSet"] == ""
    assert int(service("fleetd.service")["LimitNOFILE"]) > 10_000
    assert service("echod.service")["StateDirectory"] == "ingero/echod"
    assert "--state-dir /var/lib/ingero/echod" in service("echod.service")["ExecStart"]


def test_ingerod_units_keep_what_bcc_needs():
    for name in ("ingerod.service", "ingerod@.service"):
        unit = service(name)
        assert "User" not in unit and unit["LimitMEMLOCK"] == "infinity"
        assert set(unit["CapabilityBoundingSet"].split()) == {
            "CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH",
            "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN"}
        for hides in ("ProtectKernelModules", "ProtectKernelTunables", "ProtectKernelLogs",
                      "PrivateDevices"):
            assert unit.get(hides, "no") == "no", f"{name}: {hides} hides what bcc reads"
    assert "--job %i" in service("ingerod@.service")["ExecStart"]
    assert "--job" not in service("ingerod.service")["ExecStart"]
    assert service("ingerod.service")["RuntimeDirectoryPreserve"] == "yes"


def test_per_job_agents_can_share_a_node():
    """Two jobs on one node run two ingerod@ instances: neither may claim the node-wide agent's
    metrics port (the second would not start) or its runtime directory."""
    unit = service("ingerod@.service")
    assert "--metrics-addr none" in unit["ExecStart"] and "RuntimeDirectory" not in unit


@pytest.mark.parametrize("name", NAMES)
def test_every_flag_a_unit_passes_is_a_setting_of_its_daemon(name):
    """Each --flag VALUE of ExecStart names a setting of the daemon and parses as one (%i as
    a job id): a renamed setting cannot leave a unit that fails at start."""
    daemon = name.split("@")[0].removesuffix(".service")
    settings = {s.flag: s for s in importlib.import_module(f"{daemon}.config").SETTINGS}
    words = service(name)["ExecStart"].replace("%i", "1234").split()[1:]
    assert len(words) % 2 == 0, words
    for flag, value in zip(words[::2], words[1::2]):
        if flag != "--config":
            assert flag in settings and not settings[flag].is_flag, f"{name}: {flag}"
            settings[flag].parse(value)


DIRECTORY_BASES = {"StateDirectory": "/var/lib", "RuntimeDirectory": "/run",
                   "LogsDirectory": "/var/log", "CacheDirectory": "/var/cache",
                   "ConfigurationDirectory": "/etc"}


def directories(name: str) -> set[Path]:
    unit = service(name)
    return {Path(base, d) for key, base in DIRECTORY_BASES.items()
            for d in unit.get(key, "").split()}


def test_units_of_different_users_share_no_directory():
    """systemd chowns a unit's directories to the unit's user, recursively, at every start and
    reload: root's ingerod holding /var/log/ingero took echod's audit log from user ingero
    (seen under a booted systemd), so no directory of one may be or hold another user's."""
    for one, other in itertools.permutations(NAMES, 2):
        if service(one).get("User", "root") == service(other).get("User", "root"):
            continue
        for mine, theirs in itertools.product(directories(one), directories(other)):
            assert mine != theirs and mine not in theirs.parents, (one, mine, other, theirs)


def capabilities(name: str) -> str:
    caps = service(name)["CapabilityBoundingSet"].split()
    return "-all," + ",".join("+" + c.removeprefix("CAP_").lower() for c in caps)


# Whether a uprobe may be made with a bounding set: perf_event_open(2) on the uprobe PMU, as bcc
# does first. Linux 6.16 (and the stable kernels with the fix) want CAP_SYS_ADMIN for it again.
UPROBE_PMU_PROBE = """
import ctypes, sys
attr = ctypes.create_string_buffer(128)                        # struct perf_event_attr
path = ctypes.create_string_buffer(b"/bin/true")
pmu = int(open("/sys/bus/event_source/devices/uprobe/type").read())
for offset, value, size in ((0, pmu, 4), (4, 128, 4), (56, ctypes.addressof(path), 8)):
    attr[offset:offset + size] = value.to_bytes(size, "little")   # type, size, uprobe_path
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.syscall(298, attr, 0, -1, -1, 0)                     # x86-64 perf_event_open
sys.exit(0 if fd >= 0 else ctypes.get_errno())
"""


def may_make_uprobes(caps: str) -> bool:
    done = subprocess.run(["setpriv", f"--bounding-set={caps}", "--", sys.executable, "-c",
                           UPROBE_PMU_PROBE], capture_output=True, text=True, timeout=60)
    assert done.returncode in (0, errno.EACCES, errno.EPERM), done.stderr
    return done.returncode == 0


def without(caps: str, dropped: tuple[str, ...]) -> str:
    for cap in dropped:
        caps = caps.replace(",+" + cap.removeprefix("CAP_").lower(), "")
    return caps


@needs_ebpf
@pytest.mark.parametrize("dropped", [(), ("CAP_SYS_ADMIN",), ("CAP_BPF", "CAP_SYS_ADMIN")],
                         ids=["unit", "no-sys-admin", "no-bpf"])
def test_ingerods_capabilities_are_enough_to_trace_another_users_job(dropped):
    """`ingerod trace` under exactly the unit's bounding set (setpriv, as systemd would apply
    it) traces a sim rank run by `nobody`, tagged with its job from its environment. The
    libraries sit as deep as in a venv's site-packages. As uprobe_multi links (Linux 6.6 on,
    as here) the probes need CAP_BPF and CAP_PERFMON only, and the unit without CAP_SYS_ADMIN
    traces as well; as perf events (older kernels) bcc's fallback through tracefs cannot name
    uprobes on such paths (64 characters at most), so on a kernel that keeps perf-event uprobes
    for CAP_SYS_ADMIN the unit without it traces no NCCL or CUDA call. Without CAP_BPF (and
    CAP_SYS_ADMIN, which implies it) nothing loads at all, which shows the check can fail."""
    import sim

    tmp_path = Path(tempfile.mkdtemp(prefix="ingero-caps-"))   # nobody must reach it
    tmp_path.chmod(0o755)
    site = tmp_path / "venv/lib/python3.11/site-packages/nvidia"
    for part in ("bin", "lib"):
        shutil.copytree(sim.build_dir() / part, site / part)
    work = tmp_path / "work"
    work.mkdir()
    shutil.chown(work, "nobody")
    rank = subprocess.Popen(
        ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
         str(site / "bin/ingero-sim-rank"), "--steps", "30000", "--step-ms", "20",
         "--record", str(work / "rank.jsonl"), "--unique-id-file", str(work / "id")],
        env={"RANK": "0", "WORLD_SIZE": "1", "SLURM_JOB_ID": "77", "PATH": os.environ["PATH"]},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:            # the rank runs until the trace is done (killed then)
        time.sleep(0.5)
        caps = without(capabilities("ingerod.service"), dropped)
        libraries = sim.traced_libraries(directory=site / "lib")
        done = subprocess.run(
            ["setpriv", f"--bounding-set={caps}", "--", sys.executable, "-m", "ingerod",
             "trace", "--json", "--duration", "4", "-p", str(rank.pid), "--libraries",
             libraries], capture_output=True, text=True, timeout=240)
    finally:
        rank.kill()
        rank.wait()
        shutil.rmtree(tmp_path)
    events = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if "CAP_BPF" in dropped:
        assert done.returncode != 0 and not events, done.stdout[-2000:]
        return
    assert done.returncode == 0, done.stderr[-3000:]
    kinds = {e["kind"] for e in map(json.loads, events)
             if e["attrs"].get("job") == "77"}
    as_links = "uprobes as perf events" not in done.stderr
    if dropped and not as_links and not may_make_uprobes(caps):
        assert not kinds & {"collective", "sync"}, done.stderr[-3000:]
    else:
        assert {"collective", "sync"} <= kinds, done.stderr[-3000:]
