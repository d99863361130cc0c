"""The API's rate limit: a token bucket per caller (a token's hash, or an address that keeps
presenting bad tokens), kept per worker process: ``init_app`` gives each worker its share of
the rate and burst."""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from flask import Flask, g

from .errors import RateLimited


class RateLimiter:
    """A token bucket per key (a token's hash): ``burst`` requests at once, then ``rate_per_s``.
    A key idle long enough for its bucket to be full again is forgotten, and at most
    ``max_keys`` are kept (the least recently used goes first)."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 10_000):
        if rate_per_s <= 0 or burst < 1 or max_keys < 1:
            raise ValueError("rate_per_s must be > 0, burst and max_keys >= 1")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.clock = clock
        self.max_keys = max_keys
        self._full_after = burst / rate_per_s
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key → (level, at)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, key: str) -> float:
        """0.0 if the request may go now (and count it), else the seconds until one may."""
        with self._lock:
            now = self.clock()
            self._forget_idle(now)
            level, at = self._buckets.pop(key, (float(self.burst), now))
            level = min(float(self.burst), level + (now - at) * self.rate_per_s)
            allowed = level >= 1 - 1e-6          # a retry exactly when told is not refused
            wait = 0.0 if allowed else (1 - level) / self.rate_per_s
            self._buckets[key] = (max(0.0, level - 1) if allowed else level, now)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
            return wait

    def check(self, key: str) -> None:
        """``take``, with a refusal raised as RateLimited (429) with Retry-After."""
        wait = self.take(key)
        if wait > 0:
            retry_after = max(1, math.ceil(wait))
            raise RateLimited(f"rate limited: {self.rate_per_s:g} requests/s with bursts of "
                              f"{self.burst}; retry in {retry_after} s", retry_after=retry_after)

    def _forget_idle(self, now: float) -> None:
        while self._buckets:
            key, (_level, at) = next(iter(self._buckets.items()))
            if now - at < self._full_after:
                return
            del self._buckets[key]


def worker_share(rate_per_s: float, burst: int, workers: int) -> RateLimiter:
    """A worker's limiter: its share of the rate and burst (at least 1) of ``workers``."""
    return RateLimiter(rate_per_s / workers, max(1, burst // workers))


def init_app(app: Flask) -> None:
    """Limit each authenticated request (``g.principal``, set by ``auth.init_app`` before)
    to its token's rate."""
    settings = app.config["ECHOD_SETTINGS"]
    rate = worker_share(settings.rate_limit, settings.rate_burst, app.config["ECHOD_WORKERS"])

    @app.before_request
    def limit():
        principal = g.get("principal")
        if principal is None:
            return
        rate.check(principal.token_sha256)
