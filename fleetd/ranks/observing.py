"""Takes a push in: screens its events (ranks, jobs, owners a node may claim), files each
collective into its communicator's window and each host fact into its rank's facts, and resolves
split communicators.
"""

from __future__ import annotations

import logging
from collections import defaultdict

import numpy as np

from ingero.vocabulary import EXCHANGE, POINT_TO_POINT, UNKNOWN_COMM
from ingero.wire import Push

from ..alignment import CommWindow, Entries, Exchange
from ..rankstate import RUN_TAGS, JobState
from .common import MAX_UNRESOLVED, RESUMED_AFTER, foreign, pair_of

log = logging.getLogger("fleetd")


class Observing:
    """The part of ``RankAnalysis`` (``fleetd.ranks.analysis``) that takes a push in; it reads
    and keeps the state the face declares."""

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
            elif kind == "agent_untraced":
                self.untraced_node(push.node, a.get("reason"))
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

    def untraced_node(self, node: str, reason=None) -> None:
        """``node``'s agent cannot trace (no kernel headers, no bcc …), as its hello or its
        agent_untraced event says: no agent tells of its ranks, so after their communicators'
        first push intervals they are uncovered, not missing (``Settling._unseen``), and their
        peers are judged without them. Said once a node, however often the agent says it (its
        words are its own to choose), and counted (ingero_fleet_nodes_untraced) until its
        hello says it traces again."""
        reason = reason[:64] if isinstance(reason, str) and reason.isprintable() else None
        if node not in self.untraced:
            log.warning("node %s's agent cannot trace (%s): its ranks are not judged, and their "
                        "peers are judged without them", node, reason or "no reason given yet")
        self.untraced[node] = reason or self.untraced.get(node) or "unknown"

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
        """File one collective (``a``: its attributes; ``t``: its time less its node's offset
        now) for its communicator's window: gathered in ``into`` by (job, communicator, size),
        as the communicator's rank (its column) entered which instance (seq) when, by which
        op. A collective on a communicator made by a split waits until the split is resolved
        (up to ``MAX_UNRESOLVED`` of them); one whose communicator the agent did not see made
        is counted as unaligned, and its rank marked blind from then; a Send or Recv goes to
        the window of its peer pair (``pair_of``), an exchange (``EXCHANGE``) to its
        communicator's exchanges'. A new process of a rank clears its exit."""
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
        elif a.get("op") == EXCHANGE:
            comm = Exchange(comm)
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
