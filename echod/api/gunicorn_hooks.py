"""gunicorn settings that are code: a worker that exits leaves its metric files summed but its
gauges dropped (prometheus_client's multiprocess mode)."""

from prometheus_client import multiprocess


def child_exit(server, worker):
    multiprocess.mark_process_dead(worker.pid)
