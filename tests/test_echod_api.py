"""echod's HTTP API end to end: the real daemon under gunicorn with TLS, its embedded
PostgreSQL, evidence forwarded over the real ingest socket, tokens made with 'echod token'.

The auth matrix checks each refusal's status and code and finds its audit line by request id;
the OpenAPI document is validated, and schemathesis fuzzes every operation against it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import requests
from openapi_spec_validator import validate

from ingero import wire
from stack.launch import KeyRing, free_port, wait_for

from .support import EchodApi, forward

RANKS, COLLECTIVES, LATE_RANK, LATE_S = 8, 60, 5, 0.020
TOKENS = {
    "admin": ("*", "admin"),
    "alpha-reader": ("alpha", "read"),
    "alpha-analyst": ("alpha", "read,sql"),
    "beta-reader": ("beta", "read"),
    "rotated": ("*", "read"),
}
GRACE_S = 15        # a rotated-out token's grace: longer than new gunicorn workers take to start


def evidence(cluster: str, job: str, ranks: int, late_rank: int | None, t0: float) -> list[dict]:
    """A job's collectives (one rank entering each one late) and its node's preemptions."""
    rows = []
    for rank in range(ranks):
        node = f"{cluster}-node{rank // 2:02d}"
        delay = LATE_S if rank == late_rank else 0.0
        for seq in range(COLLECTIVES):
            rows.append({"id": f"{node}:b:{rank}:{seq}", "t": t0 + seq * 0.1 + delay,
                         "kind": "collective", "node": node, "cluster": cluster,
                         "boot_id": "b", "job": job, "attrs": {
                             "op": "ncclAllReduce", "comm_hash": "c0ffee", "seq": seq,
                             "rank": rank, "comm_rank": rank, "nranks": ranks,
                             "bytes": 1 << 20, "duration_ns": 50_000, "pid": 1000 + rank}})
        if rank == late_rank:
            rows += [{"id": f"{node}:b:p{i}", "t": t0 + i, "kind": "preempted", "node": node,
                      "cluster": cluster, "boot_id": "b", "job": job, "attrs": {
                          "rank": rank, "pid": 1000 + rank, "preemptor_pid": 4242,
                          "preemptor_comm": "ingero-hog", "count": 40}} for i in range(5)]
    return rows


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    keys = KeyRing.create(tmp_path_factory.mktemp("keys"))
    echod = EchodApi(keys, "--token-grace", str(GRACE_S), "--rate-limit", "500",
                     "--rate-burst", "2000", tokens=TOKENS)
    t0 = time.time() - 600
    for seq, rows in enumerate((evidence("alpha", "4242", RANKS, LATE_RANK, t0),
                                evidence("beta", "77", 4, None, t0))):
        ack = forward(keys, echod.ingest, wire.Forward(seq, "test", rows))
        assert ack.stored == len(rows), ack
    yield echod
    assert echod.stop() == 0


def find_audit(api: EchodApi, request_id: str) -> dict:
    assert wait_for(lambda: any(line["request_id"] == request_id for line in api.audit()), 10)
    return next(line for line in api.audit() if line["request_id"] == request_id)


# -- the plain endpoints -----------------------------------------------------------------------

def test_versions_need_no_token_and_give_major_minor_only(api):
    answer = api.request("GET", "/api/versions")
    assert answer.status_code == 200
    body = answer.json()
    assert body["versions"] == [{"path": "/api/v1", "version": "1.0"}]
    assert body["echod"].count(".") == 1
    assert answer.headers["X-Request-Id"]


def test_health_gives_version_detail_only_to_a_token(api):
    anonymous = api.request("GET", "/api/v1/health").json()
    assert anonymous["status"] == "ok" and "echod" not in anonymous
    detailed = api.request("GET", "/api/v1/health", api.tokens["alpha-reader"]).json()
    assert detailed["echod"].count(".") == 2 and detailed["schema"]


def test_errors_share_one_shape_and_every_answer_a_request_id(api):
    token = api.tokens["admin"]
    cases = [
        (api.request("GET", "/api/v1/nothing-here", token), 404, "not_found"),
        (api.request("DELETE", "/api/v1/tools", token), 405, "method_not_allowed"),
        (api.request("POST", "/api/v1/tools/no_such_tool", token, json={}), 404,
         "unknown_tool"),
        (api.request("POST", "/api/v1/tools/event_history", token, data="{not json",
                     headers={"Content-Type": "application/json"}), 400, "bad_json"),
        (api.request("POST", "/api/v1/tools/event_history", token, json=[1, 2]), 400,
         "bad_arguments"),
        (api.request("POST", "/api/v1/tools/event_history", token, json={"limit": -1}), 400,
         "bad_arguments"),
        (api.request("POST", "/api/v1/tools/event_history", token, json={"colour": "red"}),
         400, "bad_arguments"),
        (api.request("POST", "/api/v1/tools/explain", token,
                     json={"job": "no-such-job", "rank": 0}), 404, "not_found"),
        (api.request("POST", "/api/v1/tools/event_history", token, data=b"x" * (2 << 20),
                     headers={"Content-Type": "application/json"}), 413, "too_large"),
    ]
    for answer, status, code in cases:
        assert (answer.status_code, answer.json()) == (status, {
            "error": answer.json()["error"], "code": code}), answer.text
        assert answer.json()["error"]
        assert answer.headers["X-Request-Id"]
    given = api.request("GET", "/api/versions", headers={"X-Request-Id": "trace-42"})
    assert given.headers["X-Request-Id"] == "trace-42"
    hostile = api.request("GET", "/api/versions", headers={"X-Request-Id": "a b\tc" * 100})
    assert hostile.headers["X-Request-Id"] != "a b\tc" * 100


# -- authentication and authorisation ------------------------------------------------------------

def test_auth_matrix_answers_and_audits_every_refusal(api):
    straggler = {"job": "4242"}
    cases = {
        "no token": (None, "POST", "/api/v1/tools/find_stragglers", straggler, 401,
                     "unauthorized"),
        "wrong token": ("ingero_" + "x" * 43, "POST", "/api/v1/tools/find_stragglers",
                        straggler, 401, "invalid_token"),
        "not a bearer": ("", "GET", "/api/v1/whoami", None, 401, "unauthorized"),
        "another cluster": (api.tokens["beta-reader"], "POST",
                            "/api/v1/tools/find_stragglers", {"cluster": "alpha"}, 403,
                            "forbidden_cluster"),
        "missing capability": (api.tokens["alpha-reader"], "POST", "/api/v1/sql",
                               {"sql": "SELECT 1"}, 403, "forbidden"),
        "allowed": (api.tokens["alpha-reader"], "POST", "/api/v1/tools/find_stragglers",
                    straggler, 200, None),
    }
    for name, (token, method, path, body, status, code) in cases.items():
        headers = {"X-Request-Id": f"matrix-{name.replace(' ', '-')}"}
        if token == "":
            headers["Authorization"] = "Basic dXNlcjpwYXNz"
            token = None
        answer = api.request(method, path, token, json=body, headers=headers)
        assert answer.status_code == status, (name, answer.text)
        assert answer.json().get("code") == code, name
        line = find_audit(api, headers["X-Request-Id"])
        assert (line["status"], line["code"], line["method"], line["path"]) == \
            (status, code, method, path), name
        if name in ("another cluster", "missing capability", "allowed"):
            assert len(line["token_sha256"]) == 64 and line["token"]
        elif name == "wrong token":     # the hash of what was presented, never the token
            assert len(line["token_sha256"]) == 64 and line["token"] is None
        else:
            assert line["token_sha256"] is None
    audit_text = api.audit_log.read_text()
    assert not any(token in audit_text for token in api.tokens.values())


def test_a_rotated_out_token_works_for_the_grace_window_then_not(api):
    token = api.tokens["rotated"]
    assert api.request("GET", "/api/v1/whoami", token).status_code == 200
    revoked = api.echod("token", "revoke", "rotated")
    assert revoked.returncode == 0, revoked.stderr
    api.hup()
    assert wait_for(lambda: "tokens reloaded" in api.daemon.log(), 60), api.daemon.log()
    # gunicorn replaces its workers gracefully: an old one may answer a moment longer, and the
    # new ones take seconds to start on a busy machine (beside a busy loop, over 3 s: past a
    # grace window that short, the header was never seen)
    assert wait_for(lambda: "X-Token-Retiring-In" in api.request(
        "GET", "/api/v1/whoami", token).headers, 60)
    within = api.request("GET", "/api/v1/whoami", token, headers={"X-Request-Id": "in-grace"})
    assert within.status_code == 200
    assert 0 <= int(within.headers["X-Token-Retiring-In"]) <= GRACE_S
    assert wait_for(lambda: api.request("GET", "/api/v1/whoami", token).status_code == 401,
                    2 * GRACE_S)
    after = api.request("GET", "/api/v1/whoami", token, headers={"X-Request-Id": "past-grace"})
    assert (after.status_code, after.json()["code"]) == (401, "token_expired")
    line = find_audit(api, "past-grace")
    assert (line["status"], line["code"]) == (401, "token_expired")
    assert api.request("GET", "/api/v1/whoami", api.tokens["admin"]).status_code == 200


def test_whoami_and_tools_say_what_a_token_may_do(api):
    me = api.request("GET", "/api/v1/whoami", api.tokens["alpha-analyst"]).json()
    assert (me["name"], me["clusters"], me["capabilities"]) == \
        ("alpha-analyst", ["alpha"], ["read", "sql"])
    listed = api.request("GET", "/api/v1/tools", api.tokens["alpha-reader"]).json()["tools"]
    allowed = {tool["name"]: tool["allowed"] for tool in listed}
    assert len(allowed) == 15 and allowed["find_stragglers"] and not allowed["run_analysis"]


# -- the tools over HTTP, scoped -----------------------------------------------------------------

def test_find_stragglers_names_the_late_rank_and_its_preemptor(api):
    answer = api.request("POST", "/api/v1/tools/find_stragglers", api.tokens["alpha-reader"],
                         json={"job": "4242"})
    assert answer.status_code == 200, answer.text
    ranking = answer.json()["ranks"]
    assert ranking[0]["rank"] == LATE_RANK and ranking[0]["straggler"] is True
    assert not any(entry["straggler"] for entry in ranking[1:])
    assert "ingero-hog" in json.dumps(ranking[0])


def test_a_scoped_token_sees_only_its_clusters_in_tools_and_sql(api):
    alpha = api.tokens["alpha-analyst"]
    history = api.request("POST", "/api/v1/tools/event_history", alpha,
                          json={"limit": 10000}).json()
    assert {event["cluster"] for event in history["events"]} == {"alpha"}
    rows = api.request("POST", "/api/v1/sql", alpha, json={
        "sql": "SELECT cluster, count(*) FROM events GROUP BY cluster ORDER BY 1"}).json()
    assert rows["rows"] == [["alpha", RANKS * COLLECTIVES + 5]]
    sneaky = api.request("POST", "/api/v1/sql", alpha, json={
        "sql": "SELECT count(*) FROM events WHERE cluster = 'beta' OR true"}).json()
    assert sneaky["rows"] == [[RANKS * COLLECTIVES + 5]]
    beta_job = api.request("POST", "/api/v1/tools/job_report", alpha, json={"job": "77"})
    assert (beta_job.status_code, beta_job.json()["code"]) == (404, "not_found")
    everything = api.request("POST", "/api/v1/sql", api.tokens["admin"], json={
        "sql": "SELECT DISTINCT cluster FROM events ORDER BY 1"}).json()
    assert everything["rows"] == [["alpha"], ["beta"]]


def test_hostile_sql_is_refused_with_a_clear_error_and_counted(api):
    admin = api.tokens["admin"]
    for sql, code in (("DELETE FROM events", "sql_refused"),
                      ("SELECT 1; SELECT 2", "sql_refused"),
                      ("SELECT pg_read_file('/etc/passwd')", "sql_refused"),
                      ("SELECT * FROM no_such_table", "sql_error")):
        answer = api.request("POST", "/api/v1/sql", admin, json={"sql": sql})
        assert (answer.status_code, answer.json()["code"]) == (400, code), sql
    assert api.request("POST", "/api/v1/sql", admin,
                       json={"sql": "SELECT count(*) FROM events"}).status_code == 200
    metrics = api.request("GET", "/metrics", admin).text
    assert 'ingero_echo_api_errors_total{code="sql_refused"}' in metrics


def test_metrics_need_a_token(api):
    assert api.request("GET", "/metrics").status_code == 401
    text = api.request("GET", "/metrics", api.tokens["alpha-reader"]).text
    assert "ingero_echo_api_requests_total" in text


# -- the OpenAPI document, validated and fuzzed --------------------------------------------------

def test_the_openapi_document_is_valid_and_lists_every_tool(api):
    document = api.request("GET", "/api/v1/openapi.json").json()
    validate(document)
    assert document["openapi"] == "3.1.0"
    tools = [path for path in document["paths"] if path.startswith("/api/v1/tools/")]
    assert len(tools) == 15


def test_schemathesis_finds_no_server_error_and_no_schema_break(api):
    done = subprocess.run(
        [os.path.join(os.path.dirname(sys.executable), "st"), "run",
         f"{api.url}/api/v1/openapi.json", "--header",
         f"Authorization: Bearer {api.tokens['admin']}", "--tls-verify", str(api.cert),
         "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
         "response_headers_conformance,response_schema_conformance",
         "--phases", "examples,coverage,fuzzing", "--max-examples", "25", "--seed", "1",
         "--workers", "2", "--no-color", "--request-timeout", "60",
         "--generation-database", "none"],
        capture_output=True, text=True, timeout=600, cwd=api.root)  # it leaves files there
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert api.daemon.alive()


# -- TLS, the rate limit and the drain -------------------------------------------------------------

def test_plain_http_is_refused_on_the_tls_port(api):
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(f"http://127.0.0.1:{api.port}/api/versions", timeout=5)


def test_echod_refuses_to_serve_the_api_without_tls(tmp_path):
    done = subprocess.run([sys.executable, "-m", "echod", "--dsn",
                           "postgresql://nobody@127.0.0.1:1/none", "--api-bind",
                           f"127.0.0.1:{free_port()}"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode != 0
    assert "--tls-cert" in done.stderr and "--insecure-no-tls" in done.stderr


def test_rate_limit_answers_429_with_retry_after_and_sigterm_drains(tmp_path):
    echod = EchodApi(KeyRing.create(tmp_path / "keys"), "--rate-limit", "1", "--rate-burst",
                     "5", "--api-workers", "1", "--drain-seconds", "3",
                     tokens={"busy": ("*", "read")})
    try:
        answers = [echod.request("GET", "/api/v1/whoami", echod.tokens["busy"])
                   for _ in range(8)]
        statuses = [answer.status_code for answer in answers]
        assert statuses[:5] == [200] * 5 and 429 in statuses[5:], statuses
        limited = next(answer for answer in answers if answer.status_code == 429)
        assert limited.json()["code"] == "rate_limited"
        assert int(limited.headers["Retry-After"]) >= 1
        line = find_audit(echod, limited.headers["X-Request-Id"])
        assert (line["status"], line["code"], line["token"]) == (429, "rate_limited", "busy")

        echod.daemon.process.send_signal(signal.SIGTERM)
        assert wait_for(lambda: echod.request("GET", "/api/versions").status_code == 503, 5)
        draining = echod.request("GET", "/api/versions")
        assert draining.json()["code"] == "draining"
        assert int(draining.headers["Retry-After"]) >= 1
        assert echod.daemon.process.wait(30) == 0
    finally:
        echod.stop()


def test_the_shipped_logrotate_file_rotates_the_audit_log_and_echod_writes_a_new_one(api):
    """logrotate/ingero as logrotate(8) runs it, on this echod's audit log: the old lines go
    to the rotated file, and after the postrotate's reload (SIGHUP here, as systemctl reload
    sends) the next request's line is in a new file."""
    from pathlib import Path

    shipped = (Path(__file__).resolve().parent.parent / "logrotate/ingero").read_text()
    assert "/var/log/ingero/echod-audit.jsonl {" in shipped
    root = api.audit_log.parent
    conf = root / "logrotate.conf"
    conf.write_text(shipped.replace("/var/log/ingero/echod-audit.jsonl", str(api.audit_log))
                    .replace("create 0600 ingero ingero", "create 0600 root root")
                    .replace("systemctl reload echod.service",
                             f"kill -HUP {api.daemon.process.pid}"))
    before = api.request("GET", "/api/v1/whoami", api.tokens["admin"]).headers["X-Request-Id"]
    find_audit(api, before)
    done = subprocess.run(["logrotate", "--force", "--state", str(root / "logrotate.state"),
                           str(conf)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rotated = api.audit_log.with_name(api.audit_log.name + ".1")
    assert before in rotated.read_text()

    def new_line() -> str | None:
        after = api.request("GET", "/api/v1/whoami", api.tokens["admin"])
        if after.status_code != 200:            # the API's workers are being replaced
            return None
        request = after.headers["X-Request-Id"]
        return request if request in api.audit_log.read_text() else None

    request = wait_for(new_line, 30, interval=0.5)
    assert request and request not in rotated.read_text()
    assert oct(api.audit_log.stat().st_mode & 0o777) == "0o600"
