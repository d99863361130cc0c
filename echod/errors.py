"""Errors of the event store.

    IngeroError (ingero.errors)
    └── EchodError
        ├── StorageError            the database cannot be used as echod's store
        │   └── SchemaTooNew        its schema revision is newer than this echod knows
        ├── DatabaseUnavailable     PostgreSQL cannot commit now (down, restarting)
        ├── EmbeddedDatabaseError   the private PostgreSQL cluster cannot be found, set up or run
        ├── TokenFileError          (auth) --tokens-file cannot be used as written
        ├── AuthError               (auth) an API request is refused: 401, 403 or 429
        ├── SqlError                (sandbox) a SQL statement is refused (SqlRefused), runs past
        │                           its timeout (SqlTimeout) or fails (SqlFailed): 400
        └── ApiStartError           (api.supervisor) the API cannot be configured or started

The API answers any of them that carries ``status`` and ``code`` in its one error shape; so does
``registry.ToolError``, which a tool raises for bad arguments (400) or nothing found (404).

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
