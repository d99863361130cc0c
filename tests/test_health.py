"""The health score, its baseline, and the detection modes with hysteresis."""

import pytest

from ingerod.detection import Detector
from ingerod.health import EmaBaseline, HealthModel, Sample, floor_penalty, health_score


def signals(t=1.0, c=1.0, m=1.0, p=1.0):
    return {"throughput": t, "compute": c, "memory": m, "cpu": p}


def test_weights():
    assert health_score(signals()) == 1.0
    assert health_score(signals(t=0.5)) == pytest.approx(0.8)
    assert health_score(signals(c=0.5)) == pytest.approx(0.875)
    assert health_score(signals(m=0.5)) == pytest.approx(0.9)
    assert health_score(signals(p=0.5)) == pytest.approx(0.925)


def test_floor_penalty_halves_a_collapsed_signal():
    assert floor_penalty(0.2) == 0.5 and floor_penalty(0.35) == 1.0
    assert floor_penalty(0.30) == pytest.approx(0.75)
    assert health_score(signals(p=0.1)) == pytest.approx((0.85 + 0.015) * 0.5)


def test_warmup_then_active_and_idle():
    model = HealthModel(warmup=2)
    states = [model.assess(Sample(signals())).state for _ in range(3)]
    assert states == ["calibrating", "calibrating", "active"]
    assert model.assess(Sample(signals(), busy=False)).state == "idle"
    assert model.assess(Sample(signals())).state == "calibrating"


def test_baseline_keeps_a_sustained_drop_visible():
    baseline = EmaBaseline(alpha=0.5)
    assert baseline.signal(100.0) == 1.0
    assert baseline.signal(100.0) == 1.0
    drops = [baseline.signal(40.0) for _ in range(10)]
    assert drops == [0.4] * 10
    assert baseline.signal(90.0) == pytest.approx(0.9)


def detector():
    return Detector(hysteresis=0.02, fleet_fresh=20, fleet_cached=300, local_threshold=0.85)


def test_modes_in_order():
    d = detector()
    assert d.mode("calibrating", False, 0.0) == ("none", None)
    assert d.mode("active", False, 0.0) == ("local-baseline", 0.85)
    d.heard(0.8, quorum_met=False, cohort="c", now=0.0)
    assert d.mode("active", True, 0.0)[0] == "local-baseline"
    d.heard(0.8, quorum_met=True, cohort="c", now=0.0)
    assert d.mode("active", True, 10.0) == ("fleet", 0.8)
    assert d.mode("active", False, 10.0) == ("fleet-cached", 0.8)
    assert d.mode("active", True, 30.0) == ("fleet-cached", 0.8)
    assert d.mode("active", True, 301.0)[0] == "local-baseline"


def test_hysteresis_and_edges():
    d = detector()
    d.heard(0.8, True, "c", 0.0)
    edges = [d.judge(score, "active", True, 1.0).edge for score in
             (0.79, 0.77, 0.79, 0.81, 0.83, 0.77)]
    assert edges == [None, "straggler", None, None, "resolved", "straggler"]
    assert d.judge(0.1, "idle", True, 1.0).edge == "resolved"
