"""The OpenAPI 3.1 document of the API, generated from the tool registry.

Each tool gets a path of its own (``/api/v1/tools/<name>``) whose request body is the tool's
input schema and whose 200 answer is its output schema, so a client generator or a fuzzer sees
exactly what the handler checks. Every answer carries ``X-Request-Id``; every error is the one
``Error`` object.
"""

from __future__ import annotations

import functools

import ingero

from ..registry import REGISTRY

API_VERSION = "1.0"
JSON = "application/json"
ERROR = {"$ref": "#/components/schemas/Error"}
BEARER = [{"bearer": []}]


def _closed(properties: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required,
            "additionalProperties": False}


STRING, NUMBER = {"type": "string"}, {"type": "number"}
SCHEMAS = {
    "Error": _closed({"error": STRING, "code": STRING}),
    "Versions": _closed({
        "versions": {"type": "array", "items": _closed({"path": STRING, "version": STRING})},
        "echod": STRING}),
    "Health": _closed({"status": {"enum": ["ok"]}, "database": {"enum": ["ok"]},
                       "database_ms": NUMBER, "echod": STRING, "api": STRING,
                       "schema": {"type": ["string", "null"]}},
                      ["status", "database", "database_ms"]),
    "Whoami": _closed({"name": STRING, "token_sha256_prefix": STRING,
                       "clusters": {"type": "array", "items": STRING},
                       "capabilities": {"type": "array",
                                        "items": {"enum": ["read", "sql", "admin"]}},
                       "retiring_until": {"type": ["number", "null"]}}),
    "ToolList": _closed({"tools": {"type": "array", "items": _closed({
        "name": STRING, "summary": STRING, "description": STRING,
        "capability": {"enum": ["read", "sql", "admin"]}, "input_schema": {"type": "object"},
        "output_schema": {"type": "object"}, "allowed": {"type": "boolean"}})}}),
}


def _answer(description: str, schema: dict | None = None, media: str = JSON) -> dict:
    answer = {"description": description,
              "headers": {"X-Request-Id": {"$ref": "#/components/headers/RequestId"}}}
    if schema is not None:
        answer["content"] = {media: {"schema": schema}}
    return answer


def _operation(operation_id: str, summary: str, ok: dict, *, security=None, body=None,
               description: str | None = None) -> dict:
    operation = {"operationId": operation_id, "summary": summary,
                 "responses": {"200": ok, "default": _answer("An error", ERROR)}}
    if description:
        operation["description"] = description
    if security is not None:
        operation["security"] = security
    if body is not None:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    return operation


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


@functools.cache
def document() -> dict:
    run_analysis = REGISTRY["run_analysis"]
    paths = {
        "/api/versions": {"get": _operation(
            "versions", "API versions served (major.minor only)", _answer("Versions",
                                                                          _ref("Versions")),
            security=[])},
        "/api/v1/health": {"get": _operation(
            "health", "Liveness and the database; version detail with a token",
            _answer("Healthy", _ref("Health")), security=[{}, *BEARER])},
        "/api/v1/whoami": {"get": _operation(
            "whoami", "The calling token's name, clusters and capabilities",
            _answer("The caller", _ref("Whoami")))},
        "/api/v1/tools": {"get": _operation(
            "list_tools", "Every tool with its schemas, and whether this token may call it",
            _answer("The tools", _ref("ToolList")))},
        "/api/v1/sql": {"post": _operation(
            "sql", "One read-only SQL statement over the tables of the caller's clusters",
            _answer("The rows", run_analysis.output_schema), body=run_analysis.input_schema,
            description=run_analysis.description)},
        "/api/v1/openapi.json": {"get": _operation(
            "openapi", "This document", _answer("OpenAPI 3.1", {"type": "object"}),
            security=[])},
        "/metrics": {"get": _operation(
            "metrics", "Prometheus metrics of the API",
            _answer("Prometheus text format", STRING, "text/plain"))},
    }
    for tool in REGISTRY:
        paths[f"/api/v1/tools/{tool.name}"] = {"post": _operation(
            tool.name, tool.summary, _answer(f"What {tool.name} found", tool.output_schema),
            body=tool.input_schema,
            description=f"{tool.description}\n\nNeeds the '{tool.capability}' capability.")}
    return {
        "openapi": "3.1.0",
        "info": {"title": "echod", "version": f"{API_VERSION} (echod {ingero.__version__})",
                 "description": "ingero's event store: the evidence of slow ranks, and the "
                                "tools that read it. Authenticate with 'Authorization: Bearer "
                                "<token>' (see 'echod token create')."},
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "security": BEARER,
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "headers": {"RequestId": {"description": "The request's id (the caller's "
                                      "X-Request-Id if it sent a valid one); audit lines carry "
                                      "it too", "required": True, "schema": STRING}},
        },
    }
