"""The units pass systemd-analyze verify, and declare what the daemons implement."""

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = sorted((Path(__file__).resolve().parent.parent / "systemd").glob("*.service"))


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_verifies(unit, tmp_path):
    """Point ExecStart at this checkout's venv (the units name the installed path); the man
    pages are checked by test_man, not installed here."""
    assert shutil.which("systemd-analyze"), "systemd-analyze missing: make setup installs it"
    text = unit.read_text().replace("/opt/ingero/venv", sys.prefix)
    target = tmp_path / unit.name
    target.write_text(text)
    result = subprocess.run(["systemd-analyze", "verify", "--man=no", str(target)], capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_uses_notify_and_watchdog(unit):
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.read_string(unit.read_text())
    service = parser["Service"]
    assert service["Type"] == "notify" and int(service["WatchdogSec"]) > 0
