"""Helpers the end-to-end tests share: reading a daemon's /metrics, producing and forwarding
batches, and echod with its API (TLS, tokens, seeded evidence)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ingero.command.words import verdict_summary
from stack.launch import wait_for
from stack.local import Echod, Stack
from ingero.vocabulary import OWN_SEQUENCE


def have_bcc() -> bool:
    try:
        import bcc  # noqa: F401
    except ImportError:
        return False
    return True


# The tests that load eBPF programs: root and Debian's bcc, which CI has (there a skip fails).
needs_ebpf = pytest.mark.skipif(os.geteuid() != 0 or not have_bcc(),
                                reason="eBPF needs root and Debian's bcc (make setup)")


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} from /metrics; {} while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except ConnectionRefusedError:
        return {}
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return {}
        raise
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(port: int, name: str, **labels) -> float:
    return scrape(port).get((name, tuple(sorted(labels.items()))), 0.0)


class Producer:
    """A node pushing batches of events to fleetd over the real protocol, as ingerod does."""

    SIGNALS = {"throughput": 0.9, "compute": 0.9, "memory": 0.9, "cpu": 0.9}

    def __init__(self, endpoint: str, keys, node: str, cluster: str = "ingest",
                 secret: Path | None = None):
        """Under the agents' shared key, or the ``secret`` key file given."""
        import uuid

        import zmq

        from ingero import curve

        self.node, self.cluster, self.boot = node, cluster, uuid.uuid4().hex[:8]
        # The process's one context, never terminated: a producer a failed test left behind is
        # collected in a reference cycle (the test's traceback), whose weak references go
        # first, so a context of its own would find no socket to close and wait in term()
        # for the one still open, forever (a whole CI run hung so, in pyzmq's __del__).
        self.socket = zmq.Context.instance().socket(zmq.DEALER)
        self.socket.linger = 0
        curve.connect_curve(self.socket, curve.load_keypair(secret or keys.agent_secret),
                            curve.load_public(keys.fleet_public))
        self.socket.connect(endpoint)
        self.seq = self.next_event = 0
        self.acked: set[int] = set()

    def push(self, events: int, **attrs) -> None:
        import time

        from ingero import wire

        batch = [{"id": f"{self.node}:{self.boot}:{self.next_event + i}", "t": time.time(),
                  "kind": "collective", "attrs": {"op": "ncclAllReduce", "bytes": 4096, **attrs}}
                 for i in range(events)]
        self.next_event += events
        message = wire.Push(self.seq, self.node, self.cluster, self.boot, 0.9, self.SIGNALS,
                            "active", time.time(), 1.0, None, None, batch)
        self.send(wire.encode(message))

    def send(self, frames: list[bytes]) -> None:
        """Send a push already encoded (its number must be the next, ``seq``)."""
        self.socket.send_multipart(frames)
        self.seq += 1

    def collect_acks(self, timeout: float) -> int:
        """Read replies for up to ``timeout`` seconds; returns how many pushes are acked."""
        import time

        from ingero import wire

        deadline = time.monotonic() + timeout
        while len(self.acked) < self.seq and time.monotonic() < deadline:
            if self.socket.poll(50):
                reply = wire.decode(self.socket.recv_multipart())
                if isinstance(reply, wire.Reply):
                    self.acked.add(reply.ack)
        return len(self.acked)

    def close(self) -> None:
        self.socket.close()


def forward(keys, endpoint, message):
    """Send one batch as fleetd would, and wait for echod's acknowledgement."""
    import zmq

    from ingero import curve, wire

    context = zmq.Context()
    socket = context.socket(zmq.DEALER)
    socket.linger = 0
    curve.connect_curve(socket, curve.load_keypair(keys.fleet_secret),
                        curve.load_public(keys.echod_public))
    socket.connect(endpoint)
    try:
        socket.send_multipart(wire.encode(message))
        assert socket.poll(30_000), "echod did not acknowledge"
        return wire.decode(socket.recv_multipart())
    finally:
        socket.close()
        context.term()


class EchodApi(Echod):
    """echod with its HTTP API (``stack.local.Echod``) in a fresh temporary directory, and
    what the tests ask of it besides the tools: raw requests, the audit log, SIGHUP."""

    def __init__(self, keys, *flags: str, tokens: dict[str, tuple[str, str]]):
        super().__init__(Path(tempfile.mkdtemp(prefix="echod-api-test-")), keys, *flags,
                         tokens=tokens)

    def request(self, method: str, path: str, token: str | None = None, **kw):
        import requests

        headers = kw.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return requests.request(method, self.url + path, headers=headers,
                                verify=str(self.cert), timeout=60, **kw)

    def audit(self) -> list[dict]:
        import json

        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines()]

    def hup(self) -> None:
        os.kill(self.daemon.process.pid, signal.SIGHUP)


SOURCE_IGNORED = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                        "__pycache__", ".pytest_cache", ".hypothesis")


def build_wheel(repo: Path, out: Path) -> Path:
    """The wheel of this checkout, built from a copy of its sources (a stale build/ in the
    checkout can neither leak into it nor be written)."""
    source = out / "source"
    shutil.copytree(repo, source, ignore=SOURCE_IGNORED)
    shutil.rmtree(source / "sim" / "build", ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(out), str(source)], check=True,
                   capture_output=True, timeout=600)
    shutil.rmtree(source)
    return next(out.glob("ingero-*.whl"))


# What a user other than root runs of this checkout: its packages (the sim built) and its venv.
FOR_OTHERS = ("ingero", "ingerod", "fleetd", "echod", "stack", "sim")


def for_other_users(repo: Path, venv: Path, dest: Path) -> SimpleNamespace:
    """This checkout's packages and venv, copied where every user may read and run them: the
    tests that act as another user must not depend on where root cloned the repository (under
    /root or a ``mktemp -d``, a 0700 directory no other user can enter). Files are hard links
    where ``dest`` is on the same file system (the venv is hundreds of MB), copies elsewhere;
    the venv's editable install is pointed at the copy. Returns its ``checkout``, ``python``
    and ``sim_bin``."""
    dest.chmod(0o755)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info")
    checkout = dest / "checkout"
    for name in FOR_OTHERS:
        shutil.copytree(repo / name, checkout / name, symlinks=True, ignore=skip,
                        copy_function=_link_or_copy)
    shutil.copytree(venv, dest / "venv", symlinks=True, ignore=skip,
                    copy_function=_link_or_copy)
    site = next((dest / "venv/lib").glob("python3*/site-packages"))
    for editable in site.glob("__editable__*"):
        editable.unlink()
    (site / "ingero-checkout.pth").write_text(f"{checkout}\n")
    return SimpleNamespace(checkout=checkout, python=dest / "venv/bin/python",
                           sim_bin=checkout / "sim/build/bin")


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


# How far fleetd's correction of a node's times (the fit it held when it settled them) and the
# raw survey's (the offset fleetd reported with the node's first score at or after them) may
# put them apart: run by run of collectives, the two medians came within 0.05 ms here, where
# the fits themselves moved by up to 1.5 ms from one push to the next.
CLOCKS_MS = 0.25
LATE_IN_RECORD_S = 0.010   # a rank this late at its median step (its record) is a straggler


class TwoNodes(Stack):
    """The product on this machine as the demo runs it (``stack.local``): echod, fleetd
    and two node-wide ingerods, node1's clock ``SKEW_S`` ahead (faketime), so every verdict read
    from it is made through a corrected clock; the agents attach 4 library files of a user at
    most (16 by default: each costs 1.6 s to detach here) and detach one 20 s after the last
    process mapping it is gone (test_hostile_users reads both). conftest's ``two_nodes``
    shares one among the modules that each run jobs of their own and read only those."""

    SKEW_S, PUSH_S, HANG_TIMEOUT_S, LIBRARIES_PER_USER = 0.25, 1.0, 4.0, 4

    def __init__(self, root: Path):
        super().__init__(root, 2, push_s=self.PUSH_S, hang_timeout_s=self.HANG_TIMEOUT_S,
                         skew={1: self.SKEW_S},
                         echod_flags=("--rate-limit", "500", "--rate-burst", "2000"),
                         echod_root=Path(tempfile.mkdtemp(prefix="echod-two-nodes-")),
                         agent_flags=("--library-grace", "20", "--libraries-per-user",
                                      str(self.LIBRARIES_PER_USER)))
        # fleetd knows both nodes' clocks before the first job: each job's lags are compared
        # across every rank from its first collective, whichever module runs first
        if not wait_for(lambda: sum(name == "ingero_fleet_clock_offset_seconds"
                                    for name, _ in scrape(self.fleet_port)) == 2, 60):
            self.stop()
            raise RuntimeError(f"fleetd never knew both nodes' clocks:\n{self.logs()}")

    def run(self, scenario):
        """Run a sim job to its end, then wait for fleetd's word on all of it in echod."""
        from sim.cluster import Cluster

        with Cluster(scenario, self.root / f"job-{scenario.job.job_id}") as cluster:
            result = cluster.wait()
        assert self.wait_judged(scenario.job.job_id, result), self.logs()
        return result

    def verdicts(self, job: str) -> list[dict]:
        """fleetd's verdicts on the job, as find_stragglers answers them, oldest first."""
        found = self.tool("find_stragglers", job=job)["verdicts"]
        return sorted(found, key=lambda v: (v["rank"], v["raised"]))


def lag_quartiles(stack, job: str) -> dict[tuple, tuple[float, float]]:
    """Per (step, rank) of ``job``: the 25th and 75th percentiles of its entry lags (ms),
    computed here from its collectives as job_timeline gives them (each node's clock
    corrected): an instance is a (communicator, seq) that all the communicator's ranks
    entered, sends and receives none; a rank's lag there is its entry less the median of its
    peers' entries."""
    timeline = stack.tool("job_timeline", job=job)
    assert not timeline["truncated"]
    found = stack.client().sql(f"SELECT DISTINCT comm_hash, attrs ->> 'step' FROM events "
                               f"WHERE job = '{job}' AND kind = 'collective'")
    assert not found["truncated"]
    step = dict(found["rows"])
    entries: dict[tuple, dict[int, float]] = defaultdict(dict)
    for s in timeline["slices"]:
        if s["kind"] == "collective" and s["op"] not in OWN_SEQUENCE:
            entries[(s["comm_hash"], s["seq"])][s["rank"]] = s["t"] * 1e3
    width: dict[str, int] = defaultdict(int)
    for (comm, _), entered in entries.items():
        width[comm] = max(width[comm], len(entered))
    lags = defaultdict(list)
    for (comm, _), entered in entries.items():
        if len(entered) == width[comm] >= 2:
            for rank, t in entered.items():
                others = [u for r, u in entered.items() if r != rank]
                lags[(step[comm], rank)].append(t - float(np.median(others)))
    return {key: tuple(np.percentile(values, [25, 75])) for key, values in lags.items()}


def assert_same_lags(report: dict, raw: dict, quartiles: dict[tuple, tuple[float, float]]
                     ) -> None:
    """The per-rank lags of a report from summaries against one from the raw collectives:
    the same stragglers, the same ranks of the same Slurm steps, counts within 2%. A rank's
    median from summaries (its runs' medians, weighted) lies between the quartiles of its
    lags (``lag_quartiles``), as the raw median does, both give or take the clocks'
    corrections (CLOCKS_MS); it need not be near the raw median: here a healthy rank's lags
    fall in modes half a millisecond apart, its quartiles a millisecond apart, and each
    median may land in either mode. Which of ranks within microseconds of each other came
    last is that noise, as are their tails (so the shares of last arrivals are not
    compared): a late rank's p99 and what it cost within 10% and 5%; the job's idle time
    within 5% (or half a GPU-second)."""
    got = {(r["step"], r["rank"]): r for r in report["per_rank"]}
    expected = {(r["step"], r["rank"]): r for r in raw["per_rank"]}
    assert got.keys() == expected.keys() == quartiles.keys(), \
        (report["per_rank"], raw["per_rank"], quartiles)
    for rank, r in expected.items():
        mine = got[rank]
        assert (mine["straggler"], mine["node"]) == (r["straggler"], r["node"]), (rank, mine, r)
        low, high = quartiles[rank]
        for median in (r["lag_median_ms"], mine["lag_median_ms"]):
            assert low - CLOCKS_MS <= median <= high + CLOCKS_MS, (rank, low, high, mine, r)
        assert mine["collectives"] == pytest.approx(r["collectives"], rel=0.02), (mine, r)
        if r["verdict"] or r["straggler"]:      # the others' tails are the clocks' noise
            assert mine["lag_p99_ms"] == pytest.approx(r["lag_p99_ms"], rel=0.1), (mine, r)
            assert mine["cost_gpu_seconds"] == pytest.approx(r["cost_gpu_seconds"], rel=0.05), \
                (mine, r)
    assert report["cost"]["gpu_seconds_idle"] == pytest.approx(raw["cost"]["gpu_seconds_idle"],
                                                               rel=0.05, abs=0.5)
    assert [s["rank"] for s in report["top_stragglers"]] == \
        [s["rank"] for s in raw["top_stragglers"]]


def why(*parts) -> str:
    """A failed assertion's message, whole: each part on its own lines (a repr where it is no
    string). A tuple of them would be cut at 240 characters by pytest."""
    return "\n".join(part if isinstance(part, str) else repr(part) for part in parts)


def said(verdicts) -> list[str]:
    """Each verdict (a list, or a dict by rank) as the product says it, with what a failed
    assertion needs to be read: the step it began at, the clock its node's times were put on
    fleetd's through, the bar, and its first finding."""
    lines = []
    for v in (verdicts.values() if isinstance(verdicts, dict) else verdicts):
        e = v.get("evidence") or {}
        lines.append(f"{verdict_summary(v)}; from step {v.get('step')}, clock "
                     f"{e.get('clock_offset_ms')} ± {e.get('clock_uncertainty_ms')} ms, bar "
                     f"{e.get('bar_ms')} ms: {(v.get('findings') or [''])[0]}; evidence "
                     f"{json.dumps(e, sort_keys=True, default=str)[:2000]}")
    return lines


class Beside:
    """A module's slow fixture work run as stages, in order, in a thread beside the rest of the
    suite: work that waits on subprocesses of its own and on nothing any other test does (the
    Ansible runs, each a single-threaded ansible-playbook). conftest starts every module's
    stages once the tests are collected, beside the modules that trace nothing, waits for them
    before the first test that traces, and runs the tests that read them last; a test waits for
    the stage it reads, and a stage's error is raised in every test that reads it or a later
    one. ``make`` builds what the stages work on; ``cancel`` stops the work in progress;
    ``fixture`` names the module fixture that waits (the stages start only for tests that use
    it)."""

    started: list[Beside] = []       # every one started in this session, for the summary

    def __init__(self, name: str, make: Callable[[], object],
                 stages: list[Callable[[object], None]], fixture: str,
                 cancel: Callable[[object], None] = lambda subject: None):
        self.name, self.make, self.stages, self._cancel = name, make, stages, cancel
        self.fixture = fixture
        self.subject = None
        self.done = {stage.__name__: threading.Event() for stage in stages}
        self.error: BaseException | None = None
        self.failed_at: str | None = None
        self.timings: dict[str, float] = {}
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.thread is None:
            Beside.started.append(self)
            self.thread = threading.Thread(target=self._run, name=f"beside-{self.name}",
                                           daemon=True)
            self.thread.start()

    def _run(self) -> None:
        try:
            self.subject = self.make()
            for stage in self.stages:
                if self.stopping.is_set():
                    raise RuntimeError("stopped before this stage")
                self.failed_at = stage.__name__
                began = time.monotonic()
                stage(self.subject)
                self.timings[stage.__name__] = time.monotonic() - began
                self.failed_at = None
                self.done[stage.__name__].set()
        except BaseException as exc:      # raised again in every test that waits from here on
            self.error = exc
        finally:
            for event in self.done.values():
                event.set()

    def wait(self, stage: Callable[[object], None]):
        """What the stages work on, once ``stage`` has run; its error, or an earlier one's."""
        self.start()
        self.done[stage.__name__].wait()
        if stage.__name__ not in self.timings:            # it failed, or an earlier one did
            if self.failed_at in (None, stage.__name__):
                raise self.error
            pytest.fail(f"{self.name}: stage {self.failed_at} failed before {stage.__name__} "
                        f"could run: {self.error!r}"[:4000])
        return self.subject

    def join(self) -> None:
        """Wait until every stage has run (or one failed)."""
        if self.thread is not None:
            self.thread.join()

    def finish(self) -> None:
        """Stop the work in progress (if any is left: the session is ending early) and wait."""
        if self.thread is None:
            return
        if self.thread.is_alive():
            self.stopping.set()
            if self.subject is not None:
                self._cancel(self.subject)
        self.thread.join(60)

    def summary(self) -> str:
        stages = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.timings.items())
        ended = ("" if self.failed_at is None else f"; stopped in {self.failed_at}, the session "
                 "ending first" if self.stopping.is_set() else f"; {self.failed_at} failed")
        return f"{self.name}: {sum(self.timings.values()):.1f}s beside the tests ({stages}){ended}"
