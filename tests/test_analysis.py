"""The analysis package on arrays: lag, the rules for every kind of straggler, clocks, causes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ingero.analysis import causes
from ingero.analysis.clock import best_offset, exchange, fit_offset
from ingero.analysis.lag import peer_lag
from ingero.analysis.propagation import Syncs, after_first_sync, drift_seen, inherited, runs_ahead
from ingero.analysis.segments import group_rows, grouped
from ingero.analysis.stragglers import (LagPolicy, arrivals, idle_caused, judge, last_share,
                                        missing_ranks, onset, period, recent_instances,
                                        slow_workers, step_interval)

STEP = 0.05


def job(instances: int, ranks: int, seed: int = 0, jitter: float = 0.001) -> np.ndarray:
    """Entry times of a healthy lockstep job: a step apart, each rank a little jittered."""
    rng = np.random.default_rng(seed)
    return (np.arange(instances)[:, None] * STEP
            + rng.uniform(0, jitter, size=(instances, ranks)))


# -- lag -------------------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(st.integers(1, 9), st.integers(1, 5), st.integers(0, 2**32 - 1), st.floats(0, 0.5))
def test_peer_lag_is_entry_minus_the_median_of_the_others(ranks, instances, seed, missing):
    rng = np.random.default_rng(seed)
    entries = rng.normal(size=(instances, ranks))
    entries[rng.random((instances, ranks)) < missing] = np.nan
    lag = peer_lag(entries)
    for i in range(instances):
        for r in range(ranks):
            others = [entries[i, k] for k in range(ranks) if k != r and np.isfinite(entries[i, k])]
            if not others or not np.isfinite(entries[i, r]):
                assert np.isnan(lag[i, r])
            else:
                assert lag[i, r] == pytest.approx(entries[i, r] - np.median(others), abs=1e-12)


def test_a_late_rank_has_its_delay_as_lag_and_its_peers_none():
    entries = job(10, 8)
    entries[:, 5] += 0.29
    lag = peer_lag(entries)
    assert np.allclose(lag[:, 5], 0.29, atol=0.002)
    assert np.abs(np.delete(lag, 5, axis=1)).max() < 0.002


def test_in_a_job_of_two_the_late_rank_is_late_by_the_whole_gap():
    entries = np.array([[0.0, 0.3], [1.0, 1.3]])
    assert peer_lag(entries).ravel().tolist() == pytest.approx([-0.3, 0.3, -0.3, 0.3])
    entries = job(20, 2)
    entries[:, 1] += 0.1
    assert kinds(judge(entries)) == {1: "persistent"}


# -- the rules -------------------------------------------------------------------------------

def kinds(judgement) -> dict[int, str]:
    return {f.column: f.kind for f in judgement.findings}


def test_a_rank_late_from_the_first_step_is_named_with_onset_zero():
    entries = job(40, 8)
    entries[:, 3] += 0.02
    found = judge(entries)
    assert kinds(found) == {3: "persistent"}
    assert found.findings[0].onset == 0
    assert found.findings[0].lag_p50_s == pytest.approx(0.02, abs=0.002)


def test_a_rank_that_turns_slow_after_healthy_steps_gets_its_onset():
    entries = job(60, 8)
    entries[37:, 2] += 0.03
    found = judge(entries)
    assert kinds(found) == {2: "persistent"}
    assert found.findings[0].onset == 37


def test_slow_steps_are_judged_on_the_last_seconds_not_the_last_16_steps():
    entries = job(40, 8)
    entries[30:] = entries[30] + np.arange(10)[:, None] * 0.3     # steps of 300 ms from 30 on
    entries[35:, 5] += 0.29                                       # late from step 35
    assert recent_instances(entries, LagPolicy()) == 5     # 4.2 s back to 2.7 s, give or take
    found = judge(entries)
    assert kinds(found) == {5: "persistent"} and found.findings[0].onset == 35
    assert judge(entries[:37]).findings == [], "two late steps of five are not yet enough"


def test_a_named_rank_stays_named_while_late_at_a_quarter_of_its_instances():
    entries = job(40, 8)
    entries[:20, 3] += 0.02
    entries[20:, 3] += np.where(np.arange(20) % 3 == 0, 0.02, 0.0)   # late a third of the time
    assert judge(entries).findings == []
    assert kinds(judge(entries, named=frozenset({3}))) == {3: "persistent"}
    entries[20:, 3] = job(40, 8)[20:, 3]                             # recovered
    assert judge(entries, named=frozenset({3})).findings == []


@pytest.mark.parametrize("stalls, periodic", [(3, False), (4, True)])
def test_a_period_needs_four_stalls_three_can_line_up_by_chance(stalls, periodic):
    """A job that stops after 12 or 16 steps: a rank late at three evenly spaced steps is no
    pattern yet (three stray stalls among eight ranks line up often enough); at four it is."""
    entries = job(4 * stalls, 8)
    entries[1::4, 2] += 0.08
    assert kinds(judge(entries)) == ({2: "periodic"} if periodic else {})


def test_a_stall_every_k_steps_is_periodic_with_period_k():
    entries = job(60, 4)
    entries[3::7, 1] += 0.08
    found = judge(entries)
    assert kinds(found) == {1: "periodic"}
    assert found.findings[0].period == 7 and found.findings[0].occurrences == len(range(3, 60, 7))


def test_lateness_in_a_communicators_warm_up_makes_no_period():
    """Beside a busy loop, rank 15 of a healthy 16-rank job was 11-33 ms late at its steps 1,
    3, 5 and 7 (the sim's own records): at fleetd's tick after step 9 that is every other
    step, four times. Startup is irregular in any job; a period is sought after it."""
    entries = job(10, 16)
    entries[1:9:2, 15] += 0.03
    assert kinds(judge(entries)) == {15: "periodic"}, "the rule alone sees a period"
    assert judge(entries, warming=8).findings == []
    # a stall every 5 steps from the first: named, counted from after the warm-up
    entries = job(40, 8)
    entries[::5, 2] += 0.08
    found = judge(entries, warming=8)
    assert kinds(found) == {2: "periodic"}
    assert (found.findings[0].period, found.findings[0].onset) == (5, 10)
    assert found.findings[0].occurrences == len(range(10, 40, 5))


def test_irregular_rare_lateness_is_not_named():
    entries = job(60, 8)
    entries[[5, 6, 19, 40], 4] += 0.05
    assert judge(entries).findings == []


def test_a_lag_within_its_clocks_uncertainty_names_no_one():
    entries = job(40, 8)
    entries[:, 6:] += 0.02      # node3's two ranks, 20 ms behind: late, or a clock 20 ms off
    assert kinds(judge(entries)) == {6: "persistent", 7: "persistent"}
    slack = np.zeros(8)
    slack[6:] = 0.025           # node3's clock known to ±25 ms: the lag may be the clock's
    assert judge(entries, slack=slack).findings == []
    slack[6:] = 0.005           # known to ±5 ms: 20 ms is lateness all the same
    assert kinds(judge(entries, slack=slack)) == {6: "persistent", 7: "persistent"}


def test_a_lag_within_the_peers_clocks_uncertainty_names_no_one():
    """Two nodes of four ranks: node1's clock, known to ±4 ms, put 3.5 ms early. Its ranks
    look early and node0's late by as much (against peers' medians among node1's ranks),
    tightly as a group: node0's own clock, known to ±0.3 ms, cannot explain that, node1's
    can. Seen in CI on the first job of a fresh stack, its clocks known from few exchanges."""
    entries = job(40, 8)
    entries[:, 4:] -= 0.0035
    slack = np.r_[np.full(4, 0.0003), np.full(4, 0.004)]
    assert set(kinds(judge(entries, slack=np.zeros(8)))) == {0, 1, 2, 3}
    assert judge(entries, slack=slack).findings == []
    entries[:, 2] += 0.02       # a rank of node0 20 ms late is late whatever the clocks
    assert kinds(judge(entries, slack=slack)) == {2: "persistent"}


@settings(max_examples=200, deadline=None)
@given(st.integers(5, 32), st.floats(0.0, 0.4), st.integers(0, 2**32 - 1),
       st.floats(0.005, 2.0))
def test_the_bar_holds_against_any_minority_of_late_ranks(ranks, share, seed, delay):
    """Up to 40% of the ranks late, each by its own amount: every one of them is named and no
    healthy rank is."""
    rng = np.random.default_rng(seed)
    late = rng.choice(ranks, size=int(share * ranks), replace=False)
    entries = job(40, ranks, seed)
    entries[:, late] += delay * rng.uniform(1.0, 3.0, size=len(late))
    assert set(kinds(judge(entries))) == set(late.tolist())


@settings(max_examples=100, deadline=None)
@given(st.integers(2, 32), st.integers(0, 2**32 - 1), st.floats(0, 0.005))
def test_a_healthy_job_with_jitter_gets_no_finding(ranks, seed, jitter):
    assert judge(job(200, ranks, seed, jitter)).findings == []


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(0, 2**32 - 1), st.floats(0.01, 0.5))
def test_half_the_job_late_together_is_named_whole(nodes, seed, delay):
    """2·nodes nodes of four ranks, the second half all late by the same amount: the MAD of
    the ranks' median lags is that delay itself, yet the late half is named, and only it."""
    ranks = 8 * nodes
    entries = job(40, ranks, seed)
    entries[:, ranks // 2:] += delay
    found = judge(entries)
    assert set(kinds(found)) == set(range(ranks // 2, ranks))
    assert all(abs(f.lag_p50_s - delay) < 0.002 for f in found.findings)


def test_a_late_majority_is_not_named_and_its_early_minority_not_either():
    entries = job(40, 8)
    entries[:, 3:] += 0.1       # five of eight behind three: the three are early
    assert judge(entries).findings == []


def test_too_few_instances_are_not_judged():
    entries = job(LagPolicy().min_instances - 1, 4)
    entries[:, 0] += 1.0
    assert judge(entries).findings == []


def test_onset_and_period_on_yes_no_series():
    assert onset(np.array([0, 0, 1, 0, 0, 1, 1, 1, 1], bool)) == 5
    assert onset(np.ones(5, bool)) == 0
    assert period(np.array([i % 4 == 1 for i in range(30)]), LagPolicy()) == (4, 1)
    assert period(np.array([1, 1, 1, 1, 1, 0, 0], bool), LagPolicy()) is None


def test_a_period_stands_beside_a_few_late_instances_off_it_and_lates_at_random_have_none():
    # job 1003 beside a busy loop (CI, 7e195d1): 80 ms every 5 steps, 9 ms at two steps after
    lag = np.full(40, 0.001)
    lag[[10, 15]] = 0.009
    lag[4::5] = 0.080
    late = lag > 0.004
    assert period(late, LagPolicy()) == (5, 4)
    lag[22] = 0.009             # a third: too many off the grid, unless they are no stalls
    assert period(lag > 0.004, LagPolicy()) is None
    assert period(lag > 0.004, LagPolicy(), lag) == (5, 4)
    lag[[10, 15, 22]] = 0.070   # stalls as long as the grid's: they are no period
    assert period(lag > 0.004, LagPolicy(), lag) is None
    rng = np.random.default_rng(7)
    for _ in range(200):
        assert period(rng.random(40) < 0.3, LagPolicy()) is None


def test_missing_ranks_are_those_that_went_no_further():
    entered = np.array([1.0, np.nan, 1.1, np.nan])
    furthest = np.array([9, 6, 9, 8])      # rank 3 entered instance 8: its entry at 7 was lost
    assert np.flatnonzero(missing_ranks(entered, furthest, 7)).tolist() == [1]
    assert not missing_ranks(np.array([1.0, 2.0]), np.array([7, 7]), 7).any()
    several = missing_ranks(np.array([entered, [np.nan, np.nan, 1.2, 1.2]]), furthest, [7, 10])
    assert several.tolist() == [[False, True, False, False], [True, True, False, False]]


def test_idle_caused_charges_the_last_rank_for_everyone_s_wait():
    entries = np.array([[0.0, 1.0, 3.0], [10.0, 12.0, 11.0]])
    assert idle_caused(entries).tolist() == [0.0, 3.0, 5.0]   # (3-0)+(3-1); (12-10)+(12-11)
    assert last_share(entries).tolist() == [0.0, 0.5, 0.5]
    last, caused, waited = arrivals(np.vstack([entries, [[5.0, np.nan, np.nan]]]))
    assert last.tolist() == [0.0, 1.0, 1.0] and caused.tolist() == [0.0, 3.0, 5.0]
    assert waited.tolist() == [3.0 + 2.0, 2.0, 0.0 + 1.0]    # an instance of one: no wait
    assert step_interval(entries) == pytest.approx(10.0)


def test_slow_workers_are_named_by_their_self_work_against_their_peers():
    work = np.full(8, 0.006) + np.linspace(0, 0.0002, 8)
    work[6] *= 1.5
    assert slow_workers(work).tolist() == [i == 6 for i in range(8)]
    work[6] = 0.0065   # 8% slower: noise, not a slow GPU
    assert not slow_workers(work).any()
    assert not slow_workers(np.array([np.nan, 0.004])).any()


# -- clocks ----------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.floats(-5, 5), st.lists(st.tuples(st.floats(0.0001, 0.01), st.floats(0.0001, 0.01)),
                                   min_size=8, max_size=64))
def test_the_offset_is_within_half_the_best_round_trip(skew, legs):
    """Whatever the legs' asymmetry, the estimate is off by at most its uncertainty."""
    offsets, trips = [], []
    for t, (up, down) in enumerate(legs):
        t0 = 100.0 + t + skew               # the agent's clock runs ``skew`` ahead
        t1 = 100.0 + t + up                 # fleetd's
        t2 = t1 + 0.0005
        t3 = t2 + down + skew
        offset, trip = exchange(t0, t1, t2, t3)
        offsets.append(offset)
        trips.append(trip)
        assert trip == pytest.approx(up + down, abs=1e-9)
    estimate = best_offset(np.array(offsets), np.array(trips))
    assert abs(estimate.offset - skew) <= estimate.uncertainty + 1e-9


def exchanges(skew: float, legs: list[tuple[float, float]], every_s: float = 2.0):
    """The (times, offsets, round trips) fleetd keeps of exchanges ``every_s`` apart with an
    agent whose clock runs ``skew`` ahead, each of legs (up, down)."""
    times, offsets, trips = [], [], []
    for k, (up, down) in enumerate(legs):
        t1 = 100.0 + every_s * k + up                 # fleetd's clock
        offset, trip = exchange(t1 - up + skew, t1, t1 + 0.0005, t1 + 0.0005 + down + skew)
        times.append(t1)
        offsets.append(offset)
        trips.append(trip)
    return np.array(times), np.array(offsets), np.array(trips)


@settings(max_examples=200, deadline=None)
@given(st.floats(-5, 5), st.lists(st.tuples(st.floats(0.0001, 0.06), st.floats(0.0001, 0.06)),
                                   min_size=16, max_size=120))
def test_the_fitted_offset_is_within_its_uncertainty(skew, legs):
    times, offsets, trips = exchanges(skew, legs)
    estimate = fit_offset(times, offsets, trips)
    for t in (times[0], times[len(times) // 2], times[-1]):
        assert abs(estimate.offset_at(t) - skew) <= estimate.uncertainty_at(t) + 1e-9


def test_one_stretch_of_long_round_trips_does_not_loosen_the_whole_fit():
    """Four minutes of exchanges, one a second; for half a minute of them the agent was starved
    and its best exchange took 56 ms, lopsided; the others' took 1 ms. Fitted, that stretch
    set the uncertainty to ±28 ms; left out, the estimate is as tight as the rest."""
    legs = [(0.0005, 0.0005)] * 240
    legs[90:120] = [(0.050, 0.006)] * 30            # the fourth of eight stretches
    times, offsets, trips = exchanges(0.25, legs, every_s=1.0)
    estimate = fit_offset(times, offsets, trips)
    assert abs(estimate.offset_at(times[-1]) - 0.25) <= estimate.uncertainty_at(times[-1])
    assert estimate.uncertainty < 0.002, estimate


def test_symmetric_legs_give_the_offset_exactly():
    offset, trip = exchange(10.25, 10.001, 10.002, 10.253)
    assert offset == pytest.approx(0.25) and trip == pytest.approx(0.002)


# -- causes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("facts, cause", [
    (causes.Facts(self_work_s=0.009, peers_self_work_s=0.006, self_work_samples=20), "slow_gpu"),
    (causes.Facts(preemptions={("ingero-hog", 4242): 40}), "host_preemption"),
    (causes.Facts(blockio_requests=5000, blockio_bytes=2**30), "io"),
    (causes.Facts(blockio_requests=200, blockio_bytes=2**25, peers_blockio_bytes=2**21), "io"),
    (causes.Facts(blockio_requests=5000, blockio_bytes=2**30, peers_blockio_bytes=2**29),
     "host_work"),                        # every rank reads its input alike: no cause
    (causes.Facts(blockio_bytes=2**22, peers_blockio_bytes=0), "host_work"),   # too little
    (causes.Facts(allocation_s=0.02, peers_allocation_s=0.001), "allocation"),
    (causes.Facts(self_work_s=0.0061, peers_self_work_s=0.006, self_work_samples=20,
                  preemptions={("python3", 7): 2}), "host_work"),
    # a GPU 1.3 times slower, its self-work 1.25 times its peers' on busy CPUs: the 2.9 ms
    # its kernels take more is most of its 4.8 ms lag
    (causes.Facts(self_work_s=0.0146, peers_self_work_s=0.0117, self_work_samples=20,
                  lag_s=0.0048), "slow_gpu"),
    # as much slower, but 40 ms late: its kernels explain little of it
    (causes.Facts(self_work_s=0.0146, peers_self_work_s=0.0117, self_work_samples=20,
                  lag_s=0.040), "host_work"),
    (causes.Facts(self_work_s=0.0130, peers_self_work_s=0.0117, self_work_samples=20,
                  lag_s=0.002), "host_work"),        # 1.11 times: within the peers' spread
])
def test_each_cause_from_its_facts(facts, cause):
    diagnosis = causes.diagnose_late(facts, "node3")
    assert diagnosis.cause == cause and diagnosis.findings and diagnosis.fix


def test_host_preemption_names_the_process_and_its_pid():
    diagnosis = causes.diagnose_late(causes.Facts(preemptions={("ingero-hog", 4242): 40,
                                                               ("kworker/0:1", 9): 6}))
    assert "ingero-hog (pid 4242" in diagnosis.findings[0]
    assert "ingero-hog (pid 4242)" in diagnosis.fix


@pytest.mark.parametrize("late_share, self_work_s, taken, cause", [
    (0.79, None, 0.02, "host_work"),   # 60 ms late in a 76 ms step; a busy loop takes 2% of it
    (0.26, None, 0.40, "host_preemption"),     # 20 ms late a step, 40% of its time taken
    (None, 0.012, 0.02, "slow_gpu"),   # kernels 6 ms slower 13 times a second (8%), 2% taken
    (None, 0.0061, 0.02, "host_preemption"),   # kernels no slower: the preemption is the cause
    # Three hogs on its CPU: 48 ms late in 78 ms steps, its syncs 13 ms longer than its peers',
    # 37% of its time taken. The preemption explains its kernels' extra time (17% of its time).
    (0.62, 0.019, 0.37, "host_preemption"),
    (0.62, 0.019, 0.10, "slow_gpu"),   # ... but a tenth of its time does not
    # The same, its syncs without their late wake-ups (the agent's): no slower than its peers',
    # 44% of its time taken against the 63% it loses; a quarter would be its own host code.
    (0.63, 0.0061, 0.445, "host_preemption"),
    (0.63, 0.0061, 0.25, "host_work"),
    # A busy loop beside the job takes 9% of the time of a rank whose kernels take 2.3 times
    # its peers' (10.3 ms a sync, 6% of its time) and which is 7.5 ms late in 77 ms steps.
    (0.097, 0.0103, 0.089, "slow_gpu"),
])
def test_preemption_is_the_cause_only_if_it_takes_about_what_the_rank_loses(
        late_share, self_work_s, taken, cause):
    """What the sched_switch tracer saw taken from the rank is set against what the rank loses
    against its peers (where its kernels look slow, against their extra time, and a sixth of
    its time at least): a small preemption beside a large lateness is not its cause."""
    work_share = None if self_work_s is None else max(self_work_s - 0.006, 0.0) * 13
    facts = causes.Facts(self_work_s=self_work_s, peers_self_work_s=0.006,
                         self_work_samples=40, preemptions={("bash", 31553): 20},
                         preempted_s=taken * 4.0, window_s=4.0,
                         late_share=work_share if late_share is None else late_share,
                         work_share=work_share)
    assert causes.diagnose_late(facts).cause == cause
    facts.late_share = facts.work_share = None    # not known: preemption outweighs, as before
    assert causes.diagnose_late(facts).cause == "host_preemption"


def test_severity_is_the_lag_against_the_step():
    assert causes.severity(0.29, 0.02) == "critical"
    assert causes.severity(0.003, 0.02) == "major"
    assert causes.severity(0.001, 0.02) == "minor"


def test_a_small_stall_every_k_steps_that_costs_little_of_them_is_not_named():
    """Every rank stalls at its epoch boundaries (workers respawning), one a little more: 10 ms
    every 10 steps of 100 ms is 1% of them, noise; 80 ms is 8%, a straggler."""
    entries = np.arange(40)[:, None] * 0.1 + np.random.default_rng(3).uniform(0, 0.001, (40, 8))
    entries[::10, 4] += 0.010
    assert judge(entries).findings == []
    entries[::10, 4] += 0.070
    assert kinds(judge(entries)) == {4: "periodic"}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(*[st.integers(-3, 3)] * 3), max_size=40))
def test_rows_are_grouped_in_order_and_each_row_finds_its_own(rows):
    columns = [np.array([row[k] for row in rows], np.int64) for k in range(3)]
    distinct, group = group_rows(*columns)
    assert [tuple(row) for row in distinct.tolist()] == sorted(set(rows))
    assert [tuple(distinct[g]) for g in group.tolist()] == rows
    assert [(key, part.tolist()) for key, part in grouped(*columns)] == [
        (list(key), [i for i, row in enumerate(rows) if row == key]) for key in sorted(set(rows))]


def test_rows_of_many_wide_columns_are_grouped_past_what_one_integer_holds():
    """Eight columns of 400 values each: 400^8 combinations do not fit in 63 bits, so the
    combined key is numbered afresh on the way."""
    rng = np.random.default_rng(7)
    columns = [rng.integers(0, 400, 2000) for _ in range(8)]
    columns[3] = np.full(2000, 5)                       # one column the same in every row
    distinct, group = group_rows(*columns)
    rows = list(zip(*(c.tolist() for c in columns)))
    assert [tuple(row) for row in distinct.tolist()] == sorted(set(rows))
    assert all(tuple(distinct[g]) == row for g, row in zip(group.tolist(), rows))


def test_hosts_run_ahead_where_their_peers_sync_less_than_every_other_instance():
    """Forty instances 10 ms apart; peers syncing at every one, at every tenth, or never."""
    entries = np.tile(np.arange(40) * 0.01, (4, 1)).T
    every = [Syncs(np.arange(40) * 0.01 + 0.005) for _ in range(3)]
    tenth = [Syncs(np.arange(4) * 0.1 + 0.095) for _ in range(3)]
    assert runs_ahead(every, entries) is False and runs_ahead(tenth, entries) is True
    assert runs_ahead([Syncs(np.zeros(0))] * 3, entries) is None
    since = after_first_sync(tenth, entries)
    assert since.tolist() == [t > 0.095 + 1e-9 for t in np.arange(40) * 0.01]
    assert drift_seen(tenth, entries[since]) and not drift_seen(tenth, entries[10:19])


def test_a_lateness_is_passed_down_where_the_rank_came_late_from_a_sync_elsewhere():
    """Twenty instances 10 ms apart; rank 2 enters each 8 ms late, 1 ms after a sync on
    another communicator ("pp") returned, as its peers enter 1 ms after theirs on this one:
    its GPU was kept waiting elsewhere, passed down. Had its own syncs been on this one, its
    lateness is its own, told from its syncs alone: the peers' are never read (at 2,048
    ranks, reading every rank's syncs first cost a tenth of a tick)."""
    times = np.arange(20) * 0.01
    entries = np.tile(times, (4, 1)).T
    entries[:, 2] += 0.008

    def syncs(column: int, on: str) -> Syncs:
        return Syncs(entries[:, column] - 0.001, [on] * 20)

    elsewhere = [syncs(c, "pp" if c == 2 else "dp") for c in range(4)]
    assert inherited(elsewhere, entries, 2, "dp", 0.008)

    class Unread(Sequence):
        def __len__(self):
            return 4

        def __getitem__(self, column):
            assert column == 2, f"column {column} read"
            return syncs(column, "dp")

    own = Unread()
    assert not inherited(own, entries, 2, "dp", 0.008)
