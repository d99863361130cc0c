"""``ingero demo``: the whole product on one machine, on a GPU-less training job.

echod (its own PostgreSQL), fleetd and one ingerod per simulated node start as real daemons
(``stack.local``); a sim job from ``sim/scenarios/`` runs through the sim's libcudart and
libnccl while the agents trace it with eBPF; fleetd names the late rank online and echod stores
it. The demo shows the job's progress and the verdicts as they appear, then the job report and
each verdict in plain words, read back over echod's API as the CLI reads them. Whatever it
started is stopped, and its directory removed, on the way out, however it goes (unless --keep).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from ingero.errors import ApiCallError, IngeroError
from ingero.command.report import report_table
from ingero.command.words import describe_verdict, verdict_summary

PUSH_S = 1.0


class DemoError(IngeroError):
    """The demo cannot run here, or its job could not be run."""


def preflight() -> None:
    """One line on what is missing, before anything starts."""
    if os.geteuid() != 0:
        raise DemoError("ingero demo must run as root: its agents load eBPF probes (CAP_BPF, "
                        "CAP_PERFMON); try: sudo make demo")
    try:
        import bcc  # noqa: F401
    except ImportError:
        raise DemoError("Debian's bcc is not importable: run 'make setup' first, and run the "
                        "demo with the project's .venv/bin/python") from None


def find_scenario(name: str):
    """A scenario by name (sim/scenarios/NAME.yaml) or by file path."""
    from sim import scenario as scenarios
    from sim.errors import SimError

    shipped = scenarios.scenarios_dir()
    path = Path(name) if os.sep in name or name.endswith((".yaml", ".yml")) \
        else shipped / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in shipped.glob("*.yaml")))
        raise DemoError(f"no scenario {name!r}: give a file or one of {known}")
    try:
        return scenarios.load(path)
    except SimError as exc:
        raise DemoError(str(exc)) from None


def run(scenario_name: str, keep: bool, say) -> dict:
    """Run the demo; returns its outcome (``as_json`` makes the --json object of it, ``render``
    the words). ``say`` gets the progress lines."""
    preflight()
    import sim
    from sim.errors import SimError

    from stack.local import Stack

    scenario = find_scenario(scenario_name)
    with interruptible():
        try:
            sim.build()
        except SimError as exc:
            raise DemoError(str(exc)) from None
    root = Path(tempfile.mkdtemp(prefix="ingero-demo-"))
    root.chmod(0o755)
    stack = None
    try:
        with interruptible():
            try:
                stack = Stack(root, scenario.job.nodes, push_s=PUSH_S, say=say)
            except RuntimeError as exc:
                say(str(exc))
                raise DemoError("the demo's daemons did not start (their logs are above)") \
                    from None
            try:
                found = watch(stack, scenario, say)
            except SimError as exc:
                raise DemoError(f"the sim job did not run: {exc}") from None
            except ApiCallError as exc:      # echod's log goes with the directory: show its end
                say(stack.echod.daemon.log()[-4000:])
                raise DemoError(f"echod did not answer: {exc} (the end of its log is above)") \
                    from None
        if keep:
            found["kept"] = kept(stack, found["job"])
            stack = None
        return found
    finally:
        with uninterruptible():
            if stack is not None:
                stack.stop()
            if not keep or stack is not None:
                shutil.rmtree(root, ignore_errors=True)


def watch(stack, scenario, say) -> dict:
    """Run the job, telling its steps and fleetd's verdicts as they come; then the outcome."""
    from sim.cluster import Cluster
    from sim.records import read_record

    from stack.local import JUDGED_TIMEOUT_S

    job = scenario.job
    say(f"job {job.job_id}: scenario {scenario.name}, {job.nodes} nodes x {job.ranks_per_node} "
        f"ranks, {job.steps} steps" + (f" ({scenario.description})"
                                       if scenario.description else ""))
    seen: set[tuple] = set()
    shown_step = -1
    with Cluster(scenario, stack.root / f"job-{job.job_id}") as cluster:
        while any(rank.popen.poll() is None for rank in cluster.ranks):
            time.sleep(PUSH_S)
            step = len(read_record(cluster.ranks[0].record_path).ops("ncclAllReduce"))
            if step // 10 != shown_step // 10 or step == job.steps:
                if step != shown_step:
                    say(f"  step {step}/{job.steps}")
                shown_step = step
            announce(stack, job.job_id, seen, say)
        result = cluster.wait()
    say(f"job {job.job_id} ended: {result.describe() if not result.ok else 'every rank ok'}")
    if not stack.wait_judged(job.job_id, result):
        say(f"  (fleetd's word on the job's last collectives was not in echod after "
            f"{JUDGED_TIMEOUT_S:.0f} s: what follows is what it holds)")
    announce(stack, job.job_id, seen, say)
    return outcome(stack, scenario, result.ok)


def announce(stack, job: str, seen: set, say) -> None:
    """Say each verdict fleetd stored that was not said yet."""
    for verdict in stack.tool("find_stragglers", job=job)["verdicts"]:
        key = (verdict["rank"], verdict["kind"], verdict["cause"])
        if key not in seen:
            seen.add(key)
            say(f"  fleetd: {verdict_summary(verdict)}")


def outcome(stack, scenario, ok: bool) -> dict:
    job = scenario.job.job_id
    stragglers = stack.tool("find_stragglers", job=job)
    report = stack.tool("job_report", job=job)
    return {"job": job, "cluster": report["cluster"], "scenario": scenario.name,
            "job_ok": ok, "verdicts": latest(stragglers["verdicts"]),
            "report": report["per_rank"], "cost": report["cost"]}


def as_json(result: dict) -> dict:
    """The --json object: the job, its verdicts in the demo's terms, and the report rows."""
    return {**result, "verdicts": [verdict_json(v) for v in result["verdicts"]]}


def latest(verdicts: list[dict]) -> list[dict]:
    """The newest verdict of each rank and kind, by rank."""
    newest: dict[tuple, dict] = {}
    for verdict in sorted(verdicts, key=lambda v: v["raised"]):
        newest[(verdict["rank"], verdict["kind"])] = verdict
    return sorted(newest.values(), key=lambda v: (v["rank"], v["raised"]))


def verdict_json(v: dict) -> dict:
    return {"rank": v["rank"], "node": v["node"], "op": v["op"], "kind": v["kind"],
            "cause": v["cause"], "severity": v["severity"], "confidence": v["confidence"],
            "lag_ms_p50": v["lag_p50_ms"], "lag_ms_p99": v["lag_p99_ms"],
            "last_share": v["last_share"],
            "every_steps": v["period"] if v["kind"] == "periodic" else None,
            "onset_step": v["step"], "onset": v["onset"], "detected_at": v["raised"],
            "cleared": v["cleared"], "cost_gpu_seconds": v["cost_gpu_seconds"],
            "cost_usd": v["cost_usd"], "fix": v["fix"], "findings": v["findings"],
            "evidence": v["evidence"]}


def render(result: dict) -> str:
    """The job report and each verdict in plain words."""
    lines = [f"\nJob {result['job']} ({result['scenario']}): what echod answers", "",
             report_table(result["report"], result["job"]), ""]
    if not result["verdicts"]:
        lines.append("No straggler: every rank kept pace with its peers.")
    for verdict in result["verdicts"]:
        lines += [describe_verdict(verdict), ""]
    if result.get("kept"):
        lines += [result["kept"]["how"]]
    return "\n".join(lines).rstrip() + "\n"


def kept(stack, job: str) -> dict:
    """Leave the stack running: a client environment file, a stop script, and how to use
    them."""
    root = stack.root
    env, token, stop = root / "env", root / "token", root / "stop"
    token.write_text(stack.token + "\n")
    token.chmod(0o600)
    env.write_text(f"export INGERO_URL={stack.echod.url} INGERO_TOKEN_FILE={token} "
                   f"INGERO_CA_CERT={stack.echod.cert}\n")
    pids = " ".join(str(d.process.pid) for d in [*stack.daemons, stack.echod.daemon])
    stop.write_text(STOP_SCRIPT.format(pids=pids, python=sys.executable,
                                       postgres=root / "echod" / "state" / "postgres",
                                       root=root))
    stop.chmod(0o755)
    how = (f"The stack is still running (--keep). Query it with the CLI:\n"
           f"  . {env}\n  ingero report -j {job}\n  ingero explain -j {job}\n"
           f"  ingero export -j {job} --format perfetto -o trace.json\n"
           f"Stop it and remove {root}:\n  {stop}")
    return {"url": stack.echod.url, "env": str(env), "stop": str(stop), "how": how}


STOP_SCRIPT = """#!/bin/sh
# Stops what 'ingero demo --keep' left running, and removes its directory.
# kill -0 with several pids fails as soon as one is gone: ask each, until none is left.
alive() {{ for pid in {pids}; do kill -0 "$pid" 2>/dev/null && return 0; done; return 1; }}
kill -TERM {pids} 2>/dev/null
for i in $(seq 1 600); do alive || break; sleep 0.1; done
kill -KILL {pids} 2>/dev/null
for i in $(seq 1 50); do alive || break; sleep 0.1; done
{python} -c 'from pathlib import Path; from echod.embedded import EmbeddedPostgres; \
EmbeddedPostgres(Path("{postgres}")).stop()'
rm -rf {root}
"""


@contextmanager
def interruptible():
    """Ctrl-C (SIGINT) and SIGTERM end the demo: KeyboardInterrupt unwinds it. SIGINT's
    handler is set here, not left to Python: a process that starts with SIGINT ignored (a
    command a non-interactive shell runs in the background, as CI runners do) gets none from
    Python, and would run the job to its end."""
    def on_term(signum, frame):
        raise KeyboardInterrupt
    previous = [signal.signal(signal.SIGTERM, on_term),
                signal.signal(signal.SIGINT, signal.default_int_handler)]
    try:
        yield
    finally:
        for s, handler in zip((signal.SIGTERM, signal.SIGINT), previous):
            signal.signal(s, handler)


@contextmanager
def uninterruptible():
    """The clean-up runs to its end: a second Ctrl-C or SIGTERM waits for it."""
    previous = [signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)]
    try:
        yield
    finally:
        for s, handler in zip((signal.SIGINT, signal.SIGTERM), previous):
            signal.signal(s, handler)
