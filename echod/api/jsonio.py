"""JSON in and out of the API, strictly (RFC 8259).

In: the request body is read whole up to its size limit, chunked or not, and refused past it
(413), never cut short and run; then it must be UTF-8 JSON with no ``NaN`` or ``Infinity``
(nor a number too large to be finite), no lone surrogate and at most ``MAX_DEPTH`` levels of
nesting (400 ``bad_json``).

Out: every answer is strict JSON in UTF-8. A float that is not finite goes out as the string
PostgreSQL spells it (``"NaN"``, ``"Infinity"``, ``"-Infinity"``), as the SQL sandbox sends
them, and a lone surrogate in a string as U+FFFD. A tool's answer is encoded piece by piece
(each row of a list at the top of the answer on its own) and refused (422
``answer_too_large``) as soon as it passes the byte cap, not after it is all built.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

from flask import Response, current_app, g, request
from flask.json.provider import DefaultJSONProvider

from ..errors import AnswerTooLarge, BadRequest, TooLarge
from ..sandbox import NON_FINITE

MAX_BODY_BYTES = 1024 * 1024
# An oversized body up to this size is read and dropped before the 413 goes out, so that a
# client still sending it reads the answer instead of a reset connection; past it, the
# connection is closed on the sender.
DRAIN_LIMIT_BYTES = 16 * MAX_BODY_BYTES

MAX_DEPTH = 32
READ_BYTES = 64 * 1024
LONE_SURROGATE = re.compile("[\ud800-\udfff]")   # json.loads joins the pairs that are not lone
STRICT = {"allow_nan": False, "ensure_ascii": False, "default": DefaultJSONProvider.default}


# -- in ----------------------------------------------------------------------------------------

def read_body(limit: int) -> bytes:
    """The request body, or TooLarge once it passes ``limit`` bytes, whether it came with a
    Content-Length or chunked (the server ends the stream where the chunks end); read once
    a request (MUNGE's check reads it before the view)."""
    if "body" in g:
        return g.body
    if (request.content_length or 0) > limit:
        raise TooLarge(f"the body is over {limit} bytes")
    stream, body = request.environ["wsgi.input"], bytearray()
    while len(body) <= limit:
        chunk = stream.read(min(READ_BYTES, limit + 1 - len(body)))
        if not chunk:
            g.body = bytes(body)
            return g.body
        body += chunk
    raise TooLarge(f"the body is over {limit} bytes")


def drain_body(limit: int) -> None:
    """Read and drop what is left of a refused body, up to ``limit`` bytes, so that a client
    still sending it reads the answer rather than a reset connection."""
    if (request.content_length or 0) > limit:
        return
    stream = request.environ.get("wsgi.input")
    while stream is not None and limit > 0:
        chunk = stream.read(min(READ_BYTES, limit))
        if not chunk:
            return
        limit -= len(chunk)


def loads(raw: bytes) -> Any:
    """The JSON value of ``raw``, or BadRequest ``bad_json`` saying what is wrong with it."""
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_refuse_constant,
                           parse_float=_finite)
    except RecursionError:
        raise BadRequest(f"the body nests deeper than {MAX_DEPTH} levels",
                         code="bad_json") from None
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}", code="bad_json") from None
    _check_nesting_and_text(value)
    return value


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite(literal: str) -> float:
    number = float(literal)
    if not math.isfinite(number):
        raise ValueError(f"{literal[:40]} is too large a number")
    return number


def _check_nesting_and_text(value: Any) -> None:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str) and LONE_SURROGATE.search(item):
            raise BadRequest("the body holds a lone surrogate (\\ud800 to \\udfff without its "
                             "pair), which is no Unicode character", code="bad_json")
        if isinstance(item, (dict, list)):
            if depth > MAX_DEPTH:
                raise BadRequest(f"the body nests deeper than {MAX_DEPTH} levels",
                                 code="bad_json")
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)


# -- out ---------------------------------------------------------------------------------------

def encode(value: Any, **options: Any) -> bytes:
    """``value`` as strict JSON in UTF-8 (see the module's docstring)."""
    try:
        return json.dumps(value, **STRICT, **options).encode("utf-8")
    except ValueError:         # NaN or an infinity, or a lone surrogate (UnicodeEncodeError)
        return json.dumps(strict(value), **STRICT, **options).encode("utf-8")


def strict(value: Any) -> Any:
    """``value`` with what strict JSON cannot carry replaced."""
    if isinstance(value, float) and not math.isfinite(value):
        return NON_FINITE[str(value)]
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, dict):
        return {strict(key): strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(item) for item in value]
    return value


class StrictJSONProvider(DefaultJSONProvider):
    """Flask's JSON (``jsonify``, error answers) made strict."""

    sort_keys = False

    def dumps(self, obj: Any, **kwargs: Any) -> str:
        kwargs.setdefault("sort_keys", self.sort_keys)
        return encode(obj, **kwargs).decode("utf-8")

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        return loads(s if isinstance(s, bytes) else s.encode("utf-8", "surrogatepass"))


def answer(value: Any, cap: int) -> Response:
    """A 200 with ``value`` as strict JSON, or AnswerTooLarge as soon as it passes ``cap``
    bytes."""
    body = bytearray()
    for piece in _pieces(value, levels=2):
        body += piece
        if len(body) > cap:
            raise AnswerTooLarge(f"the answer is over {cap} bytes (the server's "
                                 "--api-answer-cap); ask for fewer or narrower rows")
    body += b"\n"
    return current_app.response_class(bytes(body), mimetype="application/json")


def _pieces(value: Any, levels: int) -> Iterator[bytes]:
    """The JSON of ``value`` in pieces: the objects and arrays of its first ``levels`` levels
    opened up, anything deeper encoded whole."""
    if levels and isinstance(value, dict):
        yield b"{"
        for i, (key, item) in enumerate(value.items()):
            yield (b"," if i else b"") + encode(str(key)) + b":"
            yield from _pieces(item, levels - 1)
        yield b"}"
    elif levels and isinstance(value, (list, tuple)):
        yield b"["
        for i, item in enumerate(value):
            if i:
                yield b","
            yield from _pieces(item, levels - 1)
        yield b"]"
    else:
        yield encode(value, separators=(",", ":"))
