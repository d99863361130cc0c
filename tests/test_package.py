"""The wheel as a compute node gets it (``ingero[agent]``: no extra): it carries the BPF
sources and the rate table and no sim, installs into a fresh venv made like /opt/ingero/venv
(Debian's Python, its bcc visible) without echod's dependencies (flask, gunicorn, SQLAlchemy,
psycopg), and there `ingero version` finds everything in the installed package and says what
it can run, `echod` and `ingero demo` say in one line where they run instead, and `ingerod
trace` attaches its probes to a running sim rank — nothing read from this checkout."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import pytest

from tests.support import needs_ebpf

ROOT = Path(__file__).resolve().parent.parent
BPF_SOURCES = ["common.bpf.c", "cuda.bpf.c", "graph.bpf.c", "host.bpf.c", "nccl.bpf.c"]
# Its trace asserts on what is traced, not on when: it may run beside the Ansible stages.
pytestmark = pytest.mark.load_tolerant


def test_the_wheel_carries_the_bpf_sources_and_the_rate_table(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"ingerod/bpf/{name}" for name in BPF_SOURCES} <= names
    assert "ingero/rates.yaml" in names
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names
                                                   if n.endswith("entry_points.txt")))
    for program in (b"ingerod", b"fleetd", b"echod", b"ingero"):
        assert program + b" = " in entry_points
    # The layout is the wheel: the core, the command, the daemons; not the checkout's test bed.
    assert not any(name.startswith(("sim/", "stack/")) for name in names)
    assert "ingero/command/cli.py" in names and "ingero/wire.py" in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("METADATA")))
    requires = [line.decode() for line in metadata.splitlines()
                if line.startswith(b"Requires-Dist:")]
    for module in ("flask", "gunicorn", "sqlalchemy", "psycopg"):        # the head's only
        mine = [line for line in requires if line.split()[1].startswith(module)]
        assert mine and all("extra ==" in line and "head" in line for line in mine), requires


@pytest.fixture(scope="module")
def venv(wheel):
    """A fresh venv from Debian's Python, the wheel installed with its dependencies (from the
    package index, or pip's cache where `make setup` filled it)."""
    root = Path(tempfile.mkdtemp(prefix="ingero-venv-"))
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages",
                    str(root / "venv")], check=True, timeout=120)
    started = time.monotonic()
    done = subprocess.run([str(root / "venv/bin/pip"), "install", "-q", str(wheel)],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"wheel and dependencies installed in {time.monotonic() - started:.1f}s")
    yield root / "venv"
    subprocess.run(["rm", "-rf", str(root)], check=False)


def outside(venv: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run a program of the venv away from this checkout, with nothing pointing back at it."""
    env = {"PATH": f"{venv}/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(venv.parent),
           "LANG": "C.UTF-8"}
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], capture_output=True,
                          text=True, timeout=timeout, cwd=venv.parent, env=env)


def test_ingero_version_in_the_installed_venv_finds_its_package_data(venv):
    done = outside(venv, "ingero", "version", "--json")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert facts["bpf_dir"] == str(site / "ingerod" / "bpf")
    assert sorted(facts["bpf_sources"]) == BPF_SOURCES and facts["bpf_missing"] == []
    assert facts["rates"] == str(site / "ingero" / "rates.yaml") and facts["rates_found"]
    assert facts["python_path"].startswith(str(venv))
    module = outside(venv, "python", "-c", "import ingerod; print(ingerod.__file__)")
    assert module.stdout.strip().startswith(str(site)), module.stdout
    assert facts["parts"] == {"ingerod": True, "fleetd": True, "echod": False, "mcp": False,
                              "demo": False}
    assert isinstance(facts["running"], list)


def test_the_agent_install_has_none_of_echods_dependencies_and_says_where_echod_runs(venv):
    for module in ("flask", "gunicorn", "sqlalchemy", "psycopg", "alembic"):
        found = outside(venv, "python", "-c", f"import {module}")
        assert found.returncode != 0 and "ModuleNotFoundError" in found.stderr, module
    echod = outside(venv, "echod", "--help")
    assert echod.returncode == 1 and echod.stderr.strip().splitlines() == [
        "echod: this installation lacks flask, gunicorn, sqlalchemy, alembic, psycopg, "
        "jsonschema: echod runs on the head node, installed with pip install 'ingero[head]'"]
    demo = outside(venv, "ingero", "demo")
    assert demo.returncode == 1 and "make demo" in demo.stderr, demo.stderr
    assert len(demo.stderr.strip().splitlines()) == 1, demo.stderr


@needs_ebpf
def test_ingerod_trace_from_the_installed_venv_attaches_its_probes(venv):
    import sim

    work = Path(tempfile.mkdtemp(prefix="ingero-pkg-rank-"))
    # The rank runs until the trace is done (killed then), however long bcc takes to compile.
    rank = subprocess.Popen([str(sim.bin_dir() / "ingero-sim-rank"), "--steps", "30000",
                             "--step-ms", "20", "--record", str(work / "rank.jsonl"),
                             "--unique-id-file", str(work / "id")],
                            env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        libraries = sim.traced_libraries()
        done = outside(venv, "ingerod", "trace", "--json", "--duration", "4", "-p",
                       str(rank.pid), "--libraries", libraries, timeout=240)
    finally:
        rank.kill()
        rank.wait()
        subprocess.run(["rm", "-rf", str(work)], check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    from ingerod.probes import NCCL
    assert f"libnccl.so.2: attached {len(NCCL)} probes" in done.stderr, done.stderr
    kinds = {json.loads(line)["kind"] for line in done.stdout.splitlines()
             if line.startswith("{")}
    assert {"collective", "sync"} <= kinds, done.stdout[-2000:]


def test_install_sh_lays_out_what_the_units_and_hooks_name(wheel):
    """`make install` into a staging root: the venv the units start, the units, the hooks
    slurm.conf names, the manual pages, the monitoring files; and a second run is harmless."""
    repo = Path(__file__).resolve().parent.parent
    root = Path(tempfile.mkdtemp(prefix="ingero-install-"))
    try:
        for _ in range(2):
            done = subprocess.run(["bash", str(repo / "scripts/install.sh")], capture_output=True,
                                  text=True, timeout=900,
                                  env={**os.environ, "ROOT": str(root), "WHEEL": str(wheel)})
            assert done.returncode == 0, done.stderr[-3000:]
            assert "installed in" in done.stdout
        for program in ("ingerod", "fleetd", "echod", "ingero"):
            assert os.access(root / "opt/ingero/venv/bin" / program, os.X_OK)
        units = sorted(p.name for p in (root / "etc/systemd/system").iterdir())
        assert units == sorted(p.name for p in (repo / "systemd").glob("*.service"))
        for hook in ("prolog", "epilog"):
            path = root / "etc/slurm/ingero" / hook
            assert path.stat().st_mode & 0o777 == 0o755 and not path.is_symlink()
            assert path.read_text() == (repo / "slurm" / hook).read_text()
        assert (root / "usr/local/share/man/man8/ingero-slurm.8").exists()
        assert (root / "usr/local/share/man/man1/ingero.1").exists()
        assert (root / "usr/local/share/man/man7/ingero-monitoring.7").exists()
        shipped = root / "usr/local/share/ingero/monitoring"
        assert (shipped / "ingero-rules.yml").read_text() == \
            (repo / "monitoring/ingero-rules.yml").read_text()
        assert (shipped / "tests/ingero-rules.test.yml").exists()
        assert sorted(p.name for p in (shipped / "grafana/dashboards").iterdir()) == sorted(
            p.name for p in (repo / "monitoring/grafana/dashboards").iterdir())
        assert (root / "etc/logrotate.d/ingero").read_text() == \
            (repo / "logrotate/ingero").read_text()
        version = subprocess.run([str(root / "opt/ingero/venv/bin/ingero"), "version"],
                                 capture_output=True, text=True, timeout=60, cwd=root)
        assert version.returncode == 0 and str(root / "opt/ingero/venv") in version.stdout
        assert "echod yes" in version.stdout, version.stdout     # this machine runs it all
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


# Who may import whom: the core (ingero's own modules) nothing above it; the daemons the core
# only; the command the core, and the one-machine stack (stack/, above the daemons, like the
# sim) only for `ingero demo`.
FLOORS = {"core": {"ingero.command", "stack", "ingerod", "fleetd", "echod", "sim"},
          "daemons": {"ingero.command", "stack", "sim"},
          "command": {"ingerod", "fleetd", "echod", "sim"}}
PACKAGES = ("ingero", "ingerod", "fleetd", "echod", "stack", "sim", "bench")


def _floor(path: Path) -> str | None:
    parts = path.relative_to(ROOT).parts
    if parts[0] in ("ingerod", "fleetd", "echod"):
        return "daemons"
    if parts[0] == "ingero":
        return "command" if parts[1] == "command" else "core"
    return None


def _sources() -> dict[str, Path]:
    """Every Python module of the product, the stack, the sim and the benchmarks, by its
    dotted name (migrations aside: alembic loads them by path)."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, name: str | None = None) -> set[str]:
    """The modules ``path`` imports, anywhere in it; relative ones resolved where its dotted
    ``name`` is given."""
    import ast
    found = set()
    package = None if name is None else (
        name if path.name == "__init__.py" else name.rpartition(".")[0])
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.level == 0 or package is not None):
            base = node.module or ""
            if node.level:
                above = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(above + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


def test_each_floor_imports_only_the_floors_below_it():
    # `python -m ingero` is the command; the stack for `ingero demo` is imported lazily,
    # where that command runs. ingero imports no daemon.
    allowed = {("ingero/__main__.py", "ingero.command"), ("ingero/command/cli.py", "stack")}
    wrong = []
    for path in _sources().values():
        floor = _floor(path)
        if floor is None:
            continue
        where = str(path.relative_to(ROOT))
        for name in _imports(path):
            above = [f for f in FLOORS[floor] if name == f or name.startswith(f + ".")]
            if above and (where, above[0]) not in allowed:
                wrong.append(f"{where} ({floor}) imports {name}")
    assert wrong == []


# Circles and modules over MAX_LINES allowed: none (issue 37 took the last apart).
CIRCLES = []
LONG: set[str] = set()
MAX_LINES = 600


def circles_in(edges: dict[str, set[str]]) -> list[set[str]]:
    """The parts of a graph where each node reaches each other (Tarjan's strongly connected
    parts), of two nodes or more."""
    circles, order, low, on, stack = [], {}, {}, set(), []

    def visit(node: str) -> None:
        order[node] = low[node] = len(order)
        stack.append(node)
        on.add(node)
        for target in edges.get(node, ()):
            if target not in order:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on:
                low[node] = min(low[node], order[target])
        if low[node] == order[node]:
            part = set()
            while not part or node not in part:
                part.add(stack.pop())
            on.difference_update(part)
            if len(part) > 1:
                circles.append(part)
    for name in sorted(edges):
        if name not in order:
            visit(name)
    return circles


def test_no_module_imports_itself_round_a_circle():
    sources = _sources()
    edges = {}
    for name, path in sources.items():
        targets = set()
        for target in _imports(path, name):
            while target and target not in sources:     # a name from a module: the module
                target = target.rpartition(".")[0]
            if target and target != name:
                targets.add(target)
        edges[name] = targets
    assert sorted(map(sorted, circles_in(edges))) == sorted(map(sorted, CIRCLES))


def test_no_c_file_of_the_sim_calls_itself_round_a_circle():
    """Each of the sim's C files calls functions of the files it stands on, never of one that
    calls it back: read from the objects make builds (nm: the symbols each defines and those
    it needs)."""
    import sim

    objects = sorted((sim.build() / "obj").glob("*.o"))
    defined, needed = {}, {}
    for path in objects:
        listing = subprocess.run(["nm", str(path)], capture_output=True, text=True,
                                 check=True).stdout.split("\n")
        symbols = [line.split()[-2:] for line in listing if line.strip()]
        defined.update({name: path.stem for kind, name in symbols if kind in "TDBR"})
        needed[path.stem] = {name for kind, name in symbols if kind == "U"}
    edges = {stem: {defined[name] for name in names if defined.get(name, stem) != stem}
             for stem, names in needed.items()}
    assert sum(map(len, edges.values())) > 10, edges       # the files do call each other
    assert circles_in(edges) == []


# The daemons' rooms, one way: each module imports only those before it (each package's
# __init__.py says so).
ROOMS = {"echod.store": ("summaries", "models", "db", "jobrecords", "checks", "attrsjson",
                         "chunks", "columnrows", "writer", "retention"),
         "echod.access": ("principal", "tokens", "munge_users", "ratelimit", "auth", "audit",
                          "tokens_cli"),
         "echod.sandbox": ("check", "roles", "run"),
         "fleetd.ranks": ("common", "observing", "settling", "judging", "verdicts", "analysis")}


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_is_one_way(room):
    sources, order = _sources(), ROOMS[room]
    assert sorted(name for name in sources if name.startswith(room + ".")) == sorted(
        f"{room}.{name}" for name in order)
    wrong = []
    for at, name in enumerate(order):
        below = {f"{room}.{other}" for other in order[:at]}
        module = f"{room}.{name}"
        for target in _imports(sources[module], module):
            while target and target not in sources:
                target = target.rpartition(".")[0]
            if target.startswith(room + ".") and target != module and target not in below:
                wrong.append(f"{name} imports {target}")
    assert wrong == []


def test_no_module_is_longer_than_a_reader_can_hold():
    long = {str(path.relative_to(ROOT)) for path in _sources().values()
            if len(path.read_text().splitlines()) > MAX_LINES}
    assert long == LONG
