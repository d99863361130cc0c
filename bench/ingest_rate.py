"""Sustained ingest rate: events per second from producers, through fleetd, into PostgreSQL.

Producers (separate processes, as agents on separate nodes would be) push batches of events
over the real protocol, each waiting for fleetd's ack before sending more than ``window``
pushes ahead. fleetd forwards to echod, which runs its embedded PostgreSQL (durable settings).
The rate is events stored over the time from the first push until the last event is in the
database; loss is checked by count. Needs root (echod's embedded cluster runs as postgres).
Run: ``.venv/bin/python bench/ingest_rate.py [--smoke]``.
"""

from __future__ import annotations

import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import text  # noqa: E402

from bench import harness  # noqa: E402
from echod.db import make_engine  # noqa: E402
from echod.embedded import EmbeddedPostgres  # noqa: E402
from ingero.launch import Daemon, KeyRing, free_port, stop_all, wait_for  # noqa: E402
from tests.support import Producer  # noqa: E402

NAME = "ingest_rate"
ROOT_BECAUSE = "echod's embedded PostgreSQL runs as postgres"
TARGET_PER_S = 100_000


def produce(endpoint: str, keys: KeyRing, node: str, pushes: int, per_push: int,
            window: int) -> None:
    producer = Producer(endpoint, keys, node)
    for _ in range(pushes):
        while producer.seq - len(producer.acked) >= window:
            producer.collect_acks(0.05)
        producer.push(per_push)
    producer.collect_acks(60)
    producer.close()


def stored(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM events")).scalar_one()


def run(args) -> dict:
    if args.smoke:
        args.producers, args.pushes = 2, 5
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
        total = args.producers * args.pushes * args.events_per_push
        workers = [multiprocessing.Process(target=produce, args=(
            fleet, keys, f"node{i}", args.pushes, args.events_per_push, args.window))
            for i in range(args.producers)]
        started = time.monotonic()
        for worker in workers:
            worker.start()
        wait_for(lambda: stored(engine) >= total, args.timeout, 0.2)
        elapsed = time.monotonic() - started
        for worker in workers:
            worker.join(60)
        count = stored(engine)
        engine.dispose()
    finally:
        stop_all(daemons[1:])
        stop_all(daemons[:1])
        database.stop()
        shutil.rmtree(root, ignore_errors=True)
    return {"producers": args.producers, "events_sent": total, "events_stored": count,
            "lost": total - count, "seconds": round(elapsed, 2),
            "events_per_second": round(count / elapsed)}


def add_arguments(parser) -> None:
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--pushes", type=int, default=50, help="pushes per producer")
    parser.add_argument("--events-per-push", type=int, default=500)
    parser.add_argument("--window", type=int, default=4, help="unacked pushes per producer")
    parser.add_argument("--timeout", type=float, default=600)


def summary(result: dict) -> str:
    return (f"{result['events_per_second']:,} events/s stored from {result['producers']} "
            f"producers through fleetd into PostgreSQL, {result['lost']} lost "
            f"(target {TARGET_PER_S:,})")


def section(result: dict) -> str:
    return "\n\n".join([
        "## Sustained ingest: `ingest_rate.py`",
        f"{result['producers']} producer processes push batches of events over the real "
        "protocol (CURVE, acks, a few pushes ahead each) to fleetd, which spools them and "
        "forwards them to echod on its embedded PostgreSQL (durable settings). The rate is "
        "events stored over the time from the first push until the last event is in the "
        "database; loss is checked by counting rows. Producers, fleetd, echod and PostgreSQL "
        "share the machine.",
        harness.table(["events sent", "stored", "lost", "seconds", "events/s", "target"], [[
            f"{result['events_sent']:,}", f"{result['events_stored']:,}", result["lost"],
            result["seconds"], f"{result['events_per_second']:,}", f"{TARGET_PER_S:,}"]]),
        harness.against("sustained ingest", result["events_per_second"], TARGET_PER_S,
                        "events/s", True),
        harness.measured_line(result)])


if __name__ == "__main__":
    sys.exit(harness.main(sys.modules[__name__]))
