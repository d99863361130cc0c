"""Applies the rules: names late ranks (and what they cost, or why they cost nobody), hung and
dead ones, slow kernels, with the facts and evidence each verdict carries.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from ingero.analysis import causes
from ingero.analysis.cost import (ONSET_WAITS, excess, exposure, growth, level_onset,
                                  stands_out, swing, waits_grew)
from ingero.analysis.lag import peer_lag
from ingero.analysis.propagation import after_first_sync, drift_seen, inherited, runs_ahead
from ingero.analysis.stragglers import judge, quiet, slow_workers

from ..alignment import CommKey, CommWindow, Pair, comm_of, words_of
from ..rankstate import JobState, PeerFacts, RankFacts, Verdict
from .common import (HARMLESS_GROWTH, HOST_FACTS_S, HOST_SETTLE, NOTES, PASSED_DOWN,
                     Onset, RankSyncs, by_program, heard_through, own_growth, peer_syncs,
                     waits_around)

log = logging.getLogger("fleetd")


class Judging:
    """The part of ``RankAnalysis`` (``fleetd.ranks.analysis``) that applies the rules; it reads
    and keeps the state the face declares."""

    def _judge_lag(self, job: JobState, comm: CommKey, window: CommWindow, now: float) -> dict:
        """The communicator's late ranks, by rank: its dominant op's instances on fleetd's
        clock are judged (``stragglers.judge``, past the warm-up, with the clocks' slack), each
        late rank given its cause (``causes.diagnose_late``); a lateness passed down from a
        sync on another communicator, or one shown to cost nobody (``_costs``: its host ahead
        of its GPU queue), is a note, not a verdict. Each verdict carries its severity, what
        its lag over the bar cost the peers (``excess``) and its evidence. Send/Recv pairs are
        not judged for lag: a pipeline's receives wait on their sends by design."""
        op, rows = window.dominant()
        if op is None or isinstance(comm, Pair):
            return {}        # a pipeline's receives wait on their sends by design: not lag
        ranks = self._ranks(job, comm, window.nranks)
        entries, steps = self._on_fleet_clock(job, ranks, window.entries[rows]), window.step[rows]
        # Hysteresis for a persistent verdict only: a rank named periodic, late one instance
        # in five, would otherwise pass the kept share and be renamed persistent.
        named = frozenset(column for column, rank in enumerate(ranks)
                          if (v := job.verdicts.get((rank, "lag"))) and v.cleared is None
                          and v.kind == "persistent")
        warming = int((steps < self.policy.warm_up).sum())
        judgement = judge(entries, self.policy, named, self._clock_slack(job, ranks, entries),
                          warming=warming)
        window.bar = judgement.bar_s
        lag = peer_lag(entries)
        late_columns = frozenset(f.column for f in judgement.findings)
        named = []
        for f in judgement.findings:
            rank = ranks[f.column]
            facts = self._facts_of(job, rank, now, late_share=f.lag_p50_s / (
                judgement.step_s * (f.period or 1)) if judgement.step_s else None,
                lag_s=f.lag_p50_s)
            diagnosis = causes.diagnose_late(facts, job.facts[rank].node)
            onset = float(np.nanmedian(entries[f.onset]))
            if f.kind == "persistent" and diagnosis.cause in PASSED_DOWN and \
                    inherited(RankSyncs(job, ranks), entries[f.onset:],
                              f.column, comm, f.lag_p50_s):
                self._note(job, rank, "passed_down", f, comm, self.ops.names[op],
                           int(steps[f.onset]), onset, now)
                continue
            if len(ranks) == 2 and (rank, "lag") not in job.verdicts and \
                    not self._late_elsewhere(job, comm, ranks, rank):
                continue                   # its partner's earliness as much as its lateness
            recent = self._recent(lag, f.column)
            at = level_onset(lag[:, f.column], f.onset, recent)
            costs = f.kind != "persistent" or self._shown(
                job, (comm, rank), recent, lambda: self._costs(
                    job, comm, ranks, f, at, float(np.nanmedian(entries[at])), lag, entries,
                    late_columns, warming, int(window.seq[rows][at]),
                    len(rows) / max(1, int(rows.sum()))))
            if not costs:
                if costs is False:
                    self._note(job, rank, "ahead", f, comm, self.ops.names[op],
                               int(steps[f.onset]), onset, now)
                continue
            named.append((f, rank, facts, diagnosis))
        together = sum(f.kind == "persistent" for f, *_ in named)
        found = {}
        for f, rank, facts, diagnosis in named:
            exposed = job.exposure.get((comm, rank)) if f.kind == "persistent" else None
            over = f.lag_p50_s - judgement.bar_s
            verdict = Verdict(job.cluster, job.job, rank, job.facts[rank].node, f.kind,
                              diagnosis.cause, confidence=diagnosis.confidence,
                              severity=causes.severity(
                                  over if exposed is None else min(over, exposed),
                                  judgement.step_s and judgement.step_s * (f.period or 1)),
                              fix=diagnosis.fix, findings=diagnosis.findings,
                              op=self.ops.names[op], comm_hash=comm_of(comm),
                              step=int(steps[f.onset]),
                              onset=float(np.nanmedian(entries[f.onset])),
                              lag_p50_s=f.lag_p50_s, lag_p99_s=f.lag_p99_s,
                              last_share=f.last_share, period=f.period,
                              occurrences=f.occurrences,
                              evidence=self._evidence(facts, judgement.bar_s, judgement.step_s),
                              exposed_s=exposed,
                              together=together if f.kind == "persistent" else 1)
            verdict.evidence.update(exposed_ms=None if exposed is None else round(
                exposed * 1e3, 3), late_together=verdict.together)
            verdict.cost_gpu_s = excess(lag[f.onset:, f.column], judgement.bar_s, window.nranks,
                                        verdict.exposed_s, verdict.together)
            self._clock_caveat(verdict)
            found[(rank, "lag")] = verdict
        late = {(comm, ranks[f.column]) for f in judgement.findings}
        for key in [key for key in job.harmless if key[0] == comm and key not in late]:
            del job.harmless[key]          # on time again: a new lateness is weighed anew
        return found

    def _late_elsewhere(self, job: JobState, comm: CommKey, pair: list[int], rank: int
                        ) -> bool:
        """Whether a rank found late in a communicator of two (``pair``) is late over the last
        instances of another it is in, with other peers, past that one's bar; or is in no
        other that tells. Between two ranks a lag is one number: one's lateness is as much the
        other's earliness, and ranks that spend random host time each step draw apart for a
        stretch now and then (a healthy tp/pp job's rank 10 ms behind its tensor-parallel
        partner over 16 instances, on time in its data-parallel pair, was named). A rank late
        on its own is late at every collective it enters."""
        told = False
        for other, window in job.comms.items():
            if other == comm or isinstance(other, Pair) or window.bar == np.inf:
                continue
            ranks = self._ranks(job, other, window.nranks)
            if rank not in ranks or set(ranks) == set(pair):
                continue
            op, rows = window.dominant()
            if op is None:
                continue
            entries = self._on_fleet_clock(job, ranks, window.entries[rows])
            with quiet():
                lag = float(np.nanmedian(
                    peer_lag(entries)[-self.policy.recent:, ranks.index(rank)]))
            if math.isfinite(lag):
                if lag > window.bar:
                    return True
                told = True
        return not told

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

    def _costs(self, job: JobState, comm: CommKey, ranks: list[int], f, at: int,
               onset: float, lag: np.ndarray, entries: np.ndarray,
               late: frozenset[int] = frozenset(), warming: int = 0, seq: int = -1,
               per_step: float = 1.0) -> bool | None:
        """Whether the rank's lateness delays its peers: whether their waits at collectives grew
        from its onset on (``at``: the instance its lateness reached its level, see ``level_onset``;
        ``onset``: when, on fleetd's clock; ``seq``: its seq on ``comm``, which places the waits at
        syncs there, see ``waits_around``; ``per_step``: the communicator's collectives a step),
        beyond what a later rank explains (``lag``: every column's, at each instance judged, at
        ``entries``; see ``waits_grew``; a rank later by no more than ``k`` times the swing of the
        on-time peers' lags is late with it, not later: a node's four ranks, 28 to 31 ms late, their
        peers waiting 11 ms more, were each weighed less up to 3 ms of the others' lags, no more
        than their jitter). The peers weighed are those on time: the columns ``late`` with it (a
        node's ranks, late together) wait less as the others wait more, and pooled with them the
        growth looked a third of what it was (a node's four ranks 30 ms late, the twelve others
        waiting 14 ms more a step: shown harmless). How much the waits grew at each instance is kept
        as what its lateness costs (``exposure``). A lateness that costs is named only once its lag
        stands out of the swing of its on-time peers' lags (``stands_out``) past the communicator's
        first ``warming`` instances (where enough are left): ranks that jitter and drift between
        syncs are each late by ms over a few steps now and then, and their peers' waits grow and
        shrink with whatever delays the job (a healthy pipeline job's rank 4 ms late over 16
        instances after its data-loader workers' respawn, against a swing of 3 ms, was named
        critical); a job's first steps swing far more (in a node's late ranks' first ten, beside a
        busy loop, two of the four did not stand out of them, and were never named). A rank late
        from the first instances judged has no before to weigh them against: it is taken to cost
        (its own waits cannot tell: every rank's sync ends with the collective, so its peers wait
        longer than it by its lateness whether its GPU absorbed it or not) once its lag stands out
        of the swing of its peers' (``stands_out``: a healthy tp/pp job's rank 9.7 ms late in a pair
        whose lags swing by 5 ms was named critical), and until then it is not known yet; where the
        hosts run ahead of their GPUs, or none has synced yet (``runs_ahead``), over enough
        instances to show that swing (``drift_seen``). A rank once named stays so while it is late:
        weighed again on the waits since its onset, a growth its peers' shorter steps later hid read
        as none (CI: a late node's four ranks named, then each noted as costing nobody). There, only
        its instances since its peers' first sync count (``after_first_sync``): a host that starts
        its loop a few ms late while its GPU queue is empty is late at every step it enqueues before
        the first sync, which realigns the hosts (CI: a rank 7 ms late over a job's first steps
        named beside the straggler)."""
        named = job.verdicts.get((ranks[f.column], "lag"))
        still = named is not None and named.cleared is None and named.kind != "slow_gpu"
        others = late - {f.column}
        settled = lag[warming:] if len(lag) - warming >= self.policy.min_instances else lag
        if at < self.policy.min_instances:
            if still:
                return True                # said once, as the lateness was first named
            peers = peer_syncs(job, ranks, f.column)
            if runs_ahead(peers, entries) is False:
                return True if stands_out(settled, f.column, f.lag_p50_s, self.policy.k,
                                          others) else None
            rows = after_first_sync(peers, entries)
            if rows.sum() < self.policy.min_instances or not drift_seen(peers, entries[rows]):
                return None
            with quiet():
                since = float(np.nanmedian(lag[rows, f.column]))
            return True if stands_out(lag[rows], f.column, since, self.policy.k,
                                      others) else None
        before, after = [], []
        placed = self._waits_placed(job, ranks)
        weighed = [facts for column, rank in enumerate(ranks)
                   if column != f.column and column not in late
                   and (facts := job.facts.get(rank)) is not None and facts.peer_wait_ns]
        peers = len(weighed)
        on = Onset(comm, seq, heard_through(weighed, comm)) if isinstance(comm, str) else None
        for facts in weighed:
            waits = waits_around(facts, onset, placed, on)
            before += waits[0]
            after += waits[1]
        with quiet():
            since = np.nanmedian(lag[at:], axis=0)
        later = float(np.nanmax(since) - since[f.column])
        spread = swing(settled, f.column, others)
        if spread is not None and later <= self.policy.k * spread:
            later = 0.0            # a rank late with it, by as much give or take the swing
        mine = job.facts.get(ranks[f.column])
        own = own_growth(mine, onset, placed, at=on)
        answer = waits_grew(before, after, self.policy.min_lag_s, later + own,
                            enough=ONSET_WAITS * peers, per_step=per_step)
        job.exposure[(comm, ranks[f.column])] = exposure(
            before, after, later + own_growth(mine, onset, placed, per_instance=True, at=on))
        if still:
            return True                    # said once, as the lateness was first named
        if answer and not stands_out(settled, f.column, f.lag_p50_s, self.policy.k, others):
            return None                    # within the job's own swing: not late yet
        if not answer:
            return answer
        if len(before) < 3:
            log.info("job %s: rank %d's lateness (%.1f ms) taken to cost: %d sync(s) of its "
                     "peers kept from before its onset, too few to weigh", job.job,
                     ranks[f.column], f.lag_p50_s * 1e3, len(before))
        else:
            grew, error, _ = growth(before, after)
            log.info("job %s: rank %d's lateness (%.1f ms) costs: its peers' waits at syncs "
                     "grew %.1f ms (±%.1f) from %d before its onset to %d since; %.1f ms of "
                     "that is a later rank's or its own", job.job, ranks[f.column],
                     f.lag_p50_s * 1e3, grew / 1e6, error / 1e6, len(before), len(after),
                     (later + own) * 1e3)
        return answer

    def _note(self, job: JobState, rank: int, kind: str, f, comm: CommKey, op: str, step: int,
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
                       severity="info", findings=[words], op=op, comm_hash=comm_of(comm), step=step,
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
        not (yet) late at collectives, once its job has been heard of for ``HOST_SETTLE``
        push intervals: a job's first syncs are few and its ranks' CPUs busiest (a healthy
        rank of a job heard of 47 ms before, its kernels' syncs 1.22 times its peers' over
        the first few, was named slow_gpu and cleared at the next push); and where other
        processes take its CPU, its node's preemptions come summed per interval: a hog that
        started within the first weighs as a share of time it did not run in, too small to
        explain the kernels it slows (with a busy loop beside the test, a rank under three
        hogs was named slow_gpu, then cleared, and never named at its collectives)."""
        peers = self._peers(job, now)
        found = {}
        ratio = causes.SLOW_GPU_EXPLAINS      # over the bar of the peers' spread, too
        slow = slow_workers(peers.work, self.policy, ratio) if peers.alike is None else [
            slow_workers(peers.work[np.r_[at, peers.like(at)]], self.policy, ratio)[0]
            for at in range(len(peers.ranks))]
        for at, rank in enumerate(peers.ranks):
            if rank in named or not slow[at]:
                continue
            facts = self._facts_of(job, rank, now)
            diagnosis = causes.diagnose_late(facts, job.facts[rank].node)
            if diagnosis.cause != "slow_gpu" or facts.window_s < \
                    HOST_SETTLE * self.heard.get(job.facts[rank].node, (now, 1.0))[1]:
                continue
            found[(rank, "lag")] = Verdict(
                job.cluster, job.job, rank, job.facts[rank].node, "slow_gpu", "slow_gpu",
                confidence=diagnosis.confidence, fix=diagnosis.fix,
                findings=diagnosis.findings, onset=now,
                evidence=self._evidence(facts, None, None))
        return found

    def _judge_missing(self, job: JobState, comm: CommKey, window: CommWindow, now: float) -> dict:
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
                if isinstance(comm, Pair):  # its own side of the pair: the Send or the Recv
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

    def _missing_verdict(self, job: JobState, comm: CommKey, rank: int, kind: str, op: int,
                         seq: int, began: float, gave_up: float | None, now: float,
                         waiting: int) -> Verdict:
        facts = job.facts[rank]
        waited = (gave_up if gave_up is not None else now) - began
        pair = comm if isinstance(comm, Pair) else None
        why = (f"never entered {self.ops.names[op]} #{seq} on {words_of(comm)}; its peers "
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
                       findings=[why], op=self.ops.names[op],
                       comm_hash=comm_of(comm), onset=began,
                       lag_p50_s=waited, cost_gpu_s=waited * waiting,
                       evidence={"seq": seq, "waited_s": round(waited, 3),
                                 **({"pair": f"{pair.sender}>{pair.receiver}"} if pair
                                    else {})})

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
                  late_share: float | None = None,
                  lag_s: float | None = None) -> causes.Facts:
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
                 if ns >= causes.PREEMPTED_MORE * usual[who[0]]}
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
            window_s=min(HOST_FACTS_S, now - job.started), lag_s=lag_s,
            late_share=late_share,
            work_share=work_share,
            blockio_requests=sum(r for r, _ in blockio), blockio_bytes=sum(b for _, b in blockio),
            peers_blockio_bytes=io[1],
            allocation_s=alloc[0], peers_allocation_s=alloc[1],
            peer_wait_s=wait[0], peers_peer_wait_s=wait[1])

    def _peers(self, job: JobState, now: float) -> PeerFacts:
        """Every rank's self-work, medians and preemptors, once per tick: a rank is weighed
        against all."""
        if job.peers is None:
            for facts in job.facts.values():
                facts.let_go(now - HOST_FACTS_S)
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
            if window.nranks < widest and window.op_counts and not isinstance(comm, Pair):
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
        the job's own doing), within the host facts' window."""
        taken: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0])
        for t, comm, pid, count, tgid, ns in facts.preemptions:
            if t >= now - HOST_FACTS_S and (pid if tgid is None else tgid) not in ranks:
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
