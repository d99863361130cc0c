"""``ingero mcp``: echod's tools for AI agents, as an MCP server on stdio.

The server holds no tool of its own. At start it asks echod's HTTP API which tools exist
(``GET /api/v1/tools``) and offers each one the token may call under the same name, description
and JSON Schemas; a call is ``POST /api/v1/tools/<name>`` with the token, and echod's answer
comes back as structured content and as JSON text. An API error (bad arguments, another
cluster, 429, 503) is a tool error carrying echod's message and code, never the end of the
session. The ``investigate`` prompt walks an agent from the cluster summary to the straggler
ranking, the top straggler's explanation and its cost.

An MCP client starts it as a command; for example, in a client's JSON configuration::

    {"mcpServers": {"ingero": {
        "command": "ingero",
        "args": ["mcp", "--url", "https://head:7472",
                 "--token-file", "/home/me/.config/ingero/token",
                 "--ca-cert", "/etc/ingero/echod.crt"]}}}

(or leave out ``--token-file`` and set ``"env": {"INGERO_TOKEN": "ingero_..."}``). Make the token
with ``echod token create``; its clusters and capabilities decide what the agent sees.
"""

from __future__ import annotations

import json
import math
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import click

from . import __version__
from .errors import ApiCallError

TIMEOUT_S = 120            # the API's own SQL limit is 60 s; leave it room to answer
TOKEN_ENV = "INGERO_TOKEN"


class EchodClient:
    """echod's HTTP API with one bearer token, TLS verified against ``ca_cert`` (the system's
    CAs when None), every request bounded by ``timeout`` seconds."""

    def __init__(self, url: str, token: str, ca_cert: str | None = None,
                 timeout: float = TIMEOUT_S):
        self.url, self.timeout = url.rstrip("/"), timeout
        self.opener = urllib.request.build_opener(
            _NoRedirect, urllib.request.HTTPSHandler(context=ssl.create_default_context(
                cafile=ca_cert)))
        self.headers = {"Authorization": f"Bearer {token}", "Accept": "application/json",
                        "User-Agent": f"ingero-mcp/{__version__}"}

    def tools(self) -> list[dict]:
        """The tools this token may call, as echod lists them."""
        listing = self._request("GET", "/api/v1/tools")
        return [tool for tool in listing["tools"] if tool.get("allowed")]

    def call(self, name: str, arguments: dict) -> dict:
        return self._request("POST", f"/api/v1/tools/{name}", arguments)

    def _request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        headers = self.headers if data is None else {**self.headers,
                                                     "Content-Type": "application/json"}
        request = urllib.request.Request(self.url + path, data, headers, method=method)
        try:
            with self.opener.open(request, timeout=self.timeout) as answer:
                return json.loads(answer.read())
        except urllib.error.HTTPError as answer:
            raise _refusal(answer.code, answer.headers.get("Retry-After"),
                           answer.read()) from None
        except OSError as exc:                    # URLError, TLS, refused, timed out
            raise ApiCallError(f"cannot reach echod at {self.url}: "
                             f"{getattr(exc, 'reason', exc)}", "unreachable") from None
        except ValueError:
            raise ApiCallError(f"echod at {self.url} answered {path} with no JSON",
                             "bad_answer") from None


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Answer a redirect as the error it is here: following it could carry the token to
    another host, or onto plain HTTP."""

    def redirect_request(self, *args, **kwargs):
        return None


def _refusal(status: int, retry_after: str | None, body: bytes) -> ApiCallError:
    """echod's {"error", "code"} answer (or whatever else answered) as an ApiCallError."""
    try:
        error = json.loads(body)
    except ValueError:
        error = None
    error = error if isinstance(error, dict) else {}
    return ApiCallError(error.get("error") or f"echod answered HTTP {status}",
                      error.get("code") or "http_error", status, _seconds(retry_after))


def _seconds(header: str | None) -> int | None:
    try:
        return max(1, math.ceil(float(header))) if header else None
    except ValueError:
        return None


# -- the investigate prompt ----------------------------------------------------------------------

def investigate(cluster: str | None = None, job: str | None = None) -> str:
    """The steps an agent takes to find the slow rank, why it is slow and what it costs."""
    where = {"cluster": cluster} if cluster else {}
    scope = {**where, "job": job} if job else where
    target = " on ".join(filter(None, (job and f"job {job}", cluster and f"cluster {cluster}")))
    steps = [
        f"Call cluster_summary with {json.dumps(where)}: per cluster, the nodes reporting, the "
        "recent jobs, each cohort's threshold and the nodes under it now."
        + ("" if job else " No job was given: pick a recent job whose nodes are under the bar "
           "(or, failing that, the busiest one) and pass it as `job` from here on."),
        f"Call find_stragglers with {json.dumps(scope) if job else 'that job'}: its ranks, the "
        "most suspect first. In each entry look at `straggler` (true: its median entry lag is "
        "above the job's bar, `bar_ms` under `jobs`; false: noise), its lag (`lag_median_ms`, "
        "`lag_p95_ms`: how late it enters the collectives its peers already wait in), "
        "`last_arrivals`, `idle_caused_gpu_s` and its `evidence`. If no entry is a straggler, "
        "report that no rank straggles and stop.",
        "Call explain with the job and the top-ranked straggler's `rank`: read `cause`, "
        "`confidence` and `fix`, then the `findings` and the evidence behind them "
        "(preemptions and who preempted, block I/O, its node's health signals, time in its "
        "own work against waiting for peers).",
        "Call get_cost for the same job (with `gpu` and `provider`, or `usd_per_gpu_hour`, if "
        "you know them): the GPU-hours idle at the collectives because of late ranks, their "
        "price in `usd`, and each rank's share in `by_rank`.",
    ]
    return "\n\n".join([
        f"Find the slow rank of {target or 'the clusters this token can see'} with ingero's "
        "tools, in this order:",
        *(f"{number}. {step}" for number, step in enumerate(steps, 1)),
        "Then report in a few lines: which rank (and node) is slow, in which collectives "
        "(collective_stats names the ops), how late it is, why (the cause, with its "
        "confidence), the fix, and what it costs. Quote the numbers the tools returned; "
        "invent none."])


# -- the MCP server ------------------------------------------------------------------------------

def serve(echod: EchodClient, tools: list[dict]) -> None:
    """Serve ``tools`` over MCP on stdin/stdout until the client closes them."""
    # The SDK takes seconds to import; only this command pays for it.
    import anyio
    import anyio.to_thread
    from mcp import types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError

    offered = {tool["name"]: types.Tool(
        name=tool["name"], title=tool["summary"], description=tool["description"],
        input_schema=tool["input_schema"], output_schema=tool.get("output_schema"),
        annotations=types.ToolAnnotations(read_only_hint=True, open_world_hint=False))
        for tool in tools}
    prompt = types.Prompt(
        name="investigate", title="Investigate a slow job",
        description="From the cluster summary to the stragglers, the top straggler's "
                    "explanation and its cost.",
        arguments=[types.PromptArgument(name="cluster", description="Cluster name"),
                   types.PromptArgument(name="job", description="Slurm job id")])

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=list(offered.values()))

    async def call_tool(ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        if params.name not in offered:
            raise MCPError(types.INVALID_PARAMS, f"no tool named {params.name!r} for this token")
        try:
            result = await anyio.to_thread.run_sync(echod.call, params.name,
                                                    params.arguments or {})
        except ApiCallError as exc:
            return types.CallToolResult(is_error=True, content=[types.TextContent(
                text=f"{params.name}: {exc.describe()}")])
        return types.CallToolResult(structured_content=result, content=[
            types.TextContent(text=json.dumps(result, indent=2))])

    async def list_prompts(ctx, params) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[prompt])

    async def get_prompt(ctx, params: types.GetPromptRequestParams) -> types.GetPromptResult:
        if params.name != prompt.name:
            raise MCPError(types.INVALID_PARAMS, f"no prompt named {params.name!r}")
        args = params.arguments or {}
        text = investigate(args.get("cluster"), args.get("job"))
        return types.GetPromptResult(description=prompt.description, messages=[
            types.PromptMessage(role="user", content=types.TextContent(text=text))])

    server = Server("ingero", version=__version__, instructions=(
        "echod's evidence of slow ranks in distributed GPU training. Start with the "
        "'investigate' prompt, or cluster_summary then find_stragglers."),
        on_list_tools=list_tools, on_call_tool=call_tool, on_list_prompts=list_prompts,
        on_get_prompt=get_prompt)

    async def run() -> None:
        async with stdio_server() as (read_stream, write_stream):
            await server.run(read_stream, write_stream, server.create_initialization_options())

    anyio.run(run)


# -- the command ---------------------------------------------------------------------------------

def read_token(token_file: Path | None) -> str:
    if token_file is not None:
        try:
            token = token_file.read_text().strip()
        except OSError as exc:
            raise click.ClickException(f"cannot read the token file: {exc}") from None
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise click.ClickException(f"no token: give --token-file FILE or set {TOKEN_ENV} "
                                   f"(make one with 'echod token create')")
    return token


@click.command("mcp")
@click.option("--url", required=True, help="echod's API, e.g. https://head:7472")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              help=f"File holding the bearer token [default: ${TOKEN_ENV}]")
@click.option("--ca-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="PEM CA (or echod's own certificate) to verify echod by "
                   "[default: the system's CAs]")
@click.option("--timeout", default=TIMEOUT_S, show_default=True,
              type=click.FloatRange(1, 3600), help="Seconds to wait for each API answer")
@click.option("--insecure-no-tls", is_flag=True,
              help="Allow an http:// URL: the token and every answer cross the network "
                   "unencrypted, and nothing proves the server is echod")
def mcp_command(url: str, token_file: Path | None, ca_cert: Path | None, timeout: float,
                insecure_no_tls: bool) -> None:
    """Serve echod's tools to an AI agent over MCP on stdin/stdout.

    Offers each tool the token may call, under the same name and schemas, and the
    'investigate' prompt. The token comes from --token-file or $INGERO_TOKEN.

    Example: ingero mcp --url https://head:7472 --token-file ~/.ingero-token
    """
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "http" and not insecure_no_tls:
        raise click.ClickException("refusing a plain http:// URL: the token would cross the "
                                   "network unencrypted (--insecure-no-tls to allow it)")
    if scheme not in ("https", "http"):
        raise click.ClickException(f"--url must be https://HOST:PORT, not {url!r}")
    echod = EchodClient(url, read_token(token_file), str(ca_cert) if ca_cert else None,
                        timeout)
    try:
        tools = echod.tools()
    except ApiCallError as exc:
        raise click.ClickException(f"cannot list echod's tools: {exc.describe()}") from None
    serve(echod, tools)
