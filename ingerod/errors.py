"""Errors of the agent.

    IngeroError (ingero.errors)
    └── TracingError    the BPF program cannot be compiled, loaded or attached
"""

from ingero.errors import IngeroError


class TracingError(IngeroError):
    """eBPF tracing cannot start: no bcc, no privilege, no kernel headers."""
