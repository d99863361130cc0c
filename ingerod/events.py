"""The BPF event record, decoded; and its shape on the wire.

``RawEvent`` mirrors ``struct event`` in bpf/common.bpf.c field for field; ``OPS`` mirrors
``enum probe_op``. Keep them in step: tests compare them with the C source.
"""

from __future__ import annotations

import ctypes

from ingero.vocabulary import COPY_DIRECTIONS, EXCHANGE

KINDS = {1: "collective", 2: "comm_init", 3: "comm_destroy", 4: "sync", 5: "alloc", 6: "free",
         7: "memcpy", 8: "process_exit"}

OPS = {
    1: "ncclAllReduce", 2: "ncclAllGather", 3: "ncclReduceScatter", 4: "ncclReduce",
    5: "ncclBroadcast", 6: "ncclBcast", 7: "ncclSend", 8: "ncclRecv", 9: "ncclAlltoAll",
    10: "ncclGather", 11: "ncclScatter", 12: EXCHANGE,
    20: "ncclCommInitRank", 21: "ncclCommInitRankConfig", 22: "ncclCommInitAll",
    23: "ncclCommSplit", 24: "ncclCommDestroy", 25: "ncclCommAbort",
    26: "ncclCommInitRankScalable", 27: "ncclCommShrink", 28: "ncclCommFinalize",
    40: "cudaStreamSynchronize", 41: "cudaEventSynchronize", 42: "cudaDeviceSynchronize",
    43: "cuCtxSynchronize",
    60: "cudaMalloc", 61: "cudaMallocManaged", 62: "cuMemAlloc_v2", 63: "cudaFree",
    64: "cuMemFree_v2",
    80: "cudaMemcpy", 81: "cudaMemcpyAsync", 82: "cudaMemcpy2D", 83: "cudaMemcpy2DAsync",
    84: "cudaMemcpyPeer", 85: "cudaMemcpyPeerAsync",
}

DATATYPES = {0: "int8", 1: "uint8", 2: "int32", 3: "uint32", 4: "int64", 5: "uint64",
             6: "float16", 7: "float32", 8: "float64", 9: "bfloat16", 10: "fp8e4m3",
             11: "fp8e5m2"}
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
COPY_KINDS = dict(enumerate(COPY_DIRECTIONS))

IN_GROUP, PEER_WAIT, GRAPH = 1, 2, 4
SPLITS = (23, 27)            # ncclCommSplit, ncclCommShrink: fleetd numbers the new ranks
ROOTED = (4, 5, 6, 10, 11)   # the peer field carries the root


class RawEvent(ctypes.Structure):
    _fields_ = [
        ("ts", ctypes.c_uint64), ("duration", ctypes.c_uint64), ("comm_hash", ctypes.c_uint64),
        ("seq", ctypes.c_uint64), ("count", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
        ("stream", ctypes.c_uint64), ("addr", ctypes.c_uint64), ("covered_ts", ctypes.c_uint64),
        ("pid", ctypes.c_uint32), ("tid", ctypes.c_uint32), ("kind", ctypes.c_uint32),
        ("op", ctypes.c_uint32), ("rank", ctypes.c_int32), ("nranks", ctypes.c_int32),
        ("peer", ctypes.c_int32), ("datatype", ctypes.c_uint32), ("redop", ctypes.c_uint32),
        ("result", ctypes.c_int32), ("flags", ctypes.c_uint32), ("pad", ctypes.c_uint32),
    ]


def decode(raw: RawEvent) -> dict:
    """A flat dict of what the event says, with names instead of codes."""
    kind = KINDS.get(raw.kind, str(raw.kind))
    event = {"kind": kind, "ts_ns": raw.ts, "pid": raw.pid, "tid": raw.tid}
    if raw.op:
        event["op"] = OPS.get(raw.op, str(raw.op))
    if kind == "collective":
        event.update(comm_hash=f"{raw.comm_hash:016x}", seq=raw.seq, comm_rank=raw.rank,
                     nranks=raw.nranks, count=raw.count, bytes=raw.bytes,
                     datatype=DATATYPES.get(raw.datatype, str(raw.datatype)),
                     stream=f"{raw.stream:#x}", in_group=bool(raw.flags & IN_GROUP))
        if raw.flags & GRAPH:
            event["graph"] = True       # run by a CUDA graph's replay
        if raw.op in (1, 3, 4):
            event["redop"] = REDOPS.get(raw.redop, str(raw.redop))
        if raw.peer >= 0:
            event["root" if raw.op in ROOTED else "peer"] = raw.peer
    elif kind in ("comm_init", "comm_destroy"):
        event.update(comm_hash=f"{raw.comm_hash:016x}", comm_rank=raw.rank, nranks=raw.nranks,
                     duration_ns=raw.duration)
        if kind == "comm_destroy":
            event["collectives"] = raw.seq
        elif raw.op in SPLITS and raw.result > 0:   # the parent is known: how the split goes
            event.update(parent_hash=f"{raw.covered_ts:016x}", color=raw.peer,
                         key=ctypes.c_int32(raw.count & 0xFFFFFFFF).value,
                         parent_rank=ctypes.c_int32(raw.redop).value,
                         parent_nranks=raw.result, split=raw.datatype)
    elif kind == "sync":
        event.update(duration_ns=raw.duration, stream=f"{raw.stream:#x}", result=raw.result,
                     peer_wait=bool(raw.flags & PEER_WAIT))
        if raw.flags & PEER_WAIT:
            event.update(comm_hash=f"{raw.comm_hash:016x}", seq=raw.seq,
                         covered_ts_ns=raw.covered_ts)
    elif kind in ("alloc", "free"):
        event.update(bytes=raw.bytes, addr=f"{raw.addr:#x}", duration_ns=raw.duration,
                     result=raw.result)
    elif kind == "process_exit" and raw.result >= 0:   # -1: how it ended is not known
        status = raw.result & 0xFFFF          # as wait(2) reports it
        if status & 0x7F:
            event["signal"] = status & 0x7F
        else:
            event["exit_status"] = status >> 8
    elif kind == "memcpy":
        event.update(bytes=raw.bytes, direction=COPY_KINDS.get(raw.datatype, str(raw.datatype)),
                     duration_ns=raw.duration)
    return event
