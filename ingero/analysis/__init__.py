"""The analysis: pure numpy functions of arrays that turn traced collectives into verdicts.

No sockets, clocks or SQL inside: fleetd runs it online, echod's tools on stored data, and the
tests by feeding arrays. A formula or a name of the domain is written here once.
"""

from .lag import LagStats, entry_lags
from .robust import (MAD_TO_SIGMA, Bar, ema, lower_bar, mad_threshold, median_mad, robust_bar,
                     under_bar, upper_bar)
from .segments import segment_quantile, segments
from .stragglers import LagPolicy, lag_bar

__all__ = [
    "MAD_TO_SIGMA", "Bar", "LagPolicy", "LagStats", "ema", "entry_lags", "lag_bar",
    "lower_bar", "mad_threshold", "median_mad", "robust_bar", "segment_quantile", "segments",
    "under_bar", "upper_bar",
]
