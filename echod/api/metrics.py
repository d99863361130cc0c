"""The API's Prometheus metrics. Under gunicorn each worker writes its own files in
``PROMETHEUS_MULTIPROC_DIR`` (echod sets it) and ``/metrics`` sums them across workers, dead
ones included; without it (one process) the metrics live in a private registry."""

from __future__ import annotations

import os

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector


class ApiMetrics:
    def __init__(self):
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r = None if self.multiprocess else CollectorRegistry()
        self.registry = r
        self.requests = Counter("ingero_echo_api_requests", "API requests by route and status",
                                ["route", "status"], registry=r)
        self.errors = Counter("ingero_echo_api_errors", "API answers other than 200, by error "
                              "code (unauthorized, rate_limited, sql_refused, ...)", ["code"],
                              registry=r)
        self.seconds = Histogram("ingero_echo_api_request_duration_seconds", "API request "
                                 "duration", ["route"], registry=r)
        self.tool_seconds = Histogram("ingero_echo_tool_duration_seconds", "Time a tool ran",
                                      ["tool"],
                                      buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10,
                                               30, 60), registry=r)
        self.audit_failures = Counter("ingero_echo_audit_failures", "Audit lines that could "
                                      "not be written", registry=r)

    def observe(self, route: str, status: int, code: str | None, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.seconds.labels(route).observe(seconds)
        if code is not None:
            self.errors.labels(code).inc()

    def render(self) -> bytes:
        if not self.multiprocess:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        return generate_latest(registry)
