"""What every ingero daemon's main loop needs: signal flags, a watchdog pace, quiet logging."""

from __future__ import annotations

import logging
import signal
import time

from prometheus_client import start_http_server

from .errors import IngeroError


class SignalFlags:
    """Signal handlers only record the signal; the main loop reads and clears them."""

    def __init__(self):
        self.stop = False
        self.reload = False

    def install(self) -> "SignalFlags":
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_reload)
        return self

    def _on_stop(self, signum, frame) -> None:
        self.stop = True

    def _on_reload(self, signum, frame) -> None:
        self.reload = True


class Watchdog:
    """Paces WATCHDOG=1 pings from the main loop, so a stuck loop stops pinging."""

    def __init__(self, notifier):
        self.notifier = notifier
        self.next_ping = 0.0

    def tick(self, now: float) -> None:
        interval = self.notifier.watchdog_interval
        if interval is not None and now >= self.next_ping:
            self.notifier.watchdog()
            self.next_ping = now + interval


class RateLimitedLog:
    """Logs a repeated complaint at most once per interval, with how many were suppressed."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0, clock=time.monotonic):
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str, *args, exc_info: bool = False) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        suppressed = self._suppressed.pop(key, 0)
        suffix = f" ({suppressed} more like it suppressed)" if suppressed else ""
        self.logger.warning(message + suffix, *args, exc_info=exc_info)
        self._last[key] = now
        return True


def setup_logging(level: str, name: str) -> logging.Logger:
    logging.basicConfig(level=level.upper(), format=f"{name}: %(levelname)s %(message)s")
    return logging.getLogger(name)


def serve_metrics(address: tuple[str, int], registry):
    """Start the /metrics listener in a thread; a taken port is a clear start-up error."""
    host, port = address
    try:
        server, _thread = start_http_server(port, host, registry)
    except OSError as exc:
        raise IngeroError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    return server
