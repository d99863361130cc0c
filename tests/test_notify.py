"""fleetd's notices, piece by piece: which verdict changes are told and within what rate, the
durable per-receiver queue (in order, retried, kept across a restart, a refusal dropped), the
webhook's signature against a real HTTP server, and node reputation's rules (distinct jobs,
window, cap, evidence used once) with Slurm's answers given by hand. The end-to-end tests
(test_alerting, test_slurm_actions) run the same code against real receivers and Slurm."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest
from jsonschema import Draft202012Validator, FormatChecker

from fleetd.metrics import FleetMetrics
from fleetd.notify import Announcer, Webhook, notice
from fleetd.outbox import DELIVERED, REFUSED, RETRY, Outbox
from fleetd.rankstate import Verdict
from fleetd.slurmactions import Reputation, SlurmUnavailable
from ingero import webhook
from stack.launch import free_port, wait_for


def verdict(rank=5, job="42", severity="major", revision=0, cleared=None, cause="host_work",
            node="n1") -> Verdict:
    v = Verdict("c", job, rank, node, "persistent", cause, severity=severity,
                op="ncclAllReduce", lag_p50_s=0.05, first_seen=1_800_000_000.0,
                onset=1_799_999_999.0, cost_gpu_s=12.5, cost_usd=0.01, revision=revision,
                findings=["late"], fix="look")
    v.vid = f"{rank:032x}"
    v.cleared = cleared
    return v


def users(cluster, job):
    return {"42": "alice"}.get(job)


def test_a_verdict_is_told_raised_escalated_and_cleared_and_no_more():
    said = Announcer(10, clock=lambda: 0.0)
    v = verdict()
    assert [n["event"] for n in said.notices([v], users, 1.0)] == ["raised"]
    v.revision = 1                                  # updated, same severity: nothing to say
    assert said.notices([v], users, 2.0) == []
    v.severity, v.revision = "critical", 2
    escalated = said.notices([v], users, 3.0)
    assert [n["event"] for n in escalated] == ["escalated"]
    assert escalated[0]["text"].startswith("ingero: straggler now critical: job 42 (alice) ")
    v.severity, v.revision = "major", 3             # de-escalation is not news
    assert said.notices([v], users, 4.0) == []
    v.cleared, v.revision = 5.0, 4
    cleared = said.notices([v], users, 5.0)
    assert [(n["event"], n["id"]) for n in cleared] == [("cleared", f"{v.vid}-cleared-4")]
    assert said.told == {}
    note = verdict(rank=6, severity="info")         # notes are not verdicts
    assert said.notices([note], users, 6.0) == []


def test_raises_over_the_job_rate_are_held_back_counted_and_said_by_the_next_notice():
    now = [0.0]
    said = Announcer(2, clock=lambda: now[0])
    first = said.notices([verdict(rank=r) for r in range(5)], users, 1.0)
    assert [n["rank"] for n in first] == [0, 1] and said.suppressed == 3
    other_job = said.notices([verdict(rank=9, job="43")], users, 1.0)
    assert other_job[0]["suppressed"] == 0          # per job
    # a verdict not told raised is not told cleared either
    assert said.notices([verdict(rank=3, cleared=2.0, revision=1)], users, 2.0) == []
    now[0] = 61.0
    later = said.notices([verdict(rank=7)], users, 61.0)
    assert later[0]["suppressed"] == 3 and "3 more verdict(s) of this job not told" in \
        later[0]["text"]


def test_made_up_job_ids_page_no_more_than_their_nodes_and_clusters_share():
    """A user on n1 makes up a job id a verdict: 30 jobs, each under its own job rate, are
    told 10 a minute (the node's rate); another node's are still told, up to the cluster's."""
    now = [0.0]
    said = Announcer(10, clock=lambda: now[0], per_node_per_minute=10, per_cluster_per_minute=15)
    made_up = said.notices([verdict(rank=k, job=str(1000 + k)) for k in range(30)], users, 1.0)
    assert len(made_up) == 10 and said.suppressed == 20
    others = said.notices([verdict(rank=100 + r, job="7", node="n2") for r in range(8)], users,
                          1.0)
    assert len(others) == 5, "the cluster's 15 a minute"
    now[0] = 61.0
    said.forget_jobs(set())
    assert len(said.notices([verdict(rank=200, job="2000")], users, 61.0)) == 1
    assert said.wider and all(len(times) == 1 for times in said.wider.values())


def test_a_notice_matches_the_documented_schema():
    validator = Draft202012Validator(webhook.schema(), format_checker=FormatChecker())
    for v in (verdict(), verdict(cleared=1_800_000_100.0, revision=3), verdict(job=None)):
        for event in ("raised", "escalated", "cleared"):
            payload = notice(v, event, users("c", v.job), 1_800_000_050.0)
            assert not list(validator.iter_errors(payload)), payload
    bad = {**notice(verdict(), "raised", None, 0.0), "extra": 1}
    assert list(validator.iter_errors(bad))


class Sink:
    """What a receiver answers, in turn; and what it took."""

    def __init__(self, *answers: str):
        self.answers, self.took, self.tried = list(answers), [], []

    def __call__(self, payload: dict) -> str:
        self.tried.append(payload["id"])
        answer = self.answers.pop(0) if self.answers else DELIVERED
        if answer == DELIVERED:
            self.took.append(payload["id"])
        return answer


def test_an_outbox_retries_in_order_keeps_what_is_left_across_a_restart_and_drops_refusals(
        tmp_path, monkeypatch):
    monkeypatch.setattr("fleetd.outbox.RETRY_FIRST_S", 0.01)
    metrics = FleetMetrics()
    directory = tmp_path / "notices" / "hook"
    down = Sink(RETRY, RETRY)
    box = Outbox("hook", directory, down, metrics).start()
    for k in range(3):
        box.put({"id": f"n{k}"})
    assert wait_for(lambda: down.took == ["n0", "n1", "n2"], 10), down.tried
    assert down.tried[:3] == ["n0", "n0", "n0"], "the head is retried, the rest wait in order"
    assert box.close() == 0 and list(directory.iterdir()) == []

    stuck = Sink(*[RETRY] * 1000)
    box = Outbox("hook", directory, stuck, metrics).start()
    box.put({"id": "a"})
    box.put({"id": "b"})
    assert wait_for(lambda: len(stuck.tried) >= 2, 10)
    assert box.close() == 2 and len(list(directory.iterdir())) == 2
    # the next run sends what the last one kept, first; a refusal is dropped, not retried
    again = Sink(REFUSED)
    box = Outbox("hook", directory, again, metrics).start()
    box.put({"id": "c"})
    assert wait_for(lambda: again.took == ["b", "c"], 10), again.tried
    assert again.tried == ["a", "b", "c"]
    box.close()
    sample = samples(metrics)
    assert sample[("ingero_fleet_notices_total", (("outcome", "refused"), ("sink", "hook")))] \
        == 1
    assert sample[("ingero_fleet_notices_pending", (("sink", "hook"),))] == 0


def samples(metrics) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in metrics.registry.collect() for s in family.samples}


def test_a_receiver_that_keeps_failing_holds_the_others_up_for_the_expiry_at_most(
        tmp_path, monkeypatch):
    """A webhook answering 503 forever: its notices wait at most --on-verdict-expiry each,
    then go unsent and counted, and at most --on-verdict-max-pending of them are kept (the
    oldest dropped first), on disk as in memory."""
    monkeypatch.setattr("fleetd.outbox.RETRY_FIRST_S", 0.01)
    monkeypatch.setattr("fleetd.outbox.RETRY_MAX_S", 0.01)
    metrics, now = FleetMetrics(), [1_800_000_000.0]
    directory = tmp_path / "hook"
    failing = Sink(*[RETRY] * 10_000)
    box = Outbox("hook", directory, failing, metrics, max_pending=3, expiry_s=600.0,
                 clock=lambda: now[0])
    at = lambda t: notice(verdict(), "raised", None, t)["at"]     # noqa: E731
    for k in range(5):
        box.put({"id": f"n{k}", "at": at(now[0])})
    assert [p["id"] for _, p in box.queue] == ["n2", "n3", "n4"]
    assert len(list(directory.iterdir())) == 3
    box.start()
    assert wait_for(lambda: len(failing.tried) >= 3, 10)
    assert set(failing.tried) == {"n2"}, "the head is retried, the others wait"
    now[0] += 601
    assert wait_for(lambda: not box.queue, 10), "each, past its expiry, dropped unsent"
    box.put({"id": "fresh", "at": at(now[0])})
    assert wait_for(lambda: failing.tried[-1] == "fresh", 10)
    box.close()
    sample = samples(metrics)
    outcome = lambda o: sample[("ingero_fleet_notices_total",   # noqa: E731
                                (("outcome", o), ("sink", "hook")))]
    assert (outcome("dropped"), outcome("expired")) == (2, 3)
    assert [p.name for p in directory.iterdir()] == ["000000000005.notice"]


def test_a_notice_that_does_not_read_back_is_dropped_and_counted(tmp_path):
    directory = tmp_path / "hook"
    directory.mkdir()
    (directory / "000000000000.notice").write_bytes(b"half a notice")
    metrics = FleetMetrics()
    box = Outbox("hook", directory, Sink(), metrics)
    assert list(box.queue) == [] and list(directory.iterdir()) == []
    box.close()


class Hook(BaseHTTPRequestHandler):
    answers: list[int] = []
    got: list[tuple[dict, bytes]] = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Hook.got.append((dict(self.headers), body))
        if self.path == "/moved":                 # elsewhere, POST and all
            self.send_response(307)
            self.send_header("Location", "/in")
            self.end_headers()
            return
        self.send_response(Hook.answers.pop(0) if Hook.answers else 200)
        if self.path == "/chatty":                # an answer with no end
            self.end_headers()
            try:
                while True:
                    self.wfile.write(b"x" * 65536)
            except OSError:
                return
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def hook():
    Hook.answers, Hook.got = [], []
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/in"
    server.shutdown()
    server.server_close()


def test_the_webhook_signs_each_post_and_reads_the_status(hook):
    secret = b"shared"
    post = Webhook(hook, secret)
    payload = notice(verdict(), "raised", "alice", 1_800_000_050.0)
    Hook.answers = [503, 429, 400, 200]
    assert [post(payload) for _ in range(4)] == [RETRY, RETRY, REFUSED, DELIVERED]
    headers, body = Hook.got[-1]
    assert json.loads(body) == payload and headers["X-Ingero-Notice"] == payload["id"]
    webhook.verify(secret, headers[webhook.SIGNATURE], body)
    for forged in (body + b" ", body.replace(b"alice", b"mallory")):
        with pytest.raises(webhook.BadSignature):
            webhook.verify(secret, headers[webhook.SIGNATURE], forged)
    with pytest.raises(webhook.BadSignature, match="beyond"):
        webhook.verify(secret, headers[webhook.SIGNATURE], body, now=2_000_000_000.0)
    with pytest.raises(webhook.BadSignature, match="no X-Ingero-Signature"):
        webhook.verify(secret, None, body)
    assert Webhook("http://127.0.0.1:1/none", secret)(payload) == RETRY     # nobody listens
    unsigned = Webhook(hook, None)
    assert unsigned(payload) == DELIVERED
    assert webhook.SIGNATURE not in Hook.got[-1][0]


def test_a_redirect_is_never_followed_and_an_answer_is_read_bounded(hook):
    post = Webhook(hook.replace("/in", "/moved"), b"shared")
    payload = notice(verdict(), "raised", "alice", 1_800_000_050.0)
    assert post(payload) == REFUSED
    assert len(Hook.got) == 1, "the signed notice went nowhere else"
    assert Webhook(hook.replace("/in", "/chatty"), b"shared")(payload) == DELIVERED


@pytest.mark.parametrize("header", [
    "t=1,v1=\u00e9", "t=\u0663,v1=" + "a" * 64, "t=1,v1=" + "\u00e9" * 64, "\udc80", "=,=,",
    "t=" + "9" * 40 + ",v1=" + "a" * 64, "t=1,t=2,v1", "v1=" + "a" * 64, " t = 1 , v1 = zz"])
def test_a_crafted_signature_header_raises_bad_signature_only(header):
    with pytest.raises(webhook.BadSignature):
        webhook.verify(b"shared", header, b"{}", now=1.0)


class FakeSlurm:
    """Slurm's answers for one partition of ``nodes``, ingero's drains among them noted."""

    def __init__(self, nodes: list[str], drained_by_ingero=(), down=False,
                 ran: dict[str, str] | None = None):
        self.nodes, self.reasons, self.down = nodes, {n: "ingero: x" for n in drained_by_ingero}, down
        self.drains: list[tuple[str, str]] = []
        self.ran = ran        # job → the host list it ran on (None: every job on every node)

    def run(self, *argv: str) -> str:
        if self.down:
            raise SlurmUnavailable("slurm_load_partitions: Unable to contact slurm controller")
        if argv[0] == "sacct":
            jobs = argv[argv.index("-j") + 1].split(",")
            ran = self.ran if self.ran is not None else {j: ",".join(self.nodes) for j in jobs}
            return "".join(f"{j}|{ran[j]}\n" for j in jobs if j in ran)
        if argv[:2] == ("scontrol", "update"):
            node, reason = argv[2].split("=", 1)[1], argv[4].split("=", 1)[1]
            self.drains.append((node, reason))
            self.reasons[node] = reason
            return ""
        if "-n" in argv:
            return "gpu*\n"
        return "".join(f"{n}|{'drained' if n in self.reasons else 'idle'}|"
                       f"{self.reasons.get(n, 'none')}\n" for n in self.nodes)


def told(job: str, node: str = "n1", cause: str = "slow_gpu", event: str = "raised") -> dict:
    return {"event": event, "cause": cause, "job": job, "cluster": "c", "node": node}


def reputation(slurm, tmp_path: Path, clock, fraction=0.5, after=2) -> Reputation:
    return Reputation(slurm, tmp_path / "reputation.json", after, 3600.0, fraction,
                      ["slow_gpu", "hang", "died"], FleetMetrics(), clock=clock)


def test_a_node_is_drained_on_distinct_jobs_within_the_window_once_per_evidence(tmp_path):
    now = [0.0]
    slurm = FakeSlurm(["n1", "n2", "n3", "n4"])
    rep = reputation(slurm, tmp_path, lambda: now[0])
    assert rep(told("1")) == DELIVERED and rep(told("1")) == DELIVERED   # the same job twice
    assert rep(told("2", cause="host_work")) == DELIVERED               # the job's, not the node's
    assert slurm.drains == []
    now[0] = 4000.0                                                      # job 1 is too old now
    rep(told("3"))
    assert slurm.drains == []
    rep(told("4", cause="hang"))
    assert slurm.drains == [("n1", "ingero: hang,slow_gpu in jobs 3,4 (ingero nodes)")]
    # resumed by an operator: the same evidence, kept across a restart, never drains it again
    slurm.reasons.clear()
    again = reputation(slurm, tmp_path, lambda: now[0])
    again.start()
    again(told("4", event="escalated"))
    assert len(slurm.drains) == 1
    again(told("5"))
    assert len(slurm.drains) == 1
    again(told("6"))
    assert [node for node, _ in slurm.drains] == ["n1", "n1"]


def test_only_jobs_slurm_ran_on_the_node_count_against_it(tmp_path):
    """A user's processes on n1 make up job ids (or name another node's job) and get
    themselves named slow_gpu: evidence of a job Slurm did not run on n1 is dropped, counted,
    and drains nothing; two jobs Slurm did run there drain it."""
    slurm = FakeSlurm(["n1", "n2", "n3", "n4"], ran={"7": "n[1-2]", "8": "n3", "9": "n1"})
    rep = reputation(slurm, tmp_path, lambda: 0.0, fraction=1.0)
    for job in ("424242", "made-up", "8"):
        rep(told(job))
    assert slurm.drains == []
    rep(told("7"))
    assert slurm.drains == [] and [e["job"] for e in rep.evidence["n1"]] == ["7"]
    rep(told("9"))
    assert slurm.drains == [("n1", "ingero: slow_gpu in jobs 7,9 (ingero nodes)")]
    samples = {tuple(s.labels.items()): s.value for f in rep.metrics.registry.collect()
               for s in f.samples if s.name == "ingero_fleet_node_drains_total"}
    assert samples[(("outcome", "unconfirmed"),)] >= 1


def test_the_cap_holds_and_a_slurm_that_does_not_answer_is_tried_again(tmp_path):
    slurm = FakeSlurm(["n1", "n2", "n3", "n4"], drained_by_ingero=["n2"])
    rep = reputation(slurm, tmp_path, lambda: 0.0, fraction=0.25)
    rep(told("1"))
    assert rep(told("2")) == DELIVERED and slurm.drains == []     # 2 of 4 over a quarter
    samples = {tuple(s.labels.items()): s.value for f in rep.metrics.registry.collect()
               for s in f.samples if s.name == "ingero_fleet_node_drains_total"}
    assert samples[(("outcome", "cap"),)] == 1
    slurm.reasons.clear()                                          # n2 resumed: room again
    slurm.down = True
    assert rep(told("3", node="n1")) == RETRY
    slurm.down = False
    assert rep(told("3", node="n1")) == DELIVERED
    assert slurm.drains == [("n1", "ingero: slow_gpu in jobs 1,2,3 (ingero nodes)")]


def test_fleetd_refuses_to_start_with_a_webhook_and_no_secret(tmp_path):
    from fleetd.config import SETTINGS
    from fleetd.notify import Notices
    from ingero.errors import IngeroError

    cfg = SimpleNamespace(**{s.name: s.parse(s.default) if s.default is not None else None
                             for s in SETTINGS})
    cfg.on_verdict, cfg.spool_dir = ["http://127.0.0.1:9/x"], tmp_path
    with pytest.raises(IngeroError, match="--on-verdict needs --on-verdict-secret-file"):
        Notices(cfg, FleetMetrics())
    empty = tmp_path / "secret"
    empty.write_text("\n")
    cfg.on_verdict_secret_file = empty
    with pytest.raises(IngeroError, match="is empty"):
        Notices(cfg, FleetMetrics())
    cfg.on_verdict_unsigned = True
    assert len(Notices(cfg, FleetMetrics()).outboxes) == 1
