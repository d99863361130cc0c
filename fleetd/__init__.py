"""fleetd: the head-node service that compares ranks and answers each agent with the bar.

Modules: ``stats`` (pure robust statistics), ``cohorts`` (per-cohort node state and the
threshold service), ``server`` (the ROUTER socket loop), ``metrics``, ``cli``.
"""
