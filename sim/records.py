"""Reading a rank's ground-truth record (JSON lines written by ingero-sim-rank).

Collective lines ({"type": "collective"}) carry: op (the NCCL function name), rank, nranks,
local_rank, node, job_id, pid, comm_id_hash, seq (per communicator, from 0), step, count,
datatype ("ncclFloat32"), datatype_id, bytes (count × sizeof(datatype)), root and peer (-1 where
the call has none), entry_ns and return_ns (CLOCK_MONOTONIC around the call), result.
The summary line ({"type": "summary"}) carries: status ("ok" or "error"), error, steps,
steps_done, collectives, start_ns, end_ns, step_ns and sync_wait_ns (one per finished step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Record:
    collectives: list[dict]
    summary: dict | None      # None when the rank died or hung before writing it

    def ops(self, op: str) -> list[dict]:
        return [c for c in self.collectives if c["op"] == op]

    def at_step(self, step: int, op: str = "ncclAllReduce") -> dict | None:
        return next((c for c in self.collectives if c["op"] == op and c["step"] == step), None)


def read_record(path: str | Path) -> Record:
    """Parse a record file; a torn last line (a rank killed mid-write) is ignored."""
    collectives, summary = [], None
    text = Path(path).read_text() if Path(path).exists() else ""
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if entry.get("type") == "collective":
            collectives.append(entry)
        elif entry.get("type") == "summary":
            summary = entry
    return Record(collectives, summary)
