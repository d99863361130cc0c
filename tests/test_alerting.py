"""Alerts as an operator receives them: a real Prometheus (Debian's) scrapes real fleetd, echod
and node-wide ingerods and evaluates the shipped rules (monitoring/ingero-rules.yml); a real
Alertmanager (Debian's) routes what fires to a webhook receiver in this test. A sim job, started
by the real Slurm prolog, has a rank late for a while and then on time again: the straggler
alert reaches the receiver with the job, user, rank and cause, and resolves when the rank
recovers; once the job is over and its time to live has passed, no series names it.

Every daemon of the stack logs as under systemd (JOURNAL_STREAM names its log), so its lines
carry the syslog priority journald keeps.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

import sim
from stack import local as stack_module
from stack.launch import Daemon, free_port, wait_for
from sim import scenario as scenarios
from sim.cluster import Cluster

from .support import needs_ebpf, scrape, why

pytestmark = [pytest.mark.slow, needs_ebpf]

REPO = Path(__file__).resolve().parent.parent
RULES = REPO / "monitoring" / "ingero-rules.yml"
PUSH_S = 1.0
JOB_TTL_S = 8.0


class Receiver:
    """An HTTP endpoint that keeps what is POSTed to it: (path, headers, body)."""

    def __init__(self, port: int | None = None):
        self.port = port or free_port()
        self.received: list[tuple[str, dict, bytes]] = []
        self.lock = threading.Lock()
        self.server = None

    def start(self) -> "Receiver":
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with owner.lock:
                    owner.received.append((self.path, dict(self.headers), body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None

    def posts(self, path: str) -> list[dict]:
        with self.lock:
            return [json.loads(body) for p, _, body in self.received if p == path]


def run_hook(hook: str, stack, node: int, job: str, user: str) -> None:
    """The shipped Slurm hook (slurm/prolog), as slurmd runs it on the job's node."""
    env = {"PATH": os.environ["PATH"], "INGERO_PYTHON": sys.executable,
           "INGERO_SLURM_DEFAULTS": "/dev/null", "SLURM_SCRIPT_CONTEXT": f"{hook}_slurmd",
           "SLURM_JOB_ID": job, "SLURM_JOB_USER": user, "SLURMD_NODENAME": f"node{node}",
           "SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_CLUSTER_NAME": "sim",
           "INGERO_JOBS_DIR": str(stack.root / f"jobs-node{node}"),
           "INGERO_CONTROL_SOCKET": str(stack.root / f"ingerod-node{node}.sock"),
           "INGERO_HOOK_AGENT": "node", "PYTHONPATH": str(REPO)}
    done = subprocess.run([str(REPO / "slurm" / "prolog")], env=env, capture_output=True,
                          timeout=10)
    assert done.returncode == 0, done


class Monitoring:
    """Prometheus scraping the stack every second with the shipped rules, and Alertmanager
    sending every group to the receiver at once, resolutions included."""

    def __init__(self, root: Path, stack, agent_ports: list[int], echod_port: int,
                 receiver: Receiver):
        root.mkdir(parents=True, exist_ok=True)
        self.am_port, self.prom_port = free_port(), free_port()
        self.agent_ports, self.echod_port = agent_ports, echod_port
        (root / "alertmanager.yml").write_text(yaml.safe_dump({
            "route": {"receiver": "test", "group_by": ["alertname", "job_id", "rank"],
                      "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
            "receivers": [{"name": "test", "webhook_configs": [{
                "url": f"http://127.0.0.1:{receiver.port}/alertmanager",
                "send_resolved": True}]}]}))
        (root / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "alerting": {"alertmanagers": [{"static_configs": [
                {"targets": [f"127.0.0.1:{self.am_port}"]}]}]},
            "scrape_configs": [
                {"job_name": "ingerod", "static_configs": [
                    {"targets": [f"127.0.0.1:{p}" for p in agent_ports]}]},
                {"job_name": "fleetd", "static_configs": [
                    {"targets": [f"127.0.0.1:{stack.fleet_port}"]}]},
                {"job_name": "echod", "static_configs": [
                    {"targets": [f"127.0.0.1:{echod_port}"]}]}]}))
        self.alertmanager = Daemon("alertmanager", [
            "prometheus-alertmanager", f"--config.file={root / 'alertmanager.yml'}",
            f"--storage.path={root / 'am'}", f"--web.listen-address=127.0.0.1:{self.am_port}",
            "--cluster.listen-address="], root)
        self.prometheus = Daemon("prometheus", [
            "prometheus", f"--config.file={root / 'prometheus.yml'}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.prom_port}"], root)
        assert wait_for(lambda: self.ready(), 60), (self.alertmanager.log()[-3000:],
                                                    self.prometheus.log()[-3000:])

    def ready(self) -> bool:
        try:
            for port, path in ((self.am_port, "/-/ready"), (self.prom_port, "/-/ready")):
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2):
                    pass
        except OSError:
            return False
        return all(t["health"] == "up" for t in self.api("targets")["activeTargets"]) and \
            bool(self.api("targets")["activeTargets"])

    def api(self, what: str, **params) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"http://127.0.0.1:{self.prom_port}/api/v1/{what}?{query}",
                                    timeout=10) as answer:
            return json.load(answer)["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    def stop(self) -> list[int]:
        return [self.prometheus.stop(), self.alertmanager.stop()]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    sim.build()
    root = tmp_path_factory.mktemp("alerting")
    agent_ports, echod_port = [free_port(), free_port()], free_port()
    hook = Receiver()              # fleetd's webhook receiver: down until a test starts it
    secret = root / "webhook.secret"
    secret.write_text("s3cret-shared-with-the-receiver\n")
    secret.chmod(0o600)
    stack = stack_module.Stack(
        root, 2, push_s=PUSH_S, journal=True,
        fleet_flags=("--job-ttl", str(JOB_TTL_S),
                     "--on-verdict", f"http://127.0.0.1:{hook.port}/verdicts",
                     "--on-verdict-secret-file", str(secret)),
        echod_root=Path(tempfile.mkdtemp(prefix="echod-alerting-")),
        echod_flags=("--metrics-addr", f"127.0.0.1:{echod_port}"),
        node_flags={n: ("--metrics-addr", f"127.0.0.1:{p}") for n, p in enumerate(agent_ports)})
    receiver = Receiver().start()
    try:
        monitoring = Monitoring(root / "monitoring", stack, agent_ports, echod_port, receiver)
    except BaseException:
        receiver.stop()
        stack.stop()
        raise
    stack.monitoring, stack.receiver = monitoring, receiver
    stack.hook, stack.hook_down_since, stack.secret = hook, time.monotonic(), secret
    yield stack
    receiver.stop()
    hook.stop()
    assert monitoring.stop() == [0, 0]
    assert stack.stop() == [0, 0, 0, 0], stack.logs()


def late_then_on_time(job_id: str, late: int) -> scenarios.Scenario:
    """Rank ``late`` 250 ms late each step from step 10 to 50, on time for the 150 after."""
    return scenarios.parse({"name": f"job-{job_id}", "job": {
        "nodes": 2, "ranks_per_node": 4, "steps": 200, "step_ms": 50,
        "allreduce_bytes": 1 << 20, "timeout_s": 60, "job_id": job_id},
        "stragglers": [{"rank": late, "kind": "host_delay", "delay_ms": 250, "from_step": 10,
                        "until_step": 50}]})


def alerts_of(receiver: Receiver, status: str, alertname: str, job: str) -> list[dict]:
    """The alerts Alertmanager has sent in this state, of this rule and job."""
    return [alert for post in receiver.posts("/alertmanager") for alert in post["alerts"]
            if alert["status"] == status and alert["labels"]["alertname"] == alertname
            and alert["labels"].get("job_id") == job]


def test_a_late_rank_fires_the_straggler_alert_to_the_receiver_and_it_resolves(stack):
    job, late = "4242", 5
    for node in (0, 1):
        run_hook("prolog", stack, node, job, "alice")
    with Cluster(late_then_on_time(job, late), stack.root / f"job-{job}") as cluster:
        fired = wait_for(lambda: alerts_of(stack.receiver, "firing", "IngeroStragglerCritical",
                                           job), 60, 0.2)
        assert fired, why(stack.receiver.received, stack.logs())
        labels = fired[0]["labels"]
        assert {k: labels[k] for k in ("job_id", "user", "rank", "node", "cause", "severity",
                                       "cluster")} == {
            "job_id": job, "user": "alice", "rank": str(late), "node": "node1",
            "cause": "host_work", "severity": "critical", "cluster": "sim"}, labels
        assert f"ingero explain -j {job} --rank {late}" in fired[0]["annotations"]["description"]
        # while it is live the verdict's series carry its lag and cost too
        live = {r["metric"]["__name__"]: float(r["value"][1]) for r in
                stack.monitoring.query(f'{{job_id="{job}", rank="{late}"}}')}
        assert live["ingero_fleet_verdict"] == 1, live
        assert live["ingero_fleet_verdict_lag_seconds"] == pytest.approx(0.25, abs=0.03), live
        # the rank is on time again: fleetd clears the verdict, its series goes, and the alert
        # resolves while the job still runs
        resolved = wait_for(lambda: alerts_of(stack.receiver, "resolved",
                                              "IngeroStragglerCritical", job), 60, 0.2)
        assert resolved, why(stack.receiver.received, stack.logs())
        result = cluster.wait()
    assert result.ok, result.describe()
    for node in (0, 1):
        run_hook("epilog", stack, node, job, "alice")
    # one alert for the one late rank, and nothing else about this job
    named = {(a["labels"]["alertname"], a["labels"]["rank"])
             for post in stack.receiver.posts("/alertmanager") for a in post["alerts"]
             if a["labels"].get("job_id") == job}
    assert named == {("IngeroStragglerCritical", str(late))}, named
    # fleetd said it at error in the journal's terms (a critical verdict), cleared at info
    fleet_log = stack.fleetd.log()
    assert re.search(rf"^<3>fleetd: ERROR straggler job {job} rank {late} on node1: .*, "
                     r"critical$", fleet_log, re.M), fleet_log[-3000:]
    assert re.search(rf"^<6>fleetd: INFO straggler cleared: job {job} rank {late} ", fleet_log,
                     re.M), fleet_log[-3000:]
    # After the job's time to live, no series names it: not in fleetd's metrics, not in
    # Prometheus (a series that went is stale there at once)
    def gone():
        names_job = [k for k in scrape(stack.fleet_port) if (("job_id", job) in k[1])]
        return not names_job and not stack.monitoring.query(f'{{job_id="{job}"}}')
    assert wait_for(gone, JOB_TTL_S + 20, 0.5), stack.monitoring.query(f'{{job_id="{job}"}}')


def test_every_daemon_logs_with_the_syslog_priority_journald_keeps(stack):
    """Under systemd (JOURNAL_STREAM names stderr) every line starts <N>; warnings are <4>."""
    for daemon in stack.daemons:
        lines = [line for line in daemon.log().splitlines()
                 if line.startswith(f"{daemon.module}: ") or line.startswith("<")]
        ours = [line for line in lines if re.match(r"^<[0-7]>(fleetd|echod|ingerod): ", line)]
        assert ours and len(ours) == len(lines), (daemon.name, lines[:20])
        for line in ours:
            priority, level = re.match(r"^<(\d)>\w+: (\w+) ", line).groups()
            assert {"DEBUG": "7", "INFO": "6", "WARNING": "4", "ERROR": "3",
                    "CRITICAL": "2"}[level] == priority, line


def test_the_build_info_of_every_daemon_reaches_prometheus(stack):
    from ingero import __version__

    found = {r["metric"]["job"]: r["metric"]["version"] for r in stack.monitoring.query(
        '{__name__=~"ingero_(fleet|agent|echo)_build_info"}')}
    assert found == {"fleetd": __version__, "ingerod": __version__, "echod": __version__}


def test_a_per_job_agent_writes_its_metrics_for_node_exporter_labelled_with_its_job(
        spawn, keys, endpoint, tmp_path):
    """ingerod@JOB serves no port (jobs share nodes); it writes a file node_exporter's textfile
    collector reads, every series labelled with its job, and takes it away when it stops."""
    from prometheus_client.parser import text_string_to_metric_families

    from ingero import __version__

    textfile = tmp_path / "textfile" / "ingerod-77.prom"
    textfile.parent.mkdir()
    score = tmp_path / "score"
    score.write_text("0.9\n")
    spawn("fleetd", "fleetd", ["--config", "/dev/null", "--bind", endpoint, "--metrics-addr",
                               "none", *keys.fleetd_flags()])
    agent = spawn("ingerod-77", "ingerod", [
        "--config", "/dev/null", "--source", "synthetic", "--score-file", str(score),
        "--node", "n1", "--cluster", "c", "--job", "77", "--fleet", endpoint,
        "--push-interval", "0.2", "--metrics-addr", "none", "--metrics-textfile",
        str(textfile), "--jobs-dir", str(tmp_path / "jobs"), *keys.ingerod_flags()],
        journal=True)

    seen: list[dict] = [{}]

    def answered() -> dict:
        # the file is written each cycle before that cycle's push: a file that counts a push
        # may predate fleetd's answer to it (fleetd may still be starting), so wait for both
        if not textfile.exists():
            return {}
        seen[0] = samples = {s.name: s for family in text_string_to_metric_families(
            textfile.read_text()) for s in family.samples}
        pushed = samples.get("ingero_agent_batches_pushed_total")
        reachable = samples.get("ingero_agent_fleet_reachable")
        return samples if pushed and pushed.value > 0 and reachable and reachable.value == 1 \
            else {}

    samples = wait_for(answered, 60, 0.2)
    assert samples, (seen[0], agent.log())
    assert all(s.labels.get("job_id") == "77" for s in samples.values()), samples
    assert samples["ingero_agent_build_info"].labels["version"] == __version__
    assert samples["ingero_agent_events_lost_total"].value == 0
    assert [p.name for p in textfile.parent.iterdir()] == [textfile.name], "no temporary left"
    assert agent.stop() == 0
    assert not textfile.exists(), "a finished job's series go with its agent"
    assert "<6>ingerod: INFO" in agent.log()


def late_rank(job_id: str, late: int, steps: int = 60) -> scenarios.Scenario:
    """Rank ``late`` 250 ms late at every step from step 5 to the job's end."""
    return scenarios.parse({"name": f"job-{job_id}", "job": {
        "nodes": 2, "ranks_per_node": 4, "steps": steps, "step_ms": 20,
        "allreduce_bytes": 1 << 20, "timeout_s": 60, "job_id": job_id},
        "stragglers": [{"rank": late, "kind": "host_delay", "delay_ms": 250, "from_step": 5}]})


def run_job(stack, job: str, user: str, scenario: scenarios.Scenario) -> None:
    for node in (0, 1):
        run_hook("prolog", stack, node, job, user)
    with Cluster(scenario, stack.root / f"job-{job}") as cluster:
        result = cluster.wait()
    assert result.ok, result.describe()
    for node in (0, 1):
        run_hook("epilog", stack, node, job, user)


def kept_notices(stack) -> dict[str, dict]:
    """The notices waiting in fleetd's spool for the webhook, by id."""
    from ingero.framefile import decode

    kept = {}
    for path in (stack.root / "fleetd-spool" / "notices").glob("webhook-*/*.notice"):
        try:
            payload = json.loads(decode(path.read_bytes())[0])
        except (OSError, ValueError):
            continue                          # removed as it was read
        kept[payload["id"]] = payload
    return kept


def test_a_webhook_down_for_30_s_and_fleetd_killed_meanwhile_still_gets_every_notice_once(
        stack):
    """Notices wait in fleetd's spool while the receiver is down, across a kill -9 of fleetd;
    once it is up it gets each one, exactly once by its id, each valid against the documented
    schema and signed; a tampered body or another secret fails the check."""
    from jsonschema import Draft202012Validator, FormatChecker

    from ingero import webhook

    run_job(stack, "4343", "bob", late_rank("4343", 6))
    assert wait_for(lambda: any(n["job"] == "4343" for n in kept_notices(stack).values()),
                    30), stack.fleetd.log()[-3000:]
    # kill -9 fleetd as a crash would, and start it again as systemd would
    old = stack.fleetd
    stack.fleetd = stack.fleetds[0] = old.restarted()
    stack.daemons[stack.daemons.index(old)] = stack.fleetd
    assert wait_for(lambda: stack.fleetd.log().count("listening on") >= 2, 60), \
        stack.fleetd.log()
    assert "kept from the last run, to be sent" in stack.fleetd.log()
    run_job(stack, "4344", "bob", late_rank("4344", 2))
    # the job's verdict clears when fleetd drops the job (its time to live after the end)
    assert wait_for(lambda: any(n["job"] == "4344" and n["event"] == "cleared"
                                for n in kept_notices(stack).values()), JOB_TTL_S + 30), \
        stack.fleetd.log()[-3000:]
    time.sleep(max(0.0, 30.0 - (time.monotonic() - stack.hook_down_since)))
    made = kept_notices(stack)             # nothing was delivered: every notice fleetd made
    said = {(n["job"], n["rank"], n["event"]) for n in made.values()
            if n["job"] in ("4343", "4344")}
    # (a verdict may also escalate on the way; fleetd killed, 4343's never clears)
    assert {("4343", 6, "raised"), ("4344", 2, "raised"), ("4344", 2, "cleared")} <= said <= {
        ("4343", 6, "raised"), ("4343", 6, "escalated"), ("4344", 2, "raised"),
        ("4344", 2, "escalated"), ("4344", 2, "cleared")}, made

    stack.hook.start()
    assert wait_for(lambda: not kept_notices(stack) and
                    len(stack.hook.received) >= len(made), 90), stack.fleetd.log()[-3000:]
    time.sleep(2 * PUSH_S)                  # nothing more comes
    received = [(json.loads(body), headers, body) for _, headers, body in stack.hook.received]
    ids = [payload["id"] for payload, _, _ in received]
    assert sorted(ids) == sorted(made), "each notice once, by its id"

    validator = Draft202012Validator(webhook.schema(), format_checker=FormatChecker())
    secret = stack.secret.read_bytes().strip()
    for payload, headers, body in received:
        assert not list(validator.iter_errors(payload)), (payload,
                                                          list(validator.iter_errors(payload)))
        webhook.verify(secret, headers.get(webhook.SIGNATURE), body)
        with pytest.raises(webhook.BadSignature):
            webhook.verify(secret, headers.get(webhook.SIGNATURE),
                           body.replace(f'"rank": {payload["rank"]}'.encode(), b'"rank": 99'))
        with pytest.raises(webhook.BadSignature):
            webhook.verify(b"another secret", headers.get(webhook.SIGNATURE), body)
    raised = next(p for p, _, _ in received if p["job"] == "4344" and p["event"] == "raised")
    assert (raised["user"], raised["node"], raised["cause"], raised["severity"]) == \
        ("bob", "node0", "host_work", "critical"), raised
    assert raised["lag_ms"] == pytest.approx(250, rel=0.1) and raised["cost"]["gpu_seconds"] > 0
    assert raised["explain"] == "ingero explain -j 4344 --rank 2 --cluster sim"
    assert raised["text"].startswith("ingero: straggler: job 4344 (bob) rank 2 on node0: ")
    cleared = next(p for p, _, _ in received if p["job"] == "4344" and p["event"] == "cleared")
    assert cleared["verdict_id"] == raised["verdict_id"] and cleared["cleared"]


DASHBOARDS = sorted((REPO / "monitoring" / "grafana" / "dashboards").glob("*.json"))


def dashboard_queries(path: Path) -> list[str]:
    """Every PromQL expression a dashboard runs: its panels' targets and its annotations."""
    board = json.loads(path.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    return exprs


def served_names(stack) -> set[str]:
    """The metric names the stack's daemons serve now, families and samples (echod's API
    metrics from the API, with the token)."""
    import ssl

    from prometheus_client.parser import text_string_to_metric_families

    texts = []
    for port in (stack.fleet_port, *stack.monitoring.agent_ports, stack.monitoring.echod_port):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            texts.append(answer.read().decode())
    context = ssl.create_default_context(cafile=str(stack.echod.cert))
    request = urllib.request.Request(f"{stack.echod.url}/metrics",
                                     headers={"Authorization": f"Bearer {stack.token}"})
    with urllib.request.urlopen(request, timeout=10, context=context) as answer:
        texts.append(answer.read().decode())
    names = set()
    for text in texts:
        for family in text_string_to_metric_families(text):
            names.add(family.name)
            names |= {family.name + suffix for suffix in {
                "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "info": ("_info",)}.get(family.type, ())}
            names |= {sample.name for sample in family.samples}
    return names


@pytest.mark.parametrize("board", DASHBOARDS, ids=lambda p: p.stem)
def test_every_dashboard_query_reads_served_metrics_and_runs_in_prometheus(stack, board):
    served = served_names(stack)
    exprs = dashboard_queries(board)
    assert exprs
    for expr in exprs:
        used = set(re.findall(r"\b(ingero_[a-z_]+)", expr))
        assert used <= served, (board.name, expr, used - served)
        promql = expr.replace("$__rate_interval", "1m").replace("$job", "4242")
        answer = stack.monitoring.api("query", query=promql)
        assert answer["resultType"] in ("vector", "matrix", "scalar"), (expr, answer)
