"""``ingero mcp`` end to end: the official MCP client (the SDK's ``Client`` over stdio) spawns
``python -m ingero mcp`` against the real echod API (TLS, tokens from 'echod token create',
evidence forwarded over the ingest socket) and lists, calls and prompts through it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError

from ingero import wire
from stack.launch import KeyRing

from .support import EchodApi, forward
from .test_echod_api import LATE_RANK, RANKS, evidence

ROOT = Path(__file__).resolve().parent.parent
TOKENS = {"admin": ("*", "admin"), "alpha-reader": ("alpha", "read")}


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    keys = KeyRing.create(tmp_path_factory.mktemp("keys"))
    echod = EchodApi(keys, "--rate-limit", "500", "--rate-burst", "2000", "--drain-seconds",
                     "0", tokens=TOKENS)
    t0 = time.time() - 600
    for seq, rows in enumerate((evidence("alpha", "4242", RANKS, LATE_RANK, t0),
                                evidence("beta", "77", 4, None, t0))):
        ack = forward(keys, echod.ingest, wire.Forward(seq, "test", rows))
        assert ack.stored == len(rows), ack
    yield echod
    assert echod.stop() == 0


def token_file(api: EchodApi, name: str) -> Path:
    path = api.root / f"{name}.token"
    path.write_text(api.tokens[name] + "\n")
    path.chmod(0o600)
    return path


def ingero_mcp(api: EchodApi, token: str) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, cwd=str(ROOT), args=[
        "-m", "ingero", "mcp", "--url", api.url, "--token-file", str(token_file(api, token)),
        "--ca-cert", str(api.cert)])


def with_client(server: StdioServerParameters, work):
    """Run ``await work(client)`` with the official client connected to ``server``."""
    async def session():
        async with Client(server, read_timeout_seconds=60) as client:
            return await work(client)
    return anyio.run(session)


def listed(api: EchodApi, token: str) -> dict[str, dict]:
    tools = api.request("GET", "/api/v1/tools", api.tokens[token]).json()["tools"]
    return {tool["name"]: tool for tool in tools if tool["allowed"]}


def text_of(result) -> str:
    return " ".join(block.text for block in result.content)


def error_text(result) -> str:
    assert result.is_error, result
    return text_of(result)


def test_an_admin_agent_gets_every_tool_and_walks_from_summary_to_cost(api):
    walk = (("cluster_summary", {}), ("find_stragglers", {"job": "4242"}),
            ("explain", {"job": "4242", "rank": LATE_RANK}),
            ("get_cost", {"job": "4242", "usd_per_gpu_hour": 2.49}))

    async def work(client: Client):
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        answers = {name: await client.call_tool(name, args) for name, args in walk}
        refused = await client.call_tool("event_history", {"limit": -1})
        rows = await client.call_tool("run_analysis", {"sql": "SELECT count(*) FROM events"})
        return tools, answers, refused, rows

    tools, answers, refused, rows = with_client(ingero_mcp(api, "admin"), work)
    http = listed(api, "admin")
    assert len(tools) == 15 and set(tools) == set(http) and "run_analysis" in tools
    for name, tool in tools.items():
        assert (tool.description, tool.input_schema, tool.output_schema) == \
            (http[name]["description"], http[name]["input_schema"], http[name]["output_schema"])

    # The client checked each answer against the tool's output schema on the way in.
    for name, answer in answers.items():
        assert not answer.is_error, (name, answer.content)
        assert json.loads(answer.content[0].text) == answer.structured_content
    ranking = answers["find_stragglers"].structured_content["ranks"]
    assert ranking[0]["rank"] == LATE_RANK and ranking[0]["straggler"] is True
    assert not any(entry["straggler"] for entry in ranking[1:])
    explained = answers["explain"].structured_content
    assert (explained["rank"], explained["cause"]) == (LATE_RANK, "host_preemption")
    assert answers["get_cost"].structured_content["usd"] > 0

    assert "bad_arguments" in error_text(refused) and "HTTP 400" in error_text(refused)
    assert not rows.is_error, rows.content          # the session outlived the refusal
    assert rows.structured_content["rows"][0][0] > 0


def test_a_read_only_agent_sees_no_sql_and_only_its_clusters(api):
    async def work(client: Client):
        names = {tool.name for tool in (await client.list_tools()).tools}
        other_cluster = await client.call_tool("find_stragglers", {"cluster": "beta"})
        with pytest.raises(MCPError) as unknown:
            await client.call_tool("run_analysis", {"sql": "SELECT 1"})
        mine = await client.call_tool("find_stragglers", {"job": "4242"})
        return names, other_cluster, unknown.value, mine

    names, other_cluster, unknown, mine = with_client(ingero_mcp(api, "alpha-reader"), work)
    assert names == set(listed(api, "alpha-reader"))
    assert "find_stragglers" in names and "run_analysis" not in names and len(names) < 15
    assert "forbidden_cluster" in error_text(other_cluster)
    assert "run_analysis" in unknown.message
    assert not mine.is_error, mine.content
    assert mine.structured_content["ranks"][0]["rank"] == LATE_RANK


def test_the_investigate_prompt_walks_from_summary_to_cost(api):
    async def work(client: Client):
        prompts = (await client.list_prompts()).prompts
        return prompts, await client.get_prompt("investigate", {"job": "4242"})

    prompts, prompt = with_client(ingero_mcp(api, "alpha-reader"), work)
    (listing,) = prompts
    assert listing.name == "investigate"
    assert {argument.name for argument in listing.arguments} == {"cluster", "job"}
    text = prompt.messages[0].content.text
    steps = [text.index(tool) for tool in ("cluster_summary", "find_stragglers", "explain",
                                           "get_cost")]
    assert steps == sorted(steps) and "4242" in text
    assert "straggler" in text and "confidence" in text and "cost" in text


def test_rate_limit_and_drain_are_tool_errors_saying_when_to_retry(tmp_path):
    echod = EchodApi(KeyRing.create(tmp_path / "keys"), "--rate-limit", "1", "--rate-burst",
                     "3", "--api-workers", "1", "--drain-seconds", "3",
                     tokens={"hasty": ("*", "read")})
    try:
        async def work(client: Client):
            limited = [await client.call_tool("cluster_summary", {}) for _ in range(5)]
            echod.daemon.process.send_signal(signal.SIGTERM)
            with anyio.move_on_after(3):
                while "draining" not in text_of(draining := await client.call_tool(
                        "cluster_summary", {})):
                    await anyio.sleep(0.1)
            return limited, draining

        limited, draining = with_client(ingero_mcp(echod, "hasty"), work)
        refused = [error_text(result) for result in limited if result.is_error]
        assert refused and "rate_limited" in refused[0] and "HTTP 429" in refused[0]
        assert "retry after" in refused[0]
        assert "draining" in error_text(draining) and "HTTP 503" in error_text(draining)
        assert "retry after" in error_text(draining)
        assert echod.daemon.process.wait(30) == 0
    finally:
        echod.stop()


def run_ingero_mcp(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ingero", "mcp", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_it_refuses_to_start_without_a_token_tls_or_a_good_token(api, tmp_path):
    no_token = run_ingero_mcp("--url", api.url, "--munge-socket", str(tmp_path / "no.sock"),
                              env={"PATH": "/usr/bin:/bin"})
    assert no_token.returncode != 0
    assert no_token.stderr.strip().splitlines() == [
        "Error: no token, and no munged here to prove who you are: give --token-file FILE, "
        "set INGERO_TOKEN, or run where munge runs"]
    only_token = run_ingero_mcp("--url", api.url, "--auth", "token", env={"PATH": "/usr/bin:/bin"})
    assert only_token.stderr.strip().splitlines() == [
        "Error: no token: give --token-file FILE or set INGERO_TOKEN (make one with "
        "'echod token create')"]
    plain = run_ingero_mcp("--url", f"http://127.0.0.1:{api.port}", "--token-file",
                           str(token_file(api, "admin")))
    assert plain.returncode != 0 and "--insecure-no-tls" in plain.stderr
    wrong = tmp_path / "wrong.token"
    wrong.write_text("ingero_" + "x" * 43)
    refused = run_ingero_mcp("--url", api.url, "--token-file", str(wrong), "--ca-cert",
                             str(api.cert))
    assert refused.returncode != 0 and "invalid_token" in refused.stderr
    untrusted = run_ingero_mcp("--url", api.url, "--token-file", str(token_file(api, "admin")))
    assert untrusted.returncode != 0 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
