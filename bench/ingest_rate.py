"""Sustained ingest rate: events per second from producers, through fleetd, into PostgreSQL.

Producers (separate processes, as agents on separate nodes would be) push batches of events
over the real protocol, each waiting for fleetd's ack before sending more than ``window``
pushes ahead. A push is one second of an 8-GPU node at the reference mix (``push_cost``: the
events ingerod sends, tagged as it tags them), as columns (``--form maps``: as before wire
1.3); each producer encodes its pushes before the clock starts (``push_cost`` measures the
agents' encoding), and its CPU from the start on is counted.
fleetd forwards to echod, which runs its embedded PostgreSQL (durable settings). The rate is
events stored over the time from the first push until the last event is in the database;
loss is checked by count. Needs root (echod's embedded cluster runs as postgres).
Run: ``.venv/bin/python -m bench.ingest_rate [--smoke] [--form maps]``.
"""

from __future__ import annotations

import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path


from sqlalchemy import text

from bench import harness, push_cost
from echod.store.db import make_engine
from echod.embedded import EmbeddedPostgres
from stack.launch import Daemon, KeyRing, free_port, stop_all, wait_for
from tests.support import Producer

NAME = "ingest_rate"
ROOT_BECAUSE = "echod's embedded PostgreSQL runs as postgres"
TARGET_PER_S = 100_000


def produce(endpoint: str, keys: KeyRing, node: int, pushes: int, form: str, window: int,
            base: float, ready, spent) -> None:
    """Encode the pushes, wait for the start, send them; say the CPU spent since the start
    (sending, CURVE: the encoding is the agents' and ``push_cost`` measures it)."""
    mix, _ = push_cost.reference_mix()
    frames = [push_cost.frames_of(node, second, mix, form, base) for second in range(pushes)]
    producer = Producer(endpoint, keys, f"node{node}", cluster="bench")
    ready.wait()
    began = time.process_time()
    for push in frames:
        while producer.seq - len(producer.acked) >= window:
            producer.collect_acks(0.05)
        producer.send(push)
    producer.collect_acks(60)
    producer.close()
    spent.put(time.process_time() - began)


def per_push() -> int:
    """Events in one push: one second of an 8-GPU node at the reference mix."""
    return len(push_cost.node_second(0, 0, push_cost.reference_mix()[0]))


def stored(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM events")).scalar_one()


SIZES = """
SELECT (SELECT sum(pg_total_relation_size(i.inhrelid)) FROM pg_inherits i
        WHERE i.inhparent = 'event_rows'::regclass),
       (SELECT count(*) FROM event_rows),
       (SELECT sum(pg_total_relation_size(i.inhrelid)) FROM pg_inherits i
        WHERE i.inhparent = 'event_chunks'::regclass),
       (SELECT coalesce(sum(cardinality(ts)), 0) FROM event_chunks)
"""


def stored_bytes(engine) -> dict:
    """What the stored events take on disk with their indexes: those kept a row each, and
    those kept in chunks (echod/chunks.py)."""
    with engine.connect() as connection:
        rows, row_events, chunks, chunked = connection.execute(text(SIZES)).one()
    return {"rows": int(rows or 0), "row_events": int(row_events),
            "chunks": int(chunks or 0), "chunked_events": int(chunked)}


def last_events(producers: int, pushes: int, base: float) -> list[dict]:
    """Each producer's last event."""
    mix, _ = push_cost.reference_mix()
    return [{**last, "node": f"node{node}", "rank": last["attrs"]["rank"]}
            for node in range(producers)
            for last in [push_cost.node_second(node, pushes - 1, mix, base)[-1]]]


# An event stored: as a row (by the primary key), or in a chunk of its node, rank and kind
# begun at most a minute before it (echod.chunks).
STORED = """
SELECT EXISTS (SELECT 1 FROM event_rows WHERE id = :id AND t BETWEEN
               to_timestamp(:t) - interval '1 second' AND to_timestamp(:t) + interval '1 second')
    OR EXISTS (SELECT 1 FROM event_chunks WHERE cluster = 'bench' AND node = :node
               AND t BETWEEN to_timestamp(:t) - interval '61 seconds'
                         AND to_timestamp(:t) + interval '1 second'
               AND kind = :kind AND rank = :rank
               AND CAST(split_part(:id, ':', 3) AS bigint) = ANY (numbers))
"""


def have_all(engine, events: list[dict]) -> bool:
    """Whether every one of ``events`` is stored (looked up by what indexes them: counting
    every event each poll cost PostgreSQL a quarter of what it spent here)."""
    with engine.connect() as connection:
        return all(connection.execute(text(STORED), {
            key: event[key] for key in ("id", "t", "node", "kind", "rank")}).scalar_one()
            for event in events)


def until_stored(engine, total: int, events: list[dict], timeout: float) -> None:
    """Wait until ``total`` events are stored: polling the producers' last events, cheap, and
    only then the count (the last pushes may commit before earlier ones)."""
    deadline = time.monotonic() + timeout
    wait_for(lambda: have_all(engine, events), timeout, 0.1)
    wait_for(lambda: stored(engine) >= total, max(0.0, deadline - time.monotonic()), 0.1)


def run(args) -> dict:
    """As columns, then the same pushes as maps (wire 1.2) in the same run; or ``--form``."""
    if args.smoke:
        args.producers, args.pushes, args.profile_s = 2, 3, 1.0
    result = ingest(args, args.form or "columns")
    if args.form is None:
        maps = ingest(args, "maps")
        result["maps"] = {key: maps[key] for key in (
            "events_stored", "lost", "seconds", "events_per_second", "cpu_us_per_event")}
    return result


def ingest(args, form: str) -> dict:
    root = Path(tempfile.mkdtemp(prefix="ingero-ingest-bench-"))
    root.chmod(0o755)
    keys = KeyRing.create(root / "keys")
    ingest, fleet = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    daemons = [Daemon.module("echod", "echod", [
        "--ingest-bind", ingest, "--state-dir", str(root / "state"), "--metrics-addr", "none",
        "--api-bind", "none",
        *keys.echod_flags()], root)]
    database = EmbeddedPostgres(root / "state" / "postgres")
    try:
        if not wait_for(lambda: "ingest listening" in daemons[0].log(), 120):
            raise RuntimeError(daemons[0].log())
        daemons.append(Daemon.module("fleetd", "fleetd", [
            "--bind", fleet, "--metrics-addr", "none", *keys.fleetd_flags(),
            *keys.forwarding_flags(ingest, root / "fleetd-spool")], root))
        engine = make_engine(database.start())
        total = args.producers * args.pushes * per_push()
        ready, spent = multiprocessing.Barrier(args.producers + 1), multiprocessing.Queue()
        base = time.time()
        workers = [multiprocessing.Process(target=produce, args=(
            fleet, keys, i, args.pushes, form, args.window, base, ready, spent))
            for i in range(args.producers)]
        postmaster = int((database.data_dir / "postmaster.pid").read_text().split()[0])
        cpu_before = cpu_by_part(daemons, postmaster)
        for worker in workers:
            worker.start()
        ready.wait()
        started = time.monotonic()
        profilers = {name: harness.profile(daemon.process.pid, args.profile_s,
                                           root / f"profile-{name}.txt")
                     for name, daemon in zip(("echod", "fleetd"), daemons)}
        until_stored(engine, total, last_events(args.producers, args.pushes, base),
                     args.timeout)
        elapsed = time.monotonic() - started
        cpu = {part: round(after - cpu_before[part], 2)
               for part, after in cpu_by_part(daemons, postmaster).items()}
        cpu["producers"] = round(sum(spent.get(timeout=120) for _ in workers), 2)
        for worker in workers:
            worker.join(60)
        count = stored(engine)
        kept = stored_bytes(engine)
        engine.dispose()
        profiles = {}
        for name, profiler in profilers.items():
            if profiler.wait(60):
                raise RuntimeError(f"py-spy failed on {name}: {profiler.stderr.read()}")
            profiles[name] = harness.profile_shares(root / f"profile-{name}.txt", top=8)
    finally:
        stop_all(daemons[1:])
        stop_all(daemons[:1])
        database.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {"producers": args.producers, "form": form, "events_per_push": per_push(),
            "events_sent": total, "events_stored": count, "stored_bytes": kept,
            "lost": total - count, "seconds": round(elapsed, 2),
            "events_per_second": round(count / elapsed), "cpu_seconds": cpu,
            "profile_s": args.profile_s, "profiles": profiles,
            "cpu_us_per_event": {part: round(seconds / count * 1e6, 2)
                                 for part, seconds in cpu.items()}}


def cpu_by_part(daemons: list[Daemon], postmaster: int) -> dict[str, float]:
    """CPU seconds so far of echod (without PostgreSQL, should echod be its parent),
    PostgreSQL (the postmaster and every backend) and fleetd."""
    echod, fleetd = daemons
    return {"echod": harness.tree_cpu_seconds(echod.process.pid, leave_out=postmaster),
            "postgres": harness.tree_cpu_seconds(postmaster),
            "fleetd": harness.tree_cpu_seconds(fleetd.process.pid)}


def add_arguments(parser) -> None:
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--pushes", type=int, default=30, help="pushes per producer")
    parser.add_argument("--form", choices=("columns", "maps"),
                        help="only pushes of columns (wire 1.3) or of maps (before); "
                             "default: both, one after the other")
    parser.add_argument("--window", type=int, default=4, help="unacked pushes per producer")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--profile-s", type=float, default=4.0,
                        help="sample fleetd's and echod's stacks with py-spy this long")


def summary(result: dict) -> str:
    maps = result.get("maps")
    return (f"{result['events_per_second']:,} events/s stored from {result['producers']} "
            f"producers through fleetd into PostgreSQL as {result['form']}, {result['lost']} "
            f"lost (target {TARGET_PER_S:,})" + (
                f"; as maps {maps['events_per_second']:,} events/s, {maps['lost']} lost"
                if maps else ""))


def against_maps(result: dict) -> list[str]:
    """The same pushes as maps, in the same run: what wire 1.3 changed, part by part."""
    maps = result.get("maps")
    if not maps:
        return []
    parts = [part for part, _ in PARTS]
    return ["The same pushes sent as maps (wire 1.2), in the same run:",
            harness.table(["form", "stored", "lost", "events/s", *(
                f"{part} µs/event" for part in parts)], [
                [form, f"{r['events_stored']:,}", r["lost"], f"{r['events_per_second']:,}",
                 *(r["cpu_us_per_event"][part] for part in parts)]
                for form, r in ((result["form"], result), ("maps", maps))])]


def section(result: dict) -> str:
    return "\n\n".join([
        "## Sustained ingest: `ingest_rate.py`",
        f"{result['producers']} producer processes push batches of events over the real "
        "protocol (CURVE, acks, a few pushes ahead each) to fleetd, which spools them and "
        "forwards them to echod on its embedded PostgreSQL (durable settings). A push is one "
        f"second of an 8-GPU node at the reference mix, {result.get('events_per_push', '?'):,} "
        f"events as ingerod tags them, sent as {result.get('form', 'maps')} (each producer "
        "encodes its pushes before the clock starts: push_cost measures the agents' "
        "encoding; what follows counts their CPU from the start on). The rate is "
        "events stored over the time from the first push until the last event is in the "
        "database; loss is checked by counting rows. Producers, fleetd, echod and PostgreSQL "
        "share the machine.",
        harness.table(["events sent", "stored", "lost", "seconds", "events/s", "target"], [[
            f"{result['events_sent']:,}", f"{result['events_stored']:,}", result["lost"],
            result["seconds"], f"{result['events_per_second']:,}", f"{TARGET_PER_S:,}"]]),
        harness.against("sustained ingest", result["events_per_second"], TARGET_PER_S,
                        "events/s", True),
        *against_maps(result),
        *bounds(result),
        harness.measured_line(result)])


PARTS = (("producers", "producers (the agents' side: sending, CURVE)"),
         ("fleetd", "fleetd (checking, spooling, forwarding)"),
         ("echod", "echod (checking rows, binary COPY)"),
         ("postgres", "PostgreSQL (staging, insert, indexes, WAL)"))


def waiting(result: dict, busy: float, cpus: int) -> list[str]:
    """When the CPUs were not all busy, the rest of the bound is waiting: say what is known."""
    if busy >= 0.8 * cpus:
        return []
    postgres = result["cpu_seconds"]["postgres"] / result["seconds"]
    return [f"With {cpus - busy:.2f} CPUs idle, the rest of the bound is waiting, not work. "
            f"PostgreSQL was busy {postgres:.2f} CPUs of the run: echod writes each batch in "
            "one transaction on one connection, so one backend does the inserting, and at "
            f"{result['cpu_us_per_event']['postgres']} µs an event it alone allows "
            f"{1e6 / result['cpu_us_per_event']['postgres']:,.0f} events/s. Several writers, "
            "each with a backend of its own, would use the idle CPU; fewer index entries and "
            "bytes per raw event would lower the bound itself."]


def bounds(result: dict) -> list[str]:
    """What the rate is made of: each part's CPU per stored event, and the rate those allow."""
    per_event = result.get("cpu_us_per_event")
    if not per_event:
        return []
    total = sum(per_event.values())
    cpus = result["measured"]["cpus"]
    busy = sum(result["cpu_seconds"].values()) / result["seconds"]
    return [
        "CPU time each part spent per stored event, over the whole run:",
        harness.table(["part", "µs of CPU per event", "share"], [
            [label, per_event[part], f"{per_event[part] / total:.0%}"] for part, label in PARTS
        ] + [["all", round(total, 2), "100%"]]),
        f"The run kept {busy:.2f} of the {cpus} CPUs busy. At {total:.1f} µs of CPU per event "
        f"the {cpus} CPUs allow at most {cpus / total * 1e6:,.0f} events/s whatever the "
        f"pipeline's shape; {TARGET_PER_S:,} events/s on this machine needs "
        f"{cpus / TARGET_PER_S * 1e6:.0f} µs an event for everything, agents included. On a "
        "head node the agents' share is on the compute nodes, and PostgreSQL and echod can "
        "have cores of their own (the model at the end of this page).",
        *waiting(result, busy, cpus),
        *[part for name, shares in result.get("profiles", {}).items() if shares for part in (
            f"Where {name}'s CPU went in the first {result['profile_s']:g} s (py-spy; a "
            "function's share of the busy samples includes what it called):",
            harness.table(["function", "share"], [[f"`{p['function']}`", f"{p['share']:.0%}"]
                                                  for p in shares]))]]


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
