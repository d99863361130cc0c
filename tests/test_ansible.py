"""The Ansible roles (ansible/): lint, syntax, a check-mode run, a real run on this machine into a
temporary root, and a second real run that changes nothing; then a compute node added with
--limit, a second head node added (a fleetd shard with a key pair of its own, localhost's agent
pushing to both) while that compute node leaves the inventory (and is taken out of fleetd), a
third head node with a fleetd key pair made before the roles ran (kept), the compute node
revoked by name, and a check-mode run that finds nothing to change.

localhost is both the head and a compute node; newnode, head2 and head3 are this machine again,
under roots of their own, and so is slurmctl, the controller of newnode's configless Slurm: it
holds the slurm.conf newnode's run changes. The package is the wheel the roles build from a
snapshot of the checkout. Every path the roles write to points into a temporary root; the
daemons' user is the existing nobody:nogroup, so no account is made; the Debian packages are
already installed, so apt only confirms them. There is no systemd here (PID 1 is something else):
the roles must skip every unit action and handler cleanly. The runs go on beside the tests that
trace nothing, from the suite's start; the tests that read them run last.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
import zmq
import zmq.auth

from ingero import curve
from ingero.cli_common import load_settings

from .support import Beside

# Each run of ansible-playbook has a budget of its own: one takes 40-100 s on an idle 2-core
# machine (some 90 tasks at about 0.3-0.5 s each, most of it the module's Python compiling
# ansible's module_utils, and pip's installs). The runs are grouped in stages (BESIDE below), so
# a stage that fails fails the tests that read it or a later one, not the rest.
PLAYBOOK_TIMEOUT_S = 600
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300, func_only=True)]

ROOT = Path(__file__).resolve().parent.parent
ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent
DAEMON_USER, DAEMON_GROUP = "nobody", "nogroup"
RECAP = re.compile(r"^(?P<host>\S+)\s+:\s+(?P<counts>(?:\w+=\d+\s*)+)$", re.MULTILINE)
# Directories a Debian host has before the roles run; the roles create everything else.
SKELETON = ("etc/default", "etc/systemd/system", "usr/local/share/man", "etc/slurm",
            "etc/logrotate.d")
# A site's slurm.conf with a prolog of its own (a node health check), which must keep running.
SLURM_CONF = "ClusterName=test\nSlurmctldHost=localhost\nPrologFlags=Contain\nProlog={nhc}\n"


def tool(name: str) -> str:
    """A program of the test environment (ansible-core and ansible-lint are test extras)."""
    program = BIN / name
    if not program.exists():
        pytest.fail(f"{program} is missing: install the test extras (pip install -e .[test])")
    return str(program)


def tool_env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}", ANSIBLE_NOCOLOR="1",
               ANSIBLE_HOME=str(tmp / "ansible-home"), ANSIBLE_RETRY_FILES_ENABLED="0")
    return env


def recap(output: str, host: str = "localhost") -> dict[str, int]:
    """The PLAY RECAP counts of a host (ok, changed, failed, skipped, ...)."""
    found = [m for m in RECAP.finditer(output) if m.group("host") == host]
    assert found, f"no PLAY RECAP for {host} in:\n{output[-3000:]}"
    return {key: int(value) for key, value in
            (pair.split("=") for pair in found[-1].group("counts").split())}


def snapshot(tmp: Path) -> Path:
    """What the roles and the wheel are made from, copied once: the runs see the same files
    however the checkout changes meanwhile, and the checkout gains no build/."""
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md", "constraints.txt"):
        shutil.copy(ROOT / name, source / name)
    skip = shutil.ignore_patterns("__pycache__", "build", "*.o", "*.so", "*.egg-info")
    for directory in ("ingero", "ingerod", "fleetd", "echod", "sim", "systemd", "man", "slurm",
                      "logrotate"):
        shutil.copytree(ROOT / directory, source / directory, ignore=skip, symlinks=True)
    return source


def host_root(root: Path) -> dict:
    """The path variables of a host whose files all go under root."""
    return {"ingero_common_etc_dir": str(root / "etc/ingero"),
            "ingero_common_systemd_dir": str(root / "etc/systemd/system"),
            "ingero_common_default_dir": str(root / "etc/default"),
            "ingero_compute_slurm_hooks_dir": str(root / "etc/slurm/ingero"),
            "ingero_compute_slurm_conf": str(root / "etc/slurm/slurm.conf")}


def inventory(tmp: Path, root: Path, source: Path, name: str = "inventory.yml",
              heads=("localhost",), computes=("localhost", "newnode"),
              fleet: str | None = None) -> Path:
    """``fleet``: the agents' fleetd endpoints, one per head node (default: the first's)."""
    settings = {
        "ingero_common_source_dir": str(source),
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ingero_common_wheel_dir": str(tmp / "dist"),      # the package: the roles' own build
        "ingero_common_user": DAEMON_USER,
        "ingero_common_group": DAEMON_GROUP,
        "ingero_common_home": "/nonexistent",        # nobody's own, so the user is left as is
        "ingero_common_apt_update_cache": False,
        "ingero_common_venv": str(root / "opt/ingero/venv"),
        **host_root(root),
        "ingero_common_man_dir": str(root / "usr/local/share/man"),
        "ingero_common_keys_fetch_dir": str(tmp / "fetched-keys"),
        "ingero_compute_slurm_manage_conf": True,
        "ingero_compute_slurm_reconfigure": False,       # no slurmctld reads this slurm.conf
        "ingero_head_echod_tls_selfsigned": True,
        "ingero_head_logrotate_dir": str(root / "etc/logrotate.d"),
        "ingero_compute_ingerod_cpus": "0-1",
        **({"ingero_compute_fleet_endpoint": fleet} if fleet else {}),
    }
    hosts = {
        "localhost": None,
        # a compute node added later (--limit newnode): this machine again, under a root of its
        # own, sharing the venv; its Slurm is configless, slurm.conf on slurmctl
        "newnode": {**host_root(tmp / "newnode"), "ingero_compute_slurm_conf_host": "slurmctl"},
        # a second head node (a second fleetd shard) added later, with a venv of its own
        "head2": {**host_root(tmp / "head2"),
                  "ingero_common_venv": str(tmp / "head2/opt/ingero/venv"),
                  "ingero_common_man_dir": str(tmp / "head2/usr/local/share/man"),
                  "ingero_head_logrotate_dir": str(tmp / "head2/etc/logrotate.d")},
        # a third, with a fleetd key pair of its own, sharing head2's venv
        "head3": {**host_root(tmp / "head3"),
                  "ingero_common_venv": str(tmp / "head2/opt/ingero/venv"),
                  "ingero_common_man_dir": str(tmp / "head3/usr/local/share/man"),
                  "ingero_head_logrotate_dir": str(tmp / "head3/etc/logrotate.d")},
    }
    document = {"all": {"vars": settings, "hosts": {"slurmctl": host_root(tmp / "slurmctl")},
                        "children": {
        "head": {"hosts": {h: hosts[h] for h in heads}},
        "compute": {"hosts": {h: hosts[h] for h in computes}}}}}
    path = tmp / name
    # in this order: the head nodes in shard order
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


class Site:
    """One fresh temporary root the stages of the deployment run on, in order, each run of
    ansible-playbook with a budget of its own (``PLAYBOOK_TIMEOUT_S``); what each stage saw
    is kept on it for the tests (the runs by name, and snapshots taken between them)."""

    def __init__(self, tmp: Path):
        self.tmp, self.root = tmp, tmp / "root"
        self.etc = self.root / "etc/ingero"
        for directory in SKELETON:
            (self.root / directory).mkdir(parents=True)
        (self.root / "etc/slurm/slurm.conf").write_text(
            SLURM_CONF.format(nhc=self.root / "etc/slurm/nhc"))
        self.source = snapshot(tmp)
        self.hosts = inventory(tmp, self.root, self.source)
        self.runs: dict[str, subprocess.CompletedProcess] = {}
        self.timings: dict[str, float] = {}
        self.env = tool_env(tmp)         # as the session began: tests change os.environ
        self.running: subprocess.Popen | None = None

    def cancel(self) -> None:
        if self.running is not None and self.running.returncode is None:
            self.running.kill()

    def __getattr__(self, name: str) -> subprocess.CompletedProcess:
        """A run by its name (``site.first``), once its stage ran."""
        try:
            return self.__dict__["runs"][name]
        except KeyError:
            raise AttributeError(name) from None

    def playbook(self, name: str, *flags: str, inventory_file: Path | None = None
                 ) -> subprocess.CompletedProcess:
        began = time.monotonic()
        argv = [tool("ansible-playbook"), "-i", str(inventory_file or self.hosts),
                str(ANSIBLE / "site.yml"), "--diff", *flags]
        with subprocess.Popen(argv, cwd=self.tmp, env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as self.running:
            try:
                stdout, stderr = self.running.communicate(timeout=PLAYBOOK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.running.kill()
                raise
        done = subprocess.CompletedProcess(argv, self.running.returncode, stdout, stderr)
        self.timings[f"{name} ({' '.join(flags)})"] = time.monotonic() - began
        self.runs[name] = done
        assert done.returncode == 0, "\n".join([f"ansible-playbook {flags} failed:",
                                                *_failed_tasks(done.stdout),
                                                done.stdout[-6000:], done.stderr[-3000:]])
        return done


def deploy(site: Site) -> None:
    """Check mode on the fresh root, then two real runs of localhost (head and compute)."""
    site.playbook("check", "--check", "--limit", "localhost")
    site.after_check = sorted(str(p.relative_to(site.root)) for p in site.root.rglob("*"))
    site.fetched_after_check = (site.tmp / "fetched-keys").exists()
    site.playbook("first", "--limit", "localhost")
    site.playbook("second", "--limit", "localhost")


def add_newnode(site: Site) -> None:
    """A compute node added with --limit newnode: this machine again under a root of its own,
    its Slurm configless (slurm.conf on slurmctl, an upgrade from hooks named in slurm.conf
    itself, and a site epilog with a comment)."""
    for directory in SKELETON:
        (site.tmp / "newnode" / directory).mkdir(parents=True)
    (site.tmp / "slurmctl/etc/slurm").mkdir(parents=True)
    (site.tmp / "slurmctl/etc/slurm/slurm.conf").write_text(
        SLURM_CONF.format(nhc=site.tmp / "newnode/etc/slurm/ingero/prolog")
        + "Epilog=/bin/true  # the site's cleanup\n")
    site.before_newnode = tree(site.root)
    site.playbook("newnode", "--limit", "newnode")
    site.after_newnode = tree(site.root)
    site.authorized_after_newnode = site.tmp / "authorized-after-newnode"
    shutil.copytree(site.etc / "authorized_agents", site.authorized_after_newnode)


def add_head2(site: Site) -> None:
    """head2 joins the head nodes, a second shard localhost's agent pushes to, with a venv
    that held the same version without the head extra; the package is a new build of the
    same version (the checkout changed, its version number did not); newnode leaves the
    inventory."""
    site.head2_host = prepare_head2(site.tmp, site.timings)
    with open(site.source / "ingero/shards.py", "a") as shards:
        shards.write("# a later build of the same version\n")
    site.playbook("add_head2", "--limit", "localhost,head2", inventory_file=inventory(
        site.tmp, site.root, site.source, "inventory-head2.yml", heads=("localhost", "head2"),
        computes=("localhost",), fleet="tcp://localhost:7470,tcp://head2:7470"))
    site.agent_with_head2 = yaml.safe_load((site.etc / "ingerod.yaml").read_text())
    site.authorized_after_head2 = {
        host: sorted(p.name for p in (top / "etc/ingero/authorized_agents").iterdir())
        for host, top in (("localhost", site.root), ("head2", site.tmp / "head2"))}


def add_head3(site: Site) -> None:
    """head3 comes with a fleetd key pair made before the roles ran: it keeps it."""
    keys = site.tmp / "head3/etc/ingero/keys"
    for directory in (*SKELETON, "etc/ingero/keys"):
        (site.tmp / "head3" / directory).mkdir(parents=True)
    zmq.auth.create_certificates(str(keys), "fleetd")
    site.head3_pair = {name: (keys / name).read_bytes()
                       for name in ("fleetd.key", "fleetd.key_secret")}
    site.playbook("add_head3", "--limit", "head3", inventory_file=inventory(
        site.tmp, site.root, site.source, "inventory-head3.yml",
        heads=("localhost", "head2", "head3"), computes=("localhost",)))


def revoke(site: Site) -> None:
    """newnode back in the inventory, admitted as its own run left it, then revoked by name;
    then a check-mode run of every host."""
    shutil.copy(site.tmp / "newnode/etc/ingero/keys/ingerod.key",
                site.etc / "authorized_agents/newnode.key")
    revoked = ("-e", '{"ingero_common_revoked_agents": ["newnode"]}')
    site.playbook("revoke", *revoked, "--limit", "localhost")
    site.playbook("recheck", *revoked, "--check")


def new_site() -> Site:
    # Not under pytest's 0700 basetemp: the daemons' user must reach the files under it.
    tmp = Path(tempfile.mkdtemp(prefix="ingero-ansible-"))
    tmp.chmod(0o755)
    return Site(tmp)


# The eight runs take some 8 minutes of one core, and wait on nothing the other tests do: they
# run beside the tests that trace nothing (conftest starts them once the tests are collected,
# holds the first test that traces until they are done, and runs the tests that read them
# last).
BESIDE = Beside("ansible", new_site, [deploy, add_newnode, add_head2, add_head3, revoke],
                fixture="stages", cancel=lambda site: site.cancel())


@pytest.fixture(scope="module")
def stages():
    BESIDE.start()                       # already started, unless this module runs alone
    yield BESIDE
    BESIDE.finish()
    if BESIDE.subject is not None:
        print("\nansible timings (s): " + ", ".join(
            f"{k} {v:.1f}" for k, v in BESIDE.subject.timings.items()))
        shutil.rmtree(BESIDE.subject.tmp, ignore_errors=True)


def after(stage, name: str):
    """A module fixture: the site once ``stage`` has run."""
    def fixture(stages):
        return stages.wait(stage)
    return pytest.fixture(fixture, scope="module", name=name)


deployment = after(deploy, "deployment")
newnode = after(add_newnode, "newnode")
head2 = after(add_head2, "head2")
head3 = after(add_head3, "head3")
revoked = after(revoke, "revoked")


def prepare_head2(tmp: Path, timings: dict) -> SimpleNamespace:
    """head2's root, and a venv holding the wheel the roles built, without the head extra: a
    host where the same version was installed for a compute node."""
    began = time.monotonic()
    for directory in SKELETON:
        (tmp / "head2" / directory).mkdir(parents=True)
    venv = tmp / "head2/opt/ingero/venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    wheel = next((tmp / "dist").glob("ingero-*.whl"))
    subprocess.run([str(venv / "bin/pip"), "install", "-q", str(wheel)], check=True,
                   capture_output=True, timeout=PLAYBOOK_TIMEOUT_S)
    had_flask = flask_imports(venv)
    timings["head2's venv"] = time.monotonic() - began
    return SimpleNamespace(root=tmp / "head2", etc=tmp / "head2/etc/ingero", venv=venv,
                           had_flask=had_flask)


def flask_imports(venv: Path) -> bool:
    """Whether the venv has echod's web framework (from ingero's head extra)."""
    return subprocess.run([str(venv / "bin/python"), "-c", "import flask"], capture_output=True,
                          cwd="/").returncode == 0


def tree(root: Path) -> dict[str, bytes | str]:
    """Every file under root with its content (a link: where it points), Python's byte-code
    caches left out."""
    return {str(p.relative_to(root)): os.readlink(p) if p.is_symlink() else p.read_bytes()
            for p in root.rglob("*")
            if (p.is_symlink() or p.is_file()) and "__pycache__" not in p.parts}


def test_lint_passes_the_production_profile(tmp_path):
    """ansible-lint, offline, with the configuration in ansible/.ansible-lint."""
    done = subprocess.run([tool("ansible-lint"), "--profile", "production", "--offline",
                           "--nocolor"], cwd=ANSIBLE, env=tool_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Profile 'production' was required, and it passed" in done.stdout + done.stderr


def test_syntax_check_of_site_and_example_inventory(tmp_path):
    done = subprocess.run([tool("ansible-playbook"), "--syntax-check", "-i",
                           str(ANSIBLE / "inventory/example.yml"), str(ANSIBLE / "site.yml")],
                          cwd=tmp_path, env=tool_env(tmp_path), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_check_mode_succeeds_and_writes_nothing(deployment):
    counts = recap(deployment.check.stdout)
    assert counts["failed"] == 0 and counts["changed"] > 10, counts
    # Only the skeleton that the test made: check mode created nothing.
    skeleton = sorted({str(Path(d)) for s in SKELETON for d in _parents(s)} |
                      {"etc/slurm/slurm.conf"})
    assert deployment.after_check == skeleton
    assert not deployment.fetched_after_check


def _parents(relative: str):
    path = Path(relative)
    return [path, *[p for p in path.parents if str(p) != "."]]


def runs(site: Site) -> list[subprocess.CompletedProcess]:
    """Every run of the deployment, once its last stage ran."""
    return [site.check, site.first, site.second, site.newnode, site.add_head2, site.add_head3,
            site.revoke, site.recheck]


def test_runs_give_no_warnings(revoked):
    for run in runs(revoked):
        output = run.stdout + run.stderr
        assert "[WARNING]" not in output and "[DEPRECATION WARNING]" not in output, \
            "\n".join(line for line in output.splitlines() if "WARNING" in line)


def test_second_run_changes_nothing(deployment):
    first, second = recap(deployment.first.stdout), recap(deployment.second.stdout)
    assert first["changed"] > 20 and first["failed"] == 0, first
    assert second["changed"] == 0 and second["failed"] == 0, \
        f"{second}\n" + "\n".join(_changed_tasks(deployment.second.stdout))
    # pip had nothing to do, said pip's dry run, so it did not run
    for task in ("Replace the ingero package with the new build",
                 "Install the ingero package and what it needs into its venv"):
        assert "skipping: [localhost]" in _block(deployment.second.stdout, task), task


def _block(output: str, name: str) -> str:
    """What a task or handler printed, up to the next one."""
    return output.split(name, 1)[1].split("\nTASK", 1)[0].split("\nRUNNING", 1)[0]


def _changed_task_names(output: str, host: str) -> set[str]:
    """The tasks and handlers that changed something on host itself (not delegated from it)."""
    return {re.sub(r"^(TASK|RUNNING HANDLER) \[(.*)\] \**$", r"\2", line.split(": changed:")[0])
            for line in _changed_tasks(output) if f"changed: [{host}]" in line}


def _failed_tasks(output: str) -> list[str]:
    task, failed = None, []
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line
        elif line.startswith(("fatal:", "failed:")):
            failed.append(f"{task}: {line[:3000]}")
    return failed


def _changed_tasks(output: str) -> list[str]:
    task, changed = None, []
    for line in output.splitlines():
        if line.startswith(("TASK [", "RUNNING HANDLER [")):
            task = line
        elif line.startswith("changed:"):
            changed.append(f"{task}: {line}")
    return changed


def test_no_unit_action_without_systemd(deployment):
    """PID 1 is not systemd here: every handler and unit task is skipped, none fails."""
    output = deployment.first.stdout
    for name in ("Enable and start fleetd and echod", "Enable and start the node-wide ingerod",
                 "RUNNING HANDLER [ingero_head : Restart echod]",
                 "RUNNING HANDLER [ingero_compute : Restart ingerod]"):
        block = _block(output, name)
        assert "skipping: [localhost]" in block and "changed:" not in block, (name, block)


MODES = {
    # path under the root: (mode, owner, group)
    "etc/ingero": (0o755, "root", "root"),
    "etc/ingero/keys": (0o750, "root", DAEMON_GROUP),
    "etc/ingero/keys/ingerod.key_secret": (0o600, "root", "root"),
    "etc/ingero/keys/ingerod.key": (0o644, "root", "root"),
    "etc/ingero/keys/fleetd.key_secret": (0o640, "root", DAEMON_GROUP),
    "etc/ingero/keys/fleetd.key": (0o644, "root", DAEMON_GROUP),
    "etc/ingero/keys/fleetd-localhost.key": (0o644, "root", DAEMON_GROUP),
    "etc/ingero/keys/echod.key_secret": (0o640, "root", DAEMON_GROUP),
    "etc/ingero/keys/echod.key": (0o644, "root", DAEMON_GROUP),
    "etc/ingero/authorized_agents/localhost.key": (0o644, "root", DAEMON_GROUP),
    "etc/ingero/authorized_fleetd/fleetd.key": (0o644, "root", DAEMON_GROUP),
    "etc/ingero/tls/echod.crt": (0o644, "root", DAEMON_GROUP),
    "etc/ingero/tls/echod.key": (0o640, "root", DAEMON_GROUP),
    "etc/ingero/echod-tokens.yaml": (0o640, "root", DAEMON_GROUP),
    "etc/ingero/fleetd.yaml": (0o640, "root", DAEMON_GROUP),
    "etc/ingero/echod.yaml": (0o640, "root", DAEMON_GROUP),
    "etc/ingero/ingerod.yaml": (0o644, "root", "root"),
    "etc/ingero/ingero.yaml": (0o644, "root", "root"),
    "etc/ingero/ingero-cli.token": (0o640, "root", "root"),
    "etc/default/ingerod": (0o644, "root", "root"),
    "etc/default/ingero-slurm": (0o644, "root", "root"),
    "etc/default/fleetd": (0o640, "root", "root"),
    "etc/default/echod": (0o640, "root", "root"),
    "etc/slurm/ingero/prolog": (0o755, "root", "root"),
    "etc/logrotate.d/ingero": (0o644, "root", "root"),
    "etc/systemd/system/ingerod.service.d/cpus.conf": (0o644, "root", "root"),
    "etc/systemd/system/ingerod@.service.d/cpus.conf": (0o644, "root", "root"),
    "etc/slurm/ingero/epilog": (0o755, "root", "root"),
    "etc/systemd/system/ingerod.service": (0o644, "root", "root"),
    "etc/systemd/system/ingerod@.service": (0o644, "root", "root"),
    "etc/systemd/system/fleetd.service": (0o644, "root", "root"),
    "etc/systemd/system/echod.service": (0o644, "root", "root"),
    "usr/local/share/man/man1/ingero.1": (0o644, "root", "root"),
    "usr/local/share/man/man8/ingerod.8": (0o644, "root", "root"),
    "usr/local/share/man/man5/ingero.yaml.5": (0o644, "root", "root"),
}


@pytest.mark.parametrize("relative", sorted(MODES))
def test_files_land_in_the_root_with_their_modes(deployment, relative):
    info = (deployment.root / relative).lstat()
    mode, owner, group = MODES[relative]
    assert stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)
    assert (stat.S_IMODE(info.st_mode), pwd.getpwuid(info.st_uid).pw_name,
            grp.getgrgid(info.st_gid).gr_name) == (mode, owner, group)


def test_copies_come_from_the_repository(deployment):
    root, source = deployment.root, deployment.source
    for hook in ("prolog", "epilog"):
        installed = root / "etc/slurm/ingero" / hook
        assert installed.read_bytes() == (source / "slurm" / hook).read_bytes()
        assert not installed.is_symlink()
    pages = sorted((source / "man").glob("*.[1-8]"))
    assert pages
    for page in pages:
        installed = root / f"usr/local/share/man/man{page.suffix[1:]}" / page.name
        assert installed.read_bytes() == page.read_bytes()
    for unit in ("ingerod.service", "ingerod@.service", "fleetd.service", "echod.service"):
        packaged = (source / "systemd" / unit).read_text()
        installed = (root / "etc/systemd/system" / unit).read_text()
        # The same unit, its paths moved into the temporary root.
        assert installed == packaged.replace("/opt/ingero/venv", str(root / "opt/ingero/venv")) \
            .replace("/etc/ingero", str(root / "etc/ingero")) \
            .replace("/etc/default/", str(root / "etc/default") + "/")
        assert f"{root}/opt/ingero/venv/bin/" in installed


def test_slurm_files(deployment):
    """ingero's hooks are drop-ins beside the site's: the site's Prolog= program (its node
    health check) still runs, as prolog.d's first; slurm.conf was changed once (the second run
    changes nothing, test_second_run_changes_nothing)."""
    root = deployment.root
    slurm = root / "etc/slurm"
    conf = (slurm / "slurm.conf").read_text().splitlines()
    assert f"Prolog={slurm}/prolog.d/*" in conf and f"Epilog={slurm}/epilog.d/*" in conf
    assert [line for line in conf if line.lower().startswith(("prolog=", "epilog="))] == [
        f"Prolog={slurm}/prolog.d/*", f"Epilog={slurm}/epilog.d/*"], conf
    for hook in ("prolog", "epilog"):
        assert os.readlink(slurm / f"{hook}.d/50-ingero") == f"{slurm}/ingero/{hook}"
    assert os.readlink(slurm / "prolog.d/00-site") == f"{slurm}/nhc"
    assert sorted(p.name for p in (slurm / "prolog.d").iterdir()) == ["00-site", "50-ingero"]
    assert sorted(p.name for p in (slurm / "epilog.d").iterdir()) == ["50-ingero"]
    flags = [line for line in conf if line.startswith("PrologFlags")]
    assert flags == ["PrologFlags=Contain,Alloc"]
    defaults = (root / "etc/default/ingero-slurm").read_text()
    assert f"INGERO_PYTHON={root}/opt/ingero/venv/bin/python\n" in defaults
    # The hooks source this file with sh: it must parse.
    subprocess.run(["sh", "-n", str(root / "etc/default/ingero-slurm")], check=True)


def test_the_venv_holds_the_wheel_and_sees_debian_bcc(deployment):
    python = deployment.root / "opt/ingero/venv/bin/python"
    # program_text() reads the BPF sources the agent compiles: the wheel must carry them.
    done = subprocess.run([str(python), "-c", "import ingero, echod.cli, bcc; "
                           "from ingerod.probes import program_text; assert program_text(); "
                           "print(ingero.__file__, bcc.__file__)"],
                          cwd=deployment.tmp, capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert done.returncode == 0, done.stderr
    venv_file, bcc_file = done.stdout.split()
    assert venv_file.startswith(str(deployment.root / "opt/ingero/venv/"))
    assert bcc_file.startswith("/usr/lib/python3/dist-packages/")


def test_configs_load_with_the_daemons_settings(deployment):
    from echod import config as echod_config
    from fleetd import config as fleetd_config
    from ingero.command import client
    from ingerod import config as ingerod_config
    etc = deployment.etc
    agent = load_settings(ingerod_config.SETTINGS, "INGEROD", str(etc / "ingerod.yaml"),
                          ingerod_config.DEFAULT_CONFIG, {})
    fleet = load_settings(fleetd_config.SETTINGS, "FLEETD", str(etc / "fleetd.yaml"),
                          fleetd_config.DEFAULT_CONFIG, {})
    store = load_settings(echod_config.SETTINGS, "ECHOD", str(etc / "echod.yaml"),
                          echod_config.DEFAULT_CONFIG, {})
    cli = client.settings(str(etc / "ingero.yaml"), {})
    assert agent.fleet == ["tcp://localhost:7470"]
    # the name its key is authorised under on the head: fleetd takes its pushes as that node
    assert agent.node == "localhost" and (etc / "authorized_agents/localhost.key").exists()
    assert agent.secret_key == etc / "keys/ingerod.key_secret"
    assert fleet.authorized_keys == etc / "authorized_agents"
    assert fleet.echod == store.ingest_bind == "tcp://127.0.0.1:7471"
    assert store.dsn is None                       # echod's embedded PostgreSQL
    assert (store.tls_cert, store.tls_key) == (etc / "tls/echod.crt", etc / "tls/echod.key")
    assert (cli.url, cli.token_file, cli.ca_cert) == \
        ("https://localhost:7472", etc / "ingero-cli.token", etc / "tls/echod.crt")


def curve_admits(authorized: Path, fleetd_secret: Path, agent_secret: Path,
                 fleetd_public: Path) -> int:
    """Over real CURVE, whether fleetd, with the keys under ``authorized`` loaded, takes a
    message from the agent's key pair: the number of keys loaded, or 0 when refused."""
    context = zmq.Context()
    authenticator = curve.FleetAuthenticator(context)
    authenticator.start()
    try:
        loaded = authenticator.load(authorized)
        server = context.socket(zmq.ROUTER)
        curve.serve_curve(server, curve.load_keypair(fleetd_secret))
        port = server.bind_to_random_port("tcp://127.0.0.1")
        agent = context.socket(zmq.DEALER)
        curve.connect_curve(agent, curve.load_keypair(agent_secret),
                            curve.load_public(fleetd_public))
        agent.connect(f"tcp://127.0.0.1:{port}")
        agent.send(b"hello")
        took = server.poll(5000) and server.recv_multipart()[-1] == b"hello"
        agent.close(0)
        server.close(0)
        return loaded if took else 0
    finally:
        authenticator.stop()
        context.term()


def test_key_exchange_lets_the_agent_through_fleetd_curve(deployment):
    """The agent's deployed key pair and fleetd's, as the configs name them, over real CURVE."""
    etc = deployment.etc
    assert curve_admits(etc / "authorized_agents", etc / "keys/fleetd.key_secret",
                        etc / "keys/ingerod.key_secret", etc / "keys/fleetd-localhost.key") >= 1, \
        "fleetd's socket refused the deployed agent key"


def test_a_compute_node_added_with_limit_is_admitted_by_fleetd_and_nothing_else_changes(
        newnode):
    """--limit newnode runs no head tasks: the new node's own run puts its key among fleetd's
    authorized agents (and would reload fleetd under systemd); nothing else on the head
    changes."""
    etc, new = newnode.etc, newnode.tmp / "newnode/etc/ingero"
    assert recap(newnode.newnode.stdout, "newnode")["failed"] == 0
    assert "localhost" not in {m.group("host") for m in RECAP.finditer(newnode.newnode.stdout)}
    authorized = newnode.authorized_after_newnode      # as the run left it
    assert (authorized / "newnode.key").read_bytes() == (new / "keys/ingerod.key").read_bytes()
    before, after = newnode.before_newnode, newnode.after_newnode
    assert {k for k in set(after) | set(before) if after.get(k) != before.get(k)} == {
        "etc/ingero/authorized_agents/newnode.key"}
    assert curve_admits(authorized, etc / "keys/fleetd.key_secret",
                        new / "keys/ingerod.key_secret", new / "keys/fleetd-localhost.key") == 2, \
        "fleetd's socket refused the new node's key"
    # configless: the controller's slurm.conf was changed, once, and names newnode's drop-ins;
    # newnode has none. It named ingero's hook itself: no second copy of it as the site's
    slurm = newnode.tmp / "newnode/etc/slurm"
    assert not (slurm / "slurm.conf").exists()
    conf = (newnode.tmp / "slurmctl/etc/slurm/slurm.conf").read_text().splitlines()
    assert [line for line in conf if line.lower().startswith(("prolog", "epilog"))] == [
        "PrologFlags=Contain,Alloc", f"Prolog={slurm}/prolog.d/*", f"Epilog={slurm}/epilog.d/*"]
    assert sorted(p.name for p in (slurm / "prolog.d").iterdir()) == ["50-ingero"]
    assert os.readlink(slurm / "epilog.d/00-site") == "/bin/true"
    changed = [m.group(0) for m in re.finditer(r"^changed: \[newnode -> slurmctl\].*$",
                                               newnode.newnode.stdout, re.MULTILINE)]
    assert len(changed) == 3, changed      # Prolog, Epilog and PrologFlags, on the controller


def test_the_package_is_the_wheel_built_from_the_checkout(head2):
    """By default the hosts get the controller's build of ingero_common_source_dir, installed by
    path; a later build of the same version replaces it (pip alone would keep it). The build
    leaves the checkout as it was."""
    python = head2.root / "opt/ingero/venv/bin/python"
    done = subprocess.run([str(python), "-c", "import ingero, ingero.shards; "
                           "print(ingero.__version__, ingero.shards.__file__)"],
                          cwd=head2.tmp, capture_output=True, text=True, check=True,
                          env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    version, shards = done.stdout.split()
    source = (head2.source / "ingero/shards.py").read_text()
    assert source.endswith("# a later build of the same version\n")
    assert Path(shards).read_text() == source
    assert "changed: [localhost]" in _block(head2.add_head2.stdout,
                                            "Replace the ingero package with the new build")
    wheels = head2.root / "opt/ingero/wheels"
    assert [p.name for p in wheels.iterdir()] == [f"ingero-{version}-py3-none-any.whl"]
    assert not [p.name for p in head2.source.iterdir()
                if p.name == "build" or p.name.endswith(".egg-info")]


def test_a_head_node_gets_the_head_extra_where_the_same_version_lacks_it(head2):
    """head2's venv held the same version of ingero without the head extra (as a compute node
    has it): the run added echod's dependencies."""
    assert not head2.head2_host.had_flask
    assert "changed: [head2]" in _block(head2.add_head2.stdout,
                                        "Install the ingero package and what it needs")
    assert flask_imports(head2.head2_host.venv)


def test_each_head_node_has_its_own_fleetd_key_pair_and_the_agent_knows_each(head3):
    """head2, a second shard, makes its own fleetd key pair (no secret key leaves its host);
    localhost's agent, pushing to both, installs each one's fetched public key and names them
    in its endpoints' order; each fleetd lets it through over real CURVE with the key it
    names for that endpoint."""
    etc, etc2 = head3.etc, head3.head2_host.etc
    assert (etc2 / "keys/fleetd.key_secret").read_bytes() != \
        (etc / "keys/fleetd.key_secret").read_bytes()
    for name, mode in (("fleetd.key", 0o644), ("fleetd.key_secret", 0o640)):
        info = (etc2 / "keys" / name).stat()
        assert (stat.S_IMODE(info.st_mode), pwd.getpwuid(info.st_uid).pw_name,
                grp.getgrgid(info.st_gid).gr_name) == (mode, "root", DAEMON_GROUP), name
    assert (etc2 / "authorized_fleetd/fleetd.key").read_bytes() == \
        (etc2 / "keys/fleetd.key").read_bytes()
    fetched = head3.tmp / "fetched-keys/fleetd"
    assert sorted(p.name for p in fetched.iterdir()) == ["head2.key", "head3.key", "localhost.key"]
    config = head3.agent_with_head2          # as that run left it
    assert config["fleet"] == "tcp://localhost:7470,tcp://head2:7470"
    assert config["fleet_public_key"] == [str(etc / "keys/fleetd-localhost.key"),
                                          str(etc / "keys/fleetd-head2.key")]
    for head, top in (("localhost", etc), ("head2", etc2)):
        installed = etc / f"keys/fleetd-{head}.key"
        assert installed.read_bytes() == (fetched / f"{head}.key").read_bytes() == \
            (top / "keys/fleetd.key").read_bytes()
        assert curve_admits(top / "authorized_agents", top / "keys/fleetd.key_secret",
                            etc / "keys/ingerod.key_secret", installed) >= 1, \
            f"{head}'s fleetd refused the agent"
    # on localhost, the run changed the package (a new build), the agent's keys and endpoints
    # and newnode's admission only
    assert _changed_task_names(head3.add_head2.stdout, "localhost") == {
        "ingero_common : Copy the wheel to the host",
        "ingero_common : Replace the ingero package with the new build",
        "ingero_compute : Write ingerod's configuration",
        "ingero_compute : Install each fleet endpoint's fleetd public key",
        "ingero_head : Remove the keys of revoked agents and of compute nodes no longer in the "
        "inventory"}


def test_a_head_node_keeps_a_fleetd_key_pair_it_had(head3):
    """head3 had a fleetd key pair before the roles ran: it keeps it, and its public key is
    what the compute nodes get."""
    assert recap(head3.add_head3.stdout, "head3")["failed"] == 0
    keys = head3.tmp / "head3/etc/ingero/keys"
    assert {name: (keys / name).read_bytes() for name in head3.head3_pair} == \
        head3.head3_pair
    assert (head3.tmp / "fetched-keys/fleetd/head3.key").read_bytes() == \
        head3.head3_pair["fleetd.key"]


def test_a_node_removed_from_the_inventory_is_taken_out_of_fleetd(head2):
    """newnode left the inventory: the head's run removed its key from fleetd's authorized
    agents and reloads fleetd (test_curve shows a reload cuts its connection off); head2, new,
    did not admit it."""
    assert head2.authorized_after_head2 == {"localhost": ["localhost.key"],
                                                 "head2": ["localhost.key"]}
    output = head2.add_head2.stdout
    assert "changed: [localhost] => (item=newnode)" in _block(
        output, "Remove the keys of revoked agents and of compute nodes no longer in")
    assert "skipping: [localhost]" in _block(output, "HANDLER [ingero_head : Reload fleetd]")


def test_a_node_revoked_by_name_is_refused_by_fleetd_and_stays_so(revoked):
    """ingero_common_revoked_agents: newnode, in the inventory and admitted, is taken out by the
    head's run, and fleetd over real CURVE refuses its key; a check-mode run of every host then
    changes nothing: neither the head nor newnode's own run (which admits it otherwise) puts
    it back, and check mode of a revoked that is in place says so."""
    etc, new = revoked.etc, revoked.tmp / "newnode/etc/ingero"
    assert "changed: [localhost] => (item=newnode)" in _block(
        revoked.revoke.stdout,
        "Remove the keys of revoked agents and of compute nodes no longer in")
    # the only change on the head, which reloads fleetd (skipped here, without systemd); and
    # the agent's endpoints, back to one (this inventory's head group is localhost alone)
    assert _changed_task_names(revoked.revoke.stdout, "localhost") == {
        "ingero_head : Remove the keys of revoked agents and of compute nodes no longer in the "
        "inventory", "ingero_compute : Write ingerod's configuration"}
    assert "skipping: [localhost]" in _block(revoked.revoke.stdout,
                                             "HANDLER [ingero_head : Reload fleetd]")
    assert not (etc / "authorized_agents/newnode.key").exists()
    assert curve_admits(etc / "authorized_agents", etc / "keys/fleetd.key_secret",
                        new / "keys/ingerod.key_secret", new / "keys/fleetd-localhost.key") == 0, \
        "fleetd's socket let the revoked node's key through"
    assert curve_admits(etc / "authorized_agents", etc / "keys/fleetd.key_secret",
                        etc / "keys/ingerod.key_secret", etc / "keys/fleetd.key") == 1
    for host in ("localhost", "newnode"):
        counts = recap(revoked.recheck.stdout, host)
        assert counts["changed"] == 0 and counts["failed"] == 0, \
            f"{host} {counts}\n" + "\n".join(_changed_tasks(revoked.recheck.stdout))


def test_token_made_once_stored_hashed_and_never_printed(revoked):
    etc = revoked.etc
    token = (etc / "ingero-cli.token").read_text().strip()
    assert len(token) >= 32
    tokens = yaml.safe_load((etc / "echod-tokens.yaml").read_text())["tokens"]
    assert [(t["name"], t["sha256"]) for t in tokens] == \
        [("ingero-cli", hashlib.sha256(token.encode()).hexdigest())]
    for run in runs(revoked):
        assert token not in run.stdout + run.stderr
    secret = (etc / "keys/fleetd.key_secret").read_text()
    secret_line = next(line for line in secret.splitlines() if "secret-key" in line)
    for run in runs(revoked):
        assert secret_line.split('"')[1] not in run.stdout + run.stderr


def test_daemon_user_reads_its_files_and_nothing_else(deployment):
    """fleetd and echod run as the daemons' user: their secrets must open for it, the agent's
    secret key and the CLI's token must not."""
    etc = deployment.etc
    readable = ["keys/fleetd.key_secret", "keys/echod.key_secret", "tls/echod.key",
                "echod-tokens.yaml", "fleetd.yaml", "echod.yaml", "authorized_agents/localhost.key",
                "authorized_fleetd/fleetd.key"]
    unreadable = ["keys/ingerod.key_secret", "ingero-cli.token"]
    for relative, expected in [(r, 0) for r in readable] + [(r, 1) for r in unreadable]:
        done = subprocess.run(["cat", str(etc / relative)], user=DAEMON_USER,
                              group=DAEMON_GROUP, extra_groups=[], capture_output=True)
        assert done.returncode == expected, (relative, done.stderr)


@pytest.mark.parametrize("role", ["ingero_common", "ingero_compute", "ingero_head"])
def test_argument_specs_document_every_default(role):
    """meta/argument_specs.yml and defaults/main.yml name the same variables, with the same
    defaults, each with a type and a description."""
    path = ANSIBLE / "roles" / role
    defaults = yaml.safe_load((path / "defaults/main.yml").read_text())
    options = yaml.safe_load((path / "meta/argument_specs.yml").read_text()) \
        ["argument_specs"]["main"]["options"]
    assert sorted(options) == sorted(defaults)
    for name, option in options.items():
        assert name.startswith(role + "_")
        assert option["default"] == defaults[name], name
        assert option.get("type") and option.get("description"), name


def test_ingerod_keeps_to_the_cpus_set_aside_for_daemons(deployment):
    for unit in ("ingerod.service", "ingerod@.service"):
        text = (deployment.root / f"etc/systemd/system/{unit}.d/cpus.conf").read_text()
        assert "[Service]\nAllowedCPUs=0-1\n" in text


def test_the_audit_logs_logrotate_file_names_the_daemons_user_and_parses(deployment):
    path = deployment.root / "etc/logrotate.d/ingero"
    text = path.read_text()
    assert f"create 0600 {DAEMON_USER} {DAEMON_GROUP}" in text
    assert "/var/log/ingero/echod-audit.jsonl {" in text
    done = subprocess.run(["logrotate", "--debug", "--state", str(deployment.tmp / "lr.state"),
                           str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "error" not in done.stdout + done.stderr, done.stderr
