"""ingero: finds the slow rank of a distributed GPU training job, says why, and what it costs.

This package holds what the daemons share (the wire protocol, settings, key handling, systemd
notification) and the ``ingero`` command line.
"""

__version__ = "0.2.0"
