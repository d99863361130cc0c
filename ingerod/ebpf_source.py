"""The ebpf signal source: what the training job's processes do, seen through bcc probes.

Each sample reads what the kernel gathered since the last one: per-event records (collectives,
syncs, allocations, copies) from the ring buffer, and counters (kernel launches, off-CPU time,
who preempted whom, block I/O) from maps, which it empties. From them it derives the four
health signals and the events that go to fleetd, each tagged with the process's job and rank.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from pathlib import Path
from types import SimpleNamespace

from ingero.runtime import RateLimitedLog

from .discovery import TracedProcess, identify, library_file, roles, scan
from .events import COPY_KINDS, OPS, decode
from .gpumem import DeviceMemory, device_memory
from .health import EmaBaseline, Sample, clamp
from .probes import Tracer

log = logging.getLogger("ingerod")
complaints = RateLimitedLog(log, 60.0)

MAX_BUFFERED = 65_536
DEPARTED_GRACE = 30.0  # seconds an exited process's identity is kept for its last events
# Communicator inits whose rank and size say who the process is in the job (a split says who
# it is in a part of it; ncclCommInitAll makes every rank of a group in one process).
IDENTITY_INITS = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitRankScalable")


def int_of(value) -> int:
    """bcc hands scalar map keys back as ctypes values or as ints, depending on the path."""
    return value if isinstance(value, int) else value.value


def thread_group(proc: Path, tid: int) -> int | None:
    """The process a thread belongs to (None once it is gone): who really took a CPU."""
    try:
        with open(proc / str(tid) / "status") as status:
            for line in status:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def wall_offset_ns() -> int:
    """bpf_ktime_get_ns() counts CLOCK_MONOTONIC; this turns it into wall time."""
    return time.time_ns() - time.monotonic_ns()


DEFAULT_GPU_MEMORY = 80 * 2**30


def gpu_memory(cfg: SimpleNamespace) -> int:
    """Device memory per GPU: the setting, else what NVML says, else 80 GiB (an H100)."""
    if cfg.gpu_memory_bytes is not None:
        return cfg.gpu_memory_bytes
    found = device_memory(cfg.nvml_library)
    if found is None:
        log.info("GPU memory: %d GiB per GPU, the default (no NVML answered at %s; set "
                 "gpu_memory_bytes)", DEFAULT_GPU_MEMORY >> 30, cfg.nvml_library)
        return DEFAULT_GPU_MEMORY
    log.info("GPU memory: %.1f GiB per GPU (NVML)", found / 2**30)
    return found


def memory_signal(used_share: float | None, outstanding: int, gpu_memory: int) -> float:
    """Memory headroom in [0, 1]: what NVML says the fullest GPU does not use; where NVML
    says nothing, what the largest process's own allocations leave of ``gpu_memory``."""
    if used_share is not None:
        return clamp(1.0 - used_share)
    return clamp(1.0 - outstanding / gpu_memory)


class EbpfSource:
    name = "ebpf"

    def __init__(self, cfg: SimpleNamespace, now: float, proc: Path = Path("/proc")):
        self.cfg = cfg
        self.proc = proc
        self.tracer = Tracer(self._on_event)
        self.processes: dict[int, TracedProcess] = {}
        self.departed: dict[int, tuple[TracedProcess, float]] = {}  # exited, events may remain
        # the role each traced process was last said to have, with its start (a pid reused
        # between two rescans is another process, not a role changed)
        self.told_roles: dict[int, tuple[int | None, str]] = {}
        self.buffered: deque[dict] = deque(maxlen=MAX_BUFFERED)
        self.dropped = 0
        self.collectives = 0
        self.outstanding_bytes: dict[int, int] = {}
        self.gpu_memory = gpu_memory(cfg)
        self.device_memory = DeviceMemory(cfg.nvml_library)
        self.throughput = EmaBaseline()
        self.compute = EmaBaseline()
        self.last_sample = now
        self.next_rescan = now
        self.counting_launches = True
        self.launches = 0
        self.exits: list[dict] = []           # traced processes seen gone since the last sample
        self.exit_seen: set[int] = set()      # processes whose exit the kernel reported
        self.thread_groups: dict[int, int] = {}  # tid → tgid of the tasks that preempted targets
        self.refused: Counter[str] = Counter()   # reason → what was refused, since last asked
        self.user_libraries: dict[int, set] = {}  # owner uid → its files attached
        self.refused_libraries: set = set()
        self.preloaded: set = set()              # the configured files: attached for good
        self.unmapped_since: dict = {}           # attached file → when none mapped it last
        self.detach_due: list = []               # files to detach, a probe per pass
        self.unknown: set[int] = set()           # pids of events read, not yet identified
        self.trusted = tuple(os.path.join(str(d), "") for d in cfg.trusted_library_dirs)
        self.preload()
        self.rescan(now)

    # -- discovery -------------------------------------------------------------------------------

    def preload(self) -> None:
        """Attach the configured library files now, so the first process to map one is traced
        from its first call."""
        for path in self.cfg.libraries:
            library = library_file(path)
            if library is None:
                log.warning("library %s: not found or not a CUDA/NCCL library", path)
            else:
                self.tracer.attach(library)
                self.preloaded.add(library)

    def wanted(self, process: TracedProcess) -> bool:
        return process.matches(self.cfg.job, self.cfg.match_env, self.cfg.pids)

    def rescan(self, now: float) -> None:
        """Follow processes that come and go, and attach libraries loaded late."""
        found = scan(self.proc, known=self.processes, names=frozenset(self.cfg.match_env))
        for pid, process in found.items():
            if pid not in self.processes:
                self._say_unparsed(process)
            if pid not in self.told_roles:      # new, or wanted only now (read whole now)
                self._say_tracing(process)
        for pid in self.processes.keys() - found.keys():
            if self.wanted(self.processes[pid]):
                log.info("pid %d (%s) is gone", pid, self.processes[pid].role)
                if pid not in self.exit_seen:      # the kernel did not say (not followed yet)
                    self.exits.append(self._host_event("process_exit", pid, time.time(), {}))
            self.exit_seen.discard(pid)
            self.outstanding_bytes.pop(pid, None)
            self.departed[pid] = (self.processes[pid], now)
        for pid, (_p, since) in list(self.departed.items()):
            if now - since > DEPARTED_GRACE:
                del self.departed[pid]
        mapped = set(self.preloaded)
        for process in found.values():
            if self.wanted(process):
                mapped |= process.libraries
                for library in process.libraries:
                    if self.admit(library):
                        self.tracer.attach(library)
        self.detach_unmapped(mapped, now)
        self.refused_libraries &= mapped
        self.processes = found
        self._say_roles()
        self.follow()
        self.next_rescan = now + self.cfg.rescan_interval

    def detach_unmapped(self, mapped: set, now: float) -> None:
        """Mark for detaching the files no traced process has mapped for library_grace
        seconds: a long-lived agent would otherwise hold every virtual environment's files of
        every job it ever traced (and a user's would count against their libraries_per_user
        for good). They come off a probe per pass of the loop (``detach_one``)."""
        for library in mapped:
            self.unmapped_since.pop(library, None)
        self.detach_due = [library for library in set(self.tracer.attached) - mapped
                           if now - self.unmapped_since.setdefault(library, now)
                           > self.cfg.library_grace]

    def detach_one(self) -> None:
        """Take one probe off the files no traced process maps: one per pass of the agent's
        loop, which reads events between them (a file's probes took seconds to come off, and a
        job short enough to start and end in them was never identified: its ranks were gone
        by the time their events were read)."""
        if not self.tracer.detaching and self.detach_due:
            library = self.detach_due.pop(0)
            if library in self.tracer.attached and library in self.unmapped_since:
                self.tracer.detach(library)
                self.user_libraries.get(library.owner, set()).discard(library)
                del self.unmapped_since[library]
        self.tracer.detach_next()

    def admit(self, library) -> bool:
        """Whether to attach a library file: root's and those under trusted_library_dirs
        always; a user's, up to libraries_per_user of theirs (any user can write a file named
        libnccl.so and map it)."""
        if library in self.tracer.attached or library.owner == 0 \
                or library.path.startswith(self.trusted):
            return True
        theirs = self.user_libraries.setdefault(library.owner, set())
        if library in theirs:
            return True
        if len(theirs) < self.cfg.libraries_per_user:
            theirs.add(library)
            return True
        if library not in self.refused_libraries:
            self.refused_libraries.add(library)
            self.refused["library_cap"] += 1
            complaints.warning(f"library_cap:{library.owner}", "not attaching %s: uid %d "
                               "already has %d library files attached (libraries_per_user)",
                               library.path, library.owner, len(theirs))
        return False

    def _say_unparsed(self, p: TracedProcess) -> None:
        if p.unparsed:
            self.refused["bad_variable"] += 1
            complaints.warning("bad_variable", "pid %d (%s, uid %s): %s read as unset: not a "
                               "plain number or id in range", p.pid, p.comm, p.uid,
                               ", ".join(p.unparsed))

    def take_refused(self) -> Counter:
        """What was refused since the last call, by reason."""
        refused, self.refused = self.refused, Counter()
        return refused

    def follow(self) -> None:
        wanted = {pid for pid, p in self.processes.items() if self.wanted(p)}
        self.tracer.set_pids("targets", wanted)
        self.tracer.set_cuda_text({pid: self.processes[pid].cuda_text for pid in wanted
                                   if self.processes[pid].cuda_text})
        self.tracer.set_pids("excluded", set(self.processes) - wanted)
        log.debug("following %s, excluding %s", sorted(wanted), sorted(set(self.processes) - wanted))

    def process(self, pid: int) -> TracedProcess:
        """Who a pid is; a process seen first through its events is identified now, and its
        place in the process tree with it (a rank's new worker is its helper)."""
        known = self.processes.get(pid) or self.departed.get(pid, (None, 0))[0]
        if known is None:
            known = self.processes[pid] = identify(self.proc, pid,
                                                   frozenset(self.cfg.match_env))
            roles(self.processes, self.proc)
            self._say_tracing(known)
            self._say_unparsed(known)
            self._say_roles()
            if not self.wanted(known):
                self.follow()
        return known

    def _say_tracing(self, p: TracedProcess) -> None:
        if self.wanted(p):
            log.info("tracing pid %d (%s) job %s rank %s, %s%s", p.pid, p.comm, p.job, p.rank,
                     p.role, f" of pid {p.owner}" if p.owner else "")
            self.told_roles[p.pid] = (p.started, p.role)

    def _say_roles(self) -> None:
        """Say which role a traced process changed: a launcher seen before it spawned its
        workers looked like a rank until then. And which one, still running, is traced no
        longer: it reads now as a process this agent was not asked to trace (its events are
        dropped from then on, in the kernel)."""
        for pid, (started, told) in list(self.told_roles.items()):
            p = self.processes.get(pid)
            if p is None or p.started != started:
                del self.told_roles[pid]
            elif not self.wanted(p):
                log.warning("pid %d (%s) is traced no longer: it now reads as job %s rank %s, "
                            "%d environment variables", pid, p.comm, p.job, p.rank,
                            len(p.environ or {}))
                del self.told_roles[pid]
            elif p.role != told:
                log.info("pid %d (%s) job %s: now %s, was %s", pid, p.comm, p.job, p.role, told)
                self.told_roles[pid] = (started, p.role)

    def tags(self, process: TracedProcess) -> dict:
        owner = None if process.owner is None else self.process(process.owner)
        return process.tags(owner)

    def owner_of(self, pid: int | None) -> int | None:
        """The rank process whose work a traced process's is (None for others)."""
        process = self.processes.get(pid) if pid is not None else None
        if process is None or process.role == "launcher":
            return None
        return process.owner if process.role == "helper" else process.pid

    def learn(self, event: dict) -> None:
        """NCCL's word on who a process is: the rank it initialised the job's communicator as."""
        process = self.process(event["pid"])
        if event["op"] in IDENTITY_INITS and process.learn(event["comm_rank"], event["nranks"]):
            log.warning("pid %d initialised NCCL as rank %d of %d; its launcher's variables "
                        "said rank %s of %s: NCCL's word is taken", process.pid,
                        event["comm_rank"], event["nranks"], process.rank, process.world_size)

    # -- events ----------------------------------------------------------------------------------

    def _on_event(self, raw) -> None:
        event = decode(raw)
        if event["kind"] == "process_exit":
            self.exit_seen.add(event["pid"])
        elif event["pid"] not in self.processes:
            self.unknown.add(event["pid"])
        if len(self.buffered) == self.buffered.maxlen:
            self.dropped += 1
        self.buffered.append(event)

    def poll(self, now: float) -> None:
        """Empty the ring buffer and say who the new senders are while they run (a short
        job's ranks may be gone by the next sample); called often, so the buffer never fills
        between samples."""
        self.tracer.poll()
        for pid in sorted(self.unknown):
            self.process(pid)
        self.unknown.clear()
        self.duty_cycle(now)
        if now >= self.next_rescan:
            self.rescan(now)
        self.detach_one()

    def duty_cycle(self, now: float) -> None:
        """Count kernel launches only for the configured part of each period."""
        period, duty = self.cfg.launch_duty_period, self.cfg.launch_duty_cycle
        counting = duty >= 1.0 or (now % period) < duty * period
        if counting != self.counting_launches:
            self.tracer.set_hot(counting)
            self.counting_launches = counting

    def _to_wire(self, event: dict, process: TracedProcess, offset: int) -> dict:
        attrs = {k: v for k, v in event.items() if k not in ("kind", "ts_ns")}
        attrs.update({k: v for k, v in self.tags(process).items() if v is not None})
        return {"kind": event["kind"], "t": (event["ts_ns"] + offset) / 1e9, "attrs": attrs}

    def take_events(self, offset: int) -> list[dict]:
        """The buffered events of wanted processes, tagged, in wire form."""
        events = []
        for event in self.buffered:
            process = self.process(event["pid"])
            if event["kind"] == "comm_init":
                self.learn(event)
            if self.wanted(process):
                events.append(self._to_wire(event, process, offset))
        self.buffered.clear()
        return events

    # -- the sample ------------------------------------------------------------------------------

    def sample(self, now: float) -> Sample:
        self.poll(now)
        elapsed = max(now - self.last_sample, 1e-3)
        self.last_sample = now
        offset = wall_offset_ns()
        events = self.take_events(offset)
        self._account(events)
        events += self.host_evidence(offset) + self.exits
        self.exits = []
        signals = self._signals(elapsed)
        busy = any(self.wanted(p) for p in self.processes.values())
        return Sample(signals, busy=busy, events=events)

    def _account(self, events: list[dict]) -> None:
        for event in events:
            attrs = event["attrs"]
            pid = attrs["pid"]
            if event["kind"] == "collective":
                self.collectives += 1
            elif event["kind"] == "alloc" and attrs.get("result") == 0:
                self.outstanding_bytes[pid] = self.outstanding_bytes.get(pid, 0) + attrs["bytes"]
            elif event["kind"] == "free":
                self.outstanding_bytes[pid] = max(0, self.outstanding_bytes.get(pid, 0)
                                                  - attrs["bytes"])

    def _signals(self, elapsed: float) -> dict[str, float]:
        # The kernel counts every caller not yet excluded; a process of another job counts
        # only until the next rescan excludes it, so filter here too.
        launches = sum(v for k, v in self.tracer.take("launches")
                       if self.wanted(self.process(int_of(k))))
        self.launches += launches
        preempted = max((v.preempted_ns for _k, v in self.tracer.take("offcpu")), default=0)
        outstanding = max(self.outstanding_bytes.values(), default=0)
        used = self.device_memory.used_share()
        signals = {
            "throughput": self.throughput.signal(self.collectives / elapsed),
            "compute": self.compute.signal(launches / (elapsed * self.cfg.launch_duty_cycle)
                                           if self.cfg.launch_duty_cycle else 1.0),
            "memory": memory_signal(used, outstanding, self.gpu_memory),
            "cpu": clamp(1.0 - preempted / (elapsed * 1e9)),
        }
        self.collectives = 0
        return signals

    def host_evidence(self, offset: int) -> list[dict]:
        """Who took the targets' CPUs since the last sample, as one event per pair; what
        they read from block devices; and the asynchronous copies they enqueued, counted in
        the kernel (cuda.bpf.c), as one memcpy event per process, call and direction with
        the copies' number (``calls``) and bytes."""
        t = (time.monotonic_ns() + offset) / 1e9
        events = []
        for key, value in self.tracer.take("async_copies"):
            if self.wanted(self.process(key.tgid)):
                attrs = {"pid": key.tgid, "op": OPS.get(key.op, str(key.op)),
                         "direction": COPY_KINDS.get(key.kind, str(key.kind)),
                         "bytes": min(value.bytes, 2**46), "calls": value.calls}
                events.append(self._host_event("memcpy", key.tgid, t, attrs))
        for key, value in self.tracer.take("preemptors"):
            tgid = self.thread_group(key.pid)
            owner = self.owner_of(tgid)
            attrs = {"preemptor_pid": key.pid, "preemptor_tgid": tgid, "count": value.count,
                     "preempted_ns": value.ns,
                     "preemptor_comm": value.comm.decode(errors="replace"),
                     "preemptor_own": tgid == key.tgid or (
                         owner is not None and owner == self.owner_of(key.tgid))}
            if tgid in self.processes and self.processes[tgid].job is not None:
                attrs["preemptor_job"] = self.processes[tgid].job    # a process of a job
            events.append(self._host_event("preempted", key.tgid, t, attrs))
        for key, value in self.tracer.take("blockio"):
            attrs = {"requests": value.requests, "bytes": value.bytes}
            events.append(self._host_event("blockio", int_of(key), t, attrs))
        return events

    def thread_group(self, tid: int) -> int | None:
        """The process of a thread that took a target's CPU, remembered: the last counts are
        read after a job's threads have exited."""
        tgid = thread_group(self.proc, tid)
        if tgid is None:
            return self.thread_groups.get(tid)
        if len(self.thread_groups) >= MAX_BUFFERED:
            self.thread_groups.clear()
        self.thread_groups[tid] = tgid
        return tgid

    def _host_event(self, kind: str, pid: int, t: float, attrs: dict) -> dict:
        tags = self.tags(self.process(pid))
        attrs.update({k: v for k, v in tags.items() if v is not None})
        return {"kind": kind, "t": t, "attrs": attrs}

    def lost_events(self) -> int:
        return self.tracer.lost_events() + self.dropped

    def launches_counted(self) -> int:
        """The wanted processes' kernel launches counted so far, each once (cuda.bpf.c),
        while the launch counters were attached."""
        return self.launches

    def close(self) -> None:
        self.device_memory.close()
        self.tracer.close()
