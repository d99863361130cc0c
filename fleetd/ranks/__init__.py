"""Rank-level verdicts, online: which rank of a job is late, at which collective, and why.

Per job (the Slurm job an event's process belongs to; one node-wide agent may push several),
the collectives of every rank are aligned per communicator (``alignment``) as their nodes
timed them, and on every tick the rules of ``ingero.analysis`` judge the recent instances with
each node's clock offset at the time removed (a node whose offset is not known yet is not
compared with the others): a rank late persistently or periodically, a rank whose own
kernels are slow, a rank missing from a collective its peers entered (hung, or dead when its
process exited). The job's ranks are the cohort, so no node quorum is needed. Each verdict
carries its cause from the rank's host and GPU facts, a severity, a fix and what it cost;
verdicts and per-rank lag summaries are forwarded to echod. Nothing here touches a socket or
reads the wall clock.

The package: ``common`` (limits, notes, the waits and syncs weighed), then the parts of
``RankAnalysis`` (``observing``, ``settling``, ``judging``, ``verdicts``), and ``analysis``,
its face, which this package gives.
"""

from .analysis import RankAnalysis

__all__ = ["RankAnalysis"]
