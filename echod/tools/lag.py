"""Every rank's entry lag in a selection, and the robust bar that makes it a straggler.

Entry lag. Ranks call a communicator's collectives in the same order, so (communicator,
sequence number) names one collective instance across ranks without trusting clocks. A rank's
entry lag at an instance is its entry time minus the median entry of its peers there, the one
definition fleetd uses too (``ingero.analysis.lag``): a late rank does not move the reference
its peers are measured against, and one early rank does not make everyone late. The same
per-instance aggregates give the idle time the cost tools report: every rank that arrived
before the last one waits t_last − t_rank. The stored times are each node's own clock: they
are put on fleetd's clock first, less the node's offset at each time, as fleetd reported it
with the node's first health score at or after it (``offsets_at``: the estimate fleetd
corrected that time with too). Sends and receives are no instances to lag in (a
pipeline's receive waits on its send by design), as fleetd judges none: a communicator that
made only those (so the call summaries say) is not surveyed, and one that made collectives
too is read without them.

Steps. Each srun step of a job runs processes of its own, ranked from 0, in communicators of
their own: a rank is one of a step (``RankLag.step``; None outside Slurm), its lag measured
against its own step's ranks. The raw survey takes a communicator's step from its first
instance, the summaries from the step fleetd wrote beside them (none before echod 0013). The
bar is the job's, over every step's ranks.

From summaries. Where the window holds more entries than the caller lets it read, or its raw
collectives were thinned by retention, the survey answers from fleetd's lag summaries
(``peer_lag``: per rank, per run of collectives fleetd settled, on its clock, the lag's
median, 95th and 99th percentiles and maximum, the instances the rank entered last, the wait
it caused and its own wait). A rank's median is then the median of its runs' medians, each
run weighted by its instances; its 95th and 99th percentiles those of its runs pooled, each
run's distribution taken as linear between its known quantiles (``pooled_quantile``: the
quantile of the runs' quantiles would read high, as a run of a few instances has its maximum
for its 99th percentile); its maximum the largest, its counts and waits the sums (who came
last and who waited over the runs where fleetd knew every rank's node clock: ``compared``);
the job's step time is each communicator's time over its
sequence span. ``coverage.source`` says which: ``events`` or ``summaries``. A fleetd from
before the summaries carried waits leaves them 0 there.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from sqlalchemy import Connection

from ingero.analysis import Bar, LagPolicy, LagStats, entry_lags, lag_bar
from ingero.analysis.lag import median_of_others

from ..store.chunks import UNIX_AT_PG_EPOCH
from ..store.retention import thinned_of
from .collectives import (Communicator, communicators, rank_nodes, read_entries,
                          without_point_to_point)
from .schema import DEFAULT_MAX_ENTRIES, INT, closed
from .selection import Selection, Where, Window, rows, storable
from .verdicts import NOT_A_NOTE, live_in

POLICY = LagPolicy()                   # fleetd's


@dataclass
class RankLag:
    """One rank's entry lag over the collective instances examined (seconds)."""

    cluster: str
    job: str
    rank: int
    node: str | None
    samples: int
    lag_median: float
    lag_p95: float
    lag_max: float
    last_arrivals: int
    idle_caused: float          # GPU-seconds its peers waited at instances it entered last
    waited: float               # GPU-seconds it waited itself
    straggler: bool = False     # fleetd named it, where fleetd judged its job; else over_bar
    lag_p99: float | None = None
    slack: float = 0.0          # its node's clock uncertainty, seconds (0: the job's one node)
    compared: int | None = None  # instances its arrivals count over, where not all samples
    step: str | None = None     # the Slurm step it ran in: a step's ranks are its own
    over_bar: bool = False      # its median lag over its job's bar, by the stored events

    @property
    def last_share(self) -> float | None:
        """The share of the instances compared that it entered last."""
        over = self.samples if self.compared is None else self.compared
        return self.last_arrivals / over if over else None


@dataclass
class Survey:
    """The entry lags of the ranks in a selection and what was read to get them."""

    ranks: list[RankLag]
    bars: dict[tuple[str, str], Bar]
    communicators: int
    instances_total: int
    instances_examined: int
    stride: int
    entries_examined: int
    source: str = "events"
    judged: frozenset = frozenset()   # (cluster, job) whose stragglers are fleetd's word

    @property
    def idle_total(self) -> float:
        """GPU-seconds waited at the instances examined."""
        return sum(r.waited for r in self.ranks)

    @property
    def scale(self) -> float:
        """From the instances examined to all of them."""
        return float(self.stride)

    def coverage(self) -> dict:
        return {"communicators": self.communicators, "instances_total": self.instances_total,
                "instances_examined": self.instances_examined, "stride": self.stride,
                "entries_examined": self.entries_examined, "source": self.source}

    def rank(self, cluster: str, job: str, rank: int, step: str | None = None
             ) -> RankLag | None:
        """The rank in ``step``; with none named, in the step where it entered the most."""
        found = [r for r in self.ranks if (r.cluster, r.job, r.rank) == (cluster, job, rank)
                 and (step is None or r.step == step)]
        return max(found, key=lambda r: r.samples, default=None)


COVERAGE_OUT = closed({"communicators": INT, "instances_total": INT, "instances_examined": INT,
                       "stride": INT, "entries_examined": INT,
                       "source": {"type": "string", "enum": ["events", "summaries"]}})


def survey(conn: Connection, sel: Selection, max_entries: int = DEFAULT_MAX_ENTRIES) -> Survey:
    """Every rank's entry lag in the selection: from its raw collectives, at most
    ``max_entries`` entries of them; from fleetd's summaries where there are more, or where
    retention thinned them (see the module's doc)."""
    comms, mixed = without_point_to_point(conn, communicators(conn, sel))
    entries = sum(c.instances * max(c.ranks, 1) for c in comms)
    if entries > max_entries or thinned_of(conn, "collective"):
        found = summary_survey(conn, sel)
        # Past the cap, or where fleetd settled more entries than the raw events still hold
        # (retention thinned them).
        if found is not None and (entries > max_entries or found.entries_examined > entries):
            found.judged = fleetd_says(conn, sel, found.ranks, summarized=True)
            return found
    stride = max(1, math.ceil(entries / max_entries))
    # a job's ranks are told apart by step: each step's rank 0 is a process of its own
    runs = {key: i for i, key in enumerate(dict.fromkeys((c.cluster, c.job, c.step)
                                                         for c in comms))}
    job_of = np.array([runs[(c.cluster, c.job, c.step)] for c in comms], np.int64)
    nodes = rank_nodes(conn, comms) if comms else {}
    stats, steps, clocks = None, {}, {}
    if comms:
        comm, seq, rank, t = read_entries(conn, sel, comms, stride, mixed)
        clocks = node_offsets(conn, sel, {(key[0], node) for key, node in nodes.items()})
        t = t - entry_offsets_us(conn, comms, nodes, clocks, comm, rank, t)
        stats = entry_lags(comm, seq, rank, t, job_of,
                           np.array([c.ranks for c in comms], np.int64))
        steps = job_steps(comms, comm, seq, rank, t)
    ranks = rank_lag_rows(stats, comms, nodes) if stats else []
    bars = judge_ranks(ranks, steps, clocks)
    return Survey(ranks, bars, len(comms), sum(c.instances for c in comms),
                  stats.instances if stats else 0, stride,
                  int(stats.samples.sum()) if stats else 0,
                  judged=fleetd_says(conn, sel, ranks))


# -- from fleetd's summaries -------------------------------------------------------------------

# Per rank: its runs' instances and quantiles (for ``weighted_quantile`` and
# ``pooled_quantile``) packed in one bytea as RUN lays them out, and its sums.
RANK_SUMMARIES = """
SELECT p.cluster, p.job, p.step, p.rank, min(p.node),
       string_agg(int8send(CAST(p.samples AS bigint)) || int8send(p.lag_median_ns)
                  || int8send(coalesce(p.lag_p95_ns, p.lag_median_ns))
                  || int8send(coalesce(p.lag_p99_ns, p.lag_p95_ns, p.lag_median_ns))
                  || int8send(coalesce(p.lag_max_ns, p.lag_p99_ns, p.lag_p95_ns,
                                       p.lag_median_ns)), ''::bytea),
       max(p.lag_max_ns), coalesce(sum(p.last_arrivals), 0), coalesce(sum(p.idle_caused_ns), 0),
       coalesce(sum(p.waited_ns), 0),
       coalesce(sum(p.samples) FILTER (WHERE p.last_arrivals IS NOT NULL), 0)
FROM peer_lag p WHERE {where} AND p.lag_median_ns IS NOT NULL
GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4
"""
RUN = np.dtype([("samples", ">i8"), ("p50", ">i8"), ("p95", ">i8"), ("p99", ">i8"),
                ("max", ">i8")])
COMM_SUMMARIES = """
SELECT p.cluster, p.job, p.comm_hash, min(p.seq_first), max(p.seq_last),
       max(p.seq_last) - min(p.seq_last), extract(epoch FROM max(p.t) - min(p.t)),
       sum(p.samples)
FROM peer_lag p WHERE {where} GROUP BY 1, 2, 3
"""


def summary_survey(conn: Connection, sel: Selection) -> Survey | None:
    """The survey from fleetd's lag summaries (see the module's doc); None where there are
    none."""
    if sel.job is not None and not storable(sel.job):
        return None
    where = sel.where("p", node=False, rank=False)
    found = rows(conn, RANK_SUMMARIES.format(where=where.sql()), where.params)
    if not found:
        return None
    ranks = []
    for cluster, job, step, rank, node, packed, largest, last, caused, waited, compared \
            in found:
        runs = np.frombuffer(packed, RUN)
        weights = runs["samples"].astype(np.int64)
        p50 = weighted_quantile(runs["p50"].astype(np.float64), weights, 0.5) / 1e9
        known = np.stack([runs[name] for name in RUN.names[1:]], axis=1).astype(np.float64)
        p95, p99 = (pooled_quantile(known, weights, q) / 1e9 for q in (0.95, 0.99))
        ranks.append(RankLag(cluster, job, rank, node, int(weights.sum()), p50, p95,
                             largest / 1e9, int(last), int(caused) / 1e9, int(waited) / 1e9,
                             lag_p99=p99, compared=int(compared), step=step))
    steps: dict[tuple[str, str], list[float]] = defaultdict(list)
    instances = entries = 0
    comms = rows(conn, COMM_SUMMARIES.format(where=where.sql()), where.params)
    for cluster, job, _comm, lo, hi, span, seconds, samples in comms:
        if span and seconds:
            steps[(cluster, job)].append(float(seconds) / span)
        instances += hi - lo + 1
        entries += int(samples)
    bars = judge_ranks(ranks, {job: float(np.median(v)) for job, v in steps.items()},
                       node_offsets(conn, sel, {(r.cluster, r.node) for r in ranks}))
    # Every instance fleetd settled is in a run (a run holds them all, whatever ranks it has)
    return Survey(ranks, bars, len(comms), instances, instances, 1, entries, "summaries")


# The levels of a run's known quantiles (RUN's p50, p95, p99 and max): for a tail, all of the
# run under its median may stand at its median.
KNOWN_LEVELS = np.array([0.0, 0.5, 0.95, 0.99, 1.0])


def pooled_quantile(known: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-quantile (q ≥ 0.5) of runs pooled: ``known`` holds each run's quantiles at
    KNOWN_LEVELS[1:], its distribution taken as linear between them (its lower half at its
    median), and each counts as many times as it has instances (``weights``). It is where the
    runs' distribution functions, so weighted, add up to q of their weight: found in one sweep
    over the runs' quantiles, between which that sum is linear."""
    knots = np.concatenate([known[:, :1], known], axis=1)       # from its median, its half
    lo, hi = knots[:, :-1].ravel(), knots[:, 1:].ravel()
    mass = (weights[:, None] * np.diff(KNOWN_LEVELS)).ravel().astype(np.float64)
    point = hi <= lo                         # all of it at one value: a step, not a slope
    slope = np.where(point, 0.0, mass / np.where(point, 1.0, hi - lo))
    xs, at = np.unique(np.concatenate([lo, hi]), return_inverse=True)
    starts, ends = at[:len(lo)], at[len(lo):]
    slopes = np.cumsum(np.bincount(starts, slope, len(xs)) - np.bincount(ends, slope, len(xs)))
    steps = np.bincount(starts, np.where(point, mass, 0.0), len(xs))
    ramps = np.concatenate([[0.0], np.cumsum(slopes[:-1] * np.diff(xs))])
    upto = ramps + np.cumsum(steps)          # the weight at or under each value
    target = q * float(weights.sum())
    k = min(int(np.searchsorted(upto, target)), len(xs) - 1)
    if k == 0 or upto[k] - steps[k] < target:
        return float(xs[k])                  # reached at xs[k] itself (a step there)
    return float(xs[k - 1] + (target - upto[k - 1]) / slopes[k - 1])


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The least value whose weight, with that of the values under it, is at least q of the
    whole: a run's quantile counted as many times as the run has instances."""
    order = np.argsort(values, kind="stable")
    held = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(held, q * held[-1])])


# Per node: the median offset (and uncertainty) fleetd reported in the window; where it
# reported none there (a window shorter than its reporting period), the one reported nearest
# before it, else after.
NODE_OFFSETS = """
SELECT n.cluster, n.node, coalesce(inside.value, before.value, after.value),
       coalesce(inside.uncertainty, before.uncertainty, after.uncertainty)
FROM unnest(CAST(:clusters AS text[]), CAST(:nodes AS text[])) AS n(cluster, node)
CROSS JOIN LATERAL (
    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s.clock_offset) AS value,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY s.clock_uncertainty) AS uncertainty
    FROM health_scores s
    WHERE s.cluster = n.cluster AND s.node = n.node AND s.clock_offset IS NOT NULL
      AND {window}) inside
LEFT JOIN LATERAL (
    SELECT s.clock_offset AS value, s.clock_uncertainty AS uncertainty FROM health_scores s
    WHERE s.cluster = n.cluster AND s.node = n.node AND s.clock_offset IS NOT NULL
      AND {before}
    ORDER BY s.t DESC LIMIT 1) before ON TRUE
LEFT JOIN LATERAL (
    SELECT s.clock_offset AS value, s.clock_uncertainty AS uncertainty FROM health_scores s
    WHERE s.cluster = n.cluster AND s.node = n.node AND s.clock_offset IS NOT NULL
      AND {after}
    ORDER BY s.t LIMIT 1) after ON TRUE
"""


def node_offsets(conn: Connection, sel: Selection, named: set[tuple[str, str | None]]
                 ) -> dict[tuple[str, str], tuple[float, float]]:
    """(cluster, node) → its clock's offset from fleetd's and how far off that may be,
    seconds: the median fleetd reported with the node's scores in the selection's window, else
    the nearest it reported before or after the window (absent where it reported none)."""
    pairs = sorted((cluster, node) for cluster, node in named if node is not None)
    window = Where().within("s.t", sel.window)
    before = Where().within("s.t", Window(until=sel.window.until))
    after = Where().within("s.t", Window(since=sel.window.since))
    sql = NODE_OFFSETS.format(window=window.sql(), before=before.sql(), after=after.sql())
    return {(cluster, node): (offset, uncertainty or 0.0)
            for cluster, node, offset, uncertainty in rows(
                conn, sql, {**window.params, "clusters": [c for c, _ in pairs],
                            "nodes": [n for _, n in pairs]}) if offset is not None}


# Per node (its place in the arrays), the offsets fleetd reported with its scores over a span,
# the last of each stretch of it (at most CLOCK_STRETCHES), and with its first score past it,
# oldest first.
CLOCK_STRETCHES = 256
NODE_CLOCKS = """
SELECT n.i, extract(epoch FROM s.t), s.clock_offset
FROM unnest(CAST(:clusters AS text[]), CAST(:nodes AS text[]))
     WITH ORDINALITY AS n(cluster, node, i)
CROSS JOIN LATERAL (
    (SELECT DISTINCT ON (floor(extract(epoch FROM s.t) / :stretch)) s.t, s.clock_offset
     FROM health_scores s
     WHERE s.cluster = n.cluster AND s.node = n.node AND s.clock_offset IS NOT NULL
       AND s.t >= :since AND s.t <= :until
     ORDER BY floor(extract(epoch FROM s.t) / :stretch), s.t DESC)
    UNION ALL
    (SELECT s.t, s.clock_offset FROM health_scores s
     WHERE s.cluster = n.cluster AND s.node = n.node AND s.clock_offset IS NOT NULL
       AND s.t > :until ORDER BY s.t LIMIT 1)) s
ORDER BY 1, 2
"""


def offsets_at(conn: Connection, named: list[tuple[str, str]], node: np.ndarray,
               t: np.ndarray, window: dict[tuple[str, str], tuple[float, float]]) -> np.ndarray:
    """Per time ``t`` (seconds on the clock of node ``named[node]``; -1: none), that node's
    offset from fleetd's clock then (seconds, to subtract): the one fleetd reported with the
    node's first score at or after it, which is the fit fleetd held when the push carrying
    that time came in and put it on its own clock with; past the last, the last. Over a long
    span, the last score of the stretch it falls in (CLOCK_STRETCHES of them: an hour's
    stretch is 14 s, over which a clock drifts 0.7 ms at most). Where fleetd reported none
    from the first time on, the window's (``window``, from ``node_offsets``; 0 where none).
    A clock drifts (20 ppm is 72 ms an hour) and a fit moves as exchanges come in: one
    offset for a whole window would leave that in the lags."""
    fallback = np.array([window.get(pair, (0.0, 0.0))[0] for pair in named] + [0.0])
    at = t - fallback[node]                  # near enough fleetd's clock to find the score
    offsets = fallback[node]
    if not len(t) or not window:
        return offsets
    clocks: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for i, seen, offset in rows(conn, NODE_CLOCKS, {
            "clusters": [c for c, _ in named], "nodes": [n for _, n in named],
            "since": datetime.fromtimestamp(float(at.min()), UTC),
            "until": datetime.fromtimestamp(float(at.max()), UTC),
            "stretch": max(float(at.max() - at.min()) / CLOCK_STRETCHES, 1e-3)}):
        clocks[int(i) - 1].append((float(seen), offset))
    for i, series in clocks.items():
        mine = node == i
        seen, offset = np.array(series).T
        offsets[mine] = offset[np.minimum(np.searchsorted(seen, at[mine]), len(seen) - 1)]
    return offsets


def entry_offsets_us(conn: Connection, comms: list[Communicator], nodes: dict[tuple, str],
                     window: dict[tuple[str, str], tuple[float, float]], comm: np.ndarray,
                     rank: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per entry (times in µs from PostgreSQL's epoch, as ``read_entries`` gives them), its
    node's clock offset from fleetd's at its time (µs; see ``offsets_at``), to subtract so
    that every node's times compare."""
    if not len(comm) or not window:
        return np.zeros(len(comm), np.int64)
    named = sorted({(cluster, node) for (cluster, *_), node in nodes.items()})
    index = {pair: i for i, pair in enumerate(named)}
    # (communicator, rank) → its node's place in ``named``; -1 where not known
    of_run = defaultdict(list)
    for c, communicator in enumerate(comms):
        of_run[(communicator.cluster, communicator.job, communicator.step)].append(c)
    table = np.full((len(comms), int(rank.max()) + 1), -1, np.int64)
    for (cluster, job, step, r), name in nodes.items():
        if r < table.shape[1]:
            table[of_run.get((cluster, job, step), []), r] = index[(cluster, name)]
    node = table[comm, rank]
    unix = t / 1e6 + UNIX_AT_PG_EPOCH
    return np.round(offsets_at(conn, named, node, unix, window) * 1e6).astype(np.int64)


def job_steps(comms: list[Communicator], comm: np.ndarray, seq: np.ndarray, rank: np.ndarray,
              t: np.ndarray) -> dict[tuple[str, str], float]:
    """Per job, the time between its collectives (seconds): per communicator and rank, the
    span of its sampled entries over their sequence span; the median of those."""
    spans: dict[tuple[str, str], list[float]] = defaultdict(list)
    order = np.lexsort((seq, rank, comm))
    comm, seq, rank, t = comm[order], seq[order], rank[order], t[order]
    if not len(comm):
        return {}
    edges = np.flatnonzero((comm[1:] != comm[:-1]) | (rank[1:] != rank[:-1])) + 1
    for first, last in zip(np.r_[0, edges], np.r_[edges, len(comm)] - 1):
        if seq[last] > seq[first]:
            c = comms[comm[first]]
            spans[(c.cluster, c.job)].append((t[last] - t[first]) / (seq[last] - seq[first]) / 1e6)
    return {job: float(np.median(values)) for job, values in spans.items()}


def rank_lag_rows(stats: LagStats, comms: list[Communicator],
                  nodes: dict[tuple, str]) -> list[RankLag]:
    found = []
    for i, (comm, rank) in enumerate(zip(stats.comm, stats.rank)):
        c = comms[comm]
        found.append(RankLag(c.cluster, c.job, int(rank),
                             nodes.get((c.cluster, c.job, c.step, int(rank))),
                             int(stats.samples[i]), float(stats.lag_p50[i]) / 1e6,
                             float(stats.lag_p95[i]) / 1e6, float(stats.lag_max[i]) / 1e6,
                             int(stats.last_arrivals[i]), float(stats.idle_caused[i]) / 1e6,
                             float(stats.waited[i]) / 1e6,
                             lag_p99=float(stats.lag_p99[i]) / 1e6, step=c.step))
    return found


def job_bars(ranks: list[RankLag], steps: dict[tuple[str, str], float]
             ) -> dict[tuple[str, str], Bar]:
    """Per job, the bar over its ranks' median lags: fleetd's (``lag_bar``)."""
    medians: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in ranks:
        medians[(r.cluster, r.job)].append(r.lag_median)
    return {key: lag_bar(np.array(values), steps.get(key), POLICY)
            for key, values in medians.items()}


def judge_ranks(ranks: list[RankLag], steps: dict[tuple[str, str], float],
                clocks: dict[tuple[str, str], tuple[float, float]]) -> dict[tuple[str, str], Bar]:
    """Per job, the bar over its ranks' median lags (``job_bars``); each rank a straggler whose
    median lag is over it by more than the clocks could explain, as fleetd judges
    (``least_lag``): its node's uncertainty and its peers' (the median of theirs), none where
    the job ran on one node."""
    bars = job_bars(ranks, steps)
    jobs: dict[tuple[str, str], list[RankLag]] = defaultdict(list)
    for r in ranks:
        jobs[(r.cluster, r.job)].append(r)
    for key, members in jobs.items():
        one_node = len({r.node for r in members}) == 1
        for r in members:
            r.slack = 0.0 if one_node else clocks.get((r.cluster, r.node), (0.0, 0.0))[1]
        slack = np.array([r.slack for r in members])
        order = np.argsort(slack, kind="stable")
        peers = np.zeros(len(members))
        peers[order] = np.nan_to_num(median_of_others(
            slack[order], np.array([0]), np.array([len(members)])))
        for r, theirs in zip(members, peers):
            r.over_bar = r.straggler = bool(r.samples >= POLICY.min_instances
                                            and r.lag_median - r.slack - theirs > bars[key].bar)
    return bars


# fleetd's word on the jobs of a selection: the ranks it named (verdicts, not notes) live in the
# window, with the Slurm step of each; and which jobs it judged there (it wrote their lag
# summaries, a verdict or a note; or it timed their nodes: it had their pushes)
NAMED = """
SELECT v.cluster, v.job, v.rank, v.evidence -> 'run' ->> 'step', {not_a_note}
FROM straggler_verdicts v WHERE {where} AND v.kind IS NOT NULL
"""
# Of the jobs (and their ranks' nodes) asked about, those fleetd judged: each a lookup that
# stops at its first row, not a read of every summary or score of the job.
JUDGED = """SELECT k.cluster, k.job
FROM unnest(CAST(:clusters AS text[]), CAST(:jobs AS text[])) AS k(cluster, job)
WHERE EXISTS (SELECT 1 FROM peer_lag p WHERE p.cluster = k.cluster AND p.job = k.job
              AND {where})
UNION ALL
SELECT k.cluster, NULL FROM unnest(CAST(:jobless AS text[])) AS k(cluster)
WHERE EXISTS (SELECT 1 FROM peer_lag p WHERE p.cluster = k.cluster AND p.job IS NULL
              AND {where})"""
TIMED = """SELECT k.cluster, k.job
FROM unnest(CAST(:clusters AS text[]), CAST(:jobs AS text[]), CAST(:nodes AS text[]))
     AS k(cluster, job, node)
WHERE EXISTS (SELECT 1 FROM health_scores s WHERE s.cluster = k.cluster AND s.job = k.job
              AND s.clock_offset IS NOT NULL AND {where})
   OR EXISTS (SELECT 1 FROM health_scores s WHERE s.cluster = k.cluster AND s.node = k.node
              AND s.job IS NULL AND s.clock_offset IS NOT NULL AND {where})"""


def fleetd_says(conn: Connection, sel: Selection, ranks: list[RankLag],
                summarized: bool = False) -> frozenset[tuple[str, str]]:
    """Each rank's ``straggler`` as fleetd judged it, in the jobs fleetd judged in the window:
    the ranks it named there (a verdict live in the window), whatever their lag over the bar
    (``over_bar``) says, so find_stragglers, explain and job_report say what fleetd said. fleetd
    weighs more than the bar: whether the peers' waits grew (a host late ahead of its GPU queue
    costs nobody), whether the lateness was passed down from a peer elsewhere, and how recent
    it is. A job is fleetd's to judge from its first push/reply exchange with a node of it (a
    score of the job's stored with the node's clock offset: fleetd had its pushes and timed
    them; where the node's agent serves all its jobs, a score of the node's in the window):
    until fleetd names a rank there, none is a straggler, however far over the bar
    the first stored events put it, compared before fleetd knew the nodes' clocks (a
    host-ahead job's rank was called a straggler in a poll before fleetd's first lag
    summaries, and never named). A job fleetd wrote nothing on (its events came without it)
    keeps the stored events' word. The jobs whose word is fleetd's are returned.
    ``summarized``: the ranks came from fleetd's lag summaries in the selection, so fleetd
    judged each of their jobs."""
    if not ranks:
        return frozenset()
    verdicts = live_in(sel)
    found = rows(conn, NAMED.format(where=verdicts.sql(), not_a_note=NOT_A_NOTE),
                 verdicts.params)
    jobs = {(r.cluster, r.job) for r in ranks}
    judged = set(jobs) if summarized else set()
    judged |= {(cluster, job) for cluster, job, *_ in found}
    if jobs - judged:
        lags = sel.where("p", node=False, rank=False)
        unjudged = sorted(jobs - judged, key=str)
        judged |= set(rows(conn, JUDGED.format(where=lags.sql()), {
            **lags.params, **unnested([key for key in unjudged if key[1] is not None]),
            "jobless": [cluster for cluster, job in unjudged if job is None]}))
    asked = sorted({(r.cluster, r.job, r.node) for r in ranks
                    if (r.cluster, r.job) not in judged}, key=str)
    if asked:
        timed = Where().within("s.t", sel.window)
        judged |= set(rows(conn, TIMED.format(where=timed.sql()),
                           {**timed.params, **unnested(asked, ("clusters", "jobs", "nodes"))}))
    steps: dict[tuple, set] = defaultdict(set)    # a rank named → the steps it was named in
    for cluster, job, rank, step, named in found:
        if named:
            steps[(cluster, job, rank)].add(step)
    for r in ranks:
        if (r.cluster, r.job) in judged:
            said = steps.get((r.cluster, r.job, r.rank), set())
            r.straggler = bool(said) and (r.step is None or None in said or r.step in said)
    return frozenset(judged)


def unnested(keys: list[tuple], names: tuple[str, ...] = ("clusters", "jobs")) -> dict:
    """Tuples as one array parameter per place, for ``unnest``."""
    return {name: [key[i] for key in keys] for i, name in enumerate(names)}


def ordered(ranks: list[RankLag]) -> list[RankLag]:
    """Stragglers first, then by median lag, largest first."""
    return sorted(ranks, key=lambda r: (not r.straggler, -r.lag_median, r.cluster, r.job, r.rank))
