"""Helpers the end-to-end tests share: reading a daemon's /metrics."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} from /metrics; {} while nothing listens."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except ConnectionRefusedError:
        return {}
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ConnectionRefusedError):
            return {}
        raise
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def metric(port: int, name: str, **labels) -> float:
    return scrape(port).get((name, tuple(sorted(labels.items()))), 0.0)
