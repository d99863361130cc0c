"""The two baselines and the scoring of ``bench/quality.py``: pure functions of what was read
back from echod, so that tests feed them by hand.

Baselines, from the same stored events ingero had:

    lag mean±2σ   align the collectives by (communicator, sequence number); a rank's lag at
                  one is its entry time minus the median entry of the others there; flag the
                  ranks whose mean lag is over the mean + 2σ of all ranks' mean lags. Raw node
                  times: such a tool corrects no clock.
    health MAD    each node's median health score over the job; flag the nodes below
                  median − 3·1.4826·MAD of those medians (MAD floored as fleetd floors it). It
                  can name nodes only, so a flagged node names every rank it ran.

Scores, per method: a named rank that is a true straggler is a true positive, a named rank
that is not a false positive, a straggler nobody named a false negative.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, NamedTuple

import numpy as np

from ingero.analysis import lower_bar

LAG_SIGMAS = 2.0
HEALTH_K = 3.0
HEALTH_MAD_FLOOR = 0.01            # fleetd's mad_floor for health scores
METHODS = {"ingero": "ingero", "lag_mean_2sigma": "lag mean±2σ",
           "health_mad": "health MAD per node"}   # result key → how tables name it


class Entry(NamedTuple):
    """One rank's entry into one collective instance, as stored (the node's own clock)."""

    comm_hash: str
    seq: int
    rank: int
    t: float                       # seconds since the epoch


# -- lag mean±2σ -------------------------------------------------------------------------------

def mean_lags(entries: Iterable[Entry]) -> dict[int, float]:
    """Each rank's mean entry lag (seconds) over the instances at least two ranks entered."""
    instances: dict[tuple[str, int], list[Entry]] = defaultdict(list)
    for entry in entries:
        instances[(entry.comm_hash, entry.seq)].append(entry)
    lags: dict[int, list[float]] = defaultdict(list)
    for members in instances.values():
        if len(members) < 2:
            continue
        for i, entry in enumerate(members):
            others = [m.t for j, m in enumerate(members) if j != i]
            lags[entry.rank].append(entry.t - statistics.median(others))
    return {rank: statistics.fmean(values) for rank, values in lags.items()}


def lag_mean_sigma(entries: Iterable[Entry], sigmas: float = LAG_SIGMAS) -> set[int]:
    """The ranks whose mean lag is over the mean + ``sigmas``·σ of the ranks' mean lags."""
    means = mean_lags(entries)
    if len(means) < 2:
        return set()
    values = np.array(list(means.values()))
    bar = values.mean() + sigmas * values.std()
    return {rank for rank, mean in means.items() if mean > bar}


# -- health MAD per node -----------------------------------------------------------------------

def health_mad(scores: dict[str, list[float]], k: float = HEALTH_K,
               mad_floor: float = HEALTH_MAD_FLOOR) -> set[str]:
    """The nodes whose median score is below median − k·1.4826·max(MAD, floor) of the nodes'
    medians. A node with no score is not judged."""
    medians = {node: statistics.median(values) for node, values in scores.items() if values}
    if len(medians) < 2:
        return set()
    bar = lower_bar(np.array(list(medians.values())), k, mad_floor).bar
    return {node for node, median in medians.items() if median < bar}


def ranks_of_nodes(nodes: set[str], node_of_rank: dict[int, str]) -> set[int]:
    """Every rank that ran on one of ``nodes``: what a node-level finding names."""
    return {rank for rank, node in node_of_rank.items() if node in nodes}


# -- scoring -----------------------------------------------------------------------------------

# What ingero should say of each injected kind: the verdict kind, the cause, or both.
EXPECTED: dict[str, dict[str, str]] = {
    "host_delay": {"cause": "host_work"},
    "hiccup": {"kind": "periodic"},
    "slow_gpu": {"cause": "slow_gpu"},
    "cpu_contention": {"cause": "host_preemption"},
    "hang": {"kind": "hang"},
    "die": {"kind": "died"},
    "slow_input": {"cause": ("io", "host_work")},
}


def diagnosed(injected: str, verdicts: Iterable[dict]) -> bool:
    """Whether one of a rank's verdicts says what ``EXPECTED`` holds for its injected kind."""
    want = EXPECTED[injected]
    return any(all(v.get(field) in (value if isinstance(value, tuple) else (value,))
                   for field, value in want.items()) for v in verdicts)


@dataclass
class Tally:
    """Rank-level counts of one method, over one scenario or several."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    @classmethod
    def of(cls, truth: set[int], named: set[int]) -> "Tally":
        return cls(len(named & truth), len(named - truth), len(truth - named))

    def __add__(self, other: "Tally") -> "Tally":
        return Tally(self.tp + other.tp, self.fp + other.fp, self.fn + other.fn)

    @property
    def precision(self) -> float | None:
        named = self.tp + self.fp
        return self.tp / named if named else None

    @property
    def recall(self) -> float | None:
        truth = self.tp + self.fn
        return self.tp / truth if truth else None

    def to_json(self) -> dict:
        return {"tp": self.tp, "fp": self.fp, "fn": self.fn,
                "precision": rounded(self.precision), "recall": rounded(self.recall)}


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def spread(values: list[float]) -> dict:
    """Median and max of a list of seconds (None for both when it is empty)."""
    if not values:
        return {"median_s": None, "max_s": None, "count": 0}
    return {"median_s": rounded(statistics.median(values), 2),
            "max_s": rounded(max(values), 2), "count": len(values)}


# -- one answer: what the tools say against fleetd's verdicts ----------------------------------

def disagreements(answer: dict) -> list[str]:
    """Where one ``find_stragglers`` answer contradicts itself: a rank whose ``straggler`` the
    tools set although fleetd named it in none of the answer's verdicts, or one fleetd named
    (and the answer lists) that the tools do not call a straggler. A user polling the tool, an
    alert reading ``ranks`` and a report reading ``verdicts`` must hear one answer."""
    named = {v["rank"] for v in answer["verdicts"]}
    listed = {r["rank"] for r in answer["ranks"]}
    called = {r["rank"] for r in answer["ranks"] if r["straggler"]}
    return ([f"rank {r} called a straggler, named by fleetd in no verdict"
             for r in sorted(called - named)]
            + [f"rank {r} named by fleetd, not called a straggler"
               for r in sorted((named & listed) - called)])


def explained_against(verdicts: list[dict], rank: int, explained: dict) -> str | None:
    """Where ``explain``'s answer for a rank contradicts fleetd's verdicts (``verdicts``: the
    job's, newest last): its cause is not the newest verdict's, or not none for a rank fleetd
    never named. None where they agree."""
    mine = [v for v in verdicts if v["rank"] == rank]
    want = mine[-1]["cause"] if mine else "none"
    if explained.get("cause") == want:
        return None
    return f"explain says rank {rank}'s cause is {explained.get('cause')}, fleetd's {want}"
