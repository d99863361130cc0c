"""The run_analysis tool: one read-only SQL statement, through the sandbox."""

from __future__ import annotations

import math

from ..registry import ToolContext, ToolError, obj, tool
from ..sandbox.check import MAX_SQL_CHARS, SqlError
from .schema import BOOL, NUM, STR, array, closed

# A user who reads only their own jobs is told a statement's time to this: how long a scan of
# rows they may not see took would tell them how many others' there are.
USER_ELAPSED_MS = 100.0


@tool("run_analysis", summary="One read-only SQL statement over the ingero tables of your "
      "clusters", capability="sql",
      input_schema=obj({
          "sql": {"type": "string", "minLength": 1, "maxLength": MAX_SQL_CHARS,
                  "description": "One SELECT, WITH, VALUES, TABLE or EXPLAIN statement."},
          "row_cap": {"type": "integer", "minimum": 1, "maximum": 10_000,
                      "description": "Most rows returned (default: the server's)."},
          "timeout_s": {"type": "number", "exclusiveMinimum": 0, "maximum": 600,
                        "description": "Statement timeout in seconds (default: the server's)."}},
          ("sql",)),
      output_schema=closed({"columns": array(STR), "rows": array(array({})),
                            "truncated": BOOL, "elapsed_ms": NUM}))
def run_analysis(ctx: ToolContext, args: dict) -> dict:
    """Run one read-only statement and return its columns and rows (truncated says the row cap
    cut it short). Tables: events (t, id, cluster, node, job, rank, kind, op, comm_hash, seq,
    bytes, duration_ns, attrs jsonb), health_scores (cluster, node, t, job, score, state,
    throughput, compute, memory, cpu), thresholds (cluster, cohort, t, threshold, median, mad,
    active, quorum_met, panic, stragglers), peer_lag, straggler_verdicts, jobs, nodes,
    call_stats (per rank and minute t: kind, op, comm_hash, peer_wait, calls, timed,
    duration_ns, bytes, last_t, and buckets, counts, sums: a histogram of durations). Only the
    rows of your clusters are visible; statements that write, change settings or reach files
    or the network are refused (400). Times come back in ISO 8601, intervals in seconds;
    elapsed_ms, to a user who reads only their own jobs, in whole tenths of a second."""
    timeout = args.get("timeout_s")
    timeout_ms = None if timeout is None else max(1, round(timeout * 1000))
    try:
        result = ctx.sandbox.run(args["sql"], ctx.scope, row_cap=args.get("row_cap"),
                                 timeout_ms=timeout_ms)
    except SqlError as exc:
        raise ToolError(str(exc), exc.code, exc.status) from exc
    elapsed = float(result.elapsed_ms)
    if ctx.scope.user is not None:
        elapsed = USER_ELAPSED_MS * max(1, math.ceil(elapsed / USER_ELAPSED_MS))
    return {"columns": list(result.columns), "rows": [list(row) for row in result.rows],
            "truncated": result.truncated, "elapsed_ms": elapsed}
