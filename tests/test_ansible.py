"""The Ansible roles (ansible/): lint, syntax, a check-mode run, a real run on this machine into a
temporary root, and a second real run that changes nothing.

localhost is both the head and a compute node. Every path the roles write to points into the
temporary root; the daemons' user is the existing nobody:nogroup, so no account is made; the
Debian packages are already installed, so apt only confirms them. There is no systemd here
(PID 1 is something else): the roles must skip every unit action and handler cleanly.
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

from ingero import curve
from ingero.cli_common import load_settings

pytestmark = pytest.mark.slow

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
    """What the roles and the wheel are made from, copied once: the three runs see the same
    files however the checkout changes meanwhile, and the checkout gains no build/."""
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md", "constraints.txt"):
        shutil.copy(ROOT / name, source / name)
    skip = shutil.ignore_patterns("__pycache__", "build", "*.o", "*.so", "*.egg-info")
    for directory in ("ingero", "ingerod", "fleetd", "echod", "sim", "systemd", "man", "slurm",
                      "logrotate"):
        shutil.copytree(ROOT / directory, source / directory, ignore=skip, symlinks=True)
    return source


def build_wheel(tmp: Path, source: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp / "dist"), str(source)], check=True)
    return next((tmp / "dist").glob("ingero-*.whl"))


def inventory(tmp: Path, root: Path, source: Path, wheel: Path) -> Path:
    settings = {
        "ingero_common_source_dir": str(source),
        "ansible_connection": "local",
        "ansible_python_interpreter": "/usr/bin/python3",
        "ingero_common_package": str(wheel),
        "ingero_common_user": DAEMON_USER,
        "ingero_common_group": DAEMON_GROUP,
        "ingero_common_home": "/nonexistent",        # nobody's own, so the user is left as is
        "ingero_common_apt_update_cache": False,
        "ingero_common_venv": str(root / "opt/ingero/venv"),
        "ingero_common_etc_dir": str(root / "etc/ingero"),
        "ingero_common_systemd_dir": str(root / "etc/systemd/system"),
        "ingero_common_default_dir": str(root / "etc/default"),
        "ingero_common_man_dir": str(root / "usr/local/share/man"),
        "ingero_common_keys_fetch_dir": str(tmp / "fetched-keys"),
        "ingero_compute_slurm_hooks_dir": str(root / "etc/slurm/ingero"),
        "ingero_compute_slurm_manage_conf": True,
        "ingero_compute_slurm_conf": str(root / "etc/slurm/slurm.conf"),
        "ingero_compute_slurm_reconfigure": False,       # no slurmctld reads this slurm.conf
        "ingero_head_echod_tls_selfsigned": True,
        "ingero_head_logrotate_dir": str(root / "etc/logrotate.d"),
        "ingero_compute_ingerod_cpus": "0-1",
    }
    hosts = {"hosts": {"localhost": None}}
    # a compute node added later (--limit newnode): this machine again, under a root of its own
    new = tmp / "newnode"
    newnode = {"ingero_common_etc_dir": str(new / "etc/ingero"),
               "ingero_common_systemd_dir": str(new / "etc/systemd/system"),
               "ingero_common_default_dir": str(new / "etc/default"),
               "ingero_compute_slurm_hooks_dir": str(new / "etc/slurm/ingero"),
               "ingero_compute_slurm_conf": str(new / "etc/slurm/slurm.conf")}
    document = {"all": {"vars": settings, "children": {
        "head": hosts, "compute": {"hosts": {"localhost": None, "newnode": newnode}}}}}
    path = tmp / "inventory.yml"
    path.write_text(yaml.safe_dump(document))
    return path


@pytest.fixture(scope="module")
def deployment():
    """Check mode, then two real runs, on one fresh temporary root; their outputs and timings."""
    # Not under pytest's 0700 basetemp: the daemons' user must reach the files under it.
    tmp = Path(tempfile.mkdtemp(prefix="ingero-ansible-"))
    tmp.chmod(0o755)
    try:
        yield deploy(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def deploy(tmp: Path) -> SimpleNamespace:
    root = tmp / "root"
    for directory in SKELETON:
        (root / directory).mkdir(parents=True)
    (root / "etc/slurm/slurm.conf").write_text(SLURM_CONF.format(nhc=root / "etc/slurm/nhc"))
    timings = {}
    started = time.monotonic()
    source = snapshot(tmp)
    wheel = build_wheel(tmp, source)
    timings["wheel"] = time.monotonic() - started
    hosts = inventory(tmp, root, source, wheel)

    def playbook(*flags: str) -> subprocess.CompletedProcess:
        began = time.monotonic()
        done = subprocess.run([tool("ansible-playbook"), "-i", str(hosts),
                               str(ANSIBLE / "site.yml"), "--diff", *flags],
                              cwd=tmp, env=tool_env(tmp), capture_output=True, text=True,
                              timeout=600)
        timings[f"run {len(timings)} {' '.join(flags)}".strip()] = time.monotonic() - began
        assert done.returncode == 0, f"ansible-playbook {flags} failed:\n" \
                                     f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}"
        return done

    check = playbook("--check", "--limit", "localhost")
    after_check = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    fetched_after_check = (tmp / "fetched-keys").exists()
    first = playbook("--limit", "localhost")
    second = playbook("--limit", "localhost")
    for directory in SKELETON:
        (tmp / "newnode" / directory).mkdir(parents=True)
    # an upgrade from hooks named in slurm.conf itself, and a site epilog with a comment
    (tmp / "newnode/etc/slurm/slurm.conf").write_text(
        SLURM_CONF.format(nhc=tmp / "newnode/etc/slurm/ingero/prolog")
        + "Epilog=/bin/true  # the site's cleanup\n")
    before_newnode = tree(root)
    newnode = playbook("--limit", "newnode")
    print("\nansible timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    return SimpleNamespace(tmp=tmp, root=root, source=source, etc=root / "etc/ingero", check=check,
                           after_check=after_check,
                           fetched_after_check=fetched_after_check, first=first, second=second,
                           newnode=newnode, before_newnode=before_newnode)


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


def test_runs_give_no_warnings(deployment):
    for run in (deployment.check, deployment.first, deployment.second):
        output = run.stdout + run.stderr
        assert "[WARNING]" not in output and "[DEPRECATION WARNING]" not in output, \
            "\n".join(line for line in output.splitlines() if "WARNING" in line)


def test_second_run_changes_nothing(deployment):
    first, second = recap(deployment.first.stdout), recap(deployment.second.stdout)
    assert first["changed"] > 20 and first["failed"] == 0, first
    assert second["changed"] == 0 and second["failed"] == 0, \
        f"{second}\n" + "\n".join(_changed_tasks(deployment.second.stdout))


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
        block = output.split(name, 1)[1].split("\nTASK", 1)[0].split("\nRUNNING", 1)[0]
        assert "skipping: [localhost]" in block and "changed:" not in block, (name, block)


MODES = {
    # path under the root: (mode, owner, group)
    "etc/ingero": (0o755, "root", "root"),
    "etc/ingero/keys": (0o750, "root", DAEMON_GROUP),
    "etc/ingero/keys/ingerod.key_secret": (0o600, "root", "root"),
    "etc/ingero/keys/ingerod.key": (0o644, "root", "root"),
    "etc/ingero/keys/fleetd.key_secret": (0o640, "root", DAEMON_GROUP),
    "etc/ingero/keys/fleetd.key": (0o644, "root", DAEMON_GROUP),
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
                        etc / "keys/ingerod.key_secret", etc / "keys/fleetd.key") >= 1, \
        "fleetd's socket refused the deployed agent key"


def test_a_compute_node_added_with_limit_is_admitted_by_fleetd_and_nothing_else_changes(
        deployment):
    """--limit newnode runs no head tasks: the new node's own run puts its key among fleetd's
    authorized agents (and would reload fleetd under systemd); nothing else on the head
    changes."""
    etc, new = deployment.etc, deployment.tmp / "newnode/etc/ingero"
    assert recap(deployment.newnode.stdout, "newnode")["failed"] == 0
    assert "localhost" not in {m.group("host") for m in RECAP.finditer(deployment.newnode.stdout)}
    admitted = etc / "authorized_agents/newnode.key"
    assert admitted.read_bytes() == (new / "keys/ingerod.key").read_bytes()
    after = tree(deployment.root)
    assert {k for k in set(after) | set(deployment.before_newnode)
            if after.get(k) != deployment.before_newnode.get(k)} == {
        "etc/ingero/authorized_agents/newnode.key"}
    assert curve_admits(etc / "authorized_agents", etc / "keys/fleetd.key_secret",
                        new / "keys/ingerod.key_secret", new / "keys/fleetd.key") == 2, \
        "fleetd's socket refused the new node's key"
    # its slurm.conf named ingero's hook itself: no second copy of it as the site's
    slurm = deployment.tmp / "newnode/etc/slurm"
    assert sorted(p.name for p in (slurm / "prolog.d").iterdir()) == ["50-ingero"]
    assert os.readlink(slurm / "epilog.d/00-site") == "/bin/true"


def test_token_made_once_stored_hashed_and_never_printed(deployment):
    etc = deployment.etc
    token = (etc / "ingero-cli.token").read_text().strip()
    assert len(token) >= 32
    tokens = yaml.safe_load((etc / "echod-tokens.yaml").read_text())["tokens"]
    assert [(t["name"], t["sha256"]) for t in tokens] == \
        [("ingero-cli", hashlib.sha256(token.encode()).hexdigest())]
    for run in (deployment.check, deployment.first, deployment.second):
        assert token not in run.stdout + run.stderr
    secret = (etc / "keys/fleetd.key_secret").read_text()
    secret_line = next(line for line in secret.splitlines() if "secret-key" in line)
    assert secret_line.split('"')[1] not in deployment.first.stdout


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
