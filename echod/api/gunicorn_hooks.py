"""gunicorn settings that are code: a worker that exits leaves its metric files summed but its
gauges dropped (prometheus_client's multiprocess mode); gunicorn ends with echod."""

import ctypes
import os
import signal

from prometheus_client import multiprocess


def child_exit(server, worker):
    multiprocess.mark_process_dead(worker.pid)


PR_SET_PDEATHSIG = 1


def on_starting(server):
    """The API goes when echod goes, however echod goes (kill -9 included): a gunicorn left
    behind would hold the port, and the echod that systemd restarts could not serve."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
        server.log.warning("cannot tie the API to echod's life: errno %d", ctypes.get_errno())
    if str(os.getppid()) != os.environ.get("ECHOD_PID", str(os.getppid())):
        os._exit(1)              # echod died before the tie was made
