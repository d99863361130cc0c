"""The summary line and the Markdown section of ``bench/quality.py``, from its result alone:
the per-method and per-scenario tables, and where each method went wrong, with the reason that
the failing scenarios share."""

from __future__ import annotations

from bench import harness
from bench.quality_scoring import EXPECTED, HEALTH_K, LAG_SIGMAS, METHODS

SATURATED = 0.9                    # share of all CPUs busy over a job


def figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} s"


def summary(result: dict) -> str:
    m = result["methods"]
    ingero, ttv = m["ingero"], m["ingero"]["time_to_verdict"]
    return (f"ingero precision {figure(ingero['precision'])} recall {figure(ingero['recall'])} "
            f"cause {figure(ingero['cause_accuracy'])} median time to verdict "
            f"{seconds(ttv['median_s'])} (max {seconds(ttv['max_s'])}) tools agree "
            f"{figure(ingero.get('tools_agree'))} over "
            f"{len(result['scenarios'])} scenarios; lag mean±2σ "
            f"P {figure(m['lag_mean_2sigma']['precision'])} "
            f"R {figure(m['lag_mean_2sigma']['recall'])}; health MAD "
            f"P {figure(m['health_mad']['precision'])} R {figure(m['health_mad']['recall'])}")


def method_rows(result: dict) -> list[list]:
    rows = []
    for method, label in METHODS.items():
        m = result["methods"][method]
        ttv = m.get("time_to_verdict")
        rows.append([label, figure(m["precision"]), figure(m["recall"]), m["tp"], m["fp"],
                     m["fn"], figure(m.get("cause_accuracy")) if method == "ingero" else "–",
                     f"{seconds(ttv['median_s'])} / {seconds(ttv['max_s'])}" if ttv else "–"])
    return rows


def ranks_text(ranks: list[int], most: int = 4) -> str:
    shown = ", ".join(str(r) for r in ranks[:most])
    return shown + (f" … ({len(ranks)})" if len(ranks) > most else "")


def truth_cell(row: dict) -> str:
    if not row["truth"]:
        return "none"
    by_kind: dict[str, list[int]] = {}
    for t in row["truth"]:
        by_kind.setdefault(t["kind"], []).append(t["rank"])
    return "; ".join(f"{kind} {ranks_text(ranks)}" for kind, ranks in by_kind.items())


def named_cell(row: dict, method: str) -> str:
    """'found/stragglers', then the ranks named wrongly (nodes, for the health baseline)."""
    t, truth = row[method]["tally"], {s["rank"] for s in row["truth"]}
    cell = f"{t['tp']}/{len(truth)}" if truth else "–"
    if t["fp"]:
        wrong = [r for r in row[method]["named"] if r not in truth]
        where = (", ".join(row[method]["nodes"]) if method == "health_mad"
                 else ranks_text(wrong))
        cell += f", {t['fp']} wrong ({where})"
    return cell


def cause_cell(row: dict) -> str:
    found = row["ingero"]["tally"]["tp"]
    return f"{len(row['ingero']['diagnosed'])}/{found}" if found else "–"


def verdict_time_cell(row: dict) -> str:
    times = list(row["ingero"]["time_to_verdict_s"].values())
    if not times:
        return "–"
    if len(times) == 1:
        return seconds(times[0])
    return f"{seconds(min(times))}–{seconds(max(times))}"


def tools_cell(row: dict) -> str:
    tools = row.get("tools")
    return f"{tools['agreed']}/{tools['checks']}" if tools else "–"


def scenario_rows(result: dict) -> list[list]:
    rows = []
    for row in result["scenarios"]:
        name = row["name"] + ("" if row["job_ok"] else " (job failed)")
        rows.append([f"`{name}`", row["what"], row["ranks"], f"{row['cpu_busy'] * 100:.0f}%",
                     truth_cell(row),
                     named_cell(row, "ingero"), cause_cell(row), tools_cell(row),
                     verdict_time_cell(row),
                     named_cell(row, "lag_mean_2sigma"), named_cell(row, "health_mad")])
    return rows


def names(rows: list[dict]) -> str:
    return ", ".join(f"`{r['name']}`" for r in rows)


def failures(result: dict, method: str) -> str:
    """Where a method missed a straggler or named a healthy rank, by scenario."""
    missed = [r for r in result["scenarios"] if r[method]["tally"]["fn"]]
    wrong = [r for r in result["scenarios"] if r[method]["tally"]["fp"]]
    return " and ".join([f"missed stragglers in {names(missed)}" if missed else "missed none",
                         f"named healthy ranks in {names(wrong)}" if wrong
                         else "named no healthy rank"])


def said(row: dict, rank: int) -> str:
    """What ingero's verdicts said of a rank: kind/cause, the lag, when (into the job)."""
    return ", then ".join(
        f"{v['kind']}/{v['cause']}"
        + (f" {v['lag_p50_ms']:.0f} ms late" if v["lag_p50_ms"] is not None
           and v["kind"] not in ("hang", "died") else "")
        + f" at {v['raised_s']:.1f} s" for v in row["ingero"]["verdicts"] if v["rank"] == rank)


def ingero_notes(result: dict) -> str:
    """What ingero said of the ranks it named wrongly, how busy the machine was then, and where
    its diagnosis was not the injected one; times are from the job's start."""
    wrong, other, busy, lags = [], [], [], []
    for row in result["scenarios"]:
        truth = {t["rank"]: t["kind"] for t in row["truth"]}
        where = f"`{row['name']}` ({row['seconds']:.1f} s)"
        named = [r for r in row["ingero"]["named"] if r not in truth]
        if named:
            wrong.append(f"{where}: " + "; ".join(f"rank {r}, {said(row, r)}" for r in named))
            busy.append(row["cpu_busy"])
            lags += [v["lag_p50_ms"] for v in row["ingero"]["verdicts"]
                     if v["rank"] in named and v["lag_p50_ms"] is not None
                     and v["kind"] not in ("hang", "died")]
        undiagnosed = [r for r in row["ingero"]["named"]
                       if r in truth and r not in row["ingero"]["diagnosed"]]
        if undiagnosed:
            other.append(f"`{row['name']}` (CPUs {row['cpu_busy'] * 100:.0f}% busy): " + "; ".join(
                f"rank {r} ({truth[r]}), {said(row, r)}" for r in undiagnosed))
    notes = []
    if wrong:
        notes.append("Named wrongly, with times from the job's start: " + "; ".join(wrong)
                     + f". Those jobs kept the CPUs {percent_range(busy)} busy"
                     + (f", and the ranks were {min(lags):.0f} to {max(lags):.0f} ms late by "
                        "ingero's corrected clocks" if lags else "")
                     + ("; most likely lateness the saturated CPUs made rather than none at "
                        "all, but nothing was injected there, so it counts as wrong"
                        if min(busy) >= SATURATED else "") + ".")
    if other:
        notes.append("A diagnosis other than the injected one: " + "; ".join(other) + ".")
    return " ".join(notes)


def percent_range(shares: list[float]) -> str:
    low, high = round(min(shares) * 100), round(max(shares) * 100)
    return f"{low}%" if low == high else f"{low}–{high}%"


def lag_notes(result: dict) -> list[str]:
    """Why the lag baseline failed where it did, by what those scenarios share."""
    rows = result["scenarios"]
    errs = [r for r in rows if r["lag_mean_2sigma"]["tally"]["fn"]
            or r["lag_mean_2sigma"]["tally"]["fp"]]
    skewed = [r for r in errs if r["skewed_node"] is not None]
    fatal = [r for r in errs if r not in skewed and r["lag_mean_2sigma"]["tally"]["fn"]
             and any(t["kind"] in ("die", "hang") for t in r["truth"])]
    crowded = [r for r in errs if r not in skewed + fatal and len(r["truth"]) >= 3
               and r["lag_mean_2sigma"]["tally"]["fn"]]
    healthy = [r for r in errs if r not in skewed and not r["truth"]]
    rest = [r for r in errs if r not in skewed + fatal + crowded + healthy]
    skew_ms = result["settings"]["skew_s"] * 1000
    notes = [(skewed, f"it reads raw node times, as a tool without clock correction would, "
                      f"and a node {skew_ms:.0f} ms ahead looks late, so its ranks are named, or "
                      f"they widen σ until a real straggler is under the bar"),
             (fatal, "a rank that dies or hangs stops producing lags, and the ones it had "
                     "were normal"),
             (crowded, "several late ranks raise the mean and widen σ until some of them "
                       "are under the bar"),
             (healthy, "with no straggler at all, the ranks with the most jitter stand over "
                       "mean + 2σ, since some rank always does"),
             (rest, "a straggler's mean lag stayed under the bar, or a healthy rank's went "
                    "over it")]
    return [f"{why} ({names(where)})" for where, why in notes if where]


def health_notes(result: dict) -> list[str]:
    rows = result["scenarios"]
    missed = [r for r in rows if r["health_mad"]["tally"]["fn"]]
    wrong = [r for r in rows if r["health_mad"]["tally"]["fp"]]
    notes = []
    if missed:
        notes.append("a late rank makes every rank wait for it, so the throughput part of "
                     "every node's score falls together and the late one's node does not stand "
                     "out")
    if wrong:
        notes.append("a node stands out only through its own CPU or compute signal, and then "
                     "it names every rank on it: "
                     + "; ".join(f"{', '.join(r['health_mad']['nodes'])} in `{r['name']}`, "
                                 f"{r['health_mad']['tally']['fp']} healthy ranks"
                                 for r in wrong))
    return notes


def sentence(head: str, notes: list[str]) -> str:
    return head + (": " + "; ".join(notes) if notes else "") + "."


def reading(result: dict) -> str:
    s = result["settings"]
    return "\n\n".join([
        f"How to read it. A straggler counts as found when the method names its rank; cause "
        f"counts ingero's found ranks whose verdict says what was injected "
        f"({', '.join(f'{k} → {v}' for k, v in sorted(expectations().items()))}). Time to "
        f"verdict runs from the straggler's onset in its own record (its first late entry; for "
        f"a rank that dies or hangs, when its peers entered the collective it never reached) "
        f"to fleetd raising the verdict; agents push every {s['push_s']:g} s and a hang "
        f"is called after {s['hang_timeout_s']:g} s. Healthy scenarios can only add wrong "
        f"names. Tools agree counts the checks where what a user reads is fleetd's word: "
        f"every `find_stragglers` answer while the job ran and after (a rank is `straggler: "
        f"true` exactly when the answer's verdicts name it), and `explain` of every rank "
        f"named, over the bar or noted after the job (its cause is that of fleetd's newest "
        f"verdict of it, or none).{tools_notes(result)}",
        f"ingero {failures(result, 'ingero')}. {ingero_notes(result)}".strip(),
        sentence(f"lag mean±2σ {failures(result, 'lag_mean_2sigma')}", lag_notes(result)),
        sentence(f"health MAD per node {failures(result, 'health_mad')}",
                 health_notes(result))])


def tools_notes(result: dict) -> str:
    wrong = [f"`{row['name']}`: " + "; ".join(row["tools"]["disagreements"])
             for row in result["scenarios"] if row.get("tools", {}).get("disagreements")]
    return (" Where they did not: " + "; ".join(wrong) + ".") if wrong else ""


def expectations() -> dict[str, str]:
    return {kind: " and ".join(f"{field} {value}" for field, value in want.items())
            for kind, want in EXPECTED.items()}


def stack_sentence(s: dict) -> str:
    if s["skewed_agent"] is None:
        return f"One stack serves every scenario, with {s['agents']} agents; no clock is skewed. "
    return (f"One stack serves every scenario, with {s['agents']} agents; {s['skewed_agent']}'s "
            f"clock runs {s['skew_s'] * 1000:.0f} ms ahead (faketime). The scenarios that say so "
            f"run one of their nodes on it (the agents tell ranks apart by their host label, INGERO_SIM_NODE); the "
            f"others never touch it. ")


TARGET = 0.95          # ingero's precision, recall and cause accuracy, each


def target(result: dict) -> str:
    """Whether ingero met the target, in a sentence."""
    m = result["methods"]["ingero"]
    scores = {"precision": m.get("precision"), "recall": m.get("recall"),
              "cause accuracy": m.get("cause_accuracy")}
    short = [f"{name} {value}" for name, value in scores.items()
             if value is None or value < TARGET]
    if m.get("tools_agree") != 1.0:
        short.append(f"tools agree {figure(m.get('tools_agree'))}")
    return (f"Target: precision, recall and cause accuracy of at least {TARGET} each, over "
            f"every scenario, the launchers, data-loader workers, tensor and pipeline "
            f"parallelism, a host ahead of its GPU, a late node and an elastic restart "
            f"included, and the tools agreeing with fleetd at every check: "
            + ("met." if not short else "missed (" + ", ".join(short) + ")."))


def section(result: dict) -> str:
    s = result["settings"]
    widest = max(row["ranks"] for row in result["scenarios"])
    return "\n\n".join([
        "## Detection quality: `quality.py`",
        "Sim jobs with injected stragglers run under the whole product on one machine: echod "
        "on its own PostgreSQL, fleetd, and one node-wide ingerod per simulated node with bcc "
        "uprobes on the sim's CUDA and NCCL libraries. fleetd's verdicts are read with "
        "`find_stragglers` every push interval while a job runs, as `ingero demo` tells them "
        "(the store keeps a verdict's newest revision only), and once more after it ends; the "
        "job's stored collective entries and its nodes' health scores are then read with SQL "
        "over echod's API and given to two baselines, so all three methods judge the same "
        "events. Scores are at rank level: a named straggler is "
        "found, a named healthy rank is wrong, an unnamed straggler is missed.",
        f"The baselines. *lag mean±2σ*: collectives aligned by (communicator, sequence), a "
        f"rank's lag is its entry time minus the median entry of the others, and ranks whose "
        f"mean lag is over the mean + {LAG_SIGMAS:g}σ of all ranks' mean lags are named; it "
        f"gets raw node times, no clock correction. *health MAD per node* (the way the older "
        f"Fleet decided): each node's median health score over the job, nodes below median − "
        f"{HEALTH_K:g}·1.4826·MAD of those medians (MAD floored at 0.01, as fleetd floors it) "
        f"are named, and a named node names every rank it ran. Neither gives a cause.",
        stack_sentence(s) + f"The largest job has {widest} ranks on this machine's "
        f"{result.get('measured', {}).get('cpus', '?')} CPUs: sim ranks mostly sleep through "
        f"their simulated GPU time, but every traced call traps into the kernel and the agents, "
        f"fleetd, echod and PostgreSQL share the same CPUs, so the larger jobs keep the "
        f"machine busy (the CPU busy column: all CPUs, over the job), which real nodes with "
        f"cores of their own would not. The run took {result['seconds']} s.",
        "```\n.venv/bin/python -m bench.quality            # every scenario\n"
        ".venv/bin/python -m bench.quality --smoke    # two 8-rank jobs\n```",
        harness.table(["method", "precision", "recall", "found", "wrong", "missed", "cause",
                       "time to verdict (median / max)"], method_rows(result)),
        target(result),
        harness.table(["scenario", "what", "ranks", "CPU busy", "stragglers", "ingero", "cause",
                       "tools agree", "time to verdict", "lag mean±2σ", "health MAD"],
                      scenario_rows(result)),
        reading(result),
        harness.measured_line(result)])
