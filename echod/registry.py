"""The tools echod answers with, declared once: name, capability, input and output JSON Schemas
(draft 2020-12) and the function that runs them.

The HTTP API (``POST /api/v1/tools/<name>``), its OpenAPI document and the MCP server are all
built from ``REGISTRY``; nothing else lists the tools. A tool reads through ``ToolContext.read``,
a read-only transaction as the sandbox role with the caller's clusters set, so tenancy is
PostgreSQL's row-level security and not each query's care.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

CAPABILITIES = ("read", "sql", "admin")


@dataclass(frozen=True)
class Scope:
    """The clusters a caller may see: a set of names, or None for every cluster; and, for SQL
    by a user proven by MUNGE, the user whose jobs alone it reads (row-level security)."""

    clusters: frozenset[str] | None = None
    user: str | None = None

    @property
    def restricted(self) -> bool:
        """Whether the caller sees less than the whole store."""
        return self.clusters is not None or self.user is not None

    def allows(self, cluster: str) -> bool:
        return self.clusters is None or cluster in self.clusters

    def describe(self) -> list[str]:
        return ["*"] if self.clusters is None else sorted(self.clusters)


class ToolError(Exception):
    """A tool cannot answer: the message is for the caller, ``code`` is machine-readable,
    ``status`` is the HTTP status (400 bad arguments, 404 nothing such in the caller's scope)."""

    def __init__(self, message: str, code: str = "bad_request", status: int = 400):
        super().__init__(message)
        self.code = code
        self.status = status


@dataclass
class ToolContext:
    """What a tool may use: ``read()`` opens the scoped read-only transaction; ``sandbox`` runs
    checked SQL (run_analysis); ``now`` is the request's time (unix seconds)."""

    sandbox: Any                # echod.sandbox.Sandbox
    scope: Scope
    now: float

    @contextlib.contextmanager
    def read(self, timeout_ms: int | None = None) -> Iterator[Any]:
        with self.sandbox.reading(self.scope, timeout_ms=timeout_ms) as connection:
            yield connection


@dataclass(frozen=True)
class Tool:
    name: str
    summary: str                 # one line, for listings
    description: str             # what it answers and how to read the answer
    input_schema: dict
    output_schema: dict
    run: Callable[[ToolContext, dict], dict]
    capability: str = "read"

    def listing(self) -> dict:
        return {"name": self.name, "summary": self.summary, "description": self.description,
                "capability": self.capability, "input_schema": self.input_schema,
                "output_schema": self.output_schema}


@dataclass
class Registry:
    tools: dict[str, Tool] = field(default_factory=dict)

    def add(self, tool: Tool) -> Tool:
        if tool.name in self.tools:
            raise ValueError(f"tool {tool.name} declared twice")
        if tool.capability not in CAPABILITIES:
            raise ValueError(f"tool {tool.name}: unknown capability {tool.capability}")
        self.tools[tool.name] = tool
        return tool

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools.values())


REGISTRY = Registry()


def obj(properties: dict, required: tuple[str, ...] = (), **extra) -> dict:
    """A closed JSON Schema object: the listed properties and no others."""
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False, **extra}


def tool(name: str, *, summary: str, input_schema: dict, output_schema: dict,
         capability: str = "read", registry: Registry = REGISTRY):
    """Declare the decorated function ``run(ctx, args) -> dict`` as a tool; its docstring is the
    description."""
    def declare(run: Callable[[ToolContext, dict], dict]) -> Callable[[ToolContext, dict], dict]:
        registry.add(Tool(name, summary, (run.__doc__ or summary).strip(), input_schema,
                          output_schema, run, capability))
        return run
    return declare
