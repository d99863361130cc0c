"""The baselines and the scoring of bench/quality.py, fed by hand: what each baseline names,
and how named ranks become precision, recall and causes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.quality_scoring import (Entry, Tally, diagnosed, disagreements,  # noqa: E402
                                   explained_against, health_mad,
                                   lag_mean_sigma, mean_lags, ranks_of_nodes, spread)


def lockstep(ranks: int, steps: int, late: dict[int, float] = {},
             jitter: dict[int, float] = {}) -> list[Entry]:
    """Every rank enters every step's all-reduce at the same time, but for ``late`` ranks (that
    many seconds later) and a per-rank ``jitter`` that alternates in sign."""
    return [Entry("c0ffee", step, rank, 1000.0 + step + late.get(rank, 0.0)
                  + jitter.get(rank, 0.0) * (-1) ** step)
            for step in range(steps) for rank in range(ranks)]


def test_a_rank_s_lag_is_against_the_median_of_the_others():
    lags = mean_lags(lockstep(8, 10, late={5: 0.060}))
    assert lags[5] == pytest.approx(0.060)
    assert all(lags[r] == pytest.approx(0.0) for r in range(8) if r != 5)


def test_an_instance_only_one_rank_entered_gives_no_lag():
    entries = lockstep(4, 3) + [Entry("c0ffee", 99, 2, 5000.0)]
    assert mean_lags(entries)[2] == pytest.approx(0.0)


def test_mean_two_sigma_names_one_late_rank_of_sixteen():
    assert lag_mean_sigma(lockstep(16, 20, late={11: 0.050})) == {11}


def test_mean_two_sigma_names_nobody_when_all_are_alike():
    assert lag_mean_sigma(lockstep(8, 20)) == set()


def test_mean_two_sigma_loses_stragglers_when_many_are_late():
    """Six of sixteen late: the mean rises and σ widens until the late ranks are under it."""
    late = {r: 0.050 for r in (1, 3, 6, 8, 10, 13)}
    assert lag_mean_sigma(lockstep(16, 20, late=late)) == set()


def test_mean_two_sigma_takes_a_skewed_node_for_late_ranks():
    """Raw times: two of sixteen ranks on a node whose clock is 250 ms ahead."""
    assert lag_mean_sigma(lockstep(16, 20, late={10: 0.25, 11: 0.25})) == {10, 11}


def test_health_mad_names_the_node_far_below_the_others():
    scores = {f"node{i}": [0.95, 0.96, 0.97] for i in range(7)}
    scores["node7"] = [0.5, 0.6, 0.55]
    assert health_mad(scores) == {"node7"}


def test_health_mad_floors_the_mad_so_a_hair_below_is_not_named():
    scores = {f"node{i}": [0.97] for i in range(7)} | {"node7": [0.965]}
    assert health_mad(scores) == set()


def test_health_mad_judges_nothing_with_fewer_than_two_nodes_scored():
    assert health_mad({"node0": [0.2], "node1": []}) == set()


def test_a_named_node_names_every_rank_it_ran():
    node_of_rank = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}
    assert ranks_of_nodes({"node1"}, node_of_rank) == {2, 3}


def test_tally_counts_found_wrong_and_missed():
    tally = Tally.of(truth={1, 4, 6}, named={1, 4, 9})
    assert (tally.tp, tally.fp, tally.fn) == (2, 1, 1)
    assert tally.precision == pytest.approx(2 / 3) and tally.recall == pytest.approx(2 / 3)
    total = tally + Tally.of(truth=set(), named={3})
    assert (total.tp, total.fp, total.fn) == (2, 2, 1)


def test_precision_and_recall_are_undefined_with_nothing_to_count():
    healthy = Tally.of(truth=set(), named=set())
    assert healthy.precision is None and healthy.recall is None
    assert healthy.to_json() == {"tp": 0, "fp": 0, "fn": 0, "precision": None, "recall": None}


@pytest.mark.parametrize("injected, verdicts, right", [
    ("host_delay", [{"kind": "persistent", "cause": "host_work"}], True),
    ("host_delay", [{"kind": "persistent", "cause": "host_preemption"}], False),
    ("hiccup", [{"kind": "persistent", "cause": "host_work"},
                {"kind": "periodic", "cause": "host_work"}], True),
    ("slow_gpu", [{"kind": "slow_gpu", "cause": "slow_gpu"}], True),
    ("cpu_contention", [{"kind": "persistent", "cause": "host_preemption"}], True),
    ("hang", [{"kind": "persistent", "cause": "host_work"}], False),
    ("die", [{"kind": "died", "cause": "died"}], True),
])
def test_a_diagnosis_is_right_when_one_verdict_says_what_was_injected(injected, verdicts, right):
    assert diagnosed(injected, verdicts) is right


def test_spread_of_times_to_verdict():
    assert spread([2.0, 1.0, 4.0]) == {"median_s": 2.0, "max_s": 4.0, "count": 3}
    assert spread([]) == {"median_s": None, "max_s": None, "count": 0}


def answer(named=(), called=(), listed=range(8)) -> dict:
    """A find_stragglers answer: fleetd's verdicts of ``named``, ``called`` the ranks the tools
    set ``straggler`` on, of the ``listed``."""
    return {"verdicts": [{"rank": r, "cause": "host_work"} for r in named],
            "ranks": [{"rank": r, "straggler": r in called} for r in listed]}


def test_an_answer_agrees_when_its_stragglers_are_fleetd_s_named_ranks():
    assert disagreements(answer()) == []
    assert disagreements(answer(named=[5], called=[5])) == []
    # a rank named that has no lag row (it hung before its first collective) is no contradiction
    assert disagreements(answer(named=[9], listed=range(8))) == []


def test_a_straggler_fleetd_did_not_name_or_a_named_rank_not_called_one_disagrees():
    assert disagreements(answer(called=[3])) == [
        "rank 3 called a straggler, named by fleetd in no verdict"]
    assert disagreements(answer(named=[2, 5], called=[5])) == [
        "rank 2 named by fleetd, not called a straggler"]


def test_explain_agrees_with_fleetd_s_newest_verdict_or_says_none():
    verdicts = [{"rank": 4, "cause": "host_work"}, {"rank": 4, "cause": "host_preemption"}]
    assert explained_against(verdicts, 4, {"cause": "host_preemption"}) is None
    assert explained_against(verdicts, 4, {"cause": "host_work"}) == (
        "explain says rank 4's cause is host_work, fleetd's host_preemption")
    assert explained_against(verdicts, 1, {"cause": "none"}) is None
    assert explained_against(verdicts, 1, {"cause": "host_preemption"}) is not None
