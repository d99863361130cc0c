"""fleetd's threshold service, driven by pushes and a clock the test holds."""

import pytest

from fleetd.cohorts import Fleet, SeqWindow, ThresholdPolicy
from ingero import wire

SIG = {"throughput": 1.0, "compute": 1.0, "memory": 1.0, "cpu": 1.0}


def push(node, score, seq=0, state="active", job=None, boot="b", cluster="c", interval=1.0,
         job_nodes=None):
    return wire.Push(seq, node, cluster, boot, score, SIG, state, 0.0, interval, job, job_nodes)


def fleet_with(scores, now=0.0, **policy):
    fleet = Fleet(ThresholdPolicy(**policy))
    for i, score in enumerate(scores):
        fleet.observe(push(f"n{i}", score), now)
    return fleet


def test_one_low_node_is_flagged_and_no_other():
    fleet = fleet_with([0.9] * 9 + [0.5])
    edges = fleet.recompute(0.0)
    cohort = fleet.cohorts["cluster:c"]
    assert cohort.stragglers == {"n9"} and cohort.quorum_met and not cohort.panic
    assert [(e.node, e.raised) for e in edges] == [("n9", True)]
    assert cohort.threshold == pytest.approx(0.9 - 2 * 1.4826 * 0.01)


def test_below_quorum_nobody_is_flagged():
    fleet = fleet_with([0.9, 0.9, 0.9, 0.2])
    fleet.recompute(0.0)
    cohort = fleet.cohorts["cluster:c"]
    assert not cohort.quorum_met and cohort.stragglers == set()
    assert cohort.threshold is not None


def test_panic_when_most_of_the_cohort_drops_at_once():
    fleet = fleet_with([0.9] * 10)
    fleet.recompute(0.0)
    for i in range(10):
        fleet.observe(push(f"n{i}", 0.5 if i < 7 else 0.9, seq=1), 1.0)
    edges = fleet.recompute(1.0)
    cohort = fleet.cohorts["cluster:c"]
    assert cohort.panic and cohort.stragglers == set()
    assert (None, True) in [(e.node, e.raised) for e in edges]


def test_threshold_is_smoothed():
    fleet = fleet_with([0.9] * 10, ema_alpha=0.2)
    fleet.recompute(0.0)
    first = fleet.cohorts["cluster:c"].threshold
    for i in range(10):
        fleet.observe(push(f"n{i}", 0.8, seq=1), 1.0)
    fleet.recompute(1.0)
    raw = 0.8 - 2 * 1.4826 * 0.01
    assert fleet.cohorts["cluster:c"].threshold == pytest.approx(0.2 * raw + 0.8 * first)


def test_calibrating_and_idle_nodes_stay_out_of_the_statistics():
    fleet = fleet_with([0.9] * 5)
    fleet.observe(push("warm", 0.1, state="calibrating"), 0.0)
    fleet.observe(push("idle", 0.1, state="idle"), 0.0)
    fleet.recompute(0.0)
    cohort = fleet.cohorts["cluster:c"]
    assert cohort.active == 5 and cohort.stragglers == set()


def test_silent_nodes_expire_after_ttl():
    fleet = fleet_with([0.9] * 6, ttl_multiplier=5.0)
    fleet.observe(push("n0", 0.9, seq=1), 4.0)
    fleet.recompute(5.0)
    assert fleet.cohorts["cluster:c"].active == 6
    fleet.recompute(5.5)
    assert set(fleet.nodes) == {"n0"} and fleet.cohorts["cluster:c"].active == 1


def test_job_is_the_cohort_and_declares_expected_nodes():
    fleet = Fleet(ThresholdPolicy(), expected_nodes={"c": 10})
    fleet.observe(push("a", 0.9, job="7", job_nodes=4), 0.0)
    fleet.observe(push("b", 0.9), 0.0)
    fleet.recompute(0.0)
    assert fleet.cohorts["job:7"].expected == 4 and fleet.cohorts["job:7"].coverage == 0.25
    assert fleet.cohorts["cluster:c"].expected == 10


def test_resends_are_recognised_and_do_not_rewind_the_score():
    fleet = Fleet(ThresholdPolicy())
    assert fleet.observe(push("a", 0.5, seq=0), 0.0)[0]
    assert fleet.observe(push("a", 0.9, seq=1), 0.0)[0]
    assert not fleet.observe(push("a", 0.5, seq=0), 0.0)[0]
    assert fleet.nodes["a"].score == 0.9
    assert fleet.observe(push("a", 0.7, seq=0, boot="rebooted"), 0.0)[0]
    assert fleet.nodes["a"].score == 0.7


def test_a_stale_push_naming_another_cohort_is_answered_with_the_nodes_cohort():
    """Found by the frame fuzzer: an old seq from another cluster must not invent a cohort."""
    fleet = Fleet(ThresholdPolicy())
    fleet.observe(push("a", 0.9, seq=5), 0.0)
    fresh, cohort = fleet.observe(push("a", 0.9, seq=1, cluster="elsewhere"), 0.0)
    assert fresh and cohort.name == "cluster:c" and set(fleet.cohorts) == {"cluster:c"}


def test_seq_window_forgets_only_what_cannot_come_back():
    window = SeqWindow(size=4)
    assert all(window.accept(s) for s in (0, 1, 2, 3, 4))
    assert not window.accept(0)
    assert not window.accept(4)
    assert window.accept(6) and window.accept(5)


def test_max_nodes():
    fleet = Fleet(ThresholdPolicy(), max_nodes=2)
    fleet.observe(push("a", 0.9), 0.0)
    fleet.observe(push("b", 0.9), 0.0)
    assert fleet.full("c") and not fleet.full("a")


def test_the_bar_from_early_joiners_is_not_carried_into_the_quorum():
    """Found in the 20-agent test: smoothing from a lone high node flagged lower joiners."""
    fleet = Fleet(ThresholdPolicy(quorum=5))
    fleet.observe(push("high", 0.918), 0.0)
    fleet.recompute(0.0)
    for i, score in enumerate([0.88, 0.882, 0.884, 0.886, 0.90, 0.91]):
        fleet.observe(push(f"n{i}", score), 1.0)
    fleet.recompute(1.0)
    cohort = fleet.cohorts["cluster:c"]
    assert cohort.quorum_met and cohort.stragglers == set()
    assert cohort.threshold == pytest.approx(0.886 - 2 * 1.4826 * 0.01)


def test_a_push_is_recorded_only_once_it_was_handled():
    from fleetd.cohorts import Fleet, ThresholdPolicy
    from ingero import wire

    fleet = Fleet(ThresholdPolicy(), {}, 100)
    push = wire.Push(3, "n", "c", "b", 0.9, {s: 1.0 for s in wire.SIGNALS}, "active", 1.0, 1.0)
    assert fleet.new(push) and fleet.new(push), "asking records nothing"
    assert fleet.observe(push, 1.0)[0] is True
    assert not fleet.new(push) and fleet.observe(push, 1.0)[0] is False


def test_two_agents_of_one_node_keep_a_window_each():
    """Two per-job agents on one host (ingerod@JOB units, node = the hostname) push under
    boot ids of their own: neither's pushes are taken for the other's, nor its resends for
    new ones."""
    from fleetd.cohorts import Fleet, ThresholdPolicy
    from ingero import wire

    fleet = Fleet(ThresholdPolicy(), {}, 100)
    sig = {s: 1.0 for s in wire.SIGNALS}
    a = [wire.Push(seq, "host", "c", "boot-a", 0.9, sig, "active", 1.0, 1.0, "1")
         for seq in range(3)]
    b = [wire.Push(seq, "host", "c", "boot-b", 0.9, sig, "active", 1.0, 1.0, "2")
         for seq in range(3)]
    for push_a, push_b in zip(a, b):
        assert fleet.observe(push_a, 1.0)[0] and fleet.observe(push_b, 1.0)[0]
    assert not fleet.observe(a[1], 2.0)[0] and not fleet.observe(b[2], 2.0)[0], "resends"
    assert set(fleet.windows) == {("host", "boot-a"), ("host", "boot-b")}
    fleet.expire(100.0)
    assert fleet.windows == {}
