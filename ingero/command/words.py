"""fleetd's verdicts and echod's explanations in plain words, for the CLI and the demo.

Each function takes the JSON the API answers (``find_stragglers``'s verdicts, ``explain``) and
returns text; nothing here calls the API.
"""

from __future__ import annotations

from datetime import datetime

from ingero.analysis.causes import CAUSE_WORDS, lateness, verdict_line


def verdict_summary(v: dict) -> str:
    """One line: who, what, where, why."""
    return (verdict_line(v["rank"], v["node"], v["kind"], v["period"], v["lag_p50_ms"], v["op"],
                         v["cause"]) + (f" ({v['severity']})" if v.get("severity") else ""))


def describe_verdict(v: dict) -> str:
    """A verdict as a short paragraph: what, why with the evidence, the fix, the cost."""
    lines = [f"Rank {v['rank']} on {v['node']}: {verdict_title(v)}",
             f"  what   {what(v)}",
             f"  why    {CAUSE_WORDS.get(v['cause'], v['cause'])} [{v['cause']}, "
             f"confidence {v['confidence'] or '?'}]"]
    lines += [f"         - {finding}" for finding in v.get("findings") or []]
    if v.get("fix"):
        lines.append(f"  fix    {v['fix']}")
    lines.append(f"  cost   {cost(v['cost_gpu_seconds'], v['cost_usd'])}")
    lines.append(f"  seen   raised {clock(v['raised'])}"
                 + (f", cleared {clock(v['cleared'])}" if v.get("cleared") else ", still live"))
    return "\n".join(lines)


def verdict_title(v: dict) -> str:
    severity = f"{v['severity']} " if v.get("severity") else ""
    return {"hang": f"{severity}hang", "died": f"{severity}rank died"}.get(
        v["kind"], f"{severity}straggler ({v['kind']})")


def what(v: dict) -> str:
    """How late, at which collective, how often, since when."""
    parts = [lateness(v["kind"], v["period"], v["lag_p50_ms"])]
    if v.get("lag_p99_ms") is not None and v["kind"] not in ("hang", "died"):
        parts[0] += f" (p99 {v['lag_p99_ms']:.1f} ms)"
    parts.append(f"at {v['op'] or 'its collectives'}"
                 + (f" on communicator {v['comm_hash']}" if v.get("comm_hash") else ""))
    if v.get("last_share") is not None:
        parts.append(f"last to arrive at {v['last_share']:.0%} of them")
    if v.get("step") is not None:
        parts.append(f"since step {v['step']}")
    if v.get("onset"):
        parts.append(f"from {clock(v['onset'])}")
    return ", ".join(parts)


def cost(gpu_seconds: float | None, usd: float | None) -> str:
    if gpu_seconds is None:
        return "not known"
    words = f"{gpu_seconds:.1f} GPU-seconds its peers spent waiting for it"
    return words + (f", ${usd:.4f}" if usd is not None else " (no GPU price known)")


def clock(iso: str | None) -> str:
    """An ISO time as the local wall clock, to the millisecond."""
    if not iso:
        return "-"
    return datetime.fromisoformat(iso).astimezone().strftime("%H:%M:%S.%f")[:-3]
