"""echod's tools: the questions the HTTP API and MCP answer, each declared once with its schemas.

Every tool reads through ``ctx.read()``, a read-only transaction as the sandbox role in which
row-level security already hides the clusters the caller may not see; a ``cluster`` argument
only narrows further. SQL is fixed text with the caller's values bound as parameters. Times go
out as ISO 8601 UTC strings, floats as finite numbers or null.

Importing this package declares the tools, which fills ``echod.registry.REGISTRY``. The tool
modules are imported in the order the tools are listed (the OpenAPI document and the tool
listing follow it): ``summary``, ``stragglers``, ``anomalies``, ``calls``, ``explain``,
``report``, ``jobs``, ``sql``. What they share: ``schema`` (argument and output schemas), ``selection``
(arguments, SQL conditions, JSON values), ``collectives`` (where the collectives are and how they
are read), ``lag`` (entry lag per rank), ``evidence`` (the host's), ``cost`` and ``diagnosis``.
"""

from datetime import UTC, datetime

from ingero.analysis import lower_bar

# Importing a tool module declares its tools: in this order, the order they are listed in.
# isort: off
from . import summary, stragglers, anomalies, calls, explain, report, jobs, sql  # noqa: F401
# isort: on
from .collectives import comm_arrays, communicators, entries_statement
from .diagnosis import Facts, SyncWork, diagnose
from .evidence import HostEvidence, NodeHealth
from .lag import RankLag
from .schema import DEFAULT_MAX_ENTRIES
from .selection import EARLIEST, LATEST, Where, iso, parse_time, reading, select


# What the tests and benchmarks reach as tools.X (datetime, UTC and lower_bar as well: the module
# they replaced had them).
__all__ = ["DEFAULT_MAX_ENTRIES", "EARLIEST", "LATEST", "UTC", "Facts", "HostEvidence",
           "NodeHealth", "RankLag", "SyncWork", "Where", "comm_arrays", "communicators",
           "datetime", "diagnose", "entries_statement", "iso", "lower_bar", "parse_time",
           "reading", "select"]
