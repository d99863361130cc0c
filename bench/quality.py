"""Detection quality: does ingero name the right ranks, for the right reason, and how soon?
Scored over sim scenarios against two baselines that read the same stored events.

One stack of the real product runs for the whole benchmark (``stack.local``: echod on its own
PostgreSQL, fleetd, node-wide ingerods with bcc uprobes on the sim's libraries). Each scenario
is a sim job with its own Slurm job id; fleetd's verdicts are read with the ``find_stragglers``
tool once a push interval while it runs (every revision is seen: the store keeps the newest)
and after it ends, and the job's collective entries and its nodes' health scores with SQL over
echod's API, for the baselines (``quality_scoring``). The truth is the scenario's injected
stragglers; their onset times come from the ranks' own records. The stack has one agent more
than the widest job, its clock 250 ms ahead (faketime): the clock-skew scenarios run one of
their nodes on it. ``--smoke`` runs two 8-rank jobs, one late rank (on the skewed node) and
one healthy. The tables and notes of the section are ``quality_report``'s.

    .venv/bin/python -m bench.quality [--smoke] [--only NAME ...]
"""

from __future__ import annotations

import shutil
import statistics
import sys
import tempfile
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path


from bench import harness, quality_report
from bench.quality_scoring import (HEALTH_K, LAG_SIGMAS, METHODS, Entry, Tally,
                                   diagnosed, disagreements, explained_against, health_mad,
                                   lag_mean_sigma, ranks_of_nodes, rounded, spread)
from sim import scenario as scenarios
from sim.cluster import Cluster
from sim.processes import ClusterResult
from sim.records import read_record

NAME = "quality"
ROOT_BECAUSE = "the agents load eBPF probes (CAP_BPF, CAP_PERFMON)"
summary, section = quality_report.summary, quality_report.section   # the one line, the docs

PUSH_S = 1.0
HANG_TIMEOUT_S = 4.0
SKEW_S = 0.25
SETTLE_S = 3 * PUSH_S + 2          # the last pushes, fleetd's tick and echod's commit
PAGE_ROWS = 10_000                 # the SQL endpoint's largest row cap


# -- the scenarios -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """A scenario, which of its nodes (if any) runs on the agent whose clock is ahead, and
    which of its injected stragglers cost nothing (a host late but ahead of its GPU): they
    are no straggler to name."""

    scenario: scenarios.Scenario
    skewed_node: int | None = None
    harmless: tuple[int, ...] = ()

    @property
    def name(self) -> str:
        return self.scenario.name


def case(name: str, what: str, nodes: int, ranks_per_node: int, stragglers=(),
         skewed_node: int | None = None, harmless: tuple[int, ...] = (), **job) -> Case:
    base = {"nodes": nodes, "ranks_per_node": ranks_per_node, "steps": 60, "step_ms": 50,
            "allreduce_bytes": 1 << 20, "timeout_s": 30}
    return Case(scenarios.parse({"name": name, "description": what, "job": base | job,
                                 "stragglers": list(stragglers)}), skewed_node, harmless)


def delay(rank: int, ms: float, from_step: int = 0) -> dict:
    return {"rank": rank, "kind": "host_delay", "delay_ms": ms, "from_step": from_step}


FORTY_PERCENT = [delay(rank, 20 + 5 * i) for i, rank in
                 enumerate([1, 3, 6, 8, 10, 13, 17, 20, 22, 25, 28, 31])]

FULL = [
    case("late-onset", "rank 11 turns 60 ms late on the host at step 30", 2, 8,
         [delay(11, 60, 30)]),
    case("slow-from-start", "rank 3 is 30 ms late from step 0", 2, 4, [delay(3, 30)]),
    case("periodic", "rank 1 stalls 80 ms every 5th step", 2, 4,
         [{"rank": 1, "kind": "hiccup", "delay_ms": 80, "every": 5}]),
    case("slow-gpu", "rank 6's GPU runs kernels 1.5× slower", 4, 4,
         [{"rank": 6, "kind": "slow_gpu", "factor": 1.5}]),
    case("cpu-contention", "rank 2 shares its CPU with three busy loops at nice -10", 2, 4,
         [{"rank": 2, "kind": "cpu_contention", "hogs": 3, "nice": -10}], host_work_ms=2),
    case("rank-dies", "rank 6 exits at step 30", 2, 4,
         [{"rank": 6, "kind": "die", "at_step": 30}], timeout_s=12),
    case("rank-hangs", "rank 9 stops calling anything at step 30", 2, 8,
         [{"rank": 9, "kind": "hang", "at_step": 30}], timeout_s=12),
    case("three-at-once", "3 of 8 slow at once: host delay, slow GPU, CPU contention", 2, 4,
         [delay(1, 60), {"rank": 4, "kind": "slow_gpu", "factor": 2.0},
          {"rank": 6, "kind": "cpu_contention", "hogs": 3, "nice": -10}], host_work_ms=1),
    case("forty-percent", "12 of 32 ranks late by 20 to 75 ms", 4, 8, FORTY_PERCENT),
    case("clock-skew-healthy", "no straggler; node 5's agent clock is 250 ms ahead", 8, 2,
         skewed_node=5, jitter_ms=2),
    case("clock-skew-straggler", "rank 10 late by 50 ms; node 1's agent clock 250 ms ahead",
         4, 4, [delay(10, 50, 20)], skewed_node=1),
    *(case(f"{launcher}-late", f"launched by {launcher}: rank 5 turns 60 ms late at step 10",
           2, 4, [delay(5, 60, 10)], launcher=launcher)
      for launcher in ("torchrun", "torchrun-batch", "mpirun", "bare")),
    case("workers-late", "2 data-loader workers a rank, forked every 10 steps; rank 3 60 ms "
         "late", 2, 4, [delay(3, 60, 10)], launcher="torchrun", workers=2, epoch_steps=10),
    case("workers-hang", "2 data-loader workers a rank; rank 6 hangs at step 25, after an "
         "epoch boundary", 2, 4, [{"rank": 6, "kind": "hang", "at_step": 25}],
         launcher="torchrun", workers=2, epoch_steps=10, timeout_s=12),
    case("tp-pp-slow-gpu", "tp 2, pp 2, stage 0 twice stage 1's work; rank 2's GPU 1.4× "
         "slower", 2, 4, [{"rank": 2, "kind": "slow_gpu", "factor": 1.4}],
         launcher="torchrun", parallel={"tp": 2, "pp": 2}, stage_work=[40, 20]),
    case("tp-pp-late", "tp 2, pp 2; rank 6 40 ms late on the host", 2, 4, [delay(6, 40, 10)],
         launcher="torchrun", parallel={"tp": 2, "pp": 2}, stage_work=[40, 20]),
    case("host-ahead", "syncs every 10 steps; from step 40 rank 5's host 6 ms slower a step, "
         "still ahead of its GPU: no straggler", 2, 4, [delay(5, 6, 40)], harmless=(5,),
         sync_every=10, step_ms=20, steps=100),
    case("host-behind", "syncs every 10 steps; from step 40 rank 5's host 30 ms slower a "
         "step, behind its GPU queue", 2, 4, [delay(5, 30, 40)], sync_every=10, step_ms=20,
         steps=100),
    case("tp-pp-healthy", "mpirun; tp 2, pp 2, stage 0 twice stage 1's work; 2 data-loader "
         "workers a rank, forked every 40 steps; a sync every 5 steps; 0 to 3 ms of random "
         "host time a step: no straggler", 2, 4, launcher="mpirun",
         parallel={"tp": 2, "pp": 2}, stage_work=[30, 15], workers=2, epoch_steps=40,
         sync_every=5, jitter_ms=3, steps=120),
    case("late-node", "a sync every step; from step 10 all four ranks of node 2 spend 30 ms "
         "more on the host a step (25 ms steps)", 4, 4,
         [delay(rank, 30, 10) for rank in range(8, 12)], step_ms=25, steps=80),
    case("slow-gpu-1.3", "rank 6's GPU runs kernels 1.3× slower", 4, 4,
         [{"rank": 6, "kind": "slow_gpu", "factor": 1.3}]),
    case("host-delay-24", "24 ranks on the machine's CPUs; rank 13 80 ms late on the host "
         "from step 10, past the 50 ms its GPU has queued", 3, 8, [delay(13, 80, 10)]),
    case("elastic-restart", "every rank restarts at step 30 (torchrun); rank 5 60 ms late",
         2, 4, [delay(5, 60, 10)], launcher="torchrun", restart_at=30),
    case("healthy-jitter-64", "no straggler; every rank 0 to 4 ms of random host time a step",
         8, 8, jitter_ms=4, step_ms=200, steps=40),
    case("late-rank-64", "from step 20 rank 45 turns 280 ms late, past the 170 ms of work "
         "its GPU has queued; rank 17 40 ms late, its GPU queue absorbing it: no straggler",
         8, 8, [delay(45, 280, 20), delay(17, 40, 20)], harmless=(17,), step_ms=200, steps=40),
    case("slow-gpu-64", "rank 30's GPU runs kernels 1.5× slower", 8, 8,
         [{"rank": 30, "kind": "slow_gpu", "factor": 1.5}], step_ms=200, steps=40),
    # The stack people run today (REAL-GPU.md): PyTorch DDP's loop, NCCL 2.28's inits and
    # splits, all-to-all, CUDA graphs.
    case("pytorch-healthy", "PyTorch DDP loop (NCCL stream, 4 buckets, a loss read a step); "
         "0 to 2 ms of random host time a step: no straggler", 4, 4, loop="pytorch",
         buckets=4, kernels=8, jitter_ms=2),
    case("pytorch-late", "PyTorch DDP loop; rank 5 60 ms late on the host from step 10", 4, 4,
         [delay(5, 60, 10)], loop="pytorch", buckets=4, kernels=8),
    case("pytorch-ahead", "PyTorch DDP loop, a loss read every 10 steps; from step 40 rank 5's "
         "host 6 ms slower a step, still ahead of its GPU: no straggler", 2, 4,
         [delay(5, 6, 40)], harmless=(5,), loop="pytorch", buckets=4, kernels=8,
         sync_every=10, step_ms=20, steps=100),
    case("pytorch-slow-gpu", "PyTorch DDP loop; rank 6's GPU runs kernels 1.3× slower (the "
         "host syncs only at the loss read, after the all-reduce: host timing may not show "
         "it)", 4, 4, [{"rank": 6, "kind": "slow_gpu", "factor": 1.3}], loop="pytorch",
         buckets=4, kernels=8),
    case("scalable-late", "world made with ncclCommInitRankScalable (a unique id a node); "
         "rank 9 60 ms late from step 10", 4, 4, [delay(9, 60, 10)], nccl_init="scalable"),
    case("nonblocking-late", "world made non-blocking (ncclInProgress, polled); rank 2 60 ms "
         "late from step 10", 2, 4, [delay(2, 60, 10)], nccl_init="nonblocking"),
    case("subgroups-late", "four groups split from the world, 12 NOCOLOR ranks each split; "
         "rank 6 60 ms late into its group's all-reduce only", 4, 4,
         [{**delay(6, 60, 10), "before": "subgroup"}],
         subgroups=[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]),
    case("alltoall-late", "an MoE layer's two ncclAlltoAll a step; rank 11 60 ms late from "
         "step 10", 4, 4, [delay(11, 60, 10)], extra_collectives=["alltoall"]),
    case("alltoallv-late", "an all-to-all with uneven splits a step (grouped Send/Recv with every "
         "peer, as PyTorch makes it); rank 13 60 ms late into it only, from step 10", 4, 4,
         [{**delay(13, 60, 10), "before": "alltoallv"}], extra_collectives=["alltoallv"]),
    case("graphs-late", "each step a CUDA graph's replay from step 20; rank 4 60 ms late on "
         "the host from step 30", 2, 4, [delay(4, 60, 30)], graphs={"from_step": 20}),
    case("graphs-hang", "each step a CUDA graph's replay from step 20; rank 7 hangs at step 40, "
         "inside its replays", 2, 4, [{"rank": 7, "kind": "hang", "at_step": 40}],
         graphs={"from_step": 20}, timeout_s=12),
]

SMOKE = [
    case("late-rank", "rank 5 turns 60 ms late at step 10; node 1's agent clock 250 ms ahead",
         2, 4, [delay(5, 60, 10)], skewed_node=1, steps=30, step_ms=40),
    case("healthy", "no straggler; 0 to 2 ms of random host time a step", 2, 4, steps=30,
         step_ms=40, jitter_ms=2),
]


# -- running -----------------------------------------------------------------------------------

def add_arguments(parser) -> None:
    parser.add_argument("--only", nargs="+", metavar="NAME",
                        choices=[c.name for c in FULL + SMOKE],
                        help="run only these scenarios (names as in the section's table)")


def run(args) -> dict:
    import sim
    from stack.local import Stack

    cases = SMOKE if args.smoke else FULL
    if args.only:
        cases = [c for c in FULL + SMOKE if c.name in args.only]
    sim.build()
    skewed_agent = max(c.scenario.job.nodes for c in cases)
    skewed = any(c.skewed_node is not None for c in cases)
    agents = skewed_agent + 1 if skewed else skewed_agent
    root = Path(tempfile.mkdtemp(prefix="ingero-quality-"))
    root.chmod(0o755)                         # the embedded PostgreSQL runs as postgres
    began = time.monotonic()
    try:
        stack = Stack(root, agents, push_s=PUSH_S, hang_timeout_s=HANG_TIMEOUT_S,
                      skew={skewed_agent: SKEW_S} if skewed else None,
                      echod_flags=("--drain-seconds", "0", "--rate-limit", "500",
                                   "--rate-burst", "2000"))
        try:
            rows = [run_case(stack, c, 5100 + i, skewed_agent) for i, c in enumerate(cases)]
        finally:
            stopped = stack.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {"scenarios": rows, "methods": totals(rows),
            "seconds": round(time.monotonic() - began),
            "settings": {"push_s": PUSH_S, "hang_timeout_s": HANG_TIMEOUT_S, "skew_s": SKEW_S,
                         "skewed_agent": f"node{skewed_agent}" if skewed else None,
                         "agents": agents, "lag_sigmas": LAG_SIGMAS, "health_k": HEALTH_K},
            "stack_exit_statuses": stopped}


def run_case(stack, c: Case, job_id: int, skewed_agent: int) -> dict:
    """Run one scenario as a sim job, then score what each method names."""
    scenario = scenarios.with_job(c.scenario, job_id=str(job_id))
    job = scenario.job
    placement = [skewed_agent if n == c.skewed_node else n for n in range(job.nodes)]
    print(f"{c.name}: job {job_id}, {job.world_size} ranks", file=sys.stderr, flush=True)
    cpu_before, started = cpu_times(), time.time()
    with Cluster(scenario, stack.root / f"job-{job_id}", hosts=placement) as cluster:
        result, answers = watch(stack, cluster, str(job_id))
    cpu_after, ended = cpu_times(), time.time()
    time.sleep(SETTLE_S)
    answers.append(stack.tool("find_stragglers", job=str(job_id)))
    verdicts = [v for answer in answers for v in answer["verdicts"]]
    entries, node_of_rank = read_entries(stack, str(job_id))
    scores = read_scores(stack, set(node_of_rank.values()), started, ended + PUSH_S)
    truth = {s.rank: s.kind for s in scenario.stragglers if s.rank not in c.harmless}
    onsets = onset_times(scenario, result)
    expected_failure = any(kind in ("die", "hang") for kind in truth.values())
    row = {"name": c.name, "what": scenario.description, "ranks": job.world_size,
           "nodes": job.nodes, "skewed_node": c.skewed_node,
           "job_ok": result.ok or expected_failure, "seconds": round(ended - started, 1),
           "cpu_busy": round((cpu_after[0] - cpu_before[0]) / (cpu_after[1] - cpu_before[1]), 2),
           "truth": [{"rank": rank, "kind": kind} for rank, kind in sorted(truth.items())],
           "ingero": score_ingero(truth, verdicts, onsets, started),
           "tools": score_tools(stack, str(job_id), answers),
           "lag_mean_2sigma": score_named(truth, lag_mean_sigma(entries)),
           "health_mad": score_nodes(truth, health_mad(scores), node_of_rank)}
    print(f"{c.name}: {row['seconds']} s; ingero {row['ingero']['tally']}", file=sys.stderr,
          flush=True)
    return row


def watch(stack, cluster: Cluster, job: str) -> tuple[ClusterResult, list[dict]]:
    """Wait for the job to end while reading ``find_stragglers`` once a push interval, as
    ``ingero demo`` tells fleetd's verdicts and as a user or an alert polls it: the store keeps
    a verdict's newest revision only (a hang becomes died once the launcher kills the hung
    rank), so each revision is seen as it comes. Every answer is returned."""
    answers = []
    with ThreadPoolExecutor(1) as pool:
        ending = pool.submit(cluster.wait)
        while not futures.wait([ending], timeout=PUSH_S).done:
            answers.append(stack.tool("find_stragglers", job=job))
        return ending.result(), answers


def cpu_times() -> tuple[int, int]:
    """This machine's busy and total CPU time so far (clock ticks, all CPUs), from /proc/stat."""
    ticks = [int(field) for field in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = ticks[3] + ticks[4]                    # idle, iowait
    return sum(ticks[:8]) - idle, sum(ticks[:8])  # guest time is counted in user already


# -- reading back what echod stored ------------------------------------------------------------

ENTRIES = """SELECT comm_hash, seq, rank, node, extract(epoch FROM t) FROM events
WHERE cluster = 'sim' AND job = {job} AND kind = 'collective' AND rank IS NOT NULL
  AND seq IS NOT NULL AND comm_hash IS NOT NULL
ORDER BY comm_hash, seq, rank, t LIMIT {limit} OFFSET {offset}"""

SCORES = """SELECT node, score FROM health_scores
WHERE cluster = 'sim' AND state <> 'idle' AND t >= {since} AND t <= {until}"""


def literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def timestamp(seconds: float) -> str:
    return "TIMESTAMPTZ " + literal(datetime.fromtimestamp(seconds, timezone.utc).isoformat())


def read_entries(stack, job: str) -> tuple[list[Entry], dict[int, str]]:
    """The job's collective entries as stored (each node's own clock), and each rank's node."""
    entries, node_of_rank = [], {}
    while True:
        answer = stack.client().sql(ENTRIES.format(job=literal(job), limit=PAGE_ROWS,
                                                   offset=len(entries)), row_cap=PAGE_ROWS)
        for comm_hash, seq, rank, node, t in answer["rows"]:
            entries.append(Entry(comm_hash, int(seq), int(rank), float(t)))
            node_of_rank[int(rank)] = node
        if len(answer["rows"]) < PAGE_ROWS:
            return entries, node_of_rank


def read_scores(stack, nodes: set[str], since: float, until: float) -> dict[str, list[float]]:
    """The health scores fleetd received from the job's nodes while it ran, per node."""
    answer = stack.client().sql(SCORES.format(since=timestamp(since), until=timestamp(until)),
                                row_cap=PAGE_ROWS)
    scores: dict[str, list[float]] = {node: [] for node in nodes}
    for node, score in answer["rows"]:
        if node in scores:
            scores[node].append(float(score))
    return scores


def onset_times(scenario, result: ClusterResult) -> dict[int, float]:
    """Each straggler's onset on the wall clock, from the ranks' records: its first late entry
    (the first delayed step, or step 0 for a slow GPU or a contended CPU); for a rank that
    dies or hangs, when its peers entered the collective it never reached."""
    wall_minus_monotonic = time.time() - time.monotonic()
    onsets = {}
    for s in scenario.stragglers:
        if s.kind in ("die", "hang"):
            entries = [read_record(r.record_path).at_step(s.at_step) for r in result.ranks
                       if r.rank != s.rank]
            times = [e["entry_ns"] for e in entries if e]
            entry_ns = statistics.median(times) if times else None
        else:
            step = s.from_step if s.kind in ("host_delay", "hiccup") else 0
            entry = read_record(result.rank(s.rank).record_path).at_step(step)
            entry_ns = entry["entry_ns"] if entry else None
        if entry_ns is not None:
            onsets[s.rank] = entry_ns / 1e9 + wall_minus_monotonic
    return onsets


# -- scoring each method -----------------------------------------------------------------------

def raised_at(verdict: dict) -> float:
    return datetime.fromisoformat(verdict["raised"]).timestamp()


def score_ingero(truth: dict[int, str], verdicts: list[dict], onsets: dict[int, float],
                 started: float) -> dict:
    """fleetd's verdicts (every revision seen): who was named, with what diagnosis, how long
    after the onset."""
    by_rank: dict[int, list[dict]] = {}
    for v in sorted(verdicts, key=raised_at):
        said = by_rank.setdefault(v["rank"], [])
        if (v["kind"], v["cause"]) not in [(w["kind"], w["cause"]) for w in said]:
            said.append(v)
    right = sorted(rank for rank in set(by_rank) & set(truth)
                   if diagnosed(truth[rank], by_rank[rank]))
    after = {rank: round(raised_at(by_rank[rank][0]) - onsets[rank], 2)
             for rank in set(by_rank) & set(truth) if rank in onsets}
    return {"named": sorted(by_rank), "tally": Tally.of(set(truth), set(by_rank)).to_json(),
            "diagnosed": right,
            "verdicts": [{"rank": v["rank"], "kind": v["kind"], "cause": v["cause"],
                          "lag_p50_ms": v["lag_p50_ms"],
                          "raised_s": round(raised_at(v) - started, 2)}
                         for rank in sorted(by_rank) for v in by_rank[rank]],
            "time_to_verdict_s": {str(rank): s for rank, s in sorted(after.items())}}


def score_tools(stack, job: str, answers: list[dict]) -> dict:
    """Whether what a user reads agrees with fleetd: every ``find_stragglers`` answer, while
    the job ran and after (its ``ranks[].straggler`` against its ``verdicts``), and, after,
    ``explain`` of every rank named, called a straggler, over the job's bar or noted (its cause
    against fleetd's newest verdict of the rank)."""
    wrong = [f"poll {n}: {said}" for n, answer in enumerate(answers)
             for said in disagreements(answer)]
    polls_agreed = sum(not disagreements(answer) for answer in answers)
    last = answers[-1]
    ranks = ({v["rank"] for v in last["verdicts"]} | {n["rank"] for n in last["notes"]}
             | {r["rank"] for r in last["ranks"] if r["straggler"] or r["over_bar"]})
    verdicts = sorted(last["verdicts"], key=raised_at)
    explained = [explained_against(verdicts, rank, stack.tool("explain", job=job, rank=rank))
                 for rank in sorted(ranks)]
    wrong += [said for said in explained if said]
    return {"checks": len(answers) + len(explained),
            "agreed": polls_agreed + sum(said is None for said in explained),
            "disagreements": wrong[:5]}


def score_named(truth: dict[int, str], named: set[int]) -> dict:
    return {"named": sorted(named), "tally": Tally.of(set(truth), named).to_json()}


def score_nodes(truth: dict[int, str], nodes: set[str], node_of_rank: dict[int, str]) -> dict:
    return {"nodes": sorted(nodes),
            **score_named(truth, ranks_of_nodes(nodes, node_of_rank))}


def tally_of(row: dict, method: str) -> Tally:
    t = row[method]["tally"]
    return Tally(t["tp"], t["fp"], t["fn"])


def totals(rows: list[dict]) -> dict:
    """Per method, the counts over every scenario; for ingero also the diagnoses and the time
    from onset to verdict."""
    out = {}
    for method in METHODS:
        total = sum((tally_of(row, method) for row in rows), Tally())
        out[method] = total.to_json()
    found = out["ingero"]["tp"]
    right = sum(len(row["ingero"]["diagnosed"]) for row in rows)
    out["ingero"]["cause_accuracy"] = rounded(right / found if found else None)
    out["ingero"]["diagnosed"] = right
    out["ingero"]["time_to_verdict"] = spread(
        [s for row in rows for s in row["ingero"]["time_to_verdict_s"].values()])
    checks = sum(row["tools"]["checks"] for row in rows)
    out["ingero"]["tools_agree"] = rounded(
        sum(row["tools"]["agreed"] for row in rows) / checks if checks else None)
    return out


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
