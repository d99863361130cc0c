"""systemd's notify protocol: READY=1, WATCHDOG=1, STOPPING=1 and EXTEND_TIMEOUT_USEC over
``$NOTIFY_SOCKET``.

Without ``NOTIFY_SOCKET`` (not started by systemd with Type=notify) every call is a no-op.
A failed send is ignored: telling systemd is never worth stopping a daemon for.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None):
        environ = os.environ if environ is None else environ
        address = environ.get("NOTIFY_SOCKET", "")
        if address.startswith("@"):
            address = "\0" + address[1:]
        self._address = address or None
        usec = environ.get("WATCHDOG_USEC", "")
        pid = environ.get("WATCHDOG_PID", "")
        watched = usec.isdigit() and (not pid or pid == str(os.getpid()))
        self.watchdog_interval = int(usec) / 2e6 if watched and int(usec) > 0 else None
        self._socket = None
        if self._address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    def notify(self, state: str) -> None:
        if self._socket is None:
            return
        try:
            self._socket.sendto(state.encode(), self._address)
        except OSError:
            pass

    def ready(self, status: str = "") -> None:
        self.notify("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self) -> None:
        self.notify("WATCHDOG=1")

    def stopping(self) -> None:
        self.notify("STOPPING=1")

    @contextlib.contextmanager
    def extending(self, status: str, every_s: float = 10.0, by_s: float = 30.0,
                  at_most_s: float = 6 * 3600) -> Iterator[None]:
        """While the body runs (a long start, such as a schema migration), ask systemd every
        ``every_s`` seconds for ``by_s`` more, so that TimeoutStartSec does not kill it; for
        ``at_most_s`` at most, so that a start stuck for good (a lock never granted) is still
        killed, ``by_s`` after the last word."""
        if self._socket is None:
            yield
            return
        done = threading.Event()

        def extend() -> None:
            for _ in range(max(1, int(at_most_s // every_s))):
                self.notify(f"EXTEND_TIMEOUT_USEC={int(by_s * 1e6)}\nSTATUS={status}")
                if done.wait(every_s):
                    return

        thread = threading.Thread(target=extend, name="sd-extend", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
