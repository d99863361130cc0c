"""The HTTP API's authentication: the tokens file, rotation with a grace window, capabilities and
scope, the audit log and the per-token rate limit, and 'echod token'. No database needed."""

from __future__ import annotations

import contextlib
import json
import logging
import stat
import subprocess
import sys
import textwrap

import click
import pytest
import yaml
from click.testing import CliRunner

from echod.access import tokens as auth
from echod.access.audit import AuditLog
from echod.access.principal import AuthError, new_token, token_hash
from echod.access.tokens import TokenFileError, TokenStore
from echod.errors import RateLimited
from echod.access.ratelimit import RateLimiter
from echod.access.tokens_cli import token_group

GRACE = 300.0


class FakeClock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def entry(name: str, token: str, clusters=("*",), capabilities=("read",), **extra) -> dict:
    return {"name": name, "sha256": token_hash(token), "clusters": list(clusters),
            "capabilities": list(capabilities), **extra}


def write_tokens(path, entries, revoked=()):
    document = {"tokens": list(entries)}
    if revoked:
        document["revoked"] = list(revoked)
    path.write_text(yaml.safe_dump(document))


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def files(tmp_path):
    return tmp_path / "echod-tokens.yaml", tmp_path / "state" / "tokens-retired.json"


def store_for(files, clock) -> TokenStore:
    store = TokenStore(*files, grace_s=GRACE, clock=clock)
    store.load()
    return store


def refusal(store: TokenStore, header: str | None) -> AuthError:
    with pytest.raises(AuthError) as caught:
        store.authenticate(header)
    return caught.value


# -- the tokens file ---------------------------------------------------------------------------

def test_a_good_file_loads_with_its_scopes_and_capabilities(files, clock):
    ops, alice = new_token(), new_token()
    files[0].write_text(textwrap.dedent(f"""\
        tokens:
          - name: ops
            sha256: {token_hash(ops).upper()}
            clusters: ["*"]
            capabilities: [admin]
          - name: alice
            sha256: {token_hash(alice)}
            clusters: [a100, h100]
            capabilities: [read]
            expires: 2030-01-01T00:00:00Z
        """))
    store = store_for(files, clock)
    root = store.authenticate(f"Bearer {ops}")
    assert root.name == "ops" and root.scope.clusters is None
    assert root.capabilities == {"read", "sql", "admin"}
    assert root.token_sha256 == token_hash(ops) and root.retiring_until is None
    user = store.authenticate(f"Bearer {alice}")
    assert user.scope.clusters == {"a100", "h100"} and user.capabilities == {"read"}
    clock.now = auth.parse_expires("2030-01-01T00:00:00Z")
    assert refusal(store, f"Bearer {alice}").code == "token_expired"


BAD_FILES = {
    "capability": ({"capabilities": ["read", "write"]},
                   "token 'ops': unknown capability 'write' (read, sql, admin)"),
    "no capabilities": ({"capabilities": []}, "token 'ops': capabilities must be a non-empty"),
    "capabilities not a list": ({"capabilities": "read"}, "capabilities must be a non-empty"),
    "short hash": ({"sha256": "abc123"}, "token 'ops': sha256 must be 64 hexadecimal digits"),
    "token as hash": ({"sha256": "ingero_" + "x" * 43}, "sha256 holds a token, not its hash"),
    "no clusters": ({"clusters": []}, "token 'ops': clusters must be a list"),
    "cluster string": ({"clusters": "a100"}, "token 'ops': clusters must be a list"),
    "star among names": ({"clusters": ["a100", "*"]}, "'*' means every cluster"),
    "cluster not a name": ({"clusters": ["a100", 7]}, "clusters: 7 is not a cluster name"),
    "expiry": ({"expires": "next year"}, "token 'ops': expires: 'next year' is not an ISO 8601"),
    "unknown field": ({"scope": "all"}, "token 'ops': unknown field(s) scope"),
    "missing field": ({"sha256": None}, "token 'ops': missing sha256"),
    "bad name": ({"name": "has space"}, "entry 1: name must be"),
    "no name": ({"name": None}, "entry 1: name must be"),
}


@pytest.mark.parametrize("change, message", BAD_FILES.values(), ids=BAD_FILES.keys())
def test_each_bad_field_is_refused_naming_the_entry(files, clock, change, message):
    item = {**entry("ops", new_token()), **change}
    item = {k: v for k, v in item.items() if v is not None}
    write_tokens(files[0], [item])
    with pytest.raises(TokenFileError) as caught:
        store_for(files, clock)
    assert str(caught.value).startswith(f"{files[0]}: ")
    assert message in str(caught.value)


@pytest.mark.parametrize("text, message", [
    ("tokens: [\n", "is not valid YAML"),
    ("- name: ops\n", "must hold a mapping"),
    ("tokens: []\nrevoke: []\n", "unknown key(s) revoke (tokens, revoked)"),
    ("tokens: {ops: 1}\n", "tokens and revoked must be lists"),
    ("tokens: [ops]\n", "entry 1: expected a mapping"),
    ("revoked: [nothex]\n", "revoked: sha256 must be 64 hexadecimal digits"),
])
def test_a_bad_file_shape_is_refused(files, clock, text, message):
    files[0].write_text(text)
    with pytest.raises(TokenFileError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[")):
        store_for(files, clock)


def test_duplicate_names_and_hashes_are_refused(files, clock):
    one, two = new_token(), new_token()
    write_tokens(files[0], [entry("ops", one), entry("ops", two)])
    with pytest.raises(TokenFileError, match="token 'ops': same name as token 'ops'"):
        store_for(files, clock)
    write_tokens(files[0], [entry("ops", one), entry("backup", one)])
    with pytest.raises(TokenFileError, match="token 'backup': same sha256 as token 'ops'"):
        store_for(files, clock)


def test_a_missing_file_means_no_tokens_and_says_so(files, clock, caplog):
    with caplog.at_level(logging.WARNING, logger="echod.auth"):
        store = store_for(files, clock)
    assert "does not exist: every API request will be refused" in caplog.text
    assert refusal(store, f"Bearer {new_token()}").code == "invalid_token"


# -- authenticate ------------------------------------------------------------------------------

def test_a_listed_token_is_accepted_scheme_in_any_case(files, clock):
    token = new_token()
    write_tokens(files[0], [entry("ops", token)])
    store = store_for(files, clock)
    for scheme in ("Bearer", "bearer", "BEARER"):
        assert store.authenticate(f"{scheme} {token}").name == "ops"
    assert store.authenticate(f"  Bearer   {token} ").name == "ops"


@pytest.mark.parametrize("header", [
    None, "", "   ", "Bearer", "Bearer ", "Basic dXNlcjpwYXNz", "Token abc", "Bearer a b",
    "Bearer ingero_caf\u00e9", "Bearer " + "A" * 600])
def test_a_missing_or_malformed_header_is_401_unauthorized(files, clock, header):
    write_tokens(files[0], [entry("ops", new_token())])
    error = refusal(store_for(files, clock), header)
    assert (error.status, error.code) == (401, "unauthorized")
    assert error.headers["WWW-Authenticate"].startswith("Bearer")
    assert error.token_sha256 is None


def test_an_unknown_token_is_401_invalid_token_with_its_hash(files, clock):
    write_tokens(files[0], [entry("ops", new_token())])
    stranger = new_token()
    error = refusal(store_for(files, clock), f"Bearer {stranger}")
    assert (error.status, error.code) == (401, "invalid_token")
    assert error.token_sha256 == token_hash(stranger) and error.token is None
    assert stranger not in str(error)


def test_an_expired_token_is_401_token_expired(files, clock):
    token = new_token()
    write_tokens(files[0], [entry("ops", token, expires="2027-01-15T12:00:00Z")])
    clock.now = auth.parse_expires("2027-01-15T11:59:59Z")
    store = store_for(files, clock)
    assert store.authenticate(f"Bearer {token}").name == "ops"
    clock.advance(1)
    error = refusal(store, f"Bearer {token}")
    assert (error.status, error.code, error.token) == (401, "token_expired", "ops")
    assert "expired at 2027-01-15T12:00:00Z" in str(error)


def test_a_date_alone_expires_at_midnight_utc(files, clock):
    token = new_token()
    write_tokens(files[0], [entry("ops", token, expires="2027-01-15")])
    clock.now = auth.parse_expires("2027-01-15T00:00:00+00:00")
    assert refusal(store_for(files, clock), f"Bearer {token}").code == "token_expired"


def test_a_revoked_hash_is_refused_even_while_listed(files, clock):
    token = new_token()
    write_tokens(files[0], [entry("ops", token)], revoked=[token_hash(token)])
    error = refusal(store_for(files, clock), f"Bearer {token}")
    assert (error.code, str(error)) == ("invalid_token", "token revoked")


def test_every_entry_is_compared_whichever_matches(files, clock, monkeypatch):
    tokens = [new_token() for _ in range(6)]
    write_tokens(files[0], [entry(f"t{i}", t) for i, t in enumerate(tokens)])
    store = store_for(files, clock)
    compared = []
    real = auth.hmac.compare_digest

    def counting(a, b):
        compared.append(a)
        return real(a, b)

    monkeypatch.setattr(auth.hmac, "compare_digest", counting)
    for token in (tokens[0], tokens[-1], new_token()):
        compared.clear()
        with pytest.raises(AuthError) if token not in tokens else contextlib.nullcontext():
            store.authenticate(f"Bearer {token}")
        assert sorted(compared) == sorted(token_hash(t) for t in tokens)


# -- capabilities and scope --------------------------------------------------------------------

def test_admin_implies_read_and_sql_and_read_alone_is_read(files, clock):
    admin, reader = new_token(), new_token()
    write_tokens(files[0], [entry("ops", admin, capabilities=["admin"]),
                            entry("alice", reader, clusters=["a100"], capabilities=["read"])])
    store = store_for(files, clock)
    ops = store.authenticate(f"Bearer {admin}")
    assert all(ops.may(c) for c in ("read", "sql", "admin"))
    ops.require("sql")
    ops.require_cluster("anything")
    alice = store.authenticate(f"Bearer {reader}")
    alice.require("read")
    alice.require_cluster("a100")
    with pytest.raises(AuthError) as caught:
        alice.require("sql")
    assert (caught.value.status, caught.value.code) == (403, "forbidden")
    assert str(caught.value) == "token 'alice' may not use sql"
    assert caught.value.token_sha256 == token_hash(reader)
    with pytest.raises(AuthError) as caught:
        alice.require_cluster("h100")
    assert (caught.value.status, caught.value.code) == (403, "forbidden_cluster")
    with pytest.raises(ValueError):
        alice.may("write")


# -- rotation ----------------------------------------------------------------------------------

def test_a_rotated_out_token_works_through_the_grace_window_only(files, clock):
    old, new = new_token(), new_token()
    write_tokens(files[0], [entry("ops", old, capabilities=["sql"])])
    store = store_for(files, clock)
    write_tokens(files[0], [entry("ops2", new)])
    clock.advance(10)
    summary = store.rotate()
    assert (summary.active, summary.in_grace, summary.added, summary.retired,
            summary.revoked) == (1, 1, 1, 1, 0)
    retiring = store.authenticate(f"Bearer {old}")
    assert retiring.name == "ops" and retiring.may("sql")
    assert retiring.retiring_until == clock.now + GRACE
    assert store.authenticate(f"Bearer {new}").name == "ops2"
    clock.advance(GRACE - 1)
    store.authenticate(f"Bearer {old}")
    clock.advance(1)
    error = refusal(store, f"Bearer {old}")
    assert (error.code, error.token) == ("token_expired", "ops")
    assert "rotated out" in str(error)


def test_a_process_started_after_the_rotation_honours_the_grace(files, clock):
    old, new = new_token(), new_token()
    write_tokens(files[0], [entry("ops", old)])
    supervisor = store_for(files, clock)
    write_tokens(files[0], [entry("ops2", new)])
    supervisor.rotate()
    clock.advance(GRACE / 2)
    worker = store_for(files, clock)                 # a gunicorn worker restarted by the SIGHUP
    assert worker.authenticate(f"Bearer {old}").name == "ops"
    clock.advance(GRACE / 2)
    later = store_for(files, clock)
    assert refusal(later, f"Bearer {old}").code == "invalid_token"
    assert refusal(worker, f"Bearer {old}").code == "token_expired"


def test_the_retired_file_is_private_and_holds_hashes_only(files, clock):
    old = new_token()
    write_tokens(files[0], [entry("ops", old)])
    store = store_for(files, clock)
    write_tokens(files[0], [])
    store.rotate()
    text = files[1].read_text()
    assert stat.S_IMODE(files[1].stat().st_mode) == 0o600
    assert old not in text
    assert json.loads(text)[token_hash(old)]["retired_at"] == clock.now
    assert list(files[1].parent.iterdir()) == [files[1]]        # no temporary left behind
    clock.advance(GRACE)
    store.rotate()
    assert json.loads(files[1].read_text()) == {}


def test_revoked_at_once_is_refused_inside_the_grace_window(files, clock):
    leaked, other = new_token(), new_token()
    write_tokens(files[0], [entry("leaked", leaked), entry("other", other)])
    store = store_for(files, clock)
    write_tokens(files[0], [entry("other", other)])
    store.rotate()
    assert store.authenticate(f"Bearer {leaked}").name == "leaked"
    write_tokens(files[0], [entry("other", other)], revoked=[token_hash(leaked)])
    clock.advance(1)
    assert store.rotate().revoked == 1
    assert refusal(store, f"Bearer {leaked}").code == "invalid_token"
    assert refusal(store_for(files, clock), f"Bearer {leaked}").code == "invalid_token"
    assert token_hash(leaked) not in json.loads(files[1].read_text())


def test_a_token_removed_again_gets_a_fresh_grace(files, clock):
    token = new_token()
    write_tokens(files[0], [entry("ops", token)])
    store = store_for(files, clock)
    write_tokens(files[0], [])
    store.rotate()
    clock.advance(GRACE / 2)
    write_tokens(files[0], [entry("ops", token)])
    store_for(files, clock)                          # a worker loads; nothing is written
    store.rotate()
    clock.advance(GRACE)
    write_tokens(files[0], [])
    store.rotate()
    clock.advance(GRACE - 1)
    assert store_for(files, clock).authenticate(f"Bearer {token}").name == "ops"


def test_a_bad_file_at_rotation_changes_nothing(files, clock):
    token = new_token()
    write_tokens(files[0], [entry("ops", token)])
    store = store_for(files, clock)
    files[0].write_text("tokens: [\n")
    with pytest.raises(TokenFileError):
        store.rotate()
    assert store.authenticate(f"Bearer {token}").name == "ops"
    assert not files[1].exists()


def test_a_retired_file_that_cannot_be_written_changes_nothing(tmp_path, clock):
    token = new_token()
    tokens_file, blocker = tmp_path / "tokens.yaml", tmp_path / "not-a-directory"
    blocker.write_text("")
    write_tokens(tokens_file, [entry("ops", token)])
    store = store_for((tokens_file, blocker / "retired.json"), clock)
    write_tokens(tokens_file, [])
    with pytest.raises(TokenFileError, match="cannot write .*retired.json"):
        store.rotate()
    assert store.authenticate(f"Bearer {token}").retiring_until is None


def test_an_unreadable_retired_file_means_no_grace(files, clock, caplog):
    token = new_token()
    write_tokens(files[0], [])
    files[1].parent.mkdir()
    files[1].write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="echod.auth"):
        store = store_for(files, clock)
    assert "ignoring retired-tokens file" in caplog.text
    assert refusal(store, f"Bearer {token}").code == "invalid_token"


# -- the audit log -----------------------------------------------------------------------------

def test_audit_lines_are_json_one_per_call_in_a_private_file(tmp_path, clock):
    path = tmp_path / "log" / "audit.jsonl"
    audit = AuditLog(path, clock=clock)
    audit.write(request_id="r1", token_sha256=token_hash(new_token()), token="ops",
                remote="10.0.0.1", method="POST", path="/api/v1/tools/lag", status=200,
                code=None, duration_ms=3.5, tool="lag")
    audit.write(request_id="r2", token_sha256=None, token=None, remote="10.0.0.2", method="GET",
                path="/api/v1/tools", status=401, code="unauthorized", duration_ms=0.1)
    audit.close()
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["request_id"] for r in records] == ["r1", "r2"]
    assert records[0]["ts"] == "2027-01-15T08:00:00.000Z"
    assert list(records[0])[0] == "ts" and records[1]["code"] == "unauthorized"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) & 0o027 == 0


@pytest.mark.parametrize("fields", [
    {"token": "TOKEN"}, {"path": "/api/v1/tools?access_token=TOKEN"},
    {"headers": {"Authorization": "Bearer TOKEN"}}, {"args": ["x", "TOKEN"]}])
def test_the_audit_log_refuses_anything_shaped_like_a_token(tmp_path, fields):
    token = new_token()
    fields = json.loads(json.dumps(fields).replace("TOKEN", token))
    audit = AuditLog(tmp_path / "audit.jsonl")
    with pytest.raises(ValueError, match="looks like a bearer token") as caught:
        audit.write(request_id="r1", **fields)
    assert token not in str(caught.value)
    audit.write(request_id="r2", role="ingero_sql", tool="ingero_find_stragglers")
    assert token not in (tmp_path / "audit.jsonl").read_text()
    assert len((tmp_path / "audit.jsonl").read_text().splitlines()) == 1


def test_two_processes_write_whole_lines(tmp_path):
    path = tmp_path / "audit.jsonl"
    writer = textwrap.dedent("""\
        import sys
        from pathlib import Path
        from echod.access.audit import AuditLog
        audit = AuditLog(Path(sys.argv[1]))
        for i in range(2000):
            audit.write(writer=sys.argv[2], seq=i, padding=sys.argv[2] * 3000)
        """)
    processes = [subprocess.Popen([sys.executable, "-c", writer, str(path), name])
                 for name in ("a", "b")]
    assert [p.wait(timeout=60) for p in processes] == [0, 0]
    records = [json.loads(line) for line in path.read_text().splitlines()]
    for name in ("a", "b"):
        assert [r["seq"] for r in records if r["writer"] == name] == list(range(2000))
    assert len(records) == 4000


# -- the rate limit ----------------------------------------------------------------------------

def test_a_burst_then_refusal_then_refill(clock):
    limiter = RateLimiter(rate_per_s=30, burst=100, clock=clock)
    assert [limiter.take("k") for _ in range(100)] == [0.0] * 100
    wait = limiter.take("k")
    assert wait == pytest.approx(1 / 30)
    clock.advance(wait)
    assert limiter.take("k") == 0.0
    assert limiter.take("k") > 0
    clock.advance(1.0)
    assert [limiter.take("k") for _ in range(30)] == [0.0] * 30
    assert limiter.take("k") > 0


def test_a_refusal_is_429_with_retry_after(clock):
    limiter = RateLimiter(rate_per_s=0.25, burst=2, clock=clock)
    limiter.check("k")
    limiter.check("k")
    with pytest.raises(RateLimited) as caught:
        limiter.check("k")
    assert (caught.value.status, caught.value.code) == (429, "rate_limited")
    assert caught.value.retry_after == 4 and caught.value.headers == {"Retry-After": "4"}
    fast = RateLimiter(rate_per_s=30, burst=1, clock=clock)
    fast.check("k")
    with pytest.raises(RateLimited) as caught:
        fast.check("k")
    assert caught.value.headers == {"Retry-After": "1"}      # never 0


def test_keys_are_independent_and_the_table_is_bounded(clock):
    limiter = RateLimiter(rate_per_s=1, burst=2, clock=clock, max_keys=3)
    for _ in range(2):
        limiter.take("a")
    assert limiter.take("a") > 0 and limiter.take("b") == 0.0
    for key in "cdefg":
        limiter.take(key)
    assert len(limiter) == 3
    clock.advance(2)                                  # every bucket full again: forgotten
    limiter.take("h")
    assert len(limiter) == 1


# -- echod token -------------------------------------------------------------------------------

def echod_root() -> click.Group:
    """echod's root command with 'token' under it, as echod.cli wires it."""
    from echod.cli import main
    if "token" in main.commands:
        return main
    return click.Group(main.name, commands={**main.commands, "token": token_group},
                       params=main.params, callback=main.callback,
                       invoke_without_command=True, context_settings=main.context_settings)


@pytest.fixture
def echod(tmp_path):
    config = tmp_path / "echod.yaml"
    config.write_text("{}\n")
    tokens_file = tmp_path / "etc" / "echod-tokens.yaml"

    def run(*args):
        return CliRunner().invoke(echod_root(), ["--config", str(config), "--tokens-file",
                                                 str(tokens_file), "token", *args])
    run.tokens_file = tokens_file
    return run


def test_create_prints_only_the_token_and_stores_only_its_hash(echod, tmp_path, clock):
    result = echod("create", "ops", "--clusters", "*", "--capabilities", "admin")
    assert result.exit_code == 0, result.output
    token = result.stdout.strip()
    assert result.stdout == token + "\n" and token.startswith("ingero_")
    assert "SIGHUP" in result.stderr
    text = echod.tokens_file.read_text()
    assert token not in text and token_hash(token) in text
    assert stat.S_IMODE(echod.tokens_file.stat().st_mode) == 0o600
    result = echod("create", "alice", "--clusters", "a100,h100", "--capabilities", "read,sql",
                   "--expires", "2999-01-01")
    alice = result.stdout.strip()
    store = store_for((echod.tokens_file, tmp_path / "retired.json"), clock)
    assert store.authenticate(f"Bearer {token}").may("admin")
    principal = store.authenticate(f"Bearer {alice}")
    assert principal.scope.clusters == {"a100", "h100"} and not principal.may("admin")
    assert "expires: '2999-01-01T00:00:00Z'" in echod.tokens_file.read_text()


@pytest.mark.parametrize("args, message", [
    (["ops", "--clusters", "*", "--capabilities", "read,write"],
     "unknown capability 'write' (read, sql, admin)"),
    (["ops", "--clusters", "a,*", "--capabilities", "read"], "'*' means every cluster"),
    (["ops", "--clusters", "*", "--capabilities", "read", "--expires", "soon"],
     "'soon' is not an ISO 8601 date"),
    (["ops", "--clusters", "*", "--capabilities", "read", "--expires", "2001-01-01"],
     "2001-01-01 is in the past"),
    (["bad name", "--clusters", "*", "--capabilities", "read"], "name must be"),
])
def test_create_refuses_bad_values(echod, args, message):
    result = echod("create", *args)
    assert result.exit_code == 2 and message in result.output
    assert not echod.tokens_file.exists()


def test_create_refuses_a_duplicate_and_keeps_the_other_entries(echod):
    echod("create", "ops", "--clusters", "*", "--capabilities", "read")
    echod("revoke", "ops", "--now")
    echod("create", "ops", "--clusters", "*", "--capabilities", "read")
    before = yaml.safe_load(echod.tokens_file.read_text())
    result = echod("create", "ops", "--clusters", "*", "--capabilities", "sql")
    assert result.exit_code == 1 and "already has a token named 'ops'" in result.output
    echod("create", "alice", "--clusters", "a100", "--capabilities", "read")
    after = yaml.safe_load(echod.tokens_file.read_text())
    assert after["tokens"][0] == before["tokens"][0] and after["revoked"] == before["revoked"]
    assert [t["name"] for t in after["tokens"]] == ["ops", "alice"]


def test_create_refuses_to_touch_a_broken_file(echod):
    echod.tokens_file.parent.mkdir()
    echod.tokens_file.write_text("tokens: [ops]\n")
    result = echod("create", "ops", "--clusters", "*", "--capabilities", "read")
    assert result.exit_code == 1 and "entry 1: expected a mapping" in result.output
    assert echod.tokens_file.read_text() == "tokens: [ops]\n"


def test_list_shows_hash_prefixes_never_tokens(echod):
    token = echod("create", "ops", "--clusters", "*", "--capabilities", "admin").stdout.strip()
    echod("create", "alice", "--clusters", "h100,a100", "--capabilities", "read",
          "--expires", "2999-01-01T12:00:00+01:00")
    result = echod("list")
    assert result.exit_code == 0 and token not in result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "CLUSTERS", "CAPABILITIES", "EXPIRES", "SHA256"]
    assert lines[1].split() == ["ops", "*", "read,sql,admin", "-", token_hash(token)[:12]]
    assert lines[2].split()[:4] == ["alice", "a100,h100", "read", "2999-01-01T11:00:00Z"]


def test_list_of_no_file_says_so(echod):
    result = echod("list")
    assert result.exit_code == 0 and result.stdout == "" and "no tokens in" in result.stderr


def test_revoke_leaves_a_grace_window_and_now_does_not(echod, tmp_path, clock):
    slow = echod("create", "slow", "--clusters", "*", "--capabilities", "read").stdout.strip()
    fast = echod("create", "fast", "--clusters", "*", "--capabilities", "read").stdout.strip()
    store = store_for((echod.tokens_file, tmp_path / "retired.json"), clock)
    result = echod("revoke", "slow")
    assert result.exit_code == 0 and "300 s after the next SIGHUP" in result.stderr
    result = echod("revoke", "fast", "--now")
    assert result.exit_code == 0 and "from the next SIGHUP on" in result.stderr
    assert yaml.safe_load(echod.tokens_file.read_text()) == {"tokens": [],
                                                             "revoked": [token_hash(fast)]}
    store.rotate()
    assert store.authenticate(f"Bearer {slow}").name == "slow"
    assert refusal(store, f"Bearer {fast}").code == "invalid_token"


def test_revoke_of_an_unknown_name_lists_the_known_ones(echod):
    echod("create", "ops", "--clusters", "*", "--capabilities", "read")
    result = echod("revoke", "opps")
    assert result.exit_code == 1 and "no token named 'opps'" in result.output
    assert "(tokens: ops)" in result.output


def test_every_token_command_ends_its_help_with_an_example():
    for command in [token_group, *token_group.commands.values()]:
        assert "Example: " in command.help.strip().splitlines()[-1]
