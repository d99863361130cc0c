"""The torchrun job ``bench/real_gpu.py`` reads with ingerod's discovery on a lent GPU machine:
one rank with NCCL, DDP and a DataLoader of two workers (``WORKER``), started, waited for,
scanned while it trains, and stopped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

JOB_SECONDS = 40           # how long the rank trains after its first step
SCANS = 5                  # discovery scans while the job trains
SCAN_EVERY_S = 5.0
STOP_TIMEOUT_S = 20        # SIGTERM to SIGKILL

WORKER = '''"""A torchrun rank: NCCL, DDP, a DataLoader with two workers; trains for argv[1] s."""
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 1 << 30

    def __getitem__(self, index):
        time.sleep(0.001)
        return torch.randn(256)


def main():
    seconds = float(sys.argv[1])
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 256)).to(device)
    model = DistributedDataParallel(model, device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = iter(torch.utils.data.DataLoader(Data(), batch_size=64, num_workers=2,
                                              persistent_workers=True,
                                              multiprocessing_context="fork"))
    steps, end = 0, None
    while end is None or time.time() < end:
        loss = model(next(loader).to(device, non_blocking=True)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps += 1
        if end is None:
            loss.item()
            print("READY", os.environ.get("RANK"), os.getpid(), flush=True)
            end = time.time() + seconds
        elif steps % 20 == 0:
            loss.item()
        time.sleep(0.01)
    print("DONE", steps, flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
'''


def start_job(folder: Path, log: Path) -> subprocess.Popen:
    """torchrun with one rank in its own session (so the whole tree can be stopped), its
    output to a file (a pipe nobody reads could stall it)."""
    worker = folder / "rank.py"
    worker.write_text(WORKER)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith(("TORCHELASTIC_", "SLURM_", "OMPI_", "PMIX_", "PMI_"))}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=1", str(worker), str(JOB_SECONDS)]
    with open(log, "wb") as out:
        return subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, cwd=folder)


def wait_ready(job: subprocess.Popen, log: Path, timeout: float) -> bool:
    """Whether the rank reports its first step before the timeout or the job's end."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "READY" in log.read_text(errors="replace"):
            return True
        if job.poll() is not None:
            return False
        time.sleep(0.5)
    return False


def stop_job(discovery: ModuleType, job: subprocess.Popen) -> int | None:
    """SIGTERM to torchrun's agent (it stops its workers), then SIGKILL to every process of
    the tree as it was before, by pid and only while its start time is unchanged: torchrun
    starts each worker in a session of its own, out of reach of a signal to the agent's group.
    Returns the agent's exit code."""
    proc = Path("/proc")
    tree = {pid: discovery.start_time(proc, pid) for pid in descendants(discovery, job.pid)}
    try:
        job.send_signal(signal.SIGTERM)
        job.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    for pid, started in tree.items():
        if started is not None and discovery.start_time(proc, pid) == started:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        return job.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return None


def descendants(discovery: ModuleType, root: int) -> set[int]:
    """The root and every process below it now, from each process's parent in /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            parents[int(entry.name)] = discovery.read_stat(Path("/proc"), int(entry.name))[0]
    tree, grew = {root}, True
    while grew:
        more = {pid for pid, ppid in parents.items() if ppid in tree} - tree
        tree |= more
        grew = bool(more)
    return tree


def expected_role(process: Any, root: int) -> str:
    """The role the process tree calls for: torchrun's agent a launcher, its children ranks,
    their children (data-loader workers) helpers."""
    if process.pid == root:
        return "launcher"
    return "rank" if process.ppid == root else "helper"


def describe(found: dict, tree: set[int], root: int) -> list[dict]:
    """One row per candidate, as the agent would tag it, with the role it should have."""
    rows = []
    for pid, p in sorted(found.items()):
        row = {"pid": pid, "ppid": p.ppid, "comm": p.comm, "role": p.role, "owner": p.owner,
               "rank": p.rank, "local_rank": p.local_rank, "world_size": p.world_size,
               "told_by": p.told_by, "job": p.job, "restart": p.restart,
               "libraries": sorted({lib.kind for lib in p.libraries}),
               "library_paths": sorted({lib.path for lib in p.libraries}),
               "in_job": pid in tree}
        if pid in tree:
            row["expected_role"] = expected_role(p, root)
        rows.append(row)
    return rows


def scan_job(discovery: ModuleType, job: subprocess.Popen) -> list[dict]:
    """Scan /proc several times while the job trains, as the agent's rescans do (each scan
    given the last one's result), timing each."""
    scans, known = [], None
    for index in range(SCANS):
        if index:
            time.sleep(SCAN_EVERY_S)
        if job.poll() is not None:
            break
        tree = descendants(discovery, job.pid)
        began = time.monotonic()
        known = discovery.scan(Path("/proc"), known=known)
        took = round(1000 * (time.monotonic() - began), 1)
        rows = describe(known, tree, job.pid)
        scans.append({"ms": took, "candidates": rows,
                      "mismatches": [r["pid"] for r in rows
                                     if r["in_job"] and r["role"] != r["expected_role"]]})
    return scans
