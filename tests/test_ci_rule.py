"""With CI=true a skipped test fails: in CI nothing real may be skipped."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_skipping_test(tmp_path, ci: str):
    probe = ROOT / "tests" / f"test_zz_probe_{os.getpid()}.py"
    probe.write_text("import pytest\n\ndef test_needs_something():\n"
                     "    pytest.skip('bcc missing')\n")
    try:
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               str(probe)], cwd=ROOT, capture_output=True, text=True,
                              env={**os.environ, "CI": ci}, timeout=120)
    finally:
        probe.unlink()


def test_skip_fails_in_ci(tmp_path):
    result = run_skipping_test(tmp_path, "true")
    assert result.returncode == 1
    assert "skipped in CI, where every test must run: bcc missing" in result.stdout


def test_skip_is_a_skip_elsewhere(tmp_path):
    result = run_skipping_test(tmp_path, "false")
    assert result.returncode == 0 and "1 skipped" in result.stdout


def test_the_modules_sharing_a_stack_run_together_by_name_before_the_others_that_trace():
    """Named in any order, the modules that share the ``two_nodes`` stack run one after the
    other, by name (test_cli reads windows in which its job is the only one; test_retention
    thins what came before it), and before any other module whose sim jobs their agents would
    trace too."""
    named = ["tests/test_tracing.py", "tests/test_retention.py", "tests/test_wire.py",
             "tests/test_rank_verdicts.py", "tests/test_cli.py"]
    listed = subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only",
                             "-p", "no:cacheprovider", *named], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    modules = [line.split("::")[0] for line in listed.stdout.splitlines() if "::" in line]
    order = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
    assert order == ["tests/test_wire.py", "tests/test_cli.py", "tests/test_rank_verdicts.py",
                     "tests/test_retention.py", "tests/test_tracing.py"], order
