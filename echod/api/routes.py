"""The API's routes, in two blueprints: ``root`` (/api/versions, /metrics) and ``v1``.

Tools answer ``POST /api/v1/tools/<name>`` with their arguments as the JSON body, checked
against the tool's input schema before it runs, and their answer is capped in bytes
(``--api-answer-cap``). ``POST /api/v1/sql`` is the ``run_analysis`` tool under its own name.
"""

from __future__ import annotations

import time

from flask import Blueprint, current_app, g, jsonify, request
from jsonschema import Draft202012Validator
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

import ingero

from .. import tools  # noqa: F401 (declaring the tools fills REGISTRY)
from ..access.auth import OPTIONAL, PUBLIC, access
from ..access.principal import NotAllowed
from ..errors import BadRequest, NotFound
from ..registry import REGISTRY, Scope, ToolContext, ToolError
from ..tools.selection import raw_job_args
from .jsonio import MAX_BODY_BYTES, answer, loads, read_body
from .openapi import API_VERSION, document

root = Blueprint("root", __name__)
v1 = Blueprint("v1", __name__)

NO_CLUSTERS = Scope(frozenset())
MAX_MESSAGE = 300            # of a schema error, which may quote the caller's value
VALIDATORS = {tool.name: Draft202012Validator(tool.input_schema) for tool in REGISTRY}


def state():
    return current_app.extensions["echod"]


def major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


@root.get("/api/versions")
@access(PUBLIC)
def versions():
    return jsonify(versions=[{"path": "/api/v1", "version": API_VERSION}],
                   echod=major_minor(ingero.__version__))


@root.get("/metrics")
def metrics():
    return state().metrics.render(), 200, {"Content-Type": CONTENT_TYPE_LATEST}


@v1.get("/health")
@access(OPTIONAL)
def health():
    """Liveness and the database; version detail only for a token holder."""
    started = time.monotonic()
    with state().sandbox.reading(g.principal.scope if g.principal else NO_CLUSTERS) as conn:
        conn.exec_driver_sql("SELECT 1")
    body = {"status": "ok", "database": "ok",
            "database_ms": round((time.monotonic() - started) * 1000, 3)}
    if g.principal is not None:
        body.update(echod=ingero.__version__, api=API_VERSION,
                    schema=state().settings.schema_revision)
    return jsonify(body)


@v1.get("/whoami")
def whoami():
    principal = g.principal
    return jsonify(name=principal.name, token_sha256_prefix=principal.token_sha256[:12],
                   clusters=principal.scope.describe(),
                   capabilities=sorted(principal.capabilities),
                   retiring_until=principal.retiring_until)


@v1.get("/tools")
def list_tools():
    principal = g.principal
    return jsonify(tools=[{**tool.listing(), "allowed": principal.may(tool.capability)}
                          for tool in REGISTRY])


@v1.post("/tools/<name>")
def call_tool(name: str):
    if name not in REGISTRY:
        raise NotFound(f"no tool named {name!r}; GET /api/v1/tools lists them",
                       code="unknown_tool")
    return answer(run_tool(name, arguments()), state().settings.answer_cap)


@v1.post("/sql")
def sql():
    return answer(run_tool("run_analysis", arguments()), state().settings.answer_cap)


@v1.get("/openapi.json")
@access(PUBLIC)
def openapi():
    return jsonify(document())


def arguments() -> dict:
    """The JSON object in the request body ({} for an empty body)."""
    raw = read_body(MAX_BODY_BYTES)
    if not raw:
        return {}
    if not request.is_json:
        raise BadRequest("the body must be a JSON object (Content-Type: application/json)",
                         code="bad_json")
    body = loads(raw)
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object of arguments", code="bad_arguments")
    return body


def run_tool(name: str, args: dict) -> dict:
    tool = REGISTRY[name]
    g.extra["tool"] = name
    g.principal.require(tool.capability)
    errors = sorted(VALIDATORS[name].iter_errors(args), key=lambda e: list(e.path))
    if errors:
        first = errors[0]
        where = "/".join(map(str, first.absolute_path)) or "arguments"
        raise BadRequest(f"{name}: {where}: {first.message[:MAX_MESSAGE]}", code="bad_arguments")
    args = whole_numbers(args, tool.input_schema)
    cluster = args.get("cluster")
    if isinstance(cluster, str):
        g.principal.require_cluster(cluster)
    scope = g.principal.scope
    if g.principal.own_jobs_only():
        # every tool, SQL or not, reads under the user's signed claim: the store's row-level
        # security keeps other users' jobs out, whatever the tool asks
        scope = Scope(scope.clusters, user=g.principal.user)
    context = ToolContext(state().sandbox, scope, time.time())
    started = time.monotonic()
    if name != "run_analysis" and ("job" in args or "jobs" in args
                                   or g.principal.own_jobs_only()):
        mine = g.principal.user if g.principal.own_jobs_only() else None
        with context.read() as conn:
            args = raw_job_args(conn, args, mine)
            if mine is not None:
                args = own_jobs(conn, name, args, g.principal)
    result = tool.run(context, args)
    state().metrics.tool_seconds.labels(name).observe(time.monotonic() - started)
    return result


OWNED = """SELECT j.cluster FROM jobs j WHERE j.id = :job AND j."user" = :user
           AND (CAST(:cluster AS text) IS NULL OR j.cluster = :cluster) ORDER BY 1"""


def own_jobs(conn, name: str, args: dict, principal) -> dict:
    """A MUNGE user who is no admin, told plainly what is not theirs: list_jobs of another's
    or every user's jobs is refused, and a job not theirs (as the jobs table says: the Slurm
    prolog recorded its user) is not found; a job of theirs is pinned to its cluster. What
    any tool reads is kept to their own jobs by the claim it reads under, not by this."""
    user = principal.user
    if name == "list_jobs":
        if args.get("all_users") or args.get("user", user) != user:
            raise NotAllowed(f"{user!r} sees their own jobs only: every user's (-a) or "
                             f"another's (-u) are for root, the admin group "
                             f"(--munge-admin-group) or a token", token=principal.name,
                             token_sha256=principal.token_sha256)
        return {**args, "user": user}
    if "job" in args:
        # pinned to the cluster where the job is theirs: the same id elsewhere is another's
        clusters = [c for (c,) in conn.execute(text(OWNED), {
            "job": args["job"], "user": user, "cluster": args.get("cluster")})]
        if not clusters:
            raise ToolError(f"no job {args['job']!r} of {user!r} in the clusters you may see",
                            "not_found", 404)
        if len(clusters) > 1:
            raise ToolError(f"{user!r} ran job {args['job']!r} in several clusters "
                            f"({', '.join(clusters)}): name one with 'cluster'", "ambiguous",
                            400)
        return {**args, "cluster": clusters[0]}
    return args


def whole_numbers(args: dict, schema: dict) -> dict:
    """JSON Schema counts 5.0 as an integer; give the tool the int it declared."""
    properties = schema.get("properties", {})
    return {name: int(value) if isinstance(value, float) and _integer(properties.get(name))
            else value for name, value in args.items()}


def _integer(schema: dict | None) -> bool:
    kind = (schema or {}).get("type")
    return kind == "integer" or (isinstance(kind, list) and "integer" in kind)
