"""The API's limits per caller: a token bucket of requests per key (a token's hash, or an
address that keeps presenting bad tokens), and a cap on the requests one token has in flight at
once, so that one token with slow statements cannot hold every thread of a worker.

Both are kept per worker process: ``init_app`` gives each worker its share of the rate and
burst, and the concurrency cap applies in each worker (``--api-concurrency-per-token``).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from flask import Flask, g

from ..errors import RateLimited


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


class ConcurrencyLimiter:
    """At most ``limit`` requests of one key (a token's hash) in flight at once."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self._in_flight: dict[str, int] = {}
        self._lock = threading.Lock()

    def enter(self, key: str) -> None:
        """Count one more request of ``key``, or RateLimited "concurrency_limited" (429)."""
        with self._lock:
            held = self._in_flight.get(key, 0)
            if held < self.limit:
                self._in_flight[key] = held + 1
                return
        raise RateLimited(f"this token already has {self.limit} requests in flight on this "
                          "worker; retry when one has answered", code="concurrency_limited",
                          retry_after=1)

    def leave(self, key: str) -> None:
        with self._lock:
            held = self._in_flight.pop(key) - 1
            if held:
                self._in_flight[key] = held


def init_app(app: Flask) -> None:
    """Limit each authenticated request (``g.principal``, set by ``auth.init_app`` before):
    its token's rate, then its requests in flight, released when the request ends."""
    settings = app.config["ECHOD_SETTINGS"]
    rate = worker_share(settings.rate_limit, settings.rate_burst, app.config["ECHOD_WORKERS"])
    in_flight = ConcurrencyLimiter(settings.concurrency_per_token)

    @app.before_request
    def limit():
        principal = g.get("principal")
        if principal is None:
            return
        rate.check(principal.token_sha256)
        in_flight.enter(principal.token_sha256)
        g.in_flight_key = principal.token_sha256

    @app.teardown_request
    def release(_exc):
        key = g.pop("in_flight_key", None)
        if key is not None:
            in_flight.leave(key)
