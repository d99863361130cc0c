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

import click

from ingero import __version__
from ingero.command import client
from ingero.command.client import EchodClient
from ingero.errors import ApiCallError, IngeroError

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

@click.command("mcp")
@client.client_options
def mcp_command(config: str | None, **flags) -> None:
    """Serve echod's tools to an AI agent over MCP on stdin/stdout.

    Offers each tool the token may call, under the same name and schemas, and the
    'investigate' prompt. The URL, token and CA come from the options, $INGERO_URL and
    $INGERO_TOKEN, or the client file.

    Example: ingero mcp --url https://head:7472 --token-file ~/.ingero-token
    """
    try:
        echod = client.connect(client.settings(config, flags))
        tools = echod.tools()
    except ApiCallError as exc:
        raise click.ClickException(f"cannot list echod's tools: {exc.describe()}") from None
    except IngeroError as exc:
        raise click.ClickException(str(exc)) from None
    serve(echod, tools)
