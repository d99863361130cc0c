"""Sustained ingest rate: events per second from producers, through fleetd, into PostgreSQL.

Producers (separate processes, as agents on separate nodes would be) push batches of events
over the real protocol, each waiting for fleetd's ack before sending more than ``window``
pushes ahead. fleetd forwards to echod, which runs its embedded PostgreSQL (durable settings).
The rate is events stored over the time from the first push until the last event is in the
database; loss is checked by count. Needs root (echod's embedded cluster runs as postgres).
Run: ``.venv/bin/python bench/ingest_rate.py``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sqlalchemy import text  # noqa: E402

from bench.report import run_and_report  # noqa: E402
from echod.db import make_engine  # noqa: E402
from echod.embedded import EmbeddedPostgres  # noqa: E402
from ingero.launch import Daemon, KeyRing, free_port, stop_all, wait_for  # noqa: E402
from tests.support import Producer  # noqa: E402


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--producers", type=int, default=8)
    parser.add_argument("--pushes", type=int, default=50, help="pushes per producer")
    parser.add_argument("--events-per-push", type=int, default=500)
    parser.add_argument("--window", type=int, default=4, help="unacked pushes per producer")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    run_and_report(__file__, "echod's embedded PostgreSQL runs as postgres", run, args)


if __name__ == "__main__":
    main()
