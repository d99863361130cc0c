"""A tenant's first tool call sets up its role (``ingero_sandbox_tenant()`` grants it the ingero
tables) while other transactions rewrite the same catalog rows, and must still answer.

GRANT rewrites the catalog row of each table, and PostgreSQL fails a GRANT whose row another
transaction is rewriting ("tuple concurrently updated", a 500 of the API). Two such
transactions happen in echod: the writer storing the first events of a database makes the
first partition of ``events`` (its row changes: it now has a partition), and another tenant's
first call grants the same tables. Here each is held open at that point while a caller's
first ``find_stragglers`` runs; the call must wait for it and answer.
"""

from __future__ import annotations

import threading
import time

from jsonschema import Draft202012Validator
from sqlalchemy import text

from echod.registry import REGISTRY, Scope, ToolContext
from echod.sandbox import Sandbox, prepare, sandbox_url
from echod.sandbox.roles import TENANT_FUNCTION, tenant_credentials
from echod.store.writer import write_batch

from .test_echod_tools import Batch, collectives

ROLE = "ingero_sql_setup"
PASSWORD = "setup-test-password"
CLUSTER, NODE, JOB, COMM = "alpha", "a-node0", "4242", "c0ffee00c0ffee00"
RANKS, STEPS, LATE_RANK = 4, 20, 3
EVERY = Scope(None)


def open_sandbox(engine) -> Sandbox:
    key = prepare(engine, ROLE, PASSWORD)
    return Sandbox(sandbox_url(engine.url, ROLE, PASSWORD), key, timeout_ms=20_000)


def job_rows(now: float) -> dict:
    """The first events of the database: a job whose last rank enters 20 ms late."""
    b = Batch(CLUSTER)
    collectives(b, JOB, COMM, RANKS, STEPS, now - 60, lambda rank: NODE,
                lambda rank: 0.020 if rank == LATE_RANK else 0.0001 * rank)
    return {"events": b.rows["events"]}


def waiting(engine, user: str) -> int:
    """How many of ``user``'s backends wait for a lock."""
    with engine.connect() as connection:
        return connection.scalar(text(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = :user "
            "AND wait_event_type = 'Lock'"), {"user": user})


def wait_until(condition, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


class InThread(threading.Thread):
    """``work()`` in a thread of its own; ``outcome()`` is what it returned, or raises what it
    raised."""

    def __init__(self, work):
        super().__init__(daemon=True)
        self.work, self.result, self.error = work, None, None
        self.start()

    def run(self):
        try:
            self.result = self.work()
        except Exception as exc:           # given back to the test by outcome()
            self.error = exc

    def outcome(self):
        self.join(60)
        assert not self.is_alive(), "still running"
        if self.error is not None:
            raise self.error
        return self.result


def first_call(sandbox: Sandbox, scope: Scope = EVERY) -> InThread:
    """A caller's first find_stragglers, which sets up the tenant of ``scope``."""
    tool = REGISTRY["find_stragglers"]
    return InThread(lambda: tool.run(ToolContext(sandbox, scope, time.time()), {"job": JOB}))


def valid(answer: dict) -> dict:
    output = REGISTRY["find_stragglers"].output_schema
    Draft202012Validator(output, format_checker=Draft202012Validator.FORMAT_CHECKER) \
        .validate(answer)
    return answer


def test_a_first_call_while_the_first_events_are_stored_waits_and_answers(engine):
    sandbox = open_sandbox(engine)
    now = time.time()
    b = Batch(CLUSTER)
    b.score(NODE, now - 90, JOB, 0.9, {"cpu": 0.9})
    assert write_batch(engine, b.rows, now=now).rejected == []     # the node, no partition yet
    try:
        with engine.connect() as holder:
            # The writer stops, its partition made, where it upserts the node: held here.
            holder.execute(text("SELECT 1 FROM nodes WHERE cluster = :cluster AND name = :node "
                                "FOR UPDATE"), {"cluster": CLUSTER, "node": NODE})
            writer = InThread(lambda: write_batch(engine, job_rows(now), now=now))
            assert wait_until(lambda: waiting(engine, engine.url.username) == 1)
            call = first_call(sandbox)
            assert wait_until(lambda: waiting(engine, ROLE) == 1), "the setup did not wait"
            holder.rollback()
            assert writer.outcome().stored == RANKS * STEPS
            answer = valid(call.outcome())
    finally:
        sandbox.dispose()
    assert [r["rank"] for r in answer["ranks"] if r["straggler"]] == [LATE_RANK]
    assert answer["coverage"]["entries_examined"] == RANKS * STEPS


def test_a_first_call_while_another_tenant_is_set_up_waits_and_answers(engine):
    sandbox = open_sandbox(engine)
    another_worker = Sandbox(sandbox.url, sandbox.key)
    assert write_batch(engine, job_rows(time.time())).rejected == []
    other, password = tenant_credentials(ROLE, sandbox.key, Scope(frozenset({CLUSTER})))
    try:
        with another_worker.gate.connect() as gate:
            # Another tenant's setup in another worker, its grants made, not yet committed.
            gate.exec_driver_sql("SET TRANSACTION READ WRITE")
            verifier = gate.connection.driver_connection.pgconn.encrypt_password(
                password.encode(), other.encode(), b"scram-sha-256").decode()
            gate.execute(text(f"SELECT {TENANT_FUNCTION}(:name, :verifier)"),
                         {"name": other, "verifier": verifier})
            call = first_call(sandbox)
            assert wait_until(lambda: waiting(engine, ROLE) == 1), "the setup did not wait"
            gate.commit()
            answer = valid(call.outcome())
    finally:
        another_worker.dispose()
        sandbox.dispose()
    assert [r["rank"] for r in answer["ranks"] if r["straggler"]] == [LATE_RANK]
