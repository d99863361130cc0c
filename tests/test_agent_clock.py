"""The four times of a push/reply exchange bracket what they time, whatever the agent's CPU
does between them: fleetd's estimate of the node's clock, and the uncertainty it claims, rest
on that. Driven through the agent itself (its link to fleetd), fleetd's endpoint unanswered
and its reply handed to the link as the socket would."""

from __future__ import annotations

import time

from ingero import wire
from ingero.analysis.clock import exchange

from .test_agent_backlog import agent_of, welcome

PREEMPTED_S = 0.03      # the agent loses its CPU right after ZeroMQ took the push


class PreemptedAfterSend:
    """The agent's socket, as on a busy node: the push leaves (ZeroMQ's I/O thread has it)
    when send_multipart is called, and the agent's thread gets its CPU back only later."""

    def __init__(self, socket):
        self.socket, self.left_at = socket, []

    def send_multipart(self, frames, flags=0):
        self.left_at.append(time.time())
        time.sleep(PREEMPTED_S)

    def __getattr__(self, name):
        return getattr(self.socket, name)


def test_a_preempted_send_widens_the_exchange_instead_of_biasing_the_offset(tmp_path):
    agent = agent_of(tmp_path)
    try:
        agent.tick(agent.clock())                 # connects
        welcome(agent)                            # fleetd answers the hello, and no more
        link = agent.links[0]
        link.socket = socket = PreemptedAfterSend(link.socket)
        agent.cycle(agent.clock())
        seq = next(iter(link.unacked))
        left = socket.left_at[0]
        # fleetd (this host's clock: the true offset is 0) takes the push 1 ms after it left
        # and answers at once; the agent, busy, reads the reply when its loop gets there
        reply = wire.Reply(ack=seq, cohort="c", threshold=None, quorum_met=False, panic=False,
                           straggler=False, recv_at=left + 0.001, sent_at=left + 0.0011,
                           agent_sent_at=left)
        link._decode(wire.encode(reply), time.time())
        link.socket = socket.socket
        offset, round_trip = exchange(*link.exchange)
        assert abs(offset) <= round_trip / 2, (
            f"the exchange says the node's clock is {offset * 1e3:+.2f} ms off, give or take "
            f"{round_trip / 2 * 1e3:.2f} ms; it is this host's own clock: 0")
    finally:
        agent.close()


def test_a_push_sent_before_fleetd_is_heard_gives_no_exchange(tmp_path):
    """A push sent while the link is down waits in ZeroMQ's queue until it comes up: its send
    time is not when it left, and the reply to it times nothing. The node's clock stays not
    known until a push sent once fleetd answers comes back."""
    agent = agent_of(tmp_path)
    try:
        agent.tick(agent.clock())                 # connects; fleetd is not heard from
        agent.cycle(agent.clock())
        link = agent.links[0]
        seq = next(iter(link.unacked))
        now = time.time()
        reply = wire.Reply(ack=seq, cohort="c", threshold=None, quorum_met=False, panic=False,
                           straggler=False, recv_at=now, sent_at=now, agent_sent_at=now)
        link._decode(wire.encode(reply), now)
        assert link.exchange is None, link.exchange
        agent.cycle(agent.clock() + 10)            # fleetd is heard now: the next push is timed
        seq = list(link.unacked)[-1]
        reply = wire.Reply(ack=seq, cohort="c", threshold=None, quorum_met=False, panic=False,
                           straggler=False, recv_at=now, sent_at=now, agent_sent_at=now)
        link._decode(wire.encode(reply), time.time())
        assert link.exchange is not None
    finally:
        agent.close()
