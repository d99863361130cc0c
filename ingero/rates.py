"""GPU prices per hour: the shipped table (``rates.yaml``), overridable per site."""

from __future__ import annotations

from pathlib import Path

import yaml

from .errors import ConfigError

SHIPPED = Path(__file__).with_name("rates.yaml")
USD_PLACES = 6     # a millionth of a dollar: a short job's cost is cents, not 0


def load_rates(path: Path | None = None) -> dict[str, dict[str, float]]:
    """GPU model → provider → USD per GPU-hour, checked."""
    source = path or SHIPPED
    try:
        table = yaml.safe_load(source.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"rates file {source}: {exc}") from None
    if not isinstance(table, dict):
        raise ConfigError(f"rates file {source}: expected a map of GPU models")
    for gpu, providers in table.items():
        if not isinstance(providers, dict) or not all(
                type(v) in (int, float) and 0 < v < 10_000 for v in providers.values()):
            raise ConfigError(f"rates file {source}: {gpu}: expected provider: USD per hour")
    return {str(g): {str(p): float(v) for p, v in ps.items()} for g, ps in table.items()}


def rate(gpu: str | None, provider: str | None, usd_per_gpu_hour: float | None = None,
         path: Path | None = None) -> float | None:
    """The price of one GPU-hour: the explicit rate, else the table's for gpu + provider, else
    None (costs in GPU-seconds only)."""
    if usd_per_gpu_hour is not None:
        return usd_per_gpu_hour
    if gpu is None or provider is None:
        return None
    table = load_rates(path)
    try:
        return table[gpu][provider]
    except KeyError:
        raise ConfigError(f"no rate for GPU {gpu!r} at provider {provider!r}; known: "
                          + ", ".join(f"{g}/{p}" for g in table for p in table[g])) from None


def usd(gpu_seconds: float, usd_per_gpu_hour: float | None) -> float | None:
    """What GPU time costs at a rate (None: unpriced), rounded one way wherever it is said:
    fleetd's verdicts and echod's get_cost."""
    if usd_per_gpu_hour is None:
        return None
    return round(gpu_seconds / 3600.0 * usd_per_gpu_hour, USD_PLACES)
