"""The event vocabulary, declared once: what ingerod emits, the wire carries, echod stores and
the tools filter on. A name of the domain is spelled here and imported everywhere else.
"""

from __future__ import annotations

import re

# A node's or cluster's name: what Slurm takes as a NodeName or ClusterName and a file name
# allows (an agent key is authorised as NODE.key or NODE@CLUSTER.key), never ':' (event ids
# are namespaced NODE:...) nor '@'.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
NAME_RULE = "1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"

# What a rank did, traced by the probes (bpf/*.bpf.c).
TRACED_KINDS = ("collective", "comm_init", "comm_destroy", "sync", "alloc", "free", "memcpy")
# What its host did to it, from tracepoints and /proc.
HOST_KINDS = ("preempted", "blockio", "process_exit")
# What the agent concluded: its own score against its bar, and fleetd's word on its ranks; that
# it restarted (nothing was traced between its last push and its restart); and that it cannot
# trace at all (no kernel headers, no bcc …).
AGENT_KINDS = ("straggler", "resolved", "rank_straggler", "rank_resolved", "agent_restart",
               "agent_untraced")
KINDS = TRACED_KINDS + HOST_KINDS + AGENT_KINDS

# The health score's signals, each in [0, 1].
SIGNALS = ("throughput", "compute", "memory", "cpu")

# cudaMemcpyKind, by its value.
COPY_DIRECTIONS = ("host_to_host", "host_to_device", "device_to_host", "device_to_device",
                   "default")

# NCCL calls that move data between two ranks only: they have their own order per peer pair
# and are not aligned with the collectives.
POINT_TO_POINT = ("ncclSend", "ncclRecv")
# A group of Send/Recv in which a rank sent to and received from every peer (PyTorch's
# all_to_all_single with uneven splits): ingerod tells each as one entry, numbered among the
# communicator's groups of Send/Recv, and fleetd judges it as a collective of its own.
EXCHANGE = "alltoallv"
# What keeps a sequence of its own on a communicator, apart from its collectives'.
OWN_SEQUENCE = POINT_TO_POINT + (EXCHANGE,)
# The communicator hash of a collective whose communicator the agent did not see created.
UNKNOWN_COMM = "0" * 16

# Event attributes the store lifts into columns of their own (name, integer bounds or None for
# text); the rest stays in ``attrs``.
INT32 = (-2**31, 2**31 - 1)
UINT63 = (0, 2**63 - 1)
# What one call may move or allocate (64 TiB, past any GPU's or host's memory) and how long it
# may last (19.5 hours): past them a value measures nothing (a failed cudaMalloc carries the
# size it was asked for, whatever that was), and a summary's sums over a push's events (up to
# 2^16 of them) would not fit the store's 64-bit integers.
CALL_BOUNDS = (0, 2**46)
LIFTED = (("rank", INT32), ("op", None), ("comm_hash", None), ("seq", UINT63),
          ("bytes", CALL_BOUNDS), ("duration_ns", CALL_BOUNDS))

# Slurm's job states as sacct -s names them, by code.
STATE_CODES = {"BF": "BOOT_FAIL", "CA": "CANCELLED", "CD": "COMPLETED", "DL": "DEADLINE",
               "F": "FAILED", "NF": "NODE_FAIL", "OOM": "OUT_OF_MEMORY", "PR": "PREEMPTED",
               "R": "RUNNING", "RQ": "REQUEUED", "TO": "TIMEOUT"}
