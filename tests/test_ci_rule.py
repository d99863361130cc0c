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
