"""The SQL sandbox: ``check`` (one read-only statement, tokenized as PostgreSQL does), ``roles``
(a LOGIN role per tenant, the readable tables) and ``run`` (the statement run as its tenant,
under the signed claim row-level security reads). Each imports only those before it; the
package's face is ``run``'s.
"""

from .run import (DEFAULT_ROLE, DEFAULT_ROW_CAP, DEFAULT_TIMEOUT_MS, NON_FINITE, READABLE_TABLES,
                  Sandbox, SqlResult, catalog_closed, json_ready, prepare, sandbox_url)

__all__ = ["DEFAULT_ROLE", "DEFAULT_ROW_CAP", "DEFAULT_TIMEOUT_MS", "NON_FINITE",
           "READABLE_TABLES", "Sandbox", "SqlResult", "catalog_closed", "json_ready", "prepare",
           "sandbox_url"]
