"""What every ingero daemon's main loop needs: signal flags, a watchdog pace, logging that
journald reads the level of, and its metrics' listener with the build it runs."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time

from prometheus_client import Info, start_http_server

from . import __version__
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


# syslog's priorities (sd-daemon(3)): journald strips a leading "<N>" and keeps N as the level
PRIORITIES = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4),
              (logging.INFO, 6), (logging.DEBUG, 7))


def syslog_priority(levelno: int) -> int:
    return next((priority for level, priority in PRIORITIES if levelno >= level), 7)


class JournalFormatter(logging.Formatter):
    """Each line of a record (a traceback's too) led by its syslog priority."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).split("\n"))


def to_journal(stream=None, environ=None) -> bool:
    """True when ``stream`` (stderr) is the journal's: systemd says so in JOURNAL_STREAM
    (``DEVICE:INODE`` of the stream it connected), which a child holding another stderr
    inherits but does not match."""
    stream = sys.stderr if stream is None else stream
    said = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    try:
        device, inode = (int(x) for x in said.split(":"))
        st = os.fstat(stream.fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


def setup_logging(level: str, name: str) -> logging.Logger:
    """Log to stderr; under systemd, each line led by its syslog priority so journald keeps the
    level (``journalctl -p warning`` shows a verdict)."""
    fmt = f"{name}: %(levelname)s %(message)s"
    handler = logging.StreamHandler()
    handler.setFormatter(JournalFormatter(fmt) if to_journal(handler.stream)
                         else logging.Formatter(fmt))
    logging.basicConfig(level=level.upper(), handlers=[handler])
    return logging.getLogger(name)


# What echod needs beyond the base install (the head extra).
HEAD_MODULES = ("flask", "gunicorn", "sqlalchemy", "alembic", "psycopg", "jsonschema")


def build_info(prefix: str, registry) -> Info:
    """``{prefix}_build_info{version=...} 1``: which ingero each daemon runs."""
    info = Info(f"{prefix}_build", "The ingero version this daemon runs", registry=registry)
    info.info({"version": __version__})
    return info


def serve_metrics(address: tuple[str, int], registry):
    """Start the /metrics listener in a thread; a taken port is a clear start-up error."""
    host, port = address
    try:
        server, _thread = start_http_server(port, host, registry)
    except OSError as exc:
        raise IngeroError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    return server
