"""The ``ingero`` command a user runs: its options (``cli``), echod's client and the commands
that ask it (``client``, ``query``, ``report``, ``sacct``, ``words``, ``perfetto``), fleetd's
threshold query, ``ingero mcp`` and ``ingero version``.

Above the core (``ingero``'s own modules), beside nothing: no daemon imports from here.
"""
