"""The whole product on one machine, for ``make demo``, the tests and the benchmarks: the
daemons started as child processes (``launch``), one node's stack over the sim (``local``)
and the demo that runs a job on it (``demo``).

It needs a checkout (the sim and echod's dependencies), so the wheel leaves it out.
"""
