"""A job fleetd judged is found by the job-level tools even when none of its events or health
scores were stored: a full spool drops those first and verdicts last (fleetd(8)), so after
such a loss the verdicts may be all that echod holds of a job. Tenancy still applies."""

from __future__ import annotations

import secrets
import time

import pytest
from pytest_postgresql.janitor import DatabaseJanitor

import echod.tools  # noqa: F401  (registers the tools)
from echod.store.db import make_engine
from echod.registry import REGISTRY, Scope, ToolContext
from echod.sandbox import Sandbox, prepare, sandbox_url
from echod.store.writer import write_batch

from .pg import url_of

ROLE = "ingero_lookup_test"          # roles are server-wide: this module's own
PASSWORD = secrets.token_urlsafe(24)
JOB = "7777"


def verdict(t: float) -> dict:
    return {"vid": "v-lookup", "revision": 0, "cluster": "alpha", "job": JOB, "rank": 5,
            "node": "a-node1", "kind": "persistent", "cause": "host_work",
            "confidence": "medium", "severity": "major", "fix": "profile the host code",
            "findings": ["late"], "op": "ncclAllReduce", "comm_hash": "00000000c0ffee00",
            "step": 12, "onset": t, "first_seen": t, "last_seen": t, "cleared": None,
            "lag_p50_s": 0.05, "lag_p99_s": 0.06, "last_share": 1.0, "period": None,
            "occurrences": 20, "cost_gpu_s": 2.5, "cost_usd": None, "evidence": {}}


@pytest.fixture(scope="module")
def sandbox(migrated_proc):
    url = url_of(migrated_proc).set(database="echod_lookup_tests")
    with DatabaseJanitor(user=migrated_proc.user, host=migrated_proc.host,
                         port=migrated_proc.port, password=migrated_proc.password,
                         dbname=url.database, template_dbname=migrated_proc.template_dbname):
        engine = make_engine(url)
        assert write_batch(engine, {"verdicts": [verdict(time.time() - 60)]}).stored == 1
        gate = Sandbox(sandbox_url(engine.url, ROLE, PASSWORD),
                       prepare(engine, ROLE, PASSWORD), pool_size=1)
        yield gate
        gate.dispose()
        engine.dispose()


def test_a_job_known_only_by_its_verdicts_is_found(sandbox):
    alpha = ToolContext(sandbox, Scope(frozenset({"alpha"})), time.time())
    answer = REGISTRY["find_stragglers"].run(alpha, {"job": JOB})
    assert [(v["rank"], v["kind"], v["cause"]) for v in answer["verdicts"]] == [
        (5, "persistent", "host_work")]
    assert answer["ranks"] == []            # no events: nothing to compute lags from
    report = REGISTRY["job_report"].run(alpha, {"job": JOB})
    assert (report["cluster"], report["job"]) == ("alpha", JOB)
    assert [v["rank"] for v in report["verdicts"]] == [5]


def test_another_tenant_still_does_not_see_it(sandbox):
    beta = ToolContext(sandbox, Scope(frozenset({"beta"})), time.time())
    assert REGISTRY["find_stragglers"].run(beta, {"job": JOB})["verdicts"] == []
