"""Shared fixtures. In CI (CI=true) a skipped test is a failed test: nothing real may skip."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

from stack.launch import Daemon, KeyRing, free_port, stop_all

from .support import Beside, needs_ebpf

pytest_plugins = ["tests.pg"]

IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_report_header(config):
    try:
        import bcc
        bcc_version = getattr(bcc, "__version__", "present")
    except ImportError:
        bcc_version = "missing"
    postgres = Path("/usr/lib/postgresql/15/bin/postgres")
    pg_version = (subprocess.run([postgres, "--version"], capture_output=True, text=True)
                  .stdout.strip() if postgres.exists() else "missing")
    return [f"kernel {platform.release()}, bcc {bcc_version}, {pg_version}",
            f"CI={'true: skips fail' if IN_CI else 'false'}"]


def beside_of(item) -> Beside | None:
    """The stages beside the suite this test waits for, if any."""
    beside = getattr(getattr(item, "module", None), "BESIDE", None)
    return beside if beside is not None and beside.fixture in item.fixturenames else None


def traces(item) -> bool:
    """Whether the test loads eBPF to trace sim jobs whose timing the analysis judges: not in
    a module marked ``load_tolerant`` (it traces, but asserts on what is traced, not on when,
    and its ranks run until the trace is done however slow the machine is)."""
    return any(mark == needs_ebpf.mark for mark in item.iter_markers("skipif")) and \
        item.get_closest_marker("load_tolerant") is None


# Set at collection: the modules that trace, whose jobs wait for the stages beside to be done.
TRACING: list = []
# The stack that modules share (the ``two_nodes`` fixture), and the modules that use it.
SHARED = "two_nodes"
SHARING: list = []
RUNNING: list = []
BARRIER_WAIT_S: list[float] = []


def pytest_collection_modifyitems(items):
    """In three parts, each in its usual order: the modules that trace nothing (or judge no
    timing: ``traces``), while the stages beside the suite (support.Beside) run; once those are
    done, the modules that trace sim jobs (no other load on the machine than the suite's own while
    their lateness is judged); last, the tests that read the stages. A module stays whole; the
    modules that share the ``two_nodes`` stack run together, first of their part, by name (so
    that no other test's sim job runs while its node-wide agents trace)."""
    tracing = {item.module for item in items if traces(item) and beside_of(item) is None}
    SHARING[:] = {item.module: None for item in items if SHARED in item.fixturenames}

    def part(item) -> tuple:
        module = getattr(item, "module", None)
        if beside_of(item) is not None:
            return (2,)
        if module in SHARING:        # together, first of their part, in the order of their names
            return (1 if module in tracing else 0, 0, module.__name__)
        return (1 if module in tracing else 0, 1)

    items.sort(key=part)
    TRACING[:] = tracing


def pytest_collection_finish(session):
    for beside in {id(b): b for b in map(beside_of, session.items) if b is not None}.values():
        beside.start()


def pytest_runtest_setup(item):
    if getattr(item, "module", None) in TRACING and SHARED not in item.fixturenames:
        wait_beside()


def wait_beside() -> None:
    """Before the first sim job whose timing is judged: wait for the stages beside the suite
    (``two_nodes`` waits after its stack has started beside them: a start judges nothing)."""
    if Beside.started and not BARRIER_WAIT_S:
        began = time.monotonic()
        for beside in Beside.started:
            beside.join()
        BARRIER_WAIT_S.append(time.monotonic() - began)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The shared stack stops once the last module that uses it is done (a session fixture
    would run on under every later module); its stop is that test's teardown."""
    if RUNNING and getattr(nextitem, "module", None) not in SHARING:
        stop_shared()


def stop_shared() -> None:
    stack = RUNNING.pop()
    assert stack.stop() == [0] * 4, stack.logs()


def pytest_sessionfinish():
    for beside in Beside.started:
        beside.finish()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter):
    """Each test module's time (its tests' setup, call and teardown, module fixtures included),
    slowest first: where CI's minutes go, beside --durations' slowest tests."""
    per_module = defaultdict(float)
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) in ("setup", "call", "teardown"):
                per_module[report.nodeid.split("::")[0]] += report.duration
    if not per_module:
        return
    terminalreporter.write_sep("=", "time per test module")
    for module, seconds in sorted(per_module.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f}s  {module}")
    terminalreporter.write_line(f"{sum(per_module.values()):8.1f}s  in all")
    for beside in Beside.started:
        terminalreporter.write_line(beside.summary())
    for waited in BARRIER_WAIT_S:
        terminalreporter.write_line(f"{waited:.1f}s waited for them before the first test that "
                                    "traces")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        reason = str(reason).removeprefix("Skipped: ")
        report.outcome = "failed"
        report.longrepr = f"skipped in CI, where every test must run: {reason}"


@pytest.fixture
def keys(tmp_path) -> KeyRing:
    return KeyRing.create(tmp_path / "keys")


@pytest.fixture
def endpoint() -> str:
    return f"tcp://127.0.0.1:{free_port()}"


@pytest.fixture
def spawn(tmp_path):
    """Start daemons as real processes; whatever is left running is stopped at teardown."""
    started: list[Daemon] = []

    def start(name: str, module: str, args: list[str], **kw) -> Daemon:
        daemon = Daemon.module(name, module, args, tmp_path, **kw)
        started.append(daemon)
        return daemon

    yield start
    stop_all([d for d in reversed(started) if d.alive() and d.module != "fleetd"])
    stop_all([d for d in started if d.alive()])


@pytest.fixture(scope="session")
def two_nodes(tmp_path_factory):
    """One product on two simulated nodes (support.TwoNodes: echod, fleetd, two node-wide
    agents, node1's clock 250 ms ahead) shared by the modules that each run sim jobs of their own
    on it and read only those (test_cli, test_hostile_users, test_rank_verdicts, test_retention):
    its start is paid once, and beside the stages of the suite (it compiles, starts and fits
    clocks; no timing is judged until they are done). It stops after the last of them
    (``pytest_runtest_teardown``)."""
    import sim

    from .support import TwoNodes

    sim.build()
    RUNNING.append(TwoNodes(tmp_path_factory.mktemp("two-nodes")))
    wait_beside()
    yield RUNNING[-1]
    if RUNNING:
        stop_shared()


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """This checkout built into a wheel, once per session."""
    from tests.support import build_wheel

    return build_wheel(Path(__file__).resolve().parent.parent, tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="session")
def for_others():
    """This checkout's packages and venv where another user may run them (``for_other_users``),
    once per session; removed at its end."""
    from tests.support import for_other_users

    if sys.prefix == sys.base_prefix:
        pytest.fail("the tests run in the checkout's venv (make test), which they copy")
    dest = Path(tempfile.mkdtemp(prefix="ingero-for-others-"))
    try:
        yield for_other_users(Path(__file__).resolve().parent.parent, Path(sys.prefix), dest)
    finally:
        shutil.rmtree(dest, ignore_errors=True)
