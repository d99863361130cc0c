"""Which processes ingerod traces, read from a /proc tree built here (the same reader as on
/proc): a rank's identity, once read whole, survives a failed re-read of its environment, and
a reused pid is identified anew."""

from __future__ import annotations

import os

from ingerod.discovery import scan


def fake_process(proc, pid: int, library, environ: bytes, started: int) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "maps").write_text(f"7f00-7f01 r-xp 00000000 00:00 1 {library}\n")
    (d / "environ").write_bytes(environ)
    (d / "comm").write_text("ingero-sim-rank\n")
    fields = ["S"] + ["0"] * 18 + [str(started)] + ["0"] * 20
    (d / "stat").write_text(f"{pid} (ingero-sim-rank) {' '.join(fields)}\n")
    if not (d / "root").exists():
        os.symlink("/", d / "root")


def test_a_rank_stays_itself_when_its_environment_cannot_be_read_again(tmp_path):
    library = tmp_path / "lib" / "libnccl.so.2"
    library.parent.mkdir()
    library.write_bytes(b"\x7fELF")
    proc = tmp_path / "proc"
    env = b"SLURM_JOB_ID=7001\0SLURM_PROCID=3\0SLURM_NODEID=1\0"
    fake_process(proc, 4242, library, env, started=1000)
    first = scan(proc, own_pid=1)
    assert first[4242].job == "7001" and first[4242].rank == 3
    assert first[4242].environ["SLURM_NODEID"] == "1"

    fake_process(proc, 4242, library, b"", started=1000)     # the re-read fails (exiting, busy)
    again = scan(proc, own_pid=1, known=first)
    assert again[4242].job == "7001" and again[4242].environ["SLURM_NODEID"] == "1"
    assert scan(proc, own_pid=1)[4242].job is None           # what a fresh read would say

    fake_process(proc, 4242, library, b"SLURM_JOB_ID=9\0", started=2000)   # a new process
    reused = scan(proc, own_pid=1, known=again)
    assert reused[4242].job == "9" and "SLURM_NODEID" not in reused[4242].environ


def test_a_process_first_read_without_its_environment_is_read_again(tmp_path):
    library = tmp_path / "libcudart.so.12"
    library.write_bytes(b"\x7fELF")
    proc = tmp_path / "proc"
    fake_process(proc, 77, library, b"", started=5)
    first = scan(proc, own_pid=1)
    assert first[77].job is None
    fake_process(proc, 77, library, b"SLURM_JOB_ID=12\0RANK=0\0", started=5)
    assert scan(proc, own_pid=1, known=first)[77].job == "12"
