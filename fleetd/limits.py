"""File descriptors for a fleet: one ZeroMQ connection per agent, each a descriptor.

At start fleetd raises its soft RLIMIT_NOFILE to the hard limit, and says how many it got; when
that is still short of ``max_nodes`` agents plus some room for itself, it says how to fix it.
"""

from __future__ import annotations

import resource

HEADROOM = 256          # listeners, echod's link, metrics, logs, the Python runtime


def raise_nofile(max_nodes: int, get=resource.getrlimit, put=resource.setrlimit
                 ) -> tuple[int, int, str | None]:
    """(soft limit before, soft limit now, a warning or None)."""
    wanted = max_nodes + HEADROOM
    soft, hard = get(resource.RLIMIT_NOFILE)
    target = max(soft, wanted) if hard == resource.RLIM_INFINITY else hard
    if target > soft:
        try:
            put(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            target = soft
    warning = None
    if target < wanted:
        warning = (f"fleetd may open only {target} file descriptors but may serve "
                   f"{max_nodes} agents (--max-nodes), one connection each: raise the hard "
                   f"limit to at least {wanted} (LimitNOFILE= in fleetd.service, or ulimit -n)")
    return soft, target, warning
