"""ingerod keeps up with a busy node: a cycle sends as many pushes as its backlog needs, not one
batch an interval (at the reference mix, 8 GPUs make some 3,500 events a second: at 4,096
events a push and a 5 s interval a node fell further behind each cycle until its oldest
events were dropped). Driven through the agent itself, with fleetd's endpoint unanswered."""

from __future__ import annotations

import time

from ingero import framefile, wire
from stack.launch import free_port
from ingero.settings import load
from ingerod.agent import Agent
from ingerod.config import SETTINGS


def agent_of(tmp_path, **settings) -> Agent:
    return Agent(load(SETTINGS, "INGEROD", None, {
        "fleet": f"tcp://127.0.0.1:{free_port()}", "source": "synthetic", "node": "busy",
        "cluster": "c", "queue_dir": str(tmp_path / "queue"), "metrics_addr": "none",
        "control_socket": "none", "jobs_dir": "none", "insecure_plaintext_zmq": True,
        **settings}, {}))


def collectives(n: int) -> list[dict]:
    return [{"kind": "collective", "t": time.time(), "attrs": {
        "op": "ncclAllReduce", "comm_hash": "00000000c0ffee00", "seq": k, "rank": k % 8,
        "comm_rank": k % 8, "nranks": 8, "pid": 100 + k % 8, "job": "5"}} for k in range(n)]


def welcome(agent: Agent, *capabilities: str) -> None:
    """fleetd's answer to the agent's hello, as the link reads it off the socket."""
    now = time.time()
    agent.links[0]._decode(wire.encode(wire.Welcome("test", now, now, list(capabilities))),
                           now)


def on_disk(agent: Agent) -> list[wire.Message]:
    return [wire.decode(framefile.decode(path.read_bytes()))
            for path in sorted(agent.links[0].queue.directory.glob("push-*"))]


def test_a_cycle_sends_every_pending_event_in_as_many_pushes_as_they_need(tmp_path):
    agent = agent_of(tmp_path)
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


def test_to_a_fleetd_that_takes_columns_the_events_go_as_columns(tmp_path):
    agent = agent_of(tmp_path)
    try:
        agent.tick(agent.clock())
        welcome(agent, wire.COLUMNS)
        agent.add_events(collectives(5000) + [{"id": "elsewhere:1", "t": 1.0, "kind": "x",
                                               "attrs": {}}])
        agent.cycle(agent.clock())
        sent = [wire.decode(frames) for frames in agent.links[0].unacked.values()]
        assert [type(p).__name__ for p in sent] == ["ColumnPush"] * 2
        assert [(p.columns.n, len(p.events)) for p in sent] == [(4096, 0), (904, 1)]
        agent.add_events(collectives(127))          # fewer than COLUMNS_FROM: cheaper as maps
        agent.cycle(agent.clock())
        assert type(wire.decode(list(agent.links[0].unacked.values())[-1])) is wire.Push
        assert sent[0].all_events()[5]["attrs"]["comm_rank"] == 5
    finally:
        agent.close()


def test_pushes_of_columns_go_again_as_maps_when_a_fleetd_before_1_3_answers(tmp_path):
    """fleetd downgraded under a running agent: its pushes of columns, still queued, would be
    refused (an unknown type) for ever; they go again as maps, under the same numbers, in
    memory and on disk, and the next pushes are maps."""
    agent = agent_of(tmp_path)
    try:
        agent.tick(agent.clock())
        welcome(agent, wire.COLUMNS)
        agent.add_events(collectives(6000))
        agent.cycle(agent.clock())
        before = [wire.decode(frames) for frames in agent.links[0].unacked.values()]
        assert [type(p) for p in on_disk(agent)] == [wire.ColumnPush] * 2
        welcome(agent)                                  # the older fleetd lists nothing
        after = [wire.decode(frames) for frames in agent.links[0].unacked.values()]
        assert [type(p) for p in after] == [wire.Push] * 2 == [type(p) for p in on_disk(agent)]
        assert [p.seq for p in after] == [p.seq for p in before]
        assert [p.events for p in after] == [p.all_events() for p in before]
        agent.add_events(collectives(200))
        agent.cycle(agent.clock())
        assert type(wire.decode(list(agent.links[0].unacked.values())[-1])) is wire.Push
    finally:
        agent.close()


def test_an_agent_told_to_send_maps_sends_maps_to_any_fleetd(tmp_path):
    agent = agent_of(tmp_path, wire_maps=True)
    try:
        agent.tick(agent.clock())
        welcome(agent, wire.COLUMNS)
        agent.add_events(collectives(200))
        agent.cycle(agent.clock())
        (push,) = [wire.decode(frames) for frames in agent.links[0].unacked.values()]
        assert type(push) is wire.Push and len(push.events) == 200
    finally:
        agent.close()
