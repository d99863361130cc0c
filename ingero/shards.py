"""Which fleetd owns a job when several share the work (``fleetd --shard K/N``).

Every agent is given the same list of fleetd endpoints (``ingerod --fleet A,B,...``) and sends
each event to the fleetd that owns its job: the job's cross-rank analysis needs every rank's
collectives in one process, and the owner is computed the same way on every node, with no
coordination. A node's health score goes with its pushes; a node running one job pushes to that
job's owner only, so N agents cost the shards N pushes a second together, split between them.
"""

from __future__ import annotations

import zlib


def owner(cluster: str, job: str | None, shards: int) -> int:
    """The shard (0 … shards-1) that owns ``job`` of ``cluster``; events of no job: shard 0."""
    if shards <= 1 or job is None:
        return 0
    return zlib.crc32(f"{cluster}/{job}".encode()) % shards


def home(node: str, shards: int) -> int:
    """Where an idle node's score goes: spread by its name, so idle nodes split evenly too."""
    return zlib.crc32(node.encode()) % shards if shards > 1 else 0
