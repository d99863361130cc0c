"""Why a rank is late: the cause rules, from facts gathered online (fleetd) or from the store
(echod). Strongest evidence first; every diagnosis says what it rests on and what to do.

Causes, in the order they are weighed:
    host_preemption   another process took its CPU far more often than its peers' (sched_switch
                      names it and its pid)
    slow_gpu          its syncs on its own kernels (self-work) take longer than its peers'
    io                block I/O by the rank (its data-loader workers included) far above its
                      peers'; without peers to compare with, heavy block I/O
    allocation        its GPU allocations take much longer than its peers'
    host_preemption   (weaker) its node's cpu health signal is low, no process named
    memory_pressure   its node's GPU memory headroom is low
    slow_gpu          (weaker) its node's compute signal is low
    network_or_peer   it waits in collectives much longer than its peers: the delay is elsewhere
    host_work         late entry, and nobody else on its CPU: its own host code (data loading,
                      Python, garbage collection, a sleep)
    hang              it never entered a collective its peers entered
    died              its process is gone while its peers go on (or wait for it)
"""

from __future__ import annotations

from dataclasses import dataclass, field

CAUSES = ("host_preemption", "host_work", "io", "slow_gpu", "allocation", "hang", "died",
          "memory_pressure", "network_or_peer", "unknown", "none")

# Each cause in a few words, for people: the CLI and the demo.
CAUSE_WORDS = {
    "host_preemption": "another process took its CPU",
    "host_work": "its own host work (data loading, Python, garbage collection)",
    "io": "blocking I/O on its node",
    "slow_gpu": "a slow GPU (its own kernels take longer than its peers')",
    "allocation": "slow GPU memory allocations",
    "hang": "it hung before a collective its peers entered",
    "died": "its process died",
    "memory_pressure": "GPU memory pressure",
    "network_or_peer": "it waits on something else (network or another peer)",
    "unknown": "not established",
    "none": "not late",
}


def lateness(kind: str, period: int | None, lag_ms: float | None) -> str:
    """What a verdict of this kind says the rank does, in a few words."""
    what = {"periodic": f"late every {period} steps", "hang": "missing", "died": "dead",
            "slow_gpu": "slow in its own kernels"}.get(kind, "late")
    return what + (f" by {lag_ms:.1f} ms" if lag_ms is not None and kind != "died" else "")


def verdict_line(rank: int, node: str | None, kind: str, period: int | None,
                 lag_ms: float | None, op: str | None, cause: str) -> str:
    """A verdict in a line, said alike wherever it is said (fleetd's log and notices, the
    command's reports): ``rank 5 on node1: late by 12.3 ms at ncclAllReduce, cause host_work``."""
    return (f"rank {rank} on {node}: {lateness(kind, period, lag_ms)} at "
            f"{op or 'its collectives'}, cause {cause}")


SLOW_GPU_RATIO = 1.3             # self-work over the peers' median
SLOW_GPU_EXPLAINS = 1.15         # ... or this much, where its kernels' extra time is
SLOW_GPU_SHARE = 0.5             # at least this share of its lag
MIN_SELF_WORK_SAMPLES = 3
PREEMPTION_BURST = 5             # preemptions by other processes in the window
PREEMPTED_SHARE = 0.02           # of the window, kept off its CPU by them
PREEMPTION_EXPLAINS = 0.5        # ... and half of what it loses against its peers at least:
                                 # the tracer's count is a lower bound (three nice -10 hogs
                                 # were seen taking 60-71% of what the rank lost)
PREEMPTION_BESIDE_SLOW = 0.15    # ... or, where its kernels look slow, this much of its time
PREEMPTED_MORE = 3               # a preemptor counts against a rank that it took this many
                                 # times as much as it took the rank's peers, or more: every
                                 # node's daemons take everyone's CPU now and then, and a job's
                                 # ranks crowding a busy node take each other's alike
HEAVY_BLOCKIO_BYTES = 64 * 2**20          # in the window, with no peers to compare with
HEAVY_BLOCKIO_REQUESTS = 1000
IO_RATIO = 4.0                           # the rank's block I/O over its peers' median
MIN_IO_BYTES = 8 * 2**20                 # ... and at least this much in the window
SLOW_ALLOCATION_RATIO = 3.0
SLOW_ALLOCATION_S = 0.001
LOW_SIGNAL = {"cpu": 0.75, "compute": 0.6, "memory": 0.5}    # a node's health signals
LONG_WAIT_RATIO = 1.5            # peer-wait over the peers' median

FIXES = {
    "host_preemption": "pin the training processes with taskset (or a cpuset) and keep "
                       "{preemptor} off their cores",
    "host_work": "profile the rank's host code between collectives (data loading, Python, "
                 "garbage collection): more data-loader workers, pinned memory, prefetching",
    "io": "take blocking I/O off the training path: stage the data on local disk, use more "
          "data-loader workers, write checkpoints asynchronously",
    "slow_gpu": "check the GPU on {node} (nvidia-smi -q: clocks, throttling, XID errors; DCGM "
                "diagnostics) and drain the node if it stays slow",
    "allocation": "allocate once and reuse (a caching allocator, PYTORCH_CUDA_ALLOC_CONF), "
                  "avoid cudaMalloc/cudaFree in the step",
    "hang": "take a stack of the rank (py-spy dump, gdb) on {node}: it stopped before "
            "the collective its peers wait in",
    "died": "read the rank's log and the node's kernel log on {node} (OOM killer, XID "
            "errors); restart the job from its last checkpoint",
    "memory_pressure": "lower the GPU memory this rank needs (smaller micro-batch, activation "
                       "checkpointing) and look for leaks",
    "network_or_peer": "look at what this rank waits for: its other communicators, "
                       "NCCL_DEBUG=INFO for its links, its node's clock offset",
    "unknown": "look at the rank's events around its late collectives",
}


@dataclass
class Facts:
    """What the rules weigh for one late rank; None where nothing was measured."""

    self_work_s: float | None = None          # the rank's median self-work sync
    peers_self_work_s: float | None = None    # the median of its peers' (the same measure)
    self_work_samples: int = 0
    preemptions: dict[tuple[str, int], int] = field(default_factory=dict)  # (comm, pid) → n
    preempted_s: float | None = None          # how long they kept it off its CPU
    window_s: float | None = None             # the span the host facts cover
    lag_s: float | None = None                # how late it enters collectives (None: not late)
    late_share: float | None = None           # of its time, what it loses against its peers:
    # its lag over the steps it is late in, or its kernels' extra time per second
    work_share: float | None = None           # of its time, its kernels' extra over its peers'
    blockio_requests: int = 0
    blockio_bytes: int = 0
    peers_blockio_bytes: float | None = None  # the median of its peers' (None: not compared)
    allocation_s: float | None = None
    peers_allocation_s: float | None = None
    peer_wait_s: float | None = None          # its median sync waiting on a collective
    peers_peer_wait_s: float | None = None    # its peers': long when they wait for it
    signals: dict[str, float | None] = field(default_factory=dict)   # its node's health

    @property
    def top_preemptor(self) -> tuple[str, int | None] | None:
        return max(self.preemptions, key=self.preemptions.get) if self.preemptions else None

    @property
    def preemption_count(self) -> int:
        return sum(self.preemptions.values())


@dataclass(frozen=True)
class Diagnosis:
    cause: str
    confidence: str
    fix: str | None
    findings: list[str]


def diagnose_late(facts: Facts, node: str | None = None) -> Diagnosis:
    """The cause of a rank's late entries, from its facts."""
    cause, confidence, findings = _blame(facts)
    fix = FIXES.get(cause, "")
    return Diagnosis(cause, confidence, fix.format(
        preemptor=named(facts.top_preemptor) if facts.top_preemptor else "other processes",
        node=node or "its node") or None, findings)


def named(preemptor: tuple[str, int | None]) -> str:
    """A process by command and pid (the pid where it is known)."""
    comm, pid = preemptor
    return comm if pid is None else f"{comm} (pid {pid})"


def _blame(f: Facts) -> tuple[str, str, list[str]]:
    # Preemption first: a slow GPU does not bring another process onto the rank's CPU, while a
    # rank starved of CPU may still look slow at its kernels (the agent leaves its waits for a
    # CPU once woken out of its syncs, not a wait it cannot see, nor an older agent's).
    if preempted(f):
        held = "" if f.preempted_s is None else f" for {f.preempted_s:.2f} s"
        return "host_preemption", "high", [
            f"preempted {f.preemption_count} times{held} by other processes, mostly "
            f"{named(f.top_preemptor)} ({f.preemptions[f.top_preemptor]} times)"]
    if slow_gpu(f):
        return "slow_gpu", "high", [
            f"its own kernels take {f.self_work_s * 1e3:.2f} ms per sync, its peers' "
            f"{f.peers_self_work_s * 1e3:.2f} ms ({f.self_work_s / f.peers_self_work_s:.2f}x)"]
    if heavy_io(f):
        peers = "" if f.peers_blockio_bytes is None else \
            f", its peers' {f.peers_blockio_bytes / 2**20:.1f} MiB"
        return "io", "medium", [f"block I/O: {f.blockio_requests} requests, "
                                f"{f.blockio_bytes / 2**20:.1f} MiB{peers}"]
    if slow_allocation(f):
        return "allocation", "medium", [
            f"GPU allocations take {f.allocation_s * 1e3:.2f} ms, its peers' "
            f"{f.peers_allocation_s * 1e3:.2f} ms"]
    weak = _blame_signals(f)
    if weak is not None:
        return weak
    return "host_work", "medium", [
        "enters collectives late with no other process on its CPU and its own kernels no "
        "slower than its peers': the time goes to its own host code"]


def _blame_signals(f: Facts) -> tuple[str, str, list[str]] | None:
    """Weaker evidence, where nothing above was measured: its node's health signals, and how
    long it waits in collectives against its peers."""
    for signal, cause in (("cpu", "host_preemption"), ("memory", "memory_pressure"),
                          ("compute", "slow_gpu")):
        value = f.signals.get(signal)
        if value is not None and value < LOW_SIGNAL[signal]:
            return cause, "medium", [f"its node's {signal} signal is low: {value:.2f}"]
    if (f.peer_wait_s is not None and f.peers_peer_wait_s
            and f.peer_wait_s >= LONG_WAIT_RATIO * f.peers_peer_wait_s):
        return "network_or_peer", "low", [
            f"it waits {f.peer_wait_s * 1e3:.2f} ms in collectives, its peers "
            f"{f.peers_peer_wait_s * 1e3:.2f} ms: what delays it is elsewhere"]
    return None


def preempted(f: Facts) -> bool:
    """Other processes took its CPU often and, where the time is known, for long enough to
    explain what the rank loses, half of it at least (what the tracer counts is a lower bound:
    a wait under 0.1 ms, or asleep on a lock that a preempted thread of the rank holds, is not
    counted): a rank 60 ms late each 76 ms step in its own host code, whose CPU a busy loop
    beside it takes for 2 ms a step, is late by its host work, and one whose kernels' syncs
    take 6 ms more than its peers' each step, kept off its CPU 1 ms a step, has slow kernels.
    Where its kernels look slow, the preemption need only explain their
    extra time, not its lag (a rank kept off its CPU may still carry waits for it in its syncs
    that the agent cannot see: its lag and its kernels' time grow together), but it must
    take a sixth of its time or more: a rank whose kernels are slow wakes at other times than
    its peers and is exposed to a busy process beside the job more than they are. Three hogs
    on one rank's CPU took 33-47% of its time, its kernels' extra 15-30%: preempted. A busy
    loop beside the job took 6-9% of the time of a rank whose kernels took 2.3 times its
    peers' (6% of its time), and about as much as it lost against them: slow kernels (both
    measured before the agent left late wake-ups out of syncs)."""
    if f.preemption_count < PREEMPTION_BURST:
        return False
    if f.preempted_s is None or not f.window_s:
        return True
    share = f.preempted_s / f.window_s
    if share < PREEMPTED_SHARE:
        return False
    if f.work_share is not None and slow_gpu(f):
        return share >= PREEMPTION_BESIDE_SLOW and share >= PREEMPTION_EXPLAINS * f.work_share
    return f.late_share is None or share >= PREEMPTION_EXPLAINS * f.late_share


def heavy_io(f: Facts) -> bool:
    """Its block I/O stands out against its peers' (every rank reading its input alike is no
    cause); with no peers to compare with, it is heavy outright."""
    if f.peers_blockio_bytes is None:
        return f.blockio_bytes >= HEAVY_BLOCKIO_BYTES or \
            f.blockio_requests >= HEAVY_BLOCKIO_REQUESTS
    return f.blockio_bytes >= MIN_IO_BYTES and f.blockio_bytes >= IO_RATIO * f.peers_blockio_bytes


def slow_gpu(f: Facts) -> bool:
    """Its own kernels take ``SLOW_GPU_RATIO`` times its peers' or more; or
    ``SLOW_GPU_EXPLAINS`` times, and, where it is late at collectives (``lag_s``), their
    extra time is at least ``SLOW_GPU_SHARE`` of its lag: the lag is its kernels'. Where it
    is not late, the caller has found its kernels over its peers' robust bar
    (``stragglers.slow_workers``). A GPU 1.3 times slower showed self-work 1.32 times its
    peers' on an idle machine and 1.296 times on busy CPUs (every rank's wake-up from its sync
    adds alike): called host work, or not named at all."""
    if (f.self_work_s is None or f.peers_self_work_s is None
            or f.self_work_samples < MIN_SELF_WORK_SAMPLES or f.peers_self_work_s <= 0):
        return False
    if f.self_work_s >= SLOW_GPU_RATIO * f.peers_self_work_s:
        return True
    return f.self_work_s >= SLOW_GPU_EXPLAINS * f.peers_self_work_s and (
        f.lag_s is None or f.self_work_s - f.peers_self_work_s >= SLOW_GPU_SHARE * f.lag_s)


def slow_allocation(f: Facts) -> bool:
    return (f.allocation_s is not None and f.peers_allocation_s is not None
            and f.allocation_s >= SLOW_ALLOCATION_S
            and f.allocation_s >= SLOW_ALLOCATION_RATIO * max(f.peers_allocation_s, 1e-9))


def severity(cost_s: float, step_s: float | None) -> str:
    """How much of its peers' time the rank costs: ``cost_s``, how much longer it keeps them
    waiting at each of its late instances (its lag over the bar, no more than their waits
    grew), against ``step_s``, the time between two of them (for a periodic stall, the
    period): critical from half, major from a tenth, minor below."""
    if not step_s:
        return "major"
    share = cost_s / step_s
    return "critical" if share >= 0.5 else "major" if share >= 0.1 else "minor"
