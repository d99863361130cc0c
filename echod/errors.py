"""Errors of the event store.

    IngeroError (ingero.errors)
    └── EchodError
        ├── StorageError            the database cannot be used as echod's store
        │   └── SchemaTooNew        its schema revision is newer than this echod knows
        ├── DatabaseUnavailable     PostgreSQL cannot commit now (down, restarting)
        ├── EmbeddedDatabaseError   the private PostgreSQL cluster cannot be found, set up or run
        ├── TokenFileError          (auth) --tokens-file cannot be used as written
        ├── SqlError                (sandbox.check) a SQL statement is refused (SqlRefused),
        │                           runs past its timeout (SqlTimeout) or fails (SqlFailed): 400
        ├── ApiStartError           (api.supervisor) the API cannot be configured or started
        └── HttpError               an answer of the HTTP API other than 200 (status, code)
            ├── BadRequest          400 bad_request (bad_json, bad_arguments, ...)
            ├── Unauthorized        401 unauthorized
            ├── Forbidden           403 forbidden
            ├── NotFound            404 not_found
            ├── MethodNotAllowed    405 method_not_allowed
            ├── TooLarge            413 too_large: the request body
            ├── AnswerTooLarge      422 answer_too_large: the answer, past --api-answer-cap
            ├── RateLimited         429 rate_limited (concurrency_limited), with Retry-After
            ├── Unavailable         503 unavailable (draining, database_unavailable)
            └── AuthError           (auth) a request is refused, with whose request it was
                                    (its TokenRefused is also Unauthorized, its NotAllowed
                                    also Forbidden)

Every answer of the API other than 200 is an HttpError, in one shape ``{"error": ..., "code":
...}``: ``echod.api.error_shape`` translates at the boundary what is not one yet (Flask's own
HTTP errors, ``registry.ToolError``, ``SqlError``, a lost database).

A row that fails validation is not an error: ``store.write_batch`` reports it among the rejected
rows and stores the rest.
"""

from ingero.errors import IngeroError


class EchodError(IngeroError):
    """Base of every error echod raises on purpose."""


class StorageError(EchodError):
    """The database cannot be used as echod's store (wrong dialect, unusable schema)."""


class SchemaTooNew(StorageError):
    """The database was migrated by a newer echod; this one must not touch it."""

    def __init__(self, current: str, head: str):
        super().__init__(f"database schema revision {current} is newer than this echod knows "
                         f"(its newest revision is {head}); upgrade echod")
        self.current = current
        self.head = head


class EmbeddedDatabaseError(EchodError):
    """The embedded PostgreSQL cluster cannot be found, initialised, started or stopped."""


class DatabaseUnavailable(EchodError):
    """PostgreSQL cannot commit now; an ingest batch stays unacknowledged and comes again."""


class HttpError(EchodError):
    """An answer of the HTTP API other than 200: the class gives ``status`` and the default
    ``code``; an instance may name a finer code and add headers (Retry-After, Allow...)."""

    status = 500
    code = "internal"

    def __init__(self, message: str, *, code: str | None = None, headers: dict | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        self.headers = dict(headers or {})
        self.retry_after = retry_after
        if retry_after is not None:
            self.headers["Retry-After"] = str(retry_after)


class BadRequest(HttpError):
    status, code = 400, "bad_request"


class Unauthorized(HttpError):
    status, code = 401, "unauthorized"


class Forbidden(HttpError):
    status, code = 403, "forbidden"


class NotFound(HttpError):
    status, code = 404, "not_found"


class MethodNotAllowed(HttpError):
    status, code = 405, "method_not_allowed"


class TooLarge(HttpError):
    """The request body is over the limit."""

    status, code = 413, "too_large"


class AnswerTooLarge(HttpError):
    """The answer would pass --api-answer-cap bytes: the caller should ask for less."""

    status, code = 422, "answer_too_large"


class RateLimited(HttpError):
    status, code = 429, "rate_limited"


class Unavailable(HttpError):
    status, code = 503, "unavailable"


HTTP_ERRORS = {cls.status: cls for cls in (BadRequest, Unauthorized, Forbidden, NotFound,
                                           MethodNotAllowed, TooLarge, AnswerTooLarge,
                                           RateLimited, Unavailable)}


def http_error(status: int, code: str, message: str, headers: dict | None = None) -> HttpError:
    """The HttpError of ``status`` (its class where there is one) with ``code``."""
    cls = HTTP_ERRORS.get(status)
    if cls is not None:
        return cls(message, code=code, headers=headers)
    error = HttpError(message, code=code, headers=headers)
    error.status = status
    return error
