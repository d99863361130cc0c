"""``ingerod trace``: the traced events, live, for an operator at a terminal (like a bcc tool)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import click

HOST_EVERY = 1.0  # seconds between summaries of preemption and block I/O
COLUMNS = ("TIME", "KIND", "OP", "PID", "RANK", "COMM", "SEQ", "BYTES", "DUR_US", "NOTE")
WIDTHS = (12, 12, 22, 7, 4, 16, 5, 11, 9, 0)


def note(attrs: dict) -> str:
    if attrs.get("peer_wait"):
        return "waits on peers"
    if "preemptor_comm" in attrs:
        return f"preempted by {attrs['preemptor_comm']}({attrs['preemptor_pid']}) x{attrs['count']}"
    for key in ("direction", "peer", "root"):
        if key in attrs:
            return f"{key} {attrs[key]}"
    return ""


def row(event: dict) -> str:
    a = event["attrs"]
    duration = a.get("duration_ns")
    cells = (time.strftime("%H:%M:%S", time.localtime(event["t"])) + f".{int(event['t'] % 1 * 1000):03d}",
             event["kind"], a.get("op", "-"), a.get("pid", "-"), a.get("rank", "-"),
             a.get("comm_hash", "-"), a.get("seq", "-"), a.get("bytes", "-"),
             "-" if duration is None else f"{duration / 1000:.0f}", note(a))
    return " ".join(f"{str(c):<{w}}" if w else str(c) for c, w in zip(cells, WIDTHS))


def run_trace(cfg: SimpleNamespace, as_json: bool, duration: float | None, flags) -> None:
    from .ebpf_source import EbpfSource, wall_offset_ns

    source = EbpfSource(cfg, time.monotonic())
    deadline = None if duration is None else time.monotonic() + duration
    shown, next_host = 0, time.monotonic() + HOST_EVERY
    if not as_json:
        click.echo(" ".join(f"{c:<{w}}" if w else c for c, w in zip(COLUMNS, WIDTHS)))
    click.echo("tracing; Ctrl-C to stop", err=True)
    try:
        while True:
            stopping = flags.stop or (deadline is not None and time.monotonic() >= deadline)
            source.poll(time.monotonic())
            events = source.take_events(wall_offset_ns())
            if stopping or time.monotonic() >= next_host:
                events += source.host_evidence(wall_offset_ns())
                next_host = time.monotonic() + HOST_EVERY
            for event in events:
                click.echo(json.dumps(event) if as_json else row(event))
                shown += 1
            if stopping:  # the pass above emptied the ring buffer one last time
                break
            time.sleep(0.1)
    finally:
        lost = source.lost_events()
        source.close()
    click.echo(f"{shown} events shown, {lost} lost", err=True)
