"""``make bench`` at its smoke size, as CI runs it: every benchmark runs end to end on the real
daemons and writes its result, summary line and section, so none of them rots unnoticed.
The figures are not judged here (timings are never asserted in tests); that each part ran
is, and the documents it generates are checked against the scripts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .support import needs_ebpf

pytestmark = [pytest.mark.slow, needs_ebpf]

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import all as bench_all  # noqa: E402


def test_every_benchmark_runs_at_smoke_size_and_documents_itself(tmp_path):
    done = subprocess.run([sys.executable, "-m", "bench.all", "--smoke", "--out", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    summaries = done.stdout.strip().splitlines()[-len(bench_all.BENCHMARKS):]
    assert [line.split(":")[0] for line in summaries] == bench_all.BENCHMARKS, done.stdout
    docs = (tmp_path / "benchmarks.md").read_text()
    for name in bench_all.BENCHMARKS:
        result = json.loads((tmp_path / f"{name}.json").read_text())
        assert result["measured"]["smoke"] is True
        assert f"`{name}.py`" in docs and "Not run yet" not in docs
    assert "(smoke size: not a measurement)" in docs
    # What bounds each figure ran too: the profiles, the CPU split, the SQL clock, the model.
    ingest = json.loads((tmp_path / "ingest_rate.json").read_text())
    assert set(ingest["cpu_us_per_event"]) == {"producers", "fleetd", "echod", "postgres"}
    assert set(ingest["profiles"]) == {"echod", "fleetd"}
    tools = json.loads((tmp_path / "tool_latency.json").read_text())["tools_warm"]
    assert all(0 < call["sql_s"] <= call["s"] and call["slowest_sql"] for call in tools.values())
    assert "µs of CPU per event" in docs and "in PostgreSQL" in docs
    # A busy node's agent at 4x the reference mix: every event the ranks made stored once.
    busy = json.loads((tmp_path / "agent_rate.json").read_text())
    assert busy["stored"] == busy["expected"], busy
    assert not any(busy["agent"][k] for k in ("events_lost", "events_dropped", "batches_dropped"))
    # fleetd sharded by job: both shards took pushes, the agents had every answer
    split = json.loads((tmp_path / "fleet_scale.json").read_text())["sharded"][0]
    assert split["shards"] == 2 and split["answered"] == split["pushed"] > 0
    assert all(0 < shard["pushes_share"] < 1 for shard in split["per_shard"]), split
    assert "### Sharded: several fleetds" in docs
    model = docs[docs.index("## Beyond one head node"):]
    assert "CPUs at 10,000 GPUs" in model and "Needs the full results" not in model


def test_the_stored_documents_are_what_the_stored_results_make():
    text, quoted = bench_all.documents(bench_all.RESULTS)
    assert (REPO / "docs" / "benchmarks.md").read_text() == text, \
        "docs/benchmarks.md is stale: run python -m bench.all --docs-only"
    readme = (REPO / "README.md").read_text()
    block = bench_all.QUOTE.search(readme)
    assert block and block[0].splitlines()[1:-1] == quoted, \
        "the README's figures are stale: run python -m bench.all --docs-only"
