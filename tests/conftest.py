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

from ingero.stack.launch import Daemon, KeyRing, free_port, stop_all

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


# Set at collection: the first test that traces, before which the stages beside must be done.
FIRST_TRACING: list = []
BARRIER_WAIT_S: list[float] = []


def pytest_collection_modifyitems(items):
    """In three parts, each in its usual order: the modules that trace nothing (or judge no
    timing: ``traces``), while the stages beside the suite (support.Beside) run; once those are
    done, the modules that trace sim jobs (no other load on the machine than the suite's own while
    their lateness is judged); last, the tests that read the stages. A module stays whole."""
    tracing = {item.module for item in items if traces(item) and beside_of(item) is None}
    items.sort(key=lambda item: 2 if beside_of(item) is not None else
               1 if getattr(item, "module", None) in tracing else 0)
    FIRST_TRACING[:] = [item for item in items if getattr(item, "module", None) in tracing][:1]


def pytest_collection_finish(session):
    for beside in {id(b): b for b in map(beside_of, session.items) if b is not None}.values():
        beside.start()


def pytest_runtest_setup(item):
    if FIRST_TRACING and item is FIRST_TRACING[0] and Beside.started:
        began = time.monotonic()
        for beside in Beside.started:
            beside.join()
        BARRIER_WAIT_S.append(time.monotonic() - began)


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
