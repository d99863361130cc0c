"""ingerod keeps up with a busy node: a cycle sends as many pushes as its backlog needs, not one
batch an interval (at the reference mix, 8 GPUs make some 3,500 events a second: at 4,096
events a push and a 5 s interval a node fell further behind each cycle until its oldest
events were dropped). Driven through the agent itself, with fleetd's endpoint unanswered."""

from __future__ import annotations

import time

from ingero import wire
from ingero.launch import free_port
from ingero.settings import load
from ingerod.agent import Agent
from ingerod.config import SETTINGS


def test_a_cycle_sends_every_pending_event_in_as_many_pushes_as_they_need(tmp_path):
    cfg = load(SETTINGS, "INGEROD", None, {
        "fleet": f"tcp://127.0.0.1:{free_port()}", "source": "synthetic", "node": "busy",
        "cluster": "c", "queue_dir": str(tmp_path / "queue"), "metrics_addr": "none",
        "control_socket": "none", "jobs_dir": "none", "insecure_plaintext_zmq": True}, {})
    agent = Agent(cfg)
    try:
        agent.tick(agent.clock())               # connects (fleetd never answers)
        agent.links[0].exchange = [1.0, 1.0, 1.0, 1.0002]
        agent.add_events([{"kind": "collective", "t": time.time(),
                           "attrs": {"op": "ncclAllReduce", "job": None}}
                          for _ in range(10_000)])
        agent.cycle(agent.clock())
        pushes = list(agent.links[0].queue.directory.glob("push-*"))
        assert len(agent.links[0].unacked) == len(pushes) == 3     # 4,096 + 4,096 + 1,808
        assert not any(agent.pending)
        sent = [wire.decode(frames) for frames in agent.links[0].unacked.values()]
        assert [len(p.events) for p in sent] == [4096, 4096, 1808]
        assert [p.clock is not None for p in sent] == [True, False, False], \
            "an exchange's times go once: a copy would count twice in the clock estimate"
    finally:
        agent.close()
