"""Rank-level verdicts, online: which rank of a job is late, at which collective, and why.

Per job (the Slurm job an event's process belongs to; one node-wide agent may push several),
the collectives of every rank are aligned per communicator (``alignment``) as their nodes
timed them, and on every tick the rules of ``ingero.analysis`` judge the recent instances with
each node's clock offset at the time removed (a node whose offset is not known yet is not
compared with the others): a rank late persistently or periodically, a rank whose own
kernels are slow, a rank missing from a collective its peers entered (hung, or dead when its
process exited). The job's ranks are the cohort, so no node quorum is needed. Each verdict
carries its cause from the rank's host and GPU facts, a severity, a fix and what it cost;
verdicts and per-rank lag summaries are forwarded to echod. Nothing here touches a socket or
reads the wall clock.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np

from ingero.analysis import causes
from ingero.analysis.cost import (COST_SHARE, ONSET_WAITS, excess, growth, stands_out,
                                  waits_grew)
from ingero.analysis.lag import peer_lag
from ingero.analysis.stragglers import LagPolicy, arrivals, judge, quiet, slow_workers
from ingero.runtime import RateLimitedLog
from ingero.vocabulary import POINT_TO_POINT, UNKNOWN_COMM
from ingero.wire import Push

from .alignment import CommWindow, Entries, OpCodes
from .clocks import ClockBook
from .intake import ColumnIntake
from .rankstate import RUN_TAGS, JobState, PeerFacts, RankFacts, Verdict

log = logging.getLogger("fleetd")

PAIR = ">"                           # comm>sender>receiver: a Send/Recv pair's window
HOST_FACTS_S = 30.0                  # preemptions and block I/O weighed, seconds back
HOST_SETTLE = 1                      # push intervals of them before slow kernels are named
MAX_UNRESOLVED = 65_536              # collectives held per split comm until it is resolved
NOTES = {    # what fleetd says once of a rank late on the host that it does not name
    "ahead": "enters collectives {lag:.1f} ms late on the host but its peers wait no longer at "
             "them since (its GPU queue is still ahead): no straggler, no cost",
    "passed_down": "enters collectives {lag:.1f} ms late because it waited on a peer elsewhere "
                   "first (a pipeline stage's send, another group's collective): not its own "
                   "lateness, no straggler"}
PASSED_DOWN = ("host_work", "network_or_peer")   # causes a lateness passed down may look like
UNSYNCED_INSTANCES = 16              # instances with no sync seen: a job ingerod sees none of
DRIFT_STRETCHES = 3                  # runs of instances between the peers' syncs, or
DRIFT_INSTANCES = 256                # this many instances, before a swing is known
HARMLESS_GROWTH = 1.5                # a lateness shown to cost nobody is weighed again once
                                     # its lag has grown this many times
WINDOW_IDLE_S = 60.0                 # a communicator unused this long is retired (and for
WINDOW_IDLE_INTERVALS = 10           # this many push intervals)
UNCOVERED_AFTER = 3                  # push intervals a communicator runs before a rank no
UNCOVERED_AFTER_S = 5.0              # agent told of is taken as uncovered (and this long)
RESUMED_AFTER = 2                    # push intervals without one: a node's next is a resumption
SERVE_EVERY_S = 0.001                # judging between two chances for fleetd to answer pushes


def foreign(preempted: dict, job: str | None) -> bool:
    """Whether a preemption was by another program than the job's: not the rank's own process
    tree (its data-loader workers are its own work) and not another process of its job."""
    other_job = preempted.get("preemptor_job")
    return not preempted.get("preemptor_own") and (other_job is None or other_job != job)


def waits_around(facts: RankFacts, onset: float,
                 placed: Callable[[RankFacts], np.ndarray]) -> tuple[list[tuple], list[tuple]]:
    """A rank's waits at its syncs on collectives, as (stratum, ns, sync) (see ``growth``),
    before and since ``onset`` (fleetd's clock; ``placed``: the waits' times on it, NaN where
    its node's clock is not known, and those waits are in neither)."""
    before, after, last = [], [], {}
    for t, ns, (comm, seq) in zip(placed(facts), facts.peer_wait_ns, facts.peer_wait_on):
        covered = seq - last[comm] if 0 <= last.get(comm, -1) < seq else None
        last[comm] = seq
        sync = (comm, seq) if comm and seq >= 0 else None      # None: its own
        if t == t:
            (after if t >= onset else before).append(((comm, covered), ns, sync))
    return before, after


def own_growth(facts: RankFacts | None, onset: float,
               placed: Callable[[RankFacts], np.ndarray]) -> float:
    """How much a late rank's own waits at its syncs grew since its onset, in seconds (0 when
    they shrank or too few are seen to tell). The rank its peers wait for comes last and
    waits least; a delay that made the rank itself wait longer too came from elsewhere (a
    third rank's GPU, every host slowed at once), and that much of its peers' growth is not
    its doing (CI, eight ranks on two CPUs: rank 2 of a host-ahead job 6 ms late on the host
    while everyone's waits at one sync grew, its own the most, 30 ms against 16; named)."""
    if facts is None:
        return 0.0
    before, after = waits_around(facts, onset, placed)
    if len(before) < 2 or len(after) < ONSET_WAITS:
        return 0.0
    return max(0.0, growth(before, after)[0] / 1e9)


def runs_ahead(job: JobState, ranks: list[int], column: int,
               entries: np.ndarray) -> bool | None:
    """Whether the job's hosts run ahead of their GPUs: its peers (of ``column``) sync with
    them less than every other instance (``entries``, on fleetd's clock; where a peer's
    syncs kept no longer reach back to the first, over those since the oldest one kept);
    None where none of them has synced yet."""
    with quiet():
        times = np.nanmedian(entries, axis=1)
    times = times[np.isfinite(times)]
    shares, synced = [], False
    for at, rank in enumerate(ranks):
        facts = job.facts.get(rank)
        if at == column or facts is None:
            continue
        ends = np.fromiter(facts.sync_end, float)
        synced |= len(ends) > 0
        since = times
        if len(ends) and len(ends) == facts.sync_end.maxlen:
            since = since[since >= ends.min()]
        if len(since) >= 2:
            shares.append(int(((ends >= since.min()) & (ends <= since.max())).sum())
                          / len(since))
    if not synced:
        return None
    return bool(shares) and float(np.median(shares)) < 0.5


def after_first_sync(job: JobState, ranks: list[int], column: int,
                     entries: np.ndarray) -> np.ndarray:
    """Which instances (rows of ``entries``, on fleetd's clock) came after the first sync of
    the peers of ``column`` returned (of those kept); all of them where no peer has synced in
    ``UNSYNCED_INSTANCES`` (a job whose syncs ingerod does not see), none before that."""
    ends = [min(facts.sync_end) for at, rank in enumerate(ranks)
            if at != column and (facts := job.facts.get(rank)) is not None and facts.sync_end]
    with quiet():
        times = np.nanmedian(entries, axis=1)
    if ends:
        return np.nan_to_num(times, nan=-np.inf) > min(ends)
    return np.full(len(entries), len(entries) >= UNSYNCED_INSTANCES)


def drift_seen(job: JobState, ranks: list[int], column: int, entries: np.ndarray) -> bool:
    """Whether the instances (rows of ``entries``, on fleetd's clock, those since the first
    sync) show how far hosts that run ahead drift: they reach over ``DRIFT_STRETCHES`` runs of
    two or more instances between syncs of the peers of ``column`` (their median), or over
    ``DRIFT_INSTANCES``; or no peer syncs at all. Each sync realigns the hosts, and between
    two they drift apart by however long each was kept off its CPU, each by about as much at
    every instance of the run: within one run every rank's lag is steady, so its swing about
    its own median is nil and any rank a few ms behind stands out of it (beside a busy loop,
    a rank 10 ms behind in the run after a job's first sync, of peers from 11 ms ahead to
    15 ms behind, named critical). Across runs a rank's place changes, and that is the swing."""
    with quiet():
        times = np.nanmedian(entries, axis=1)
    times = times[np.isfinite(times)]
    if len(times) >= DRIFT_INSTANCES:
        return True
    runs = []
    for at, rank in enumerate(ranks):
        facts = job.facts.get(rank)
        if at == column or facts is None or not facts.sync_end:
            continue
        after = np.searchsorted(np.sort(np.fromiter(facts.sync_end, float)), times)
        lengths = np.unique(after, return_counts=True)[1]  # instances between two syncs
        runs.append(int((lengths >= 2).sum()))
    return not runs or float(np.median(runs)) >= DRIFT_STRETCHES


def pair_of(comm: str, me: int, peer: int, op: str) -> tuple[str, int, int]:
    """Send/Recv between two ranks of ``comm`` as a communicator of their own: the pair (the
    sender's and the receiver's communicator ranks), its Send the first column and its Recv the
    second, in the pair's own sequence (Send/Recv match per peer pair, in order)."""
    sender, receiver = (me, peer) if op == "ncclSend" else (peer, me)
    return f"{comm}{PAIR}{sender}{PAIR}{receiver}", int(op != "ncclSend"), 2


def by_program(taken: dict[tuple[str, int], tuple[int, int]]) -> dict[str, int]:
    """ns a rank was kept off its CPU, per preempting program (its name, whatever its pid)."""
    total: dict[str, int] = defaultdict(int)
    for (comm, _pid), (_n, ns) in taken.items():
        total[comm] += ns
    return total


class RankAnalysis:
    """Every job's aligned collectives, rank facts and verdicts."""

    def __init__(self, cfg: SimpleNamespace, rate_usd_per_gpu_hour: float | None = None,
                 clocks: ClockBook | None = None):
        self.policy = LagPolicy(k=cfg.lag_k, min_lag_s=cfg.min_lag)
        self.hang_timeout = cfg.hang_timeout
        self.clear_ticks = cfg.clear_ticks
        self.job_ttl = cfg.job_ttl
        self.rate = rate_usd_per_gpu_hour
        self.clocks = clocks or ClockBook()
        self.jobs: dict[tuple, JobState] = {}       # (cluster, job, run) → its state
        self.ops = OpCodes()
        self.intake = ColumnIntake(self)
        self.unaligned = 0            # collectives on communicators never seen created
        self.heard: dict[str, tuple[float, float]] = {}   # node → (last push, its interval)
        self.resumed: dict[str, float] = {}  # node → its first push after a silence, when
        self.pending_rows: list[dict] = []
        self.pending_lag: list[dict] = []
        self.live_by_node: dict[str | None, set[tuple]] = {}  # node → (job, rank) named
        self.failed = 0               # a job's tick that raised (a bug): counted, logged, skipped
        self.failures = RateLimitedLog(log, 60.0)
        self.interval_s = 1.0         # the longest push interval of the job being judged
        self.users: dict[tuple, tuple[str, float]] = {}   # (cluster, job) → (user, when said)
        self.max_ranks = cfg.max_ranks
        self.max_jobs_per_node = cfg.max_jobs_per_node
        self.node_jobs: dict[tuple, dict[str, float]] = {}   # (cluster, node) → job → when
        self.owners: dict[tuple, tuple[int, float]] = {}  # (cluster, job) → (its uid, when)
        self.refused: Counter[str] = Counter()    # events refused at intake, by reason

    # -- intake --------------------------------------------------------------------------------

    def screen(self, push: Push, now: float) -> tuple[list[dict], np.ndarray | None]:
        """The events of a push fleetd takes, from what their processes may claim: its maps
        kept, and a mask over its columns (None: it has none). Refused and counted, by reason:
        a communicator past --max-ranks or a rank out of range (``_admit``), and an event of a
        process whose user is not the job's (``foreign_uid``: the uid its Slurm prolog
        recorded, else the first its events carried), which may name any job and rank it
        likes in its environment."""
        before = self.refused.copy()
        cols = getattr(push, "columns", None)
        room = self._room(push, cols, now)
        records = push.events + (cols.rows(np.flatnonzero(cols.of_kind("job_start")))
                                 if cols is not None and cols.n else [])
        for event in records:
            uid = event["attrs"].get("uid")
            if event["kind"] == "job_start" and type(uid) is int:
                self.owners[(push.cluster, str(push.job_of(event)))] = (uid, now)
        kept = [event for event in push.events if room(push.job_of(event), 1)
                and self._admit(event["attrs"])
                and self._owned(push.cluster, push.job_of(event), event["attrs"].get("uid"), now)]
        admitted = None
        if cols is not None and cols.n:
            job, jobs = cols.coded("job")
            roomy = np.ones(cols.n, bool)
            for code, name in [*enumerate(jobs), (-1, push.job)]:
                mine = job == code
                if name is not None and mine.any() and not room(name, int(mine.sum())):
                    roomy &= ~mine
            admitted = roomy & self._admit_columns(cols)
            admitted &= self._owned_columns(push, cols, now, admitted)
        if self.refused != before:
            self.failures.warning(f"refused {push.node}", "node %s: refused %s", push.node,
                                  ", ".join(f"{n} event(s) {reason}" for reason, n
                                            in (self.refused - before).items()))
        return kept, admitted

    def _room(self, push: Push, cols, now: float):
        """A test of whether ``push``'s node may have events of a job (refusing and counting
        ``n`` of them as ``too_many_jobs`` if not): one of the jobs the node already has, or
        one more within --max-jobs-per-node. A user's process may claim any job id: made-up
        ones cost fleetd no more state than a node's share."""
        jobs = self.node_jobs.setdefault((push.cluster, push.node), {})

        def room(job: str | None, n: int) -> bool:
            if job is None or str(job) in jobs or len(jobs) < self.max_jobs_per_node:
                if job is not None:
                    jobs[str(job)] = now
                return True
            self.refused["too_many_jobs"] += n
            return False
        return room

    def _owned(self, cluster: str, job: str | None, uid, now: float) -> bool:
        """Whether an event of user ``uid`` may be of ``job`` (the first user a job is seen
        with owns it until its record says otherwise)."""
        if job is None or type(uid) is not int:
            return True
        owner = self.owners.setdefault((cluster, str(job)), (uid, now))[0]
        if owner == uid:
            return True
        self.refused["foreign_uid"] += 1
        return False

    def _owned_columns(self, push: Push, cols, now: float, among: np.ndarray) -> np.ndarray:
        """``_owned`` for the events ``among`` those of a push of columns (the others are
        refused already: they make no job an owner)."""
        uid = cols.ints("uid")
        job, jobs = cols.coded("job")
        ok = np.ones(cols.n, bool)
        if not (uid >= 0).any():
            return ok
        for code, name in [*enumerate(jobs), (-1, push.job)]:
            mine = (job == code) & (uid >= 0) & among
            if name is None or not mine.any():
                continue
            first = int(uid[np.flatnonzero(mine)[0]])
            owner = self.owners.setdefault((push.cluster, str(name)), (first, now))[0]
            foreign = mine & (uid != owner)
            ok &= ~foreign
            self.refused["foreign_uid"] += int(foreign.sum())
        return ok

    def observe(self, push: Push, now: float,
                screened: tuple[list[dict], np.ndarray | None] | None = None) -> None:
        """A fresh push's events: collectives as the node timed them (corrected when judged),
        the other facts less the node's offset now (0 while unknown: they are weighed in
        seconds, not compared across nodes). A push of columns is taken whole arrays at a
        time (``intake``), its few other events one by one first, as a push of maps is."""
        offset = self.clocks.offset(push.node)
        last = self.heard.get(push.node)
        if last is not None and now - last[0] > RESUMED_AFTER * max(last[1], push.interval):
            self.resumed[push.node] = now
        self.heard[push.node] = (now, push.interval)
        collectives: dict[tuple, list] = defaultdict(list)    # → (seq, column, t, op) rows
        chunks: dict[tuple, list] = defaultdict(list)         # → the same, as arrays
        cols = getattr(push, "columns", None)
        events, admitted = screened or self.screen(push, now)
        if cols is not None and cols.n:
            bulk = self.intake.bulk(cols) & admitted
            events = events + cols.rows(np.flatnonzero(~bulk & admitted))
        for event in events:
            a = event["attrs"]
            job = self.job_state(push.cluster, push.job_of(event),
                                 tuple(a.get(tag) for tag in RUN_TAGS), now)
            kind = event["kind"]
            if kind == "collective":
                self._collective(job, push.node, event, a, collectives, event["t"] - offset)
            elif "rank" in a and a["rank"] is not None:
                self._fact(job, push.node, kind, a, event["t"] - offset, event["t"])
            elif kind == "agent_restart":
                self._restarted(push.node, a.get("untraced_from") or event["t"] - offset)
            elif kind == "job_start" and a.get("user"):
                self.users[(push.cluster, job.job)] = (str(a["user"]), now)
        if cols is not None and cols.n:
            self.intake.take(push, cols, offset, chunks, now, bulk)
        for job in {id(j): j for j in self.jobs.values() if j.unresolved}.values():
            for comm in [c for c in job.unresolved if c in job.split_comms]:
                for node, event, a, t in job.unresolved.pop(comm):
                    self._collective(job, node, event, a, collectives, t)
        for key, rows in collectives.items():
            chunks[key].append(tuple(np.array(x) for x in zip(*rows)))
        for (job, comm, nranks), parts in chunks.items():
            window = job.comms.get(comm)
            if window is None or window.nranks != nranks:
                window = job.comms[comm] = CommWindow(comm, nranks, created=now)
            window.last_added = now
            seq, column, t, op = (np.concatenate(x) for x in zip(*parts))
            window.add(Entries(seq.astype(np.int64), column.astype(np.int64), t.astype(float),
                               op.astype(np.int64)))

    def job_state(self, cluster: str, job: str | None, run: tuple, now: float) -> JobState:
        """The state of one run: steps of one job, a requeue, an elastic restart are runs of
        their own (their own ranks, exits, verdicts and cost)."""
        state = self.jobs.get((cluster, job, run))
        if state is None:
            state = self.jobs[(cluster, job, run)] = JobState(cluster, job, run, started=now)
        state.last_event = now
        state.changed = True
        return state

    def _restarted(self, node: str, since: float) -> None:
        """``node``'s agent restarted: the communicators its ranks made before are unknown to
        it now, so their collectives cannot be placed; those ranks are not waited for there
        (they are not missing: no one can tell), and their peers are judged without them."""
        for job in self.jobs.values():
            for facts in job.facts.values():
                if facts.node == node and facts.blind_since is None:
                    facts.blind_since = since
        log.info("node %s's agent restarted: its ranks' collectives on the communicators it "
                 "made before are not placed from then on", node)

    def _admit(self, a: dict) -> bool:
        """Whether an event's rank and communicator size are in range (``_admit_columns``
        for a push of columns); one that is not is refused and counted."""
        nranks, rank, column = a.get("nranks"), a.get("rank"), a.get("comm_rank")
        reason = None
        if isinstance(nranks, int) and nranks > self.max_ranks:
            reason = "too_many_ranks"
        elif (isinstance(rank, int) and not 0 <= rank < self.max_ranks) or (
                isinstance(column, int) and isinstance(nranks, int) and column >= nranks >= 1):
            reason = "bad_rank"
        if reason is not None:
            self.refused[reason] += 1
        return reason is None

    def _admit_columns(self, cols) -> np.ndarray:
        nranks, column = cols.ints("nranks"), cols.ints("comm_rank")
        rank = cols.ints("rank", missing=0)
        too_many = nranks > self.max_ranks
        bad = ~too_many & (((rank < 0) | (rank >= self.max_ranks))
                           | ((nranks >= 1) & (column >= nranks)))
        self.refused["too_many_ranks"] += int(too_many.sum())
        self.refused["bad_rank"] += int(bad.sum())
        return ~(too_many | bad)

    def _collective(self, job: JobState, node: str, event: dict, a: dict, into: dict,
                    t: float) -> None:
        comm, nranks, column = a.get("comm_hash"), a.get("nranks"), a.get("comm_rank")
        if comm and comm != UNKNOWN_COMM and (column is None or column < 0) \
                and a.get("rank") is not None:         # on a communicator made by a split
            known = job.split_comms.get(comm, {}).get(a["rank"])
            if known is None:
                held = job.unresolved.setdefault(comm, [])
                if len(held) < MAX_UNRESOLVED:
                    held.append((node, event, a, t))   # placed once the split is resolved
                return
            column, nranks = known
        if not comm or comm == UNKNOWN_COMM or not nranks or nranks < 1 or column is None:
            self.unaligned += 1        # kept out, and counted
            rank = a.get("rank")
            if comm in (None, UNKNOWN_COMM) and rank is not None \
                    and job.facts[rank].blind_since is None:
                job.facts[rank].node = node          # alive and calling, on a communicator
                job.facts[rank].blind_since = t      # its agent did not see made
            return
        rank = a.get("rank") if a.get("rank") is not None else column
        if a.get("op") in POINT_TO_POINT:
            if a.get("peer") is None or not 0 <= a["peer"] < nranks:
                self.unaligned += 1
                return
            comm, column, nranks = pair_of(comm, column, a["peer"], a["op"])
        job.columns.setdefault(comm, {})[column] = rank
        facts = job.facts[rank]
        if facts.pid is not None and a.get("pid") not in (None, facts.pid):
            facts.exited_at = facts.crashed = facts.aborted_at = None   # a new process of it
        facts.node, facts.pid = node, a.get("pid")
        into[(job, comm, nranks)].append((a.get("seq", -1), column, event["t"],
                                          self.ops.code(a.get("op", "?"))))

    def _fact(self, job: JobState, node: str, kind: str, a: dict, t: float,
              raw: float) -> None:
        """One fact of a rank (``t``: less its node's offset now; ``raw``: as the node timed
        it, where it is placed against collectives' entries)."""
        facts = job.facts[a["rank"]]
        facts.node = node
        if kind == "sync" and a.get("duration_ns") is not None:
            facts.sync_end.append(t + a["duration_ns"] / 1e9)
            facts.sync_on.append(a.get("comm_hash") if a.get("peer_wait") else None)
            if a.get("peer_wait"):
                facts.peer_wait_ns.append(a["duration_ns"])
                facts.peer_wait_t.append(raw)
                facts.peer_wait_on.append((a.get("comm_hash"), a.get("seq", -1)))
            else:
                facts.self_work_ns.append(a["duration_ns"])
        elif kind == "alloc" and a.get("duration_ns") is not None:
            facts.allocation_ns.append(a["duration_ns"])
        elif kind == "preempted" and foreign(a, job.job):
            facts.preemptions.append((t, a.get("preemptor_comm", "?"), a.get("preemptor_pid"),
                                      a.get("count", 1), a.get("preemptor_tgid"),
                                      a.get("preempted_ns") or 0))
        elif kind == "blockio":
            facts.blockio.append((t, a.get("requests", 0), a.get("bytes", 0)))
        elif kind == "process_exit" and a.get("role", "rank") == "rank":
            facts.exited_at = t       # a helper's exit (a data-loader worker's) is no death
            if "exit_status" in a or "signal" in a:
                facts.crashed = a.get("signal") is not None or a.get("exit_status") != 0
        elif kind == "comm_destroy" and a.get("op") == "ncclCommAbort":
            facts.aborted_at = t
        elif kind == "comm_destroy" and a.get("comm_hash") in job.comms:
            job.comms[a["comm_hash"]].destroyed = True     # the job is done with it
        elif kind == "comm_init" and a.get("parent_hash") is not None:
            self._split(job, a)

    def _split(self, job: JobState, a: dict) -> None:
        """One rank's ncclCommSplit: once every rank of the parent has split, each new
        communicator's ranks are numbered as NCCL numbers them (by key, then parent rank,
        among the ranks of one colour), and the collectives held for it are placed."""
        members = job.splits.setdefault((a["parent_hash"], a.get("split", 0)), {})
        members[a.get("parent_rank", -1)] = (a.get("color", -1), a.get("key", 0),
                                             a.get("comm_hash"), a["rank"])
        if len(members) < (a.get("parent_nranks") or 0):
            return
        colours: dict[int, list] = defaultdict(list)
        for parent_rank, (colour, key, comm, rank) in members.items():
            if colour >= 0:                              # NCCL_SPLIT_NOCOLOR: no new comm
                colours[colour].append((key, parent_rank, comm, rank))
        for group in colours.values():
            for comm_rank, (_key, _parent, comm, rank) in enumerate(sorted(group)):
                job.split_comms.setdefault(comm, {})[rank] = (comm_rank, len(group))
        del job.splits[(a["parent_hash"], a.get("split", 0))]

    # -- the tick ------------------------------------------------------------------------------

    def tick(self, now: float, between: Callable[[], None] | None = None,
             every_s: float = SERVE_EVERY_S) -> list[Verdict]:
        """Settle, judge every job, expire idle ones; returns the verdicts that changed.
        ``between`` is called between two jobs once ``every_s`` of judging has passed since
        it last ran: fleetd answers the pushes waiting meanwhile, so a tick over thousands of
        jobs does not hold every reply up (a push it handles then may add to a job already
        judged, or not yet: either way it is judged next tick)."""
        changed: list[Verdict] = []
        served = time.perf_counter()
        for key, job in list(self.jobs.items()):
            if between is not None and time.perf_counter() - served >= every_s:
                between()
                served = time.perf_counter()
            try:
                self.interval_s = self._interval(job)
                changed += self._judge_job(job, now)
            except Exception:
                self.failed += 1
                self.failures.warning(f"{key}", "the rank analysis of job %s/%s failed; the "
                                      "other jobs are judged, and this one again next tick",
                                      job.cluster, job.job, exc_info=True)
            if now - job.last_event > self.job_ttl:
                changed += self._close_all(job, now)
                del self.jobs[key]
        changed = list({id(v): v for v in changed}.values())   # a verdict once, as it is now
        self.heard = {node: said for node, said in self.heard.items()
                      if now - said[0] <= max(self.job_ttl, RESUMED_AFTER * said[1])}
        tracked = {(job.cluster, job.job) for job in self.jobs.values()}
        self.users = {key: said for key, said in self.users.items()
                      if key in tracked or now - said[1] <= self.job_ttl}
        self.owners = {key: said for key, said in self.owners.items()
                       if key in tracked or now - said[1] <= self.job_ttl}
        for (cluster, node), jobs in list(self.node_jobs.items()):
            for job in [j for j, seen in jobs.items()
                        if (cluster, j) not in tracked and now - seen > self.job_ttl]:
                del jobs[job]
            if not jobs:
                del self.node_jobs[(cluster, node)]
        self.pending_rows += [v.row() for v in changed]
        self.live_by_node = defaultdict(set)
        for verdict in self.active():
            self.live_by_node[verdict.node].add((verdict.job, verdict.rank))
        return changed

    def _judge_job(self, job: JobState, now: float) -> list[Verdict]:
        """Settle and judge one job's communicators; the verdicts that changed."""
        job.peers = None
        found: dict[tuple[int, str], Verdict] = {}
        judged, retired = set(), set()
        for comm, window in list(job.comms.items()):
            job.changed |= self._settle(job, comm, window, now)
            if job.changed:
                found.update(self._judge_lag(job, comm, window, now))
                judged.add(comm)
            found.update(self._judge_missing(job, comm, window, now))
            if self._retired(window, now):
                del job.comms[comm]      # judged to its last instance: what it found stands
                retired.add(comm)
        if job.changed:
            found.update(self._judge_work(job, now, {rank for rank, _ in found}))
            judged.add(None)
        # Nothing new on a communicator, or it is retired: what was found on it holds (only
        # time can make a rank missing, and that is judged every tick), neither seen again
        # nor missed: a tick between two pushes must not keep a rank that recovered named.
        held = {key for key, v in job.verdicts.items()
                if key[1] == "lag" and v.cleared is None and key not in found
                and v.comm_hash not in judged}
        # What a verdict on a retired communicator cost is all charged: stored now, not up
        # to 10 s later (a job that ends just after a rank is named).
        final = {key for key, v in job.verdicts.items()
                 if key[1] == "lag" and v.cleared is None and v.comm_hash in retired}
        job.changed = False
        return self._merge(job, found, now, held, final)

    def _retired(self, window: CommWindow, now: float) -> bool:
        """A communicator the job destroyed, or has not used for WINDOW_IDLE_S, with nothing
        of it left open (an instance some rank never entered is a hang's evidence)."""
        if window.open_seq.max() >= 0:
            return False
        return window.destroyed or now - window.last_added > max(
            WINDOW_IDLE_S, WINDOW_IDLE_INTERVALS * self.interval_s)

    def _unseen(self, job: JobState, window: CommWindow, ranks: list[int],
                now: float) -> np.ndarray:
        """Per column, whether no agent can tell where its rank is: its agent restarted since
        the communicator was made (blind), or no agent has ever told of the rank while the
        communicator ran a few push intervals (uncovered: its node runs none). Where this
        fleetd came to the communicator after its start (its first instance is not the first:
        fleetd restarted mid-job, and the previous run took the entries before), a rank that
        entered none of the instances it has is not known to be anywhere either: its last
        entries may have gone to the previous run."""
        unseen = np.zeros(window.nranks, bool)
        settled = now - window.created >= max(UNCOVERED_AFTER_S,
                                              UNCOVERED_AFTER * self.interval_s)
        joined = window.first_seq > 0
        for column, rank in enumerate(ranks):
            facts = job.facts.get(rank)
            if joined and window.latest[column] < 0:
                unseen[column] = True
            elif facts is None or not facts.node:
                unseen[column] = settled and window.latest[column] < 0
            elif facts.blind_since is not None:      # made before its agent restarted
                unseen[column] = facts.blind_since >= window.created - self.interval_s
        newly = {ranks[c] for c in np.flatnonzero(unseen)
                 if not getattr(job.facts.get(ranks[c]), "node", "")} - job.uncovered
        if newly:
            job.uncovered |= newly
            log.warning("job %s: rank(s) %s never told of by any agent (their node runs none, "
                        "or not for this job): not judged, and their peers judged without them",
                        job.job, ",".join(map(str, sorted(newly))))
        return unseen

    def _interval(self, job: JobState) -> float:
        """The longest push interval of the job's nodes: a node pushing once an hour (an
        agent's setting, or a stolen key's) stretches its own jobs' timeouts, nobody else's."""
        nodes = {facts.node for facts in job.facts.values() if facts.node}
        return max((self.heard[node][1] for node in nodes if node in self.heard), default=1.0)

    def _settle(self, job: JobState, comm: str, window: CommWindow, now: float) -> bool:
        """Move the instances now complete to the history; whether there were any."""
        ranks = self._ranks(job, comm, window.nranks)
        seq, _op, raw = window.settle(self._unseen(job, window, ranks, now))
        if not len(seq):
            return False
        entries = self._on_fleet_clock(job, ranks, raw)
        lag = peer_lag(entries)      # complete, but NaN where a node's clock is not known yet
        self._charge(job, comm, window, ranks, entries, lag)
        known = np.isfinite(lag).all(axis=0)
        if known.sum() < 2 or PAIR in comm:
            return True
        # The rank's lag summary for echod, which answers from these where the raw
        # collectives are not kept (or too many to read): its lag on the clocks known; who
        # came last and who waited only where every rank's clock is known (among a part of
        # the ranks, the last of that part is no last arrival).
        t = float(np.nanmedian(entries[-1]))
        summary = (np.quantile(lag[:, known], [0.5, 0.95, 0.99, 1.0], axis=0) * 1e9).round() \
            .astype(np.int64)
        waits = arrivals(entries) if known.all() else None
        for at, column in enumerate(np.flatnonzero(known)):
            median, p95, p99, largest = summary[:, at].tolist()
            self.pending_lag.append({
                "t": t, "cluster": job.cluster, "job": job.job, "comm_hash": comm,
                "seq_first": int(seq[0]), "seq_last": int(seq[-1]), "rank": ranks[column],
                "node": job.facts[ranks[column]].node or None,
                "step": job.run[0], "samples": len(seq), "lag_median_ns": median,
                "lag_p95_ns": p95, "lag_p99_ns": p99, "lag_max_ns": largest,
                **({} if waits is None else {
                    "last_arrivals": int(waits[0][column]),
                    "idle_caused_ns": round(waits[1][column] * 1e9),
                    "waited_ns": round(waits[2][column] * 1e9)})})
        return True

    def _charge(self, job: JobState, comm: str, window: CommWindow, ranks: list[int],
                entries: np.ndarray, lag: np.ndarray) -> None:
        """What the newly settled instances cost, on the verdicts live on this communicator:
        from each verdict's onset, only the part of the rank's lag over the bar, once for
        each peer kept waiting (GPU-seconds)."""
        for column, rank in enumerate(ranks):
            verdict = job.verdicts.get((rank, "lag"))
            if verdict is None or verdict.cleared is not None or verdict.comm_hash != comm:
                continue
            since = np.nan_to_num(np.nanmedian(entries, axis=1), nan=-np.inf) >= verdict.onset
            verdict.cost_gpu_s += excess(lag[since, column], window.bar, window.nranks)
            verdict.cost_usd = self._usd(verdict.cost_gpu_s)

    def _on_fleet_clock(self, job: JobState, ranks: list[int], raw: np.ndarray) -> np.ndarray:
        """Entry times (instances × columns, each column as its node timed it) on fleetd's
        clock: less the column's node's offset at each time. A column whose node's offset is
        not known yet is NaN, not compared (its node may be 20 ms ahead), unless every column
        is on that one node: a clock compares with itself."""
        nodes = [job.facts[rank].node for rank in ranks]
        fits = [self.clocks.at(node) for node in nodes]
        if len(set(nodes)) == 1 and fits[0] is None:
            return raw
        for node in {n for n, fit in zip(nodes, fits) if fit is None and n} - job.unclocked:
            job.unclocked.add(node)
            log.info("job %s: node %s's clock is not known yet (no push/reply exchange): its "
                     "ranks are compared with no other node's until it is", job.job, node)
        offset = np.array([f.offset if f else np.nan for f in fits])
        drift = np.array([f.drift if f else 0.0 for f in fits])
        at = np.array([f.at if f else 0.0 for f in fits])
        return raw - (offset + drift * (raw - at))

    def _waits_placed(self, job: JobState, ranks: list[int]) -> Callable[[RankFacts],
                                                                         np.ndarray]:
        """How a rank's waits at syncs are placed on fleetd's clock, as ``_on_fleet_clock``
        places the entries of ``ranks`` they are weighed against: each less its node's
        offset at its time; NaN where that is not known yet, unless every rank is on one node.
        Kept as the node timed them: with node1's clock 250 ms ahead and not yet known, its
        ranks' waits from before a rank's onset counted as after it, and the peers' waits
        looked to grow 107 ms where they grew 290 (beside a busy loop, a rank 290 ms late
        shown harmless in a stack's first job)."""
        alone = len({job.facts[rank].node for rank in ranks if rank in job.facts}) == 1

        def placed(facts: RankFacts) -> np.ndarray:
            raw = np.fromiter(facts.peer_wait_t, float, len(facts.peer_wait_t))
            fit = self.clocks.at(facts.node)
            if fit is None:
                return raw if alone else np.full_like(raw, np.nan)
            return raw - fit.offset_at(raw)
        return placed

    def _ranks(self, job: JobState, comm: str, nranks: int) -> list[int]:
        known = job.columns.get(comm, {})
        return [known.get(column, column) for column in range(nranks)]

    # -- the rules -----------------------------------------------------------------------------

    def _judge_lag(self, job: JobState, comm: str, window: CommWindow, now: float) -> dict:
        op, rows = window.dominant()
        if op is None or PAIR in comm:
            return {}        # a pipeline's receives wait on their sends by design: not lag
        ranks = self._ranks(job, comm, window.nranks)
        entries, steps = self._on_fleet_clock(job, ranks, window.entries[rows]), window.step[rows]
        # Hysteresis for a persistent verdict only: a rank named periodic, late one instance
        # in five, would otherwise pass the kept share and be renamed persistent.
        named = frozenset(column for column, rank in enumerate(ranks)
                          if (v := job.verdicts.get((rank, "lag"))) and v.cleared is None
                          and v.kind == "persistent")
        judgement = judge(entries, self.policy, named, self._clock_slack(job, ranks, entries),
                          warming=int((steps < self.policy.warm_up).sum()))
        window.bar = judgement.bar_s
        lag = peer_lag(entries)
        found = {}
        for f in judgement.findings:
            rank = ranks[f.column]
            facts = self._facts_of(job, rank, now, late_share=f.lag_p50_s / (
                judgement.step_s * (f.period or 1)) if judgement.step_s else None)
            diagnosis = causes.diagnose_late(facts, job.facts[rank].node)
            onset = float(np.nanmedian(entries[f.onset]))
            if f.kind == "persistent" and diagnosis.cause in PASSED_DOWN and \
                    self._inherited(job, comm, ranks, entries[f.onset:], f):
                self._note(job, rank, "passed_down", f, comm, self.ops.names[op],
                           int(steps[f.onset]), onset, now)
                continue
            costs = f.kind != "persistent" or self._shown(
                job, (comm, rank), self._recent(lag, f.column),
                lambda: self._costs(job, ranks, f, onset, lag, entries))
            if not costs:
                if costs is False:
                    self._note(job, rank, "ahead", f, comm, self.ops.names[op],
                               int(steps[f.onset]), onset, now)
                continue
            verdict = Verdict(job.cluster, job.job, rank, job.facts[rank].node, f.kind,
                              diagnosis.cause, confidence=diagnosis.confidence,
                              severity=causes.severity(f.lag_p50_s, judgement.step_s),
                              fix=diagnosis.fix, findings=diagnosis.findings,
                              op=self.ops.names[op], comm_hash=comm,
                              step=int(steps[f.onset]),
                              onset=float(np.nanmedian(entries[f.onset])),
                              lag_p50_s=f.lag_p50_s, lag_p99_s=f.lag_p99_s,
                              last_share=f.last_share, period=f.period,
                              occurrences=f.occurrences,
                              evidence=self._evidence(facts, judgement.bar_s, judgement.step_s))
            verdict.cost_gpu_s = excess(lag[f.onset:, f.column], judgement.bar_s, window.nranks)
            self._clock_caveat(verdict)
            found[(rank, "lag")] = verdict
        late = {(comm, ranks[f.column]) for f in judgement.findings}
        for key in [key for key in job.harmless if key[0] == comm and key not in late]:
            del job.harmless[key]          # on time again: a new lateness is weighed anew
        return found

    def _recent(self, lag: np.ndarray, column: int) -> float:
        """The column's median lag over the last instances judged."""
        with quiet():
            return float(np.nanmedian(lag[-self.policy.min_instances:, column]))

    @staticmethod
    def _shown(job: JobState, key: tuple[str, int], recent: float,
               costs: Callable[[], bool | None]) -> bool | None:
        """``costs()``, but a lateness already shown to cost nobody stays so while it lasts
        and its lag (``recent``: over the last instances) has not grown ``HARMLESS_GROWTH``
        times: the peers' waits from before its onset, the proof, are kept for the last
        ``FACTS_KEPT`` syncs only, and without them a rank looks late from the start, which
        is taken to cost."""
        shown = job.harmless.get(key)
        if shown is not None and recent <= HARMLESS_GROWTH * shown:
            return False
        answer = costs()
        if answer is False:
            job.harmless[key] = recent
        elif answer:
            job.harmless.pop(key, None)
        return answer

    def _costs(self, job: JobState, ranks: list[int], f, onset: float,
               lag: np.ndarray, entries: np.ndarray) -> bool | None:
        """Whether the rank's lateness delays its peers: whether their waits at collectives
        grew from its onset on, beyond what a later rank explains (``lag``: every column's, at
        each instance judged, at ``entries``; see ``waits_grew``). A rank
        late from the first instances judged has no before to weigh them against: it is
        taken to cost (its own waits cannot tell: every rank's sync ends with the collective,
        so its peers wait longer than it by its lateness whether its GPU absorbed it or not);
        where the hosts run ahead of their GPUs, or none has synced yet (``runs_ahead``),
        once its lag stands out of the swing of its peers' (``stands_out``) over enough
        instances to show that swing (``drift_seen``), and until then it is not known yet.
        There, only its instances since its peers' first sync count (``after_first_sync``):
        a host that starts its loop a few ms late while its GPU queue is empty is late at
        every step it enqueues before the first sync, which realigns the hosts (CI: a rank
        7 ms late over a job's first steps named beside the straggler)."""
        if f.onset < self.policy.min_instances:
            if runs_ahead(job, ranks, f.column, entries) is False:
                return True
            rows = after_first_sync(job, ranks, f.column, entries)
            if rows.sum() < self.policy.min_instances or \
                    not drift_seen(job, ranks, f.column, entries[rows]):
                return None
            with quiet():
                since = float(np.nanmedian(lag[rows, f.column]))
            return True if stands_out(lag[rows], f.column, since, self.policy.k) else None
        before, after, peers = [], [], 0
        placed = self._waits_placed(job, ranks)
        for column, rank in enumerate(ranks):
            facts = job.facts.get(rank)
            if column == f.column or facts is None or not facts.peer_wait_ns:
                continue
            peers += 1
            waits = waits_around(facts, onset, placed)
            before += waits[0]
            after += waits[1]
        with quiet():
            since = np.nanmedian(lag[f.onset:], axis=0)
            later = float(np.nanmax(since) - since[f.column])
        own = own_growth(job.facts.get(ranks[f.column]), onset, placed)
        answer = waits_grew(before, after, f.lag_p50_s, self.policy.min_lag_s, later + own,
                            enough=ONSET_WAITS * peers)
        named = job.verdicts.get((ranks[f.column], "lag"))
        if not answer or (named is not None and named.cleared is None):
            return answer                  # said once, as the lateness is first named
        if len(before) < 3:
            log.info("job %s: rank %d's lateness (%.1f ms) taken to cost: %d sync(s) of its "
                     "peers kept from before its onset, too few to weigh", job.job,
                     ranks[f.column], f.lag_p50_s * 1e3, len(before))
        else:
            grew, error = growth(before, after)
            log.info("job %s: rank %d's lateness (%.1f ms) costs: its peers' waits at syncs "
                     "grew %.1f ms (±%.1f) from %d before its onset to %d since; %.1f ms of "
                     "that is a later rank's or its own", job.job, ranks[f.column],
                     f.lag_p50_s * 1e3, grew / 1e6, error / 1e6, len(before), len(after),
                     (later + own) * 1e3)
        return answer

    def _inherited(self, job: JobState, comm: str, ranks: list[int], entries: np.ndarray,
                   f) -> bool:
        """Whether the rank's lateness was passed down to it. Its host came from a sync that
        waited on a collective of another communicator (a pipeline stage's send, another
        group's collective) at most of its entries since the onset (``entries``, on
        fleetd's clock, as the syncs are kept); and from that sync's end (its GPU done, its
        thread woken) to its entry it took no longer than its peers did from theirs, by a
        share of its lag (a host slow to get back its CPU is late on its own): its host
        came late only because its GPU was kept waiting elsewhere (its own kernels are no
        slower: asked before). The rank that held it up is judged where it was late."""
        gaps = np.full(len(ranks), np.nan)
        for column, rank in enumerate(ranks):
            facts = job.facts.get(rank)
            if facts is None or not facts.sync_end:
                continue
            ends = np.fromiter(facts.sync_end, float)
            order = np.argsort(ends, kind="stable")
            ends, entered = ends[order], entries[:, column][np.isfinite(entries[:, column])]
            at = np.searchsorted(ends, entered, side="right") - 1
            entered, at = entered[at >= 0], at[at >= 0]
            if not len(at):
                continue
            gaps[column] = np.median(entered - ends[at])
            if column == f.column:
                on = [facts.sync_on[i] for i in order[at]]
                if sum(c is not None and c != comm for c in on) * 2 <= len(on):
                    return False
        others = np.delete(gaps, f.column)
        if not np.isfinite(gaps[f.column]) or not np.isfinite(others).any():
            return False
        return gaps[f.column] - float(np.nanmedian(others)) < COST_SHARE * f.lag_p50_s

    def _note(self, job: JobState, rank: int, kind: str, f, comm: str, op: str, step: int,
              onset: float, now: float) -> None:
        """A rank late on the host that costs nobody (``ahead``: its peers wait no longer
        for it since, its GPU queue still ahead of it) or whose lateness is another's
        (``passed_down``): said once, in the log and to echod as a note (severity info, no
        cost, cleared as it is raised: it is what was seen then), and never named."""
        if rank in job.noted:
            return
        job.noted.add(rank)
        words = NOTES[kind].format(lag=f.lag_p50_s * 1e3)
        log.info("job %s rank %d %s", job.job, rank, words)
        note = Verdict(job.cluster, job.job, rank, job.facts[rank].node, kind, "none",
                       severity="info", findings=[words], op=op, comm_hash=comm, step=step,
                       onset=onset, first_seen=now, last_seen=now, cleared=now,
                       lag_p50_s=f.lag_p50_s, lag_p99_s=f.lag_p99_s, last_share=f.last_share)
        if any(value is not None for value in job.run):
            note.evidence["run"] = job.run_json()
        self.pending_rows.append(note.row())

    def _clock_slack(self, job: JobState, ranks: list[int], entries: np.ndarray) -> np.ndarray:
        """Per column, how far its node's clock estimate may be off at the latest entries (0
        where none is known: then the column is compared with its own node's only; and 0 for
        all where all are on one node: a clock compares with itself)."""
        nodes = [job.facts[rank].node for rank in ranks]
        if len(set(nodes)) == 1:
            return np.zeros(len(ranks))
        t = float(np.nanmax(entries)) if np.isfinite(entries).any() else 0.0
        fits = (self.clocks.at(node) for node in nodes)
        return np.array([float(f.uncertainty_at(t)) if f else 0.0 for f in fits])

    def _clock_caveat(self, verdict: Verdict) -> None:
        """Say what the node's clock estimate is, and when it is too loose for this lag."""
        known = self.clocks.at(verdict.node)
        if known is None:
            return
        verdict.evidence["clock_offset_ms"] = round(known.offset * 1e3, 3)
        verdict.evidence["clock_uncertainty_ms"] = round(known.uncertainty * 1e3, 3)
        if verdict.lag_p50_s is not None and known.uncertainty > verdict.lag_p50_s / 2:
            verdict.findings.append(
                f"{verdict.node}'s clock is known only to ±{known.uncertainty * 1e3:.1f} ms, "
                f"a large part of this {verdict.lag_p50_s * 1e3:.1f} ms lag: the lag may be "
                "the clocks'")
            verdict.confidence = "low"

    def _judge_work(self, job: JobState, now: float, named: set[int]) -> dict:
        """A rank whose own kernels are slow, against the ranks doing its work, though it is
        not (yet) late at collectives. Where other processes take its CPU, once its node's
        preemptions cover ``HOST_SETTLE`` push intervals: they come summed per interval, and
        a hog that started within the first weighs as a share of time it did not run in, too
        small to explain the kernels it slows (with a busy loop beside the test, a rank under
        three hogs was named slow_gpu, then cleared, and never named at its collectives)."""
        peers = self._peers(job, now)
        found = {}
        slow = slow_workers(peers.work, self.policy) if peers.alike is None else [
            slow_workers(peers.work[np.r_[at, peers.like(at)]], self.policy)[0]
            for at in range(len(peers.ranks))]
        for at, rank in enumerate(peers.ranks):
            if rank in named or not slow[at]:
                continue
            facts = self._facts_of(job, rank, now)
            diagnosis = causes.diagnose_late(facts, job.facts[rank].node)
            if diagnosis.cause != "slow_gpu" or facts.preemptions and facts.window_s < \
                    HOST_SETTLE * self.heard.get(job.facts[rank].node, (now, 1.0))[1]:
                continue
            found[(rank, "lag")] = Verdict(
                job.cluster, job.job, rank, job.facts[rank].node, "slow_gpu", "slow_gpu",
                confidence=diagnosis.confidence, fix=diagnosis.fix,
                findings=diagnosis.findings, onset=now,
                evidence=self._evidence(facts, None, None))
        return found

    def _judge_missing(self, job: JobState, comm: str, window: CommWindow, now: float) -> dict:
        """The ranks missing from the oldest instance some rank has not entered, once it is
        known that they will not come: they crashed (at once), their peers gave up on them
        (aborted or failed while waiting: a hang the job's end cut short), or the peers have
        waited the hang timeout. A rank not heard of yet is not missing."""
        stalled = window.stalled(now, 0.0)
        if not stalled:
            return {}
        seq, op, columns = stalled[0]
        ranks = self._ranks(job, comm, window.nranks)
        unseen = self._unseen(job, window, ranks, now)
        columns = [c for c in columns if not unseen[c] and job.facts.get(ranks[c]) is not None]
        if not columns:
            return {}                  # not observed is never missing
        opened = self._on_fleet_clock(job, ranks, window.open[seq % len(window.open_seq)][None])
        if not np.isfinite(opened).any():
            return {}      # entered only by ranks of nodes whose clocks are not known yet
        began = float(np.nanmin(opened))
        missing = {int(c) for c in columns}
        entered = [job.facts[ranks[c]] for c in range(window.nranks) if c not in missing]
        gave_up = min((t for f in entered if (t := f.gave_up_at()) is not None and t >= began),
                      default=None)
        # Ranks that entered and have since exited, none failing, wait on no one: the
        # instance completed and the missing entry was lost, or the whole job ended.
        nobody_waits = gave_up is None and all(f.exited_at is not None for f in entered)
        found = {}
        for column in columns:
            rank = ranks[column]
            current = job.verdicts.get((rank, "missing"))
            if nobody_waits:
                if current is not None and current.cleared is None:
                    found[(rank, "missing")] = current    # named while its peers waited
                continue
            kind = self._missing(job.facts[rank], began, gave_up, now)
            if kind is None and current is not None and current.cleared is None:
                found[(rank, "missing")] = current     # named: a node heard from only
                continue                                # again after a silence clears nothing
            if kind is not None:
                if PAIR in comm:          # its own side of the pair: the Send or the Recv
                    op = self.ops.code("ncclSend" if column == 0 else "ncclRecv")
                found[(rank, "missing")] = self._missing_verdict(
                    job, comm, rank, kind, op, seq, began, gave_up, now, len(entered))
        return found

    def _missing(self, facts: RankFacts, began: float, gave_up: float | None,
                 now: float) -> str | None:
        """hang, died, or None while it may still come (or what its node knows of it may)."""
        gone_at = min((t for t in (facts.exited_at, facts.aborted_at) if t is not None),
                      default=None)
        if gave_up is not None:
            if self._silent(facts.node, gave_up):
                return None   # what its node saw up to the peers' giving up is on its way
            return "died" if gone_at is not None and gone_at <= gave_up else "hang"
        if facts.crashed:
            return "died"     # its process ended failing: it will not come
        waiting = now - began
        if waiting < self.hang_timeout or (self._silent(facts.node, began)
                                           and waiting < 2 * self.hang_timeout):
            return None       # a silent node may only be late to tell: the time of two
        return "died" if gone_at is not None else "hang"

    def _missing_verdict(self, job: JobState, comm: str, rank: int, kind: str, op: int,
                         seq: int, began: float, gave_up: float | None, now: float,
                         waiting: int) -> Verdict:
        facts = job.facts[rank]
        waited = (gave_up if gave_up is not None else now) - began
        comm, _, pair = comm.partition(PAIR)
        where = f"communicator {comm}" + (
            f" (the Send/Recv of its ranks {pair.replace(PAIR, ' to ')})" if pair else "")
        why = (f"never entered {self.ops.names[op]} #{seq} on {where}; its peers "
               + (f"gave up after waiting {waited:.1f} s (NCCL failed or timed out in them)"
                  if gave_up is not None else f"have waited {waited:.1f} s")
               + (" and its process exited" if facts.exited_at is not None else "")
               + (" failing" if facts.crashed else "")
               + (" after it aborted its NCCL communicator (an NCCL error or timeout)"
                  if facts.aborted_at is not None else "")
               + (f"; {facts.node or 'its node'} has not reported since"
                  if self._silent(facts.node, began) else ""))
        return Verdict(job.cluster, job.job, rank, facts.node, kind, kind, confidence="high",
                       severity="critical",
                       fix=causes.FIXES[kind].format(node=facts.node or "its node"),
                       findings=[why], op=self.ops.names[op], comm_hash=comm, onset=began,
                       lag_p50_s=waited, cost_gpu_s=waited * waiting,
                       evidence={"seq": seq, "waited_s": round(waited, 3),
                                 **({"pair": pair} if pair else {})})

    def _silent(self, node: str, since: float) -> bool:
        """Whether ``node`` has not pushed, one push interval after ``since``, since then, or
        its last push is its first after a silence: what it knows of a collective entered at
        ``since`` may still be on its way. An agent starved of CPU catches up over more than
        one push (beside a busy loop and a rank's three hogs, node1's first push after 4 s
        without one carried 322 events, the next, 2 s later, 1,270, among them its ranks'
        entries of 2.5 s before: its ranks were named hung in between)."""
        heard = self.heard.get(node)
        return heard is None or heard[0] < since + heard[1] or \
            self.resumed.get(node) == heard[0]

    def _facts_of(self, job: JobState, rank: int, now: float,
                  late_share: float | None = None) -> causes.Facts:
        """What the cause rules weigh for the rank; ``late_share``: what its lateness costs it,
        a share of its time (without it: its kernels' extra time per second, if any)."""
        mine, peers = job.facts[rank], self._peers(job, now)
        at = peers.ranks.index(rank)
        # A preemptor counts against the rank when it keeps the rank off its CPU far longer than
        # the same program keeps its peers off theirs: every node's daemons take everyone's now
        # and then (each node's under its own pid), a hog only the rank's.
        others = peers.preemptions[:at] + peers.preemptions[at + 1:]
        usual = {comm: float(np.median([by_program(seen).get(comm, 0) for seen in others]
                                       or [0]))
                 for comm, _pid in peers.preemptions[at]}
        taken = {who: (n, ns) for who, (n, ns) in peers.preemptions[at].items()
                 if ns >= 3 * usual[who[0]]}
        blockio = [(r, b) for t, r, b in mine.blockio if t >= now - HOST_FACTS_S]
        work, alloc, wait, io = (peers.own_and_others(values, at) for values in (
            peers.work, peers.alloc, peers.wait, peers.io))
        work_share = None if None in work else \
            max(work[0] - work[1], 0.0) * mine.self_work_rate()
        if late_share is None:
            late_share = work_share
        return causes.Facts(
            self_work_s=work[0], peers_self_work_s=work[1],
            self_work_samples=len(mine.self_work_ns),
            preemptions={who: n for who, (n, _ns) in taken.items()},
            preempted_s=sum(ns for _n, ns in taken.values()) / 1e9,
            window_s=min(HOST_FACTS_S, now - job.started), late_share=late_share,
            work_share=work_share,
            blockio_requests=sum(r for r, _ in blockio), blockio_bytes=sum(b for _, b in blockio),
            peers_blockio_bytes=io[1],
            allocation_s=alloc[0], peers_allocation_s=alloc[1],
            peer_wait_s=wait[0], peers_peer_wait_s=wait[1])

    def _peers(self, job: JobState, now: float) -> PeerFacts:
        """Every rank's self-work, medians and preemptors, once per tick: a rank is weighed
        against all."""
        if job.peers is None:
            ranks = sorted(job.facts)
            measures = [[job.facts[r].median(getattr(job.facts[r], name)) for r in ranks]
                        for name in ("self_work_ns", "allocation_ns", "peer_wait_ns")]
            io = [sum(b for t, _r, b in job.facts[r].blockio if t >= now - HOST_FACTS_S)
                  for r in ranks]
            pids = {f.pid for f in job.facts.values() if f.pid is not None}
            job.peers = PeerFacts(ranks, *(np.array(m, float) for m in measures),
                                  [self._preemptions(job.facts[r], pids, now) for r in ranks],
                                  np.array(io, float), self._alike(job, ranks))
        return job.peers

    @staticmethod
    def _alike(job: JobState, ranks: list[int]) -> list[np.ndarray] | None:
        """Per rank, the ranks doing the same work: those it shares a communicator smaller
        than the job with (its tensor- and data-parallel groups, its pipeline stage's), whose
        kernels are its kernels' peers; None when it has none (every rank is its peer). A
        pipeline's stages do unequal work by design, and are never compared with each other."""
        widest = max((w.nranks for w in job.comms.values()), default=0)
        index = {rank: i for i, rank in enumerate(ranks)}
        alike: dict[int, set[int]] = defaultdict(set)
        for comm, window in job.comms.items():
            members = set(job.columns.get(comm, {}).values()) & index.keys()
            if window.nranks < widest and window.op_counts and PAIR not in comm:
                for member in members:
                    alike[member] |= members - {member}
        if not alike:
            return None
        return [np.array(sorted(index[m] for m in alike.get(rank, ())), np.int64)
                for rank in ranks]

    @staticmethod
    def _preemptions(facts: RankFacts, ranks: set[int],
                     now: float) -> dict[tuple[str, int], tuple[int, int]]:
        """Who else took the rank's CPU lately, how often and for how long (ns): processes
        other than the job's own ranks (``ranks``: their pids; ranks crowding each other are
        the job's own doing). What is older than the window is let go on the way."""
        while facts.preemptions and facts.preemptions[0][0] < now - HOST_FACTS_S:
            facts.preemptions.popleft()
        while facts.blockio and facts.blockio[0][0] < now - HOST_FACTS_S:
            facts.blockio.popleft()
        taken: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        for t, comm, pid, count, tgid, ns in facts.preemptions:
            if (pid if tgid is None else tgid) not in ranks:
                taken[(comm, pid)][0] += count
                taken[(comm, pid)][1] += ns
        return {who: (n, ns) for who, (n, ns) in taken.items()}

    @staticmethod
    def _evidence(facts: causes.Facts, bar_s: float | None, step_s: float | None) -> dict:
        ms = (lambda s: None if s is None or not np.isfinite(s) else round(s * 1e3, 3))
        return {"bar_ms": ms(bar_s), "step_ms": ms(step_s),
                "self_work_ms": ms(facts.self_work_s),
                "peers_self_work_ms": ms(facts.peers_self_work_s),
                "preemptions": [{"comm": c, "pid": p, "count": n}
                                for (c, p), n in sorted(facts.preemptions.items(),
                                                        key=lambda kv: -kv[1])[:5]],
                "blockio": {"requests": facts.blockio_requests, "bytes": facts.blockio_bytes},
                "allocation_ms": ms(facts.allocation_s),
                "peers_allocation_ms": ms(facts.peers_allocation_s),
                "peer_wait_ms": ms(facts.peer_wait_s),
                "peers_peer_wait_ms": ms(facts.peers_peer_wait_s),
                "preempted_ms": ms(facts.preempted_s), "host_window_ms": ms(facts.window_s),
                **{name: None if value is None else round(value, 4) for name, value in (
                    ("late_share", facts.late_share), ("work_share", facts.work_share))}}

    # -- verdict lifecycle ---------------------------------------------------------------------

    def _merge(self, job: JobState, found: dict, now: float, held: set = frozenset(),
               final: set = frozenset()) -> list[Verdict]:
        """Raise what is new, update what goes on, clear what was not found for
        ``clear_ticks`` judgements in a row (``held``: verdicts on communicators not judged
        this tick, which count neither way; ``final``: verdicts whose communicator was
        retired, stored with what they cost to its end)."""
        changed = []
        for key, fresh in found.items():
            if any(value is not None for value in job.run):
                fresh.evidence["run"] = job.run_json()
            current = job.verdicts.get(key)
            if current is None or current.cleared is not None:
                fresh.first_seen = fresh.last_seen = now
                fresh.cost_usd = self._usd(fresh.cost_gpu_s)
                job.verdicts[key] = fresh
                changed.append(fresh)
                log.log(logging.ERROR if fresh.severity == "critical" else logging.WARNING,
                        "straggler %s, %s", fresh.describe(), fresh.severity)
                continue
            if self._update(current, fresh, job, now):
                changed.append(current)
        for key in held | final:        # what it cost since (charged as instances settle)
            current = job.verdicts[key]
            if any(current is v for v in changed):
                continue
            current.cost_usd = self._usd(current.cost_gpu_s)
            if self._restamp(current, now, key in final):
                changed.append(current)
        for key, current in job.verdicts.items():
            if key not in found and key not in held and current.cleared is None:
                current.misses += 1
                if current.misses >= self.clear_ticks:
                    current.cleared = now
                    current.revision += 1
                    changed.append(current)
                    log.info("straggler cleared: %s", current.describe())
        return changed

    def _update(self, current: Verdict, fresh: Verdict, job: JobState, now: float) -> bool:
        """Carry the latest numbers; True when something worth storing changed."""
        material = (fresh.kind, fresh.cause, fresh.period) != (current.kind, current.cause,
                                                              current.period)
        for name in ("kind", "cause", "confidence", "severity", "fix", "findings", "op",
                     "lag_p50_s", "lag_p99_s", "last_share", "period", "occurrences",
                     "evidence"):
            setattr(current, name, getattr(fresh, name))
        current.misses = 0
        if fresh.kind in ("hang", "died"):      # the peers' wait so far
            current.cost_gpu_s = fresh.cost_gpu_s
        current.cost_usd = self._usd(current.cost_gpu_s)
        return self._restamp(current, now, material)

    @staticmethod
    def _restamp(current: Verdict, now: float, material: bool) -> bool:
        """A new revision to store when it changed materially, or 10 s after the last."""
        if material or now - current.last_seen >= 10.0:
            current.last_seen = now
            current.revision += 1
            return True
        return False

    def _close_all(self, job: JobState, now: float) -> list[Verdict]:
        closed = []
        for verdict in job.verdicts.values():
            if verdict.cleared is None:
                verdict.cleared, verdict.revision = now, verdict.revision + 1
                closed.append(verdict)
        return closed

    def _usd(self, gpu_s: float) -> float | None:
        return None if self.rate is None else round(gpu_s / 3600.0 * self.rate, 6)

    # -- answers -------------------------------------------------------------------------------

    @property
    def incomplete(self) -> int:
        """Instances dropped for a lost entry, in the jobs still tracked."""
        return sum(w.incomplete for job in self.jobs.values() for w in job.comms.values())

    def straggler_ranks(self, node: str) -> list[tuple[str | None, int]]:
        """(job, rank) of the ranks on ``node`` under a live verdict as of the last tick, for
        the push reply (asked once a push: an index, not a walk over every job's verdicts)."""
        return sorted(self.live_by_node.get(node, ()), key=lambda jr: (str(jr[0]), jr[1]))

    def user_of(self, cluster: str, job: str | None) -> str | None:
        """The job's user, as its Slurm prolog recorded it (None without one)."""
        said = self.users.get((cluster, job))
        return None if said is None else said[0]

    def active(self) -> list[Verdict]:
        return [v for job in self.jobs.values() for v in job.verdicts.values()
                if v.cleared is None]

    def take_rows(self) -> tuple[list[dict], list[dict]]:
        """Verdict rows and peer-lag rows gathered since the last call, for echod."""
        rows, lag = self.pending_rows, self.pending_lag
        self.pending_rows, self.pending_lag = [], []
        return rows, lag
