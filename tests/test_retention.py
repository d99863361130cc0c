"""Retention as a user meets it: sim jobs through real ingerod (node-wide), fleetd and echod,
then ``echod db retention`` with a short raw window, as it will be due days later. The raw
events of the summarized kinds are gone outside the evidence window around the verdict; the
summaries, the verdicts and that window stay; every tool still answers, and what it answers
from summaries and verdicts is what it answered before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

import echod.tools  # noqa: F401  (registers the tools)
from echod.registry import REGISTRY
from sim import scenario as scenarios

from .support import assert_same_lags, lag_quartiles, needs_ebpf, said

pytestmark = [pytest.mark.slow, needs_ebpf]

EVIDENCE_S = 1.0
LATE, HEALTHY = "4101", "4102"
LATE_RANK = 3
EVENTS = "SELECT job, kind, count(*) FROM events WHERE job IN ('4101', '4102') GROUP BY 1, 2"
SUMMARIES = ("SELECT job, kind, op, sum(calls), sum(timed), sum(duration_ns), sum(bytes) "
             "FROM call_stats WHERE job IN ('4101', '4102') GROUP BY 1, 2, 3")
IN_WINDOW = ("SELECT count(*) FROM events WHERE job = '4101' AND kind = 'collective' "
             "AND t BETWEEN CAST('{lo}' AS timestamptz) AND CAST('{hi}' AS timestamptz)")


@pytest.fixture(scope="module")
def stack(two_nodes):
    """The stack this module shares with test_cli and test_rank_verdicts (conftest's
    ``two_nodes``), fleetd knowing both nodes' clocks before the first job (one job's lags are
    then compared across every rank from its first collective, in the raw survey and in
    fleetd's). conftest runs this module last on it: what the retention below thins of the
    earlier modules' jobs, none of them reads again."""
    return two_nodes


def held(verdicts: list[dict]) -> list[dict]:
    """The verdicts but when fleetd last stored them: it stores a live one again every 10 s
    while it holds the job (5 minutes after its last event), retention or not."""
    return [{k: v for k, v in verdict.items() if k != "last_seen"} for verdict in verdicts]


def run(stack, job_id: str, stragglers=(), steps: int = 240) -> None:
    scenario = scenarios.parse({"name": f"job-{job_id}", "stragglers": list(stragglers), "job": {
        "nodes": 2, "ranks_per_node": 2, "steps": steps, "step_ms": 20, "launcher": "srun",
        "allreduce_bytes": 1 << 20, "timeout_s": 60, "job_id": job_id}})
    result = stack.run(scenario)
    assert result.ok, result.describe()


def rows(stack, sql: str) -> set[tuple]:
    return {tuple(row) for row in stack.client().sql(sql)["rows"]}


def answers(stack) -> dict[str, dict]:
    """Every tool's answer about the two jobs, as the API gives them."""
    got = {}
    for name, tool in REGISTRY.tools.items():
        accepts = tool.input_schema.get("properties", {})
        for job in (LATE, HEALTHY):
            args = {"job": job} if "job" in accepts else {}
            if "rank" in tool.input_schema.get("required", ()):
                args["rank"] = LATE_RANK
            if name == "run_analysis":
                args = {"sql": f"SELECT count(*) FROM call_stats WHERE job = '{job}'"}
            got[f"{name} {job}"] = stack.tool(name, **args)
    return got


def test_past_a_short_raw_window_only_the_evidence_stays_and_every_tool_still_answers(stack):
    run(stack, LATE, [{"rank": LATE_RANK, "kind": "host_delay", "delay_ms": 60,
                       "from_step": 160}])
    run(stack, HEALTHY)
    verdicts = stack.tool("find_stragglers", job=LATE)["verdicts"]
    assert [(v["rank"], v["cause"]) for v in verdicts] == [(LATE_RANK, "host_work")], \
        "\n".join([*said(verdicts), stack.logs()])
    before = answers(stack)
    quartiles = {job: lag_quartiles(stack, job) for job in (LATE, HEALTHY)}
    stored, summaries = rows(stack, EVENTS), rows(stack, SUMMARIES)
    onset = min(datetime.fromisoformat(v["onset"] or v["raised"]) for v in verdicts)
    end = max(datetime.fromisoformat(v["cleared"] or v["last_seen"]) for v in verdicts)
    window = {"lo": onset - timedelta(seconds=EVIDENCE_S),
              "hi": end + timedelta(seconds=EVIDENCE_S)}
    evidence = rows(stack, IN_WINDOW.format(**window))

    later = (datetime.now(UTC) + timedelta(days=3)).strftime("%Y-%m-%d")
    done = stack.echod.echod("--config", "/dev/null", "--state-dir",
                             str(stack.echod.root / "state"), "--raw-days", "1",
                             "--evidence-window", str(EVIDENCE_S), "db", "retention",
                             "--as-of", later)
    assert done.returncode == 0, done.stderr
    today = f"events_{datetime.now(UTC):%Y%m%d}"
    assert done.stdout.startswith(f"thinned {today}: raw alloc, collective"), done.stdout

    # What is left of the raw events: the late job's collectives in the window around its
    # verdict, every one of them; nothing of the summarized kinds from the healthy job.
    after = {(job, kind): n for job, kind, n in rows(stack, EVENTS)}
    assert rows(stack, IN_WINDOW.format(**window)) == evidence
    assert after[(LATE, "collective")] == next(iter(evidence))[0] > 0
    assert after[(LATE, "collective")] < {(j, k): n for j, k, n in stored}[(LATE, "collective")]
    assert not {kind for job, kind in after if job == HEALTHY} & {"collective", "sync", "alloc",
                                                                  "free", "memcpy"}, after
    # The summaries and the verdicts are whole, and what is answered from them is the same.
    assert rows(stack, SUMMARIES) == summaries
    now = answers(stack)
    assert now.keys() == before.keys() and len(now) == 2 * len(REGISTRY.tools) >= 28
    for job in (LATE, HEALTHY):
        for name in ("collective_stats", "memcpy_bandwidth", "memory_hotspots", "anomalies"):
            assert now[f"{name} {job}"] == before[f"{name} {job}"], name
        assert held(now[f"find_stragglers {job}"]["verdicts"]) == \
            held(before[f"find_stragglers {job}"]["verdicts"])
        report, earlier = now[f"job_report {job}"], before[f"job_report {job}"]
        assert report["coverage"]["source"] == "summaries"
        assert self_work(report) == self_work(earlier)
        assert_same_lags(report, earlier, quartiles[job])
    explained, earlier = now[f"explain {LATE}"], before[f"explain {LATE}"]
    assert (explained["cause"], explained["fix"]) == (earlier["cause"], earlier["fix"])
    for part in ("sync", "preemptions", "blockio"):
        assert explained["evidence"][part] == earlier["evidence"][part], part
    assert held([explained["evidence"]["verdict"]]) == held([earlier["evidence"]["verdict"]])


def test_the_lag_survey_from_fleetd_s_summaries_answers_as_the_raw_collectives_do(stack):
    """job_report on one job two ways: from the raw collectives, and (1,200 entries, more than
    a cap of 1,000) from fleetd's per-rank lag summaries."""
    run(stack, "4103", [{"rank": 1, "kind": "host_delay", "delay_ms": 40, "from_step": 100}],
        steps=300)
    raw = stack.tool("job_report", job="4103")
    summed = stack.tool("job_report", job="4103", max_entries=1000)
    assert (raw["coverage"]["source"], summed["coverage"]["source"]) == ("events", "summaries")
    assert [r["rank"] for r in raw["top_stragglers"]] == [1], raw["top_stragglers"]
    assert_same_lags(summed, raw, lag_quartiles(stack, "4103"))


def self_work(report: dict) -> dict[int, tuple]:
    return {r["rank"]: (r["self_work_ms"], r["peers_self_work_ms"], r["verdict"], r["cause"])
            for r in report["per_rank"]}
