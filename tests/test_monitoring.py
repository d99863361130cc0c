"""The monitoring files as an operator uses them: the alert rules pass promtool's checks and its
unit tests, every rule is tested both firing and quiet, the example Alertmanager and
Prometheus configurations pass amtool and promtool, and each metric a rule reads is one the
daemons export (by the names their code declares)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
MONITORING = REPO / "monitoring"
RULES = MONITORING / "ingero-rules.yml"
RULE_TESTS = MONITORING / "tests" / "ingero-rules.test.yml"


def tool(name: str, *args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess:
    assert shutil.which(name), f"{name} missing: make setup installs Debian's prometheus packages"
    return subprocess.run([name, *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def alerts() -> dict[str, dict]:
    return {rule["alert"]: rule for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"] if "alert" in rule}


def test_the_rules_pass_promtool_check_rules():
    done = tool("promtool", "check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_the_rules_pass_their_promtool_unit_tests():
    done = tool("promtool", "test", "rules", str(RULE_TESTS), cwd=RULE_TESTS.parent)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_every_rule_is_tested_firing_and_quiet():
    cases: dict[str, set[bool]] = {}
    for case in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            cases.setdefault(check["alertname"], set()).add(bool(check.get("exp_alerts")))
    assert {name: {False, True} for name in alerts()} == cases


def test_every_alert_has_a_severity_alertmanager_routes_and_words_for_people():
    routed = {m.split("=")[1].strip('"') for route in
              yaml.safe_load((MONITORING / "alertmanager.yml").read_text())["route"]["routes"]
              for m in route["matchers"] if m.startswith("severity=")}
    for name, rule in alerts().items():
        # a verdict's severity is its own label; the others set one
        severity = rule.get("labels", {}).get("severity")
        if severity is None:
            assert "ingero_fleet_verdict" in rule["expr"], name
        else:
            assert severity in routed, (name, severity)
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
    assert routed == {"critical", "major", "minor"}


def test_the_example_alertmanager_configuration_passes_amtool():
    done = tool("amtool", "check-config", "alertmanager.yml")
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_the_example_prometheus_configuration_passes_promtool(tmp_path):
    config = yaml.safe_load((MONITORING / "prometheus.yml").read_text())
    assert config["rule_files"] == ["/etc/prometheus/ingero-rules.yml"]
    config["rule_files"] = [str(RULES)]       # where this checkout has it
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = tool("promtool", "check", "config", "--syntax-only", str(tmp_path / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    used = set(re.findall(r'job(?:=~?)"([^"]+)"', RULES.read_text()))
    assert {j for u in used for j in u.split("|")} <= jobs


def declared_metrics() -> set[str]:
    """The metric names the daemons' code declares, as Prometheus sees them."""
    from echod.api.metrics import ApiMetrics
    from echod.metrics import EchoMetrics
    from fleetd.metrics import FleetMetrics
    from ingerod.metrics import AgentMetrics

    names = set()
    for metrics in (FleetMetrics(), AgentMetrics(), EchoMetrics(), ApiMetrics()):
        for family in metrics.registry.collect():
            names |= {sample.name for sample in family.samples}
            names.add(family.name)
            names |= {family.name + suffix for suffix in {
                "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
                "info": ("_info",)}.get(family.type, ())}
    return names


def test_every_metric_a_rule_reads_is_one_the_daemons_declare():
    declared = declared_metrics()
    read = {name for rule in alerts().values()
            for name in re.findall(r"\b(ingero_[a-z_]+)", rule["expr"])}
    assert read and read <= declared, read - declared


DASHBOARDS = sorted((MONITORING / "grafana" / "dashboards").glob("*.json"))


def test_the_dashboards_are_the_three_promised_each_provisionable_from_its_file():
    boards = {p.name: json.loads(p.read_text()) for p in DASHBOARDS}
    assert sorted(boards) == ["ingero-daemons.json", "ingero-fleet.json", "ingero-job.json"]
    assert len({b["uid"] for b in boards.values()}) == 3
    for name, board in boards.items():
        assert board["templating"]["list"][0]["type"] == "datasource", name
        for panel in board["panels"]:
            grid = panel["gridPos"]
            assert grid["x"] + grid["w"] <= 24 and panel["targets"], (name, panel["title"])
            assert all(t["datasource"]["uid"] == "${datasource}" for t in panel["targets"])
    job = boards["ingero-job.json"]
    assert [v["name"] for v in job["templating"]["list"]] == ["datasource", "job"]
    annotations = [a for a in job["annotations"]["list"] if "expr" in a]
    assert annotations and 'job_id="$job"' in annotations[0]["expr"]
    provider = yaml.safe_load((MONITORING / "grafana/provisioning/ingero-dashboards.yaml")
                              .read_text())["providers"][0]
    assert provider["type"] == "file" and provider["options"]["path"]


def test_every_metric_a_dashboard_reads_is_one_the_daemons_declare():
    declared = declared_metrics()
    for board in DASHBOARDS:
        data = json.loads(board.read_text())
        exprs = [t["expr"] for p in data["panels"] for t in p["targets"]]
        exprs += [a["expr"] for a in data["annotations"]["list"] if "expr" in a]
        exprs += [v["definition"] for v in data["templating"]["list"] if "definition" in v]
        read = {name for expr in exprs for name in re.findall(r"\b(ingero_[a-z_]+)", expr)}
        assert read and read <= declared, (board.name, read - declared)
