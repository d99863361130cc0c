"""The ``ingero`` CLI as an operator runs it, against a job that really ran: sim ranks traced by
node-wide ingerods (real bcc), fleetd's verdicts, echod's store, read over HTTPS with a token.

One job (rank 3 late on the host), on the stack this module shares with test_rank_verdicts
and test_retention (conftest's ``two_nodes``), serves the module; each test runs the real
command line (``python -m ingero``) with INGERO_URL, INGERO_TOKEN_FILE and INGERO_CA_CERT set
as a user's shell would, and asserts on what it prints.
"""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import subprocess
import sys
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from stack.launch import free_port
from stack.local import self_signed
from sim import scenario as scenarios
from ingero import __version__

from .support import needs_ebpf

pytestmark = [pytest.mark.slow, needs_ebpf]

JOB, LATE = "7001", 3


@pytest.fixture(scope="module")
def stack(two_nodes):
    """The shared two-node stack once this module's job has run on it and been judged. conftest
    runs this module first on that stack, so the job is the only one echod has seen: the
    windows read without -j find it alone."""
    stack = two_nodes
    scenario = scenarios.parse({"name": "cli", "job": {
        "nodes": 2, "ranks_per_node": 2, "steps": 30, "step_ms": 20, "job_id": JOB,
        "timeout_s": 30}, "stragglers": [
        {"rank": LATE, "kind": "host_delay", "delay_ms": 60, "from_step": 5}]})
    stack.started = datetime.now().astimezone()
    result = stack.run(scenario)
    assert result.ok, result.describe()
    stack.ended = datetime.now().astimezone()
    token = stack.root / "token"
    token.write_text(stack.token + "\n")
    stack.env = {"INGERO_URL": stack.echod.url, "INGERO_TOKEN_FILE": str(token),
                 "INGERO_CA_CERT": str(stack.echod.cert)}
    return stack


def ingero(stack, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INGERO_")}
    return subprocess.run([sys.executable, "-m", "ingero", *args], capture_output=True,
                          text=True, timeout=120, cwd=stack.root,
                          env={**clean, "HOME": str(stack.root), **(env or stack.env)})


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_report_default_layout_has_a_row_per_rank_and_names_the_late_one(stack):
    lines = ok(ingero(stack, "report", "-j", JOB)).splitlines()
    header, dashes, *rows = lines
    assert header.split()[:4] == ["JobID", "Step", "Node", "Rank"]
    assert set(dashes.replace(" ", "")) == {"-"}
    assert len(rows) == 4
    by_rank = {int(row.split()[3]): row for row in rows}
    assert "host_work" in by_rank[LATE] and "persistent" in by_rank[LATE]
    assert all("host_work" not in row for rank, row in by_rank.items() if rank != LATE)
    # every column lines up under its dashes
    ends = [i for i, c in enumerate(dashes) if c == "-" and (i + 1 == len(dashes)
                                                            or dashes[i + 1] == " ")]
    assert all(len(row) == len(dashes) for row in rows)
    assert all(row[end] != " " for row in rows for end in ends[:5])


def test_report_format_with_widths_parsable_noheader_and_json(stack):
    text = ok(ingero(stack, "report", "-j", JOB, "-o", "JobID%6,Rank%-4,LagP50%9,Cause"))
    header, dashes, *rows = text.splitlines()
    assert dashes == "------ ---- --------- ---------------"
    assert header == " JobID Rank    LagP50           Cause"
    late = next(row for row in rows if row[7:11] == f"{LATE}   ")
    assert float(late[12:21]) > 40
    assert ok(ingero(stack, "report", "-j", JOB, "-p", "-o", "rank,cause")).splitlines()[0] \
        == "Rank|Cause|"
    parsable2 = ok(ingero(stack, "report", "-j", JOB, "-P", "-n", "-o", "rank,cause"))
    assert f"{LATE}|host_work" in parsable2.splitlines() and "Rank" not in parsable2
    assert all(line.count("|") == 1 for line in parsable2.splitlines())
    answer = json.loads(ok(ingero(stack, "report", "-j", JOB, "--json")))
    assert answer["meta"]["command"] == ["ingero", "report", "-j", JOB, "--json"]
    assert answer["meta"]["ingero"]["version"] == __version__
    [job] = answer["jobs"]                  # as sacct --json: the job, its ranks inside
    assert job["job"] == JOB and job["ranks"] == 4
    assert sorted(r["rank"] for r in job["per_rank"]) == [0, 1, 2, 3]
    late = next(r for r in job["per_rank"] if r["rank"] == LATE)
    assert late["cause"] == "host_work"
    assert late["lag_median_ms"] > 40 and late["lag_p99_ms"] >= late["lag_median_ms"]
    assert late["last_share"] > 0.5 and late["cost_gpu_seconds"] > 0


def test_report_truncates_a_value_wider_than_its_column_with_a_plus(stack):
    text = ok(ingero(stack, "report", "-j", JOB, "-n", "-o", "rank%2,cause%5"))
    assert f" {LATE} host+" in text.splitlines()


def test_report_one_line_per_job_and_the_time_window(stack):
    one = ok(ingero(stack, "report", "-X", "-j", JOB, "-P", "-n",
                    "-o", "jobid,ranks,stragglers")).splitlines()
    assert one == [f"{JOB}|4|1"]
    later = (stack.ended + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")
    assert ok(ingero(stack, "report", "-j", JOB, "-n", "-S", later)) == ""
    assert ok(ingero(stack, "report", "-j", JOB, "-n", "-S", "now-1hour",
                     "-E", "now")).count("\n") == 4
    assert ok(ingero(stack, "report", "-n", "-S", "now-1hour")).count("\n") == 4
    assert ok(ingero(stack, "report", "-n", "-S", "now+1hour")) == ""
    assert ok(ingero(stack, "jobs", "-n", "-P", "-o", "jobid", "-S", "today")) == f"{JOB}\n"
    assert ok(ingero(stack, "jobs", "-n", "-E", "now-1day")) == ""
    assert ok(ingero(stack, "jobs", "-n", "-S", "now-2days", "-E", "now-1day")) == ""


def test_an_unknown_job_prints_no_row_and_exits_0(stack):
    assert ok(ingero(stack, "report", "-j", "9999", "-n")) == ""
    assert json.loads(ok(ingero(stack, "report", "-j", "9999", "--json")))["jobs"] == []


def test_stragglers_and_explain_say_it_in_words(stack):
    assert f"rank {LATE} on node1: late by" in ok(ingero(stack, "stragglers"))
    text = ok(ingero(stack, "explain", "-j", JOB))
    first = text.splitlines()[0]
    assert first.startswith(("CRITICAL", "MAJOR", "MINOR")), text
    assert f"rank {LATE} on node1" in first and "what to do:" in text
    assert "\033[" not in text                      # no colour off a terminal


def test_every_command_takes_a_list_of_jobs_and_of_clusters(stack):
    [job] = json.loads(ok(ingero(stack, "jobs", "-j", JOB, "--json")))["jobs"]
    listed = ["jobs", "-n", "-P", "-o", "JobID", "-S", "today"]
    for clusters in (job["cluster"], "all", f"elsewhere,{job['cluster']}"):
        assert ok(ingero(stack, *listed, "-M", clusters)) == f"{JOB}\n", clusters
    assert ok(ingero(stack, *listed, "-M", "elsewhere")) == ""
    assert ok(ingero(stack, "report", "-j", JOB, "-n", "-M", "elsewhere")) == ""
    assert ok(ingero(stack, "report", "-j", JOB, "-n", "-M", job["cluster"])).count("\n") == 4
    assert ok(ingero(stack, "stragglers", "-j", f"9999,{JOB}", "-M", job["cluster"])) \
        .count(f"rank {LATE} on node1: late by") >= 1
    assert "no straggler verdict" in ok(ingero(stack, "stragglers", "-M", "elsewhere"))
    explained = ok(ingero(stack, "explain", "-j", f"{JOB},9999"))
    assert f"job {JOB} rank {LATE} on node1" in explained.splitlines()[0]
    assert "job 9999: echod knows no such job" in explained
    answer = json.loads(ok(ingero(stack, "explain", "-j", JOB, "--json")))
    assert [e["rank"] for e in answer["explanations"]] == [LATE] and "meta" in answer
    # export: a job echod knows not is refused before anything is written; one file per job,
    # named by %j as sbatch -o names its files
    unknown = ingero(stack, "export", "-j", f"{JOB},9999", "-o", str(stack.root / "t-%j.json"))
    assert unknown.returncode == 1 and "9999" in unknown.stderr, unknown.stderr
    assert not list(stack.root.glob("t-*.json"))
    each = ingero(stack, "export", "-j", JOB, "-M", job["cluster"], "-o",
                  str(stack.root / "t-%j.json"))
    assert each.returncode == 0, each.stderr
    assert json.loads((stack.root / f"t-{JOB}.json").read_text())["traceEvents"]


def test_field_lists_need_no_server_and_colour_only_on_a_terminal_unless_refused(stack):
    for command in ("report", "jobs", "nodes"):
        fields = ingero(stack, command, "-e", env={})          # no URL, no token
        assert fields.returncode == 0, (command, fields.stderr)
        assert ("NodeName" if command == "nodes" else "JobID") in fields.stdout, command
    for extra, env, coloured in (((), {}, True), (("--no-color",), {}, False),
                                 ((), {"NO_COLOR": "1"}, False)):
        leader, follower = pty.openpty()
        clean = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR",)}
        done = subprocess.run([sys.executable, "-m", "ingero", *extra, "explain", "-j", JOB],
                              stdout=follower, stderr=subprocess.PIPE, timeout=120,
                              env={**clean, "HOME": str(stack.root), **stack.env, **env})
        os.close(follower)
        text = b""
        while chunk := _read(leader):
            text += chunk
        os.close(leader)
        assert done.returncode == 0, done.stderr
        assert (b"\033[" in text) == coloured, (extra, env, text[:200])


def _read(fd: int) -> bytes:
    try:
        return os.read(fd, 65536)
    except OSError:                 # EIO: the writer has gone
        return b""


def test_the_users_client_file_is_read_over_the_sites(stack, tmp_path):
    from ingero.command import client
    site, user = tmp_path / "site.yaml", tmp_path / "user.yaml"
    site.write_text(f"url: {stack.echod.url}\nca_cert: {stack.env['INGERO_CA_CERT']}\n"
                    "timeout: 30\n")
    user.write_text(f"token_file: {stack.env['INGERO_TOKEN_FILE']}\ntimeout: 45\n")
    both = client.settings(None, {}, {}, site=site, user=user)
    assert (both.url, str(both.ca_cert), str(both.token_file), both.timeout) == (
        stack.echod.url, stack.env["INGERO_CA_CERT"], stack.env["INGERO_TOKEN_FILE"], 45.0)
    assert client.settings(None, {}, {}, site=site, user=tmp_path / "none").timeout == 30.0
    assert client.settings(str(user), {}, {}, site=tmp_path / "none").url is None
    # as a user runs it: their file under HOME holds the token, the environment the rest
    home = tmp_path / "home"
    (home / ".config/ingero").mkdir(parents=True)
    (home / ".config/ingero/ingero.yaml").write_text(user.read_text())
    clean = {k: v for k, v in os.environ.items() if not k.startswith("INGERO_")}
    done = subprocess.run([sys.executable, "-m", "ingero", "jobs", "-n", "-P", "-o", "JobID",
                           "-j", JOB], capture_output=True, text=True, timeout=120, env={
        **clean, "HOME": str(home), "INGERO_URL": stack.echod.url,
        "INGERO_CA_CERT": stack.env["INGERO_CA_CERT"]})
    assert done.returncode == 0 and done.stdout == f"{JOB}\n", done.stderr


def test_sql_as_table_json_and_csv(stack):
    statement = f"SELECT rank, cause FROM straggler_verdicts WHERE job = '{JOB}'"
    assert ["rank", "cause"] == ok(ingero(stack, "sql", statement)).split()[:2]
    answer = json.loads(ok(ingero(stack, "sql", "--json", statement)))
    assert answer["columns"] == ["rank", "cause"] and [LATE, "host_work"] in answer["rows"]
    rows = list(csv.reader(io.StringIO(ok(ingero(stack, "sql", "--csv", statement)))))
    assert rows[0] == ["rank", "cause"] and [str(LATE), "host_work"] in rows


def test_perfetto_export_has_a_process_per_node_a_track_per_rank_and_the_verdict(stack):
    out = stack.root / "trace.json"
    ok(ingero(stack, "export", "-j", JOB, "--format", "perfetto", "-o", str(out)))
    trace = json.loads(out.read_text())
    events = trace["traceEvents"]
    for e in events:
        assert {"name", "ph", "ts", "pid", "tid"} <= set(e), e
        if e["ph"] == "X":
            assert e["dur"] > 0, e
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(processes.values()) == ["node0", "node1"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["name"] == "thread_name"}
    assert sorted(threads.values()) == [f"rank {r}" for r in range(4)]
    late_track = next(key for key, name in threads.items() if name == f"rank {LATE}")
    assert processes[late_track[0]] == "node1"
    markers = [e for e in events if e["ph"] == "i" and e.get("cat") == "verdict"]
    assert markers and all((e["pid"], e["tid"]) == late_track for e in markers)
    collectives = [e for e in events if e.get("cat") == "collective"]
    assert {(e["pid"], e["tid"]) for e in collectives} == set(threads)
    assert any(e.get("cat") == "wait" for e in events)


def test_error_paths_print_one_line_and_exit_1(stack):
    closed = {**stack.env, "INGERO_URL": f"https://127.0.0.1:{free_port()}"}
    bad_token = stack.root / "bad-token"
    bad_token.write_text("ingero_not_a_token\n")
    other_ca, _key = self_signed(Path(tempfile.mkdtemp(prefix="other-ca-")))
    cases = {
        "no server": closed,
        "wrong token": {**stack.env, "INGERO_TOKEN_FILE": str(bad_token)},
        "wrong CA": {**stack.env, "INGERO_CA_CERT": str(other_ca)},
        "no URL": {k: v for k, v in stack.env.items() if k != "INGERO_URL"},
    }
    for case, env in cases.items():
        done = ingero(stack, "report", "-j", JOB, env=env)
        assert done.returncode == 1, (case, done.stdout, done.stderr)
        assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, (case, done)
        assert done.stderr.startswith("Error: "), (case, done.stderr)
    assert "401" in ingero(stack, "jobs", env=cases["wrong token"]).stderr or \
        "token" in ingero(stack, "jobs", env=cases["wrong token"]).stderr
    assert "CERTIFICATE_VERIFY_FAILED" in ingero(stack, "jobs", env=cases["wrong CA"]).stderr
    bad_time = ingero(stack, "report", "-S", "yesterday-ish")
    assert bad_time.returncode == 1 and "bad time" in bad_time.stderr
