"""One process of fleet_scale.py's load generator: COUNT agents speaking the real protocol.

Each agent is a DEALER socket with CURVE, as ingerod's is. It says Hello, waits for Welcome,
then pushes once a second at its own phase (the agents of all processes spread evenly over
the second) for DURATION seconds, and times each push from its send to fleetd's reply. The
pushes are what a node of an 8-rank job pushes each second (``--events`` of them: collective
entries with the communicator and sequence fleetd aligns, and syncs); their messages are
built as msgpack maps directly, the same bytes ``wire.encode`` makes, without its dataclass
copy, so that the generator is not what is measured. ENDPOINT may list several fleetd
shards, comma-separated in shard order: each agent then pushes to its job's owner
(``ingero.shards``), as ingerod does. Prints one JSON line at the end:
latencies (ms), pushes sent and answered, how late the sends ran behind their schedule, and
the process's CPU seconds.

    python -m bench.fleet_load ENDPOINT AGENT_SECRET FLEET_PUBLIC COUNT FIRST TOTAL DURATION \\
        EVENTS RANKS_PER_JOB
"""

from __future__ import annotations

import heapq
import json
import resource
import sys
import time
import uuid
from pathlib import Path

import msgpack
import zmq


from ingero import __version__, curve, shards, wire

RANKS_PER_NODE = 8
SIGNALS = dict.fromkeys(wire.SIGNALS, 0.9)
PUSH_HEADER = wire.encode(wire.Push(0, "n", "c", "b", 0.9, SIGNALS, "active", 0.0, 1.0))[0]


class Agent:
    """One node: its socket, its job (``ranks_per_job`` ranks, 8 a node) and its counters."""

    def __init__(self, context: zmq.Context, endpoints: list[str], keys, index: int,
                 events: int, ranks_per_job: int):
        self.node = f"load-{index:05d}"
        self.boot = uuid.uuid4().hex[:16]
        nodes_per_job = max(1, ranks_per_job // RANKS_PER_NODE)
        self.job = str(100_000 + index // nodes_per_job)
        self.first_rank = (index % nodes_per_job) * RANKS_PER_NODE
        self.ranks_per_job = ranks_per_job
        self.comm = f"{int(self.job):016x}"
        self.events = events
        self.seq = self.collective_seq = self.event_seq = 0
        self.socket = context.socket(zmq.DEALER)
        self.socket.linger = 0
        curve.connect_curve(self.socket, *keys)
        self.socket.connect(endpoints[shards.owner("load", self.job, len(endpoints))])
        self.sent: dict[int, float] = {}

    def hello(self) -> None:
        self.socket.send_multipart(wire.encode(wire.Hello(
            self.node, "load", self.boot, [], 1.0, __version__)), zmq.NOBLOCK)

    def batch(self, now: float) -> list[dict]:
        """A second's events of this node's ranks: all-reduce entries, then a sync each."""
        out = []
        while len(out) < self.events:
            for local in range(RANKS_PER_NODE):
                rank = self.first_rank + local
                tags = {"rank": rank, "job": self.job, "pid": 10_000 + rank}
                kind = "collective" if len(out) % 2 == 0 else "sync"
                attrs = ({"op": "ncclAllReduce", "comm_hash": self.comm,
                          "seq": self.collective_seq, "comm_rank": rank,
                          "nranks": self.ranks_per_job, "bytes": 1 << 26, **tags}
                         if kind == "collective" else
                         {"duration_ns": 6_000_000, "peer_wait": False, **tags})
                out.append({"id": f"{self.node}:{self.boot}:{self.event_seq}",
                            "t": now - 0.5 + local * 1e-5, "kind": kind, "attrs": attrs})
                self.event_seq += 1
                if len(out) >= self.events:
                    break
            self.collective_seq += 1
        return out

    def push(self) -> None:
        now = time.time()
        body = msgpack.packb({
            "seq": self.seq, "node": self.node, "cluster": "load", "boot_id": self.boot,
            "score": 0.9, "signals": SIGNALS, "state": "active", "sent_at": now,
            "interval": 1.0, "job": None, "job_nodes": None, "events": self.batch(now),
            "clock": None}, use_bin_type=True)
        self.socket.send_multipart([PUSH_HEADER, body], zmq.NOBLOCK)
        self.sent[self.seq] = time.perf_counter()
        self.seq += 1


def main(endpoint: str, secret: str, public: str, count: int, first: int, total: int,
         duration: float, events: int, ranks_per_job: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))   # two descriptors a socket
    context = zmq.Context(io_threads=2)
    context.max_sockets = count + 16
    keys = (curve.load_keypair(Path(secret)), curve.load_public(Path(public)))
    agents = [Agent(context, endpoint.split(","), keys, first + i, events, ranks_per_job)
              for i in range(count)]
    poller = zmq.Poller()
    by_socket = {}
    for agent in agents:
        agent.hello()
        poller.register(agent.socket, zmq.POLLIN)
        by_socket[agent.socket] = agent
    welcomed, deadline = 0, time.monotonic() + 300
    while welcomed < count and time.monotonic() < deadline:
        for socket, _ in poller.poll(1000):
            if isinstance(wire.decode(socket.recv_multipart()), wire.Welcome):
                welcomed += 1
    if welcomed < count:
        sys.exit(f"only {welcomed} of {count} agents were welcomed")
    print(json.dumps({"welcomed": welcomed}), flush=True)
    sys.stdin.readline()                 # the parent starts every process's clock at once
    cpu_before = time.process_time()
    start = time.perf_counter()
    due = [(start + ((first + i) / total) % 1.0, i) for i in range(count)]
    heapq.heapify(due)
    end = start + duration
    latencies, behind, pushed = [], [], 0
    in_flight: dict[zmq.Socket, Agent] = {}
    while True:
        now = time.perf_counter()
        while due and due[0][0] <= now:
            at, i = heapq.heappop(due)
            if at >= end:
                due = []
                break
            behind.append(now - at)
            agents[i].push()
            in_flight[agents[i].socket] = agents[i]
            pushed += 1
            heapq.heappush(due, (at + 1.0, i))
        if not due and (now > end + 5 or not in_flight):
            break
        wait = 0.05 if not due else max(0.0, due[0][0] - time.perf_counter())
        # Only the agents with a push in flight can get an answer: polling those few, not
        # every socket, keeps the generator's cost per push flat as agents are added.
        waiting = [agent.socket for agent in in_flight.values()]
        ready = zmq.select(waiting, [], [], min(0.05, wait))[0] if waiting else \
            (time.sleep(min(0.05, wait)) or [])
        for socket in ready:
            agent = by_socket[socket]
            while True:
                try:
                    frames = socket.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                received = time.perf_counter()
                answer = msgpack.unpackb(frames[1], raw=False)
                sent = agent.sent.pop(answer.get("ack"), None)
                if sent is not None:
                    latencies.append((received - sent) * 1e3)
            if not agent.sent:
                in_flight.pop(socket, None)
    unanswered = sum(len(a.sent) for a in agents)
    print(json.dumps({"pushed": pushed, "answered": len(latencies), "unanswered": unanswered,
                      "latencies_ms": [round(x, 3) for x in latencies],
                      "behind_ms_p99": round(sorted(behind)[int(0.99 * (len(behind) - 1))]
                                             * 1e3, 3) if behind else 0.0,
                      "cpu_s": round(time.process_time() - cpu_before, 3)}), flush=True)
    for agent in agents:
        agent.socket.close(linger=0)
    context.term()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], *map(int, sys.argv[4:7]), float(sys.argv[7]),
         *map(int, sys.argv[8:10]))
