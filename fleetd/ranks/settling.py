"""Settles each job at a tick: retires idle communicators, marks ranks no agent covers, places
each settled instance on fleetd's clock and charges what it cost.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np

from ingero.analysis.cost import excess
from ingero.analysis.lag import peer_lag
from ingero.analysis.stragglers import arrivals

from ..alignment import CommKey, CommWindow
from ..rankstate import JobState, RankFacts, Verdict
from .common import UNCOVERED_AFTER, UNCOVERED_AFTER_S, WINDOW_IDLE_INTERVALS, WINDOW_IDLE_S

log = logging.getLogger("fleetd")


class Settling:
    """The part of ``RankAnalysis`` (``fleetd.ranks.analysis``) that settles each job at a tick;
    it reads and keeps the state the face declares."""

    def _judge_job(self, job: JobState, now: float) -> list[Verdict]:
        """Settle and judge one job's communicators; the verdicts that changed. A rank
        late at several communicators is named at the one where its lateness began: a rank
        late into its subgroup's all-reduce holds up that group, whose members all come late
        to the next world collective, but the subgroup is where it was late first."""
        job.peers = None
        found: dict[tuple[int, str], Verdict] = {}
        judged, retired = set(), set()
        for comm, window in list(job.comms.items()):
            job.changed |= self._settle(job, comm, window, now)
            if job.changed:
                for key, verdict in self._judge_lag(job, comm, window, now).items():
                    if key not in found or verdict.onset < found[key].onset:
                        found[key] = verdict    # where its lateness began (see below)
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

    def _settle(self, job: JobState, comm: CommKey, window: CommWindow, now: float) -> bool:
        """Move the instances now complete to the history; whether there were any."""
        ranks = self._ranks(job, comm, window.nranks)
        seq, _op, raw = window.settle(self._unseen(job, window, ranks, now))
        if not len(seq):
            return False
        entries = self._on_fleet_clock(job, ranks, raw)
        lag = peer_lag(entries)      # complete, but NaN where a node's clock is not known yet
        self._charge(job, comm, window, ranks, entries, lag)
        known = np.isfinite(lag).all(axis=0)
        if known.sum() < 2 or not isinstance(comm, str):
            return True   # no summary of a pair's or the exchanges': echod's are per communicator
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

    def _charge(self, job: JobState, comm: CommKey, window: CommWindow, ranks: list[int],
                entries: np.ndarray, lag: np.ndarray) -> None:
        """What the newly settled instances cost, on the verdicts live on this communicator:
        from each verdict's onset, only the part of the rank's lag over the bar that the
        peers' waits grew by, once for each peer kept waiting (GPU-seconds; ``excess``)."""
        for column, rank in enumerate(ranks):
            verdict = job.verdicts.get((rank, "lag"))
            if verdict is None or verdict.cleared is not None or verdict.comm_hash != comm:
                continue
            since = np.nan_to_num(np.nanmedian(entries, axis=1), nan=-np.inf) >= verdict.onset
            verdict.cost_gpu_s += excess(lag[since, column], window.bar, window.nranks,
                                         verdict.exposed_s, verdict.together)
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

    def _ranks(self, job: JobState, comm: CommKey, nranks: int) -> list[int]:
        known = job.columns.get(comm, {})
        return [known.get(column, column) for column in range(nranks)]
