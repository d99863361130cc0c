"""The JSON Schemas the tools share: their arguments (names, times, ranks, the window, the
sample size) and the pieces of their closed output objects."""

from __future__ import annotations

from ..registry import obj

DEFAULT_MAX_ENTRIES = 250_000

NAME = {"type": "string", "minLength": 1, "maxLength": 256}
TIME_ARG = {"type": "string", "format": "date-time", "minLength": 1, "maxLength": 64}
RANK = {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
LIMIT = {"type": "integer", "minimum": 1, "maximum": 10_000, "default": 100}
MAX_ENTRIES = {"type": "integer", "minimum": 1000, "maximum": 10_000_000,
               "default": DEFAULT_MAX_ENTRIES,
               "description": "Most raw (collective, rank) entries read; past it the lags "
                              "come from fleetd's per-rank summaries (coverage.source), or "
                              "where there are none every k-th collective is read "
                              "(coverage.stride is k)."}


def described(schema: dict, description: str) -> dict:
    return {**schema, "description": description}


CLUSTER_ARG = described(NAME, "Only this cluster (else every cluster the caller may see).")
JOB_ARG = described(NAME, "Only this job: its Slurm job id as sacct's -j takes it (1234, "
                    "1234_7 for an array task, 1234+1 for a heterogeneous component, 1234.0 "
                    "for a step, which names its job) or its raw id.")
NODE_ARG = described(NAME, "Only this node.")
RANK_ARG = described(RANK, "Only this rank (the process's global rank).")
SINCE_ARG = described(TIME_ARG, "Window start, ISO 8601 (RFC 3339) date-time, inclusive; "
                                "no offset means UTC.")
UNTIL_ARG = described(TIME_ARG, "Window end, ISO 8601 (RFC 3339) date-time, exclusive.")

INT = {"type": "integer"}
NUM = {"type": "number"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
TIME = {"type": "string", "format": "date-time"}
INT_OR_NULL = {"type": ["integer", "null"]}
NUM_OR_NULL = {"type": ["number", "null"]}
STR_OR_NULL = {"type": ["string", "null"]}
TIME_OR_NULL = {"type": ["string", "null"], "format": "date-time"}
SCALAR = {"type": ["string", "number", "boolean", "null"]}


def array(items: dict) -> dict:
    return {"type": "array", "items": items}


def closed(properties: dict) -> dict:
    """An output object: every property always present."""
    return obj(properties, tuple(properties))


def nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


WINDOW_OUT = closed({"since": TIME_OR_NULL, "until": TIME_OR_NULL})
