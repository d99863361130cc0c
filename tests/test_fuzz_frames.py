"""100,000 random and mutated frames at a live fleetd: it stays up, its memory bounded, and its
books balance (echod's own: test_echod_ingest)."""

import random
import time

import msgpack
import zmq

from ingero import columns, wire
from ingero.errors import FrameError
from stack.launch import free_port, wait_for

from .support import scrape

FRAMES = 100_000
MAX_FRAME = 65_536
SIG = {"throughput": 0.9, "compute": 0.9, "memory": 0.9, "cpu": 0.9}


def random_message(rnd):
    """A well-formed message of any type, from a fuzz node of its own."""
    node = f"fuzz{rnd.randrange(50)}"
    kind = rnd.randrange(6)
    if kind == 5:
        return column_push(rnd, node)
    if kind == 0:
        return wire.Hello(node, "fuzz", "b", ["synthetic"], 1.0)
    if kind == 1:
        return wire.Push(rnd.randrange(10**6), node, "fuzz", "b", rnd.random(), SIG, "active",
                         time.time(), 1.0, None, None,
                         [{"id": f"{node}:b:{rnd.randrange(10**9)}", "t": 1.0, "kind": "k",
                           "attrs": {"x": rnd.random()}}])
    if kind == 2:
        return wire.Query("cluster:fuzz")
    if kind == 3:
        return wire.Heartbeat(time.time())
    return wire.Reply(1, "c", 0.5, True, False, False, 1.0, 1.0, 1.0)


def column_push(rnd, node: str) -> wire.ColumnPush:
    """A push of columns: collectives and syncs of a few ranks, as ingerod sends them."""
    first = rnd.randrange(10**6)
    events = [{"id": f"{node}:b:{first + k}", "t": 1.0 + k / 100,
               "kind": rnd.choice(["collective", "sync", "alloc", "preempted"]),
               "attrs": {"rank": rnd.randrange(8), "job": rnd.choice(["1", "2"]),
                         "comm_hash": rnd.choice(["00000000c0ffee00", "0000000000000000"]),
                         "seq": k, "comm_rank": rnd.randrange(-1, 8), "nranks": 8,
                         "op": rnd.choice(["ncclAllReduce", "ncclSend"]), "peer": 1,
                         "duration_ns": rnd.randrange(10**6), "pid": 1000,
                         "peer_wait": rnd.random() < 0.5}}
              for k in range(rnd.randrange(1, 40))]
    return wire.ColumnPush(rnd.randrange(10**6), node, "fuzz", "b", rnd.random(), SIG,
                           "active", time.time(), 1.0, None, None, [], None, None,
                           columns.encode(events))


def mutate_column(rnd, body: bytes) -> bytes:
    """One column of a push of columns made wrong: garbage, cut short, another code."""
    values = msgpack.unpackb(body)
    attrs = values["columns"]["attrs"]
    name = rnd.choice(list(attrs))
    code, data, present, strings = attrs[name]
    attrs[name] = rnd.choice([rnd.choice(GARBAGE), [code, data[:-1], present, strings],
                              [rnd.choice(["s1", "f8", "u1", "zz"]), data, present, strings],
                              [code, data, b"\x01", strings]])
    return msgpack.packb(values, use_bin_type=True)


GARBAGE = [None, True, -1, 2**63 - 1, 1.5, float("nan"), float("inf"), "", "x" * 300,
           b"\x00\xff", [], [1, [2, [3]]], {}, {"a": {"b": {}}}]


def mutate(rnd, frames):
    header, body = frames
    if header[6] == wire.ColumnPush.TYPE and rnd.random() < 0.3:
        return [header, mutate_column(rnd, body)]
    choice = rnd.randrange(8)
    if choice == 0:  # flip bytes anywhere
        data = bytearray(header + body)
        for _ in range(rnd.randint(1, 4)):
            data[rnd.randrange(len(data))] = rnd.randrange(256)
        return [bytes(data[:8]), bytes(data[8:])]
    if choice == 1:  # truncate the body
        return [header, body[:rnd.randrange(len(body))]]
    if choice == 2:  # replace, drop or add a field
        values = msgpack.unpackb(body)
        key = rnd.choice(list(values) + ["extra"])
        if rnd.random() < 0.3:
            values.pop(key, None)
        else:
            values[key] = rnd.choice(GARBAGE)
        return [header, msgpack.packb(values, use_bin_type=True)]
    if choice == 3:  # another version or type in the header
        return [header[:4] + bytes([rnd.choice([0, 1, 2, 255]), 0, rnd.randrange(12), 0]), body]
    if choice == 4:  # too many or too few frames
        return rnd.choice([[header], [header, body, body], [header, b"", body, b""]])
    if choice == 5:  # oversized, still under the transport's hard limit
        return [header, body + b"\x00" * (MAX_FRAME - len(body) + rnd.randrange(1, 512))]
    if choice == 6:  # random bytes
        return [rnd.randbytes(rnd.randrange(0, 16)), rnd.randbytes(rnd.randrange(0, 200))]
    return frames  # unchanged: well-formed


def test_fleetd_survives_100k_bad_frames_and_keeps_answering(spawn, keys, endpoint):
    port = free_port()
    fleetd = spawn("fleetd", "fleetd", [
        "--bind", endpoint, "--metrics-addr", f"127.0.0.1:{port}", "--max-frame-bytes",
        str(MAX_FRAME), *keys.fleetd_flags()])
    agent = spawn("agent", "ingerod", [
        "--source", "synthetic", "--node", "good", "--cluster", "good", "--fleet", endpoint,
        "--push-interval", "0.2", "--heartbeat-interval", "0.1", "--metrics-addr", "none",
        "--warmup", "0", *keys.ingerod_flags()])
    assert wait_for(lambda: scrape(port).get(("ingero_fleet_batches_accepted_total", ())), 30)

    rnd = random.Random(20261121)
    context = zmq.Context()
    fuzzer = context.socket(zmq.DEALER)
    fuzzer.linger = 0
    (keypair, server) = keys.client_keys()
    fuzzer.curve_publickey, fuzzer.curve_secretkey = keypair
    fuzzer.curve_serverkey = server
    fuzzer.connect(endpoint)
    expected_bad, expected_good = 0, 0
    for _ in range(FRAMES):
        frames = mutate(rnd, wire.encode(random_message(rnd)))
        try:
            message = wire.decode(frames, MAX_FRAME)
            if not isinstance(message, (wire.Hello, wire.Push, wire.Query, wire.Heartbeat)):
                raise FrameError("not a message fleetd takes from an agent")
            expected_good += 1
        except FrameError:
            expected_bad += 1
        fuzzer.send_multipart(frames)

    # The link is FIFO: once the sentinel query is answered, every fuzz frame was handled.
    fuzzer.send_multipart(wire.encode(wire.Query("cluster:good")))
    answered = None
    while answered is None and fuzzer.poll(120_000):
        message = wire.decode(fuzzer.recv_multipart())
        if isinstance(message, wire.Status) and message.cohort == "cluster:good":
            answered = message
    assert answered is not None and answered.active_nodes == 1
    assert fleetd.alive() and agent.alive()
    pushes = scrape(port)[("ingero_fleet_batches_accepted_total", ())]
    assert wait_for(lambda: scrape(port)[("ingero_fleet_batches_accepted_total", ())]
                    >= pushes + 3, 10), "the well-formed agent stopped getting answers"

    agent.stop()
    m = scrape(port)
    received = m[("ingero_fleet_frames_received_total", ())]
    rejected = sum(v for (name, _), v in m.items() if name == "ingero_fleet_frames_rejected_total")
    handled = sum(v for (name, _), v in m.items() if name == "ingero_fleet_messages_total")
    assert received == rejected + handled, "every frame is either handled or rejected"
    assert rejected == expected_bad, "fleetd rejected exactly the frames the protocol forbids"
    assert handled >= expected_good + 1
    reasons = {dict(labels)["reason"] for (name, labels), _ in m.items()
               if name == "ingero_fleet_frames_rejected_total"}
    assert {"bad_schema", "bad_msgpack", "frame_count", "too_large", "bad_version",
            "bad_type", "unexpected_type", "bad_column"} <= reasons

    assert "internal error" not in fleetd.log()
    assert fleetd.log().count("dropped a bad frame") < 100
    with open(f"/proc/{fleetd.process.pid}/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    assert peak < 512 * 1024, f"fleetd's peak resident memory {peak} KiB"
    fuzzer.close()
    context.term()


def test_a_string_rank_is_a_bad_frame_and_every_other_job_is_still_judged(spawn, keys,
                                                                         endpoint):
    """A push that passes the schema but for one attribute fleetd reads (a string rank) is
    refused whole at decode and counted; the jobs of the well-formed pushes are judged."""
    port = free_port()
    fleetd = spawn("fleetd", "fleetd", [
        "--bind", endpoint, "--metrics-addr", f"127.0.0.1:{port}", "--recompute-interval",
        "0.2", *keys.fleetd_flags()])
    context = zmq.Context()
    (keypair, server) = keys.client_keys()

    def dealer():
        socket = context.socket(zmq.DEALER)
        socket.linger = 0
        socket.curve_publickey, socket.curve_secretkey = keypair
        socket.curve_serverkey = server
        socket.connect(endpoint)
        return socket

    t0 = time.time() - 3

    def push(node: str, job: str, ranks, rank_of=lambda r: r) -> list[bytes]:
        events = [{"id": f"{node}:b:{s}:{r}", "kind": "collective",
                   "t": t0 + s * 0.05 + (0.2 if r == 5 and s >= 10 else 0.0),
                   "attrs": {"op": "ncclAllReduce", "comm_hash": "00000000000000aa", "seq": s,
                             "comm_rank": r, "nranks": 8, "rank": rank_of(r), "job": job,
                             "pid": 100 + r}}
                  for s in range(40) for r in ranks]
        before = time.time() - 1        # the exchange of a push before: clocks known
        return wire.encode(wire.Push(0, node, "c", "b", 0.9, SIG, "active", time.time(), 1.0,
                                     events=events, clock=[before, before, before,
                                                           before + 0.0002]))

    bad, good = dealer(), [dealer(), dealer()]
    bad.send_multipart(push("n9", "9", range(8), rank_of=str))
    for socket, (node, ranks) in zip(good, (("n0", range(4)), ("n1", range(4, 8)))):
        socket.send_multipart(push(node, "1", ranks))
        assert socket.poll(10_000), "the well-formed pushes are answered"

    def raised() -> float:
        return sum(v for (name, _), v in scrape(port).items()
                   if name == "ingero_fleet_rank_verdicts_raised_total")

    assert wait_for(lambda: raised() >= 1, 15), fleetd.log()
    m = scrape(port)
    assert m[("ingero_fleet_frames_rejected_total", (("reason", "bad_schema"),))] == 1
    assert "events[0].attrs.rank" in fleetd.log() and "internal error" not in fleetd.log()
    assert m.get(("ingero_fleet_analysis_errors_total", ()), 0) == 0
    assert not bad.poll(500), "a refused push is not acknowledged"
    context.destroy()
