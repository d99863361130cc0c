"""echod's HTTP API under hostile input: the real daemon under gunicorn with TLS and its
embedded PostgreSQL, driven with raw http.client requests where a client library would clean
the input up (lone surrogates, chunked bodies, NaN).

Every bad input must get a 4xx answer in the one error shape, be counted in the metrics, and
every answer must be strict JSON; one answer is capped in bytes, and one token's slow
statements must leave threads for the others. The error shape of the framework's own errors is
checked in process, on the app ``create_app`` wires.
"""

from __future__ import annotations

import http.client
import json
import ssl
import socket
import threading
import time
from types import SimpleNamespace

import pytest
from flask import abort, jsonify
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.exceptions import default_exceptions

from echod.api import create_app
from echod.api.jsonio import encode
from echod.api.settings import ApiSettings
from echod.api.supervisor import concurrency_per_token
from echod.access.auth import PUBLIC, access
from echod.errors import HTTP_ERRORS
from echod.registry import ToolError
from echod.sandbox.check import SqlRefused
from stack.launch import KeyRing, wait_for

from .support import EchodApi

ANSWER_CAP = 256 * 1024
THREADS, PER_TOKEN = 4, 2
TOKENS = {"admin": ("*", "admin"), "slow": ("*", "read,sql"), "fast": ("*", "read,sql")}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    echod = EchodApi(KeyRing.create(tmp_path_factory.mktemp("keys")), "--api-workers", "1",
                     "--api-threads", str(THREADS), "--api-concurrency-per-token",
                     str(PER_TOKEN), "--api-answer-cap", str(ANSWER_CAP), "--rate-limit",
                     "500", "--rate-burst", "2000", tokens=TOKENS)
    yield echod
    assert echod.stop() == 0


class Answer:
    def __init__(self, status: int, headers: dict, body: bytes):
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        """The body, which must be strict JSON: UTF-8, no NaN or Infinity, no lone surrogate."""
        value = json.loads(self.body.decode("utf-8"), parse_constant=_not_json)
        json.dumps(value, ensure_ascii=False).encode("utf-8")    # a lone surrogate raises
        return value


def _not_json(name):
    raise AssertionError(f"{name} in an answer")


def raw(api: EchodApi, method: str, path: str, body=None, token: str = "admin",
        headers: dict | None = None) -> Answer:
    """One request as written: ``body`` bytes as given, or an iterable of bytes sent chunked."""
    context = ssl.create_default_context(cafile=str(api.cert))
    connection = http.client.HTTPSConnection("127.0.0.1", api.port, context=context, timeout=60)
    headers = {"Content-Type": "application/json", **(headers or {})}
    if token:
        headers["Authorization"] = f"Bearer {api.tokens[token]}"
    try:
        chunked = body is not None and not isinstance(body, bytes)
        connection.request(method, path, body=body, headers=headers, encode_chunked=chunked)
        response = connection.getresponse()
        return Answer(response.status, dict(response.getheaders()), response.read())
    finally:
        connection.close()


def counted(api: EchodApi, code: str) -> float:
    """ingero_echo_api_errors_total{code=...}, from the API's /metrics."""
    text = api.request("GET", "/metrics", api.tokens["admin"]).text
    return sum(sample.value for family in text_string_to_metric_families(text)
               for sample in family.samples
               if sample.name == "ingero_echo_api_errors_total"
               and sample.labels.get("code") == code)


def refused(answer: Answer, status: int, code: str) -> None:
    assert (answer.status, answer.json()["code"]) == (status, code), answer.body[:500]
    assert set(answer.json()) == {"error", "code"} and answer.json()["error"]


# -- bodies and arguments ----------------------------------------------------------------------

def test_lone_surrogates_are_refused_as_bad_json_and_counted(api):
    before = counted(api, "bad_json")
    bodies = [b'{"sql": "\\ud800"}', b'{"sql": "SELECT \'\\udc00\'"}', b'{"\\udfff": 1}',
              b'{"sql": "SELECT \'\xed\xa0\x80\'"}',      # a surrogate encoded in UTF-8
              b'{"sql": "SELECT 1 \xff"}']                  # not UTF-8 at all
    for body in bodies:
        refused(raw(api, "POST", "/api/v1/sql", body), 400, "bad_json")
    assert counted(api, "bad_json") - before == len(bodies)
    paired = raw(api, "POST", "/api/v1/sql", b'{"sql": "SELECT \'\\ud83d\\ude00\'"}')
    assert (paired.status, paired.json()["rows"]) == (200, [["\U0001f600"]])


def test_deep_nesting_is_refused_as_bad_json(api):
    before = counted(api, "bad_json")
    bodies = [b"[" * 100_000, b'{"sql": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
              b'{"a": ' * 40 + b"1" + b"}" * 40]
    for body in bodies:
        answer = raw(api, "POST", "/api/v1/tools/event_history", body)
        refused(answer, 400, "bad_json")
        assert "deeper" in answer.json()["error"]
    assert counted(api, "bad_json") - before == len(bodies)


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999"])
def test_nan_and_infinity_are_not_numbers(api, number):
    before = counted(api, "bad_json")
    for body in (b'{"sql": "SELECT 1", "timeout_s": ' + number + b"}",
                 b'{"limit": ' + number + b"}"):
        answer = raw(api, "POST", "/api/v1/sql" if b"sql" in body
                     else "/api/v1/tools/event_history", body)
        refused(answer, 400, "bad_json")
    assert counted(api, "bad_json") - before == 2


def test_a_chunked_body_over_the_limit_is_refused_not_cut_short_and_run(api):
    """Cut at 1 MiB, this body would still be JSON that runs: it must be refused whole."""
    statement = b'{"sql": "SELECT 42"}'
    before = counted(api, "too_large")
    padding = (b" " * 65536 for _ in range(32))                          # 2 MiB of blanks
    refused(raw(api, "POST", "/api/v1/sql", iter([statement, *padding])), 413, "too_large")
    assert counted(api, "too_large") - before == 1
    small = raw(api, "POST", "/api/v1/sql", iter([statement[:10], statement[10:]]))
    assert (small.status, small.json()["rows"]) == (200, [[42]])


# -- answers -----------------------------------------------------------------------------------

def test_every_answer_is_strict_json(api):
    floats = raw(api, "POST", "/api/v1/sql", json.dumps({"sql": (
        "SELECT 'NaN'::float8, 'Infinity'::float8, '-Infinity'::float4, 'NaN'::numeric, "
        "ARRAY['Infinity'::float8], 1.5::float8")}).encode())
    assert floats.status == 200
    assert floats.json()["rows"] == [["NaN", "Infinity", "-Infinity", "NaN", ["Infinity"], 1.5]]
    for method, path, body in (("POST", "/api/v1/tools/%ED%A0%80", b"{}"),
                               ("GET", "/api/v1/%ED%A0%80%FF", None),
                               ("POST", "/api/v1/sql", b'{"sql": "SELECT \\"\xe2\x82\xac\\""}')):
        answer = raw(api, method, path, body)
        assert 400 <= answer.status < 500 and answer.json()["code"], answer.body


def test_encoding_replaces_what_strict_json_cannot_carry():
    value = {"nan": float("nan"), "list": [float("inf"), -float("inf")], "\udfff": "a\ud800b",
             "pair": "\ud83d\ude00"}
    decoded = json.loads(encode(value).decode("utf-8"), parse_constant=_not_json)
    assert decoded == {"nan": "NaN", "list": ["Infinity", "-Infinity"], "\ufffd": "a\ufffdb",
                       "pair": "\U0001f600"}


def test_an_answer_over_the_byte_cap_is_refused_and_counted(api):
    before = counted(api, "answer_too_large")
    big = api.request("POST", "/api/v1/sql", api.tokens["admin"], json={
        "sql": "SELECT repeat('x', 10000) FROM generate_series(1, 100)"})      # ~1 MB
    assert (big.status_code, big.json()["code"]) == (422, "answer_too_large"), big.text[:300]
    assert str(ANSWER_CAP) in big.json()["error"]
    one_wide_row = api.request("POST", "/api/v1/sql", api.tokens["admin"], json={
        "sql": f"SELECT repeat('x', {ANSWER_CAP + 1})"})
    assert one_wide_row.status_code == 422
    assert counted(api, "answer_too_large") - before == 2
    under = api.request("POST", "/api/v1/sql", api.tokens["admin"], json={
        "sql": "SELECT repeat('x', 10000) FROM generate_series(1, 20)"})      # ~200 kB
    assert under.status_code == 200 and len(under.json()["rows"]) == 20


# -- per-token concurrency ---------------------------------------------------------------------

def test_one_token_with_slow_statements_leaves_threads_to_the_others(api):
    """With 4 threads and 2 per token, 'slow' sends 4 slow statements at once: 2 run, 2 get 429
    at once, and 'fast' is answered while the 2 still run."""
    before = counted(api, "concurrency_limited")
    answers: list[tuple[object, float]] = []

    def call():
        answer = api.request("POST", "/api/v1/sql", api.tokens["slow"],
                             json={"sql": "SELECT pg_sleep(3)"})
        answers.append((answer, time.monotonic()))

    callers = [threading.Thread(target=call) for _ in range(THREADS)]
    for caller in callers:
        caller.start()
    assert wait_for(lambda: len(answers) >= THREADS - PER_TOKEN, 10), answers
    quick = api.request("POST", "/api/v1/sql", api.tokens["fast"], json={"sql": "SELECT 1"})
    quick_at = time.monotonic()
    for caller in callers:
        caller.join(60)
    limited = [answer for answer, _ in answers if answer.status_code == 429]
    slow_done = [at for answer, at in answers if answer.status_code == 200]
    assert (len(limited), len(slow_done)) == (THREADS - PER_TOKEN, PER_TOKEN), \
        [answer.text for answer, _ in answers]
    assert all(answer.json()["code"] == "concurrency_limited"
               and answer.headers["Retry-After"] == "1" for answer in limited)
    assert quick.status_code == 200 and quick_at < min(slow_done)
    assert counted(api, "concurrency_limited") - before == THREADS - PER_TOKEN
    again = api.request("POST", "/api/v1/sql", api.tokens["slow"], json={"sql": "SELECT 1"})
    assert again.status_code == 200                      # the slots were given back


def test_the_concurrency_cap_defaults_to_half_the_threads():
    def cap(given: int, threads: int) -> int:
        return concurrency_per_token(SimpleNamespace(api_concurrency_per_token=given,
                                                     api_threads=threads))

    assert (cap(0, 8), cap(0, 1), cap(0, 3), cap(3, 8)) == (4, 1, 1, 3)


# -- the app's shape: one error tree, one shape ------------------------------------------------

@pytest.fixture
def app(tmp_path):
    settings = ApiSettings(
        sandbox_url="postgresql://nobody@127.0.0.1:1/none", sandbox_key="k",
        tokens_file=str(tmp_path / "tokens.yaml"), retired_file=str(tmp_path / "retired.json"),
        token_grace=0, audit_log=str(tmp_path / "audit.jsonl"), rate_limit=1000,
        rate_burst=1000, drain_file="", drain_seconds=0, sql_timeout_ms=1000, sql_row_cap=10,
        threads=2, answer_cap=1024, concurrency_per_token=1)
    app = create_app(settings, workers=1)

    @access(PUBLIC)
    def fail(how: str):
        if how.isdigit():
            abort(int(how))
        if how == "tool":
            raise ToolError("two jobs match", "ambiguous", 400)
        if how == "sql":
            raise SqlRefused("writes are not allowed")
        if how == "nan":
            return jsonify(value=float("nan"), text="\ud800")
        raise RuntimeError("a fault in echod")

    app.add_url_rule("/fail/<how>", view_func=fail)
    return app


def test_every_framework_error_leaves_in_the_one_shape(app):
    client = app.test_client()
    for status in sorted(default_exceptions):
        answer = client.get(f"/fail/{status}")
        known = HTTP_ERRORS.get(status)
        assert answer.status_code == status
        assert answer.get_json() == {"error": answer.get_json()["error"],
                                     "code": known.code if known else "http_error"}, status
    assert client.delete("/api/versions").headers["Allow"]
    for how, status, code in (("tool", 400, "ambiguous"), ("sql", 400, "sql_refused"),
                              ("crash", 500, "internal")):
        answer = client.get(f"/fail/{how}")
        assert (answer.status_code, answer.get_json()["code"]) == (status, code), how
        assert answer.headers["X-Request-Id"]
    assert client.get("/api/v1/whoami").get_json()["code"] == "unauthorized"
    strict = client.get("/fail/nan")
    assert json.loads(strict.data.decode("utf-8"), parse_constant=_not_json) == {
        "value": "NaN", "text": "\ufffd"}


def test_every_error_class_the_api_answers_with_is_an_http_error():
    from echod.access.principal import AuthError, NotAllowed, TokenRefused
    from echod.errors import HttpError

    for cls in (*HTTP_ERRORS.values(), AuthError, TokenRefused, NotAllowed):
        assert issubclass(cls, HttpError)
        assert isinstance(cls.status, int) and isinstance(cls.code, str)
    assert (TokenRefused.status, NotAllowed.status) == (401, 403)


# -- slow and idle clients ---------------------------------------------------------------------

# The first bytes of a TLS ClientHello record: a client that starts the handshake and stops.
HALF_A_HANDSHAKE = bytes.fromhex("160301020001000200")


def test_200_half_open_tls_connections_do_not_stop_a_normal_request(api):
    """gunicorn's threaded workers would each be held by one of these (4 threads here); the
    front does the handshakes without tying up anything but a descriptor. Also idle TCP
    connections that send nothing, and a client trickling its headers."""
    idle = []
    try:
        for i in range(200):
            sock = socket.create_connection(("127.0.0.1", api.port), timeout=5)
            if i % 2 == 0:
                sock.sendall(HALF_A_HANDSHAKE)
            idle.append(sock)
        trickle = ssl.create_default_context(cafile=str(api.cert)).wrap_socket(
            socket.create_connection(("127.0.0.1", api.port), timeout=5),
            server_hostname="127.0.0.1")
        trickle.sendall(b"GET /api/versions HTTP/1.1\r\nHost: x\r\n")
        idle.append(trickle)
        time.sleep(0.5)
        started = time.monotonic()
        answer = raw(api, "POST", "/api/v1/sql", json.dumps({"sql": "SELECT 1"}).encode(),
                     token="fast")
        took = time.monotonic() - started
        assert answer.status == 200 and answer.json()["rows"] == [[1]], answer.body
        assert took < 1.0, took
    finally:
        for sock in idle:
            sock.close()


def test_a_client_that_never_finishes_its_headers_is_answered_408_and_let_go(api):
    context = ssl.create_default_context(cafile=str(api.cert))
    with context.wrap_socket(socket.create_connection(("127.0.0.1", api.port), timeout=30),
                             server_hostname="127.0.0.1") as sock:
        sock.sendall(b"GET /api/versions HTTP/1.1\r\nHost: x\r\n")
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["code"] == "timeout"


def test_the_front_replaces_a_forged_forwarded_address(api):
    """The rate limit for bad tokens goes by address: a client cannot pick its own."""
    forged = raw(api, "GET", "/api/v1/tools", token=None,
                 headers={"X-Forwarded-For": "203.0.113.9", "X-Ingero-Refused": "too_large",
                          "Authorization": "Bearer not-a-token"})
    assert forged.status == 401, forged.body     # not the 413 the forged header asks for
    assert wait_for(lambda: api.audit() and api.audit()[-1]["status"] == 401, 5), api.audit()[-2:]
    assert api.audit()[-1]["remote"] == "127.0.0.1", api.audit()[-1]
