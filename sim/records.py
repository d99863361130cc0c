"""Reading a rank's ground-truth record (JSON lines written by ingero-sim-rank).

Collective lines ({"type": "collective"}) carry: op (the NCCL function name), rank, nranks,
local_rank, node, job_id, pid, comm_id_hash, seq (per communicator, from 0), step, count,
datatype ("ncclFloat32"), datatype_id, bytes (count × sizeof(datatype)), root and peer (-1 where
the call has none), entry_ns and return_ns (CLOCK_MONOTONIC around the call), result.
The summary line ({"type": "summary"}) carries: status ("ok" or "error"), error, steps,
steps_done, collectives, start_ns, end_ns, launches (kernel launches made by cudaLaunchKernel
and by cuLaunchKernelEx), and one value per finished step of each of: step_ns,
sync_wait_ns (the step's last sync), loss_sync_ns (the loss read's sync on the rank's own
kernels, entry to return; 0 where the step read no loss) and loss_device_ns (of that, how long
until the device was done: the rest is how late the host got back its CPU; -1 where the
libcudart is not the sim's).
"""

from __future__ import annotations

import json
import statistics
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


def entry_lags(paths: dict[int, str | Path], op: str = "ncclAllReduce") -> dict[int, float]:
    """Each rank's median lag (seconds) entering ``op`` behind the median of all ranks' entries
    at the same step, from their records (``paths``: rank → record): how late each rank
    really was in the job as it ran, whatever the machine around it did. The entry times are
    CLOCK_MONOTONIC, so ranks compared must share one host (the sim's nodes do)."""
    return {rank: statistics.median(values)
            for rank, values in step_lags(paths, op).items() if values}


def step_lags(paths: dict[int, str | Path], op: str = "ncclAllReduce") -> dict[int, list[float]]:
    """Each rank's lag (seconds) entering ``op`` at every step all ranks entered it, behind the
    median of all ranks' entries there (``entry_lags`` takes their median)."""
    entries = {rank: {c["step"]: c["entry_ns"] for c in read_record(path).ops(op)}
               for rank, path in paths.items()}
    steps = sorted(set.intersection(*(set(e) for e in entries.values()))) if entries else []
    lags: dict[int, list[float]] = {rank: [] for rank in entries}
    for step in steps:
        median = statistics.median(e[step] for e in entries.values())
        for rank, e in entries.items():
            lags[rank].append((e[step] - median) / 1e9)
    return lags
