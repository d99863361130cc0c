"""fleetd raises its descriptor limit for a large fleet, and says when it cannot."""

from __future__ import annotations

import resource
import subprocess
import sys

from fleetd.limits import HEADROOM, raise_nofile
from ingero.launch import free_port, wait_for


def limits(soft, hard, fail=False):
    state = {"now": (soft, hard)}

    def get(_):
        return state["now"]

    def put(_, value):
        if fail:
            raise ValueError("not allowed")
        state["now"] = value
    return state, get, put


def test_the_soft_limit_goes_up_to_the_hard_one():
    state, get, put = limits(1024, 65536)
    assert raise_nofile(10_000, get, put) == (1024, 65536, None)
    assert state["now"] == (65536, 65536)


def test_an_unlimited_hard_limit_gives_what_the_fleet_needs():
    state, get, put = limits(1024, resource.RLIM_INFINITY)
    assert raise_nofile(10_000, get, put)[1] == 10_000 + HEADROOM


def test_a_hard_limit_short_of_the_fleet_is_named_with_its_fix():
    _, get, put = limits(1024, 4096)
    before, now, warning = raise_nofile(10_000, get, put)
    assert (before, now) == (1024, 4096)
    assert "10000 agents" in warning and "LimitNOFILE=" in warning and "10256" in warning
    _, get, put = limits(1024, 65536, fail=True)
    assert raise_nofile(10_000, get, put)[1] == 1024


def test_fleetd_under_a_low_hard_limit_raises_its_soft_one_and_warns(tmp_path):
    log = tmp_path / "fleetd.log"
    with open(log, "wb") as out:
        fleetd = subprocess.Popen(
            ["prlimit", "--nofile=512:4096", sys.executable, "-m", "fleetd", "--config",
             "/dev/null", "--bind", f"tcp://127.0.0.1:{free_port()}", "--metrics-addr", "none",
             "--insecure-plaintext-zmq"], stdout=out, stderr=subprocess.STDOUT)
    try:
        assert wait_for(lambda: "listening on" in log.read_text(), 60), log.read_text()
        limit = open(f"/proc/{fleetd.pid}/limits").read()
        assert any(line.startswith("Max open files") and line.split()[3] == "4096"
                   for line in limit.splitlines()), limit
    finally:
        fleetd.terminate()
        assert fleetd.wait(30) == 0
    text = log.read_text()
    assert "soft limit 4096 (raised from 512)" in text
    assert "may serve 10000 agents" in text and "LimitNOFILE=" in text
