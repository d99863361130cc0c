"""The demo README promises: real daemons, one node slowed, fleetd flags it and only it."""

import re
import subprocess
import sys


def test_demo_flags_the_slowed_node():
    result = subprocess.run([sys.executable, "-m", "ingero", "demo", "--nodes", "6"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    lowered = re.search(r"lowering (\S+)'s score", result.stdout).group(1)
    assert re.search(rf"fleetd flagged {lowered} after [\d.]+s", result.stdout)
    assert "no other node flagged" in result.stdout
    assert "exit codes: 0\n" in result.stdout
