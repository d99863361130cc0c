"""The first wall of the SQL sandbox: a tokenizer that reads SQL as PostgreSQL does (comments,
nested comments, every kind of quoting, string continuation) and ``check_sql``, which refuses
anything but one SELECT, WITH, VALUES, TABLE or EXPLAIN statement (no EXPLAIN for a caller
scoped to clusters), any word that writes or changes the schema or the session, and functions
that reach files, large objects, the network, locks, sequences, other sessions, table
statistics or run SQL given as a string. ``echod.sandbox`` runs what passes.

Errors::

    EchodError (echod.errors)
    └── SqlError                status 400
        ├── SqlRefused          sql_refused: the check, or PostgreSQL's privilege or read-only
        │                       refusal
        ├── SqlTimeout          sql_timeout: the statement ran past its time limit
        └── SqlFailed           sql_error: any other error in the caller's statement
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import NamedTuple

from ..errors import EchodError

MAX_SQL_CHARS = 100_000


# -- errors ------------------------------------------------------------------------------------

class SqlError(EchodError):
    """The caller's SQL was not answered; ``status`` and ``code`` are for the API."""

    status = 400
    code = "sql_error"


class SqlRefused(SqlError):
    """Refused before it ran (the lexical check) or by PostgreSQL's privileges."""

    code = "sql_refused"


class SqlTimeout(SqlError):
    """Cancelled at the statement timeout."""

    code = "sql_timeout"


class SqlScopedUnavailable(SqlError):
    """Scoped SQL is off: the database cannot keep tenants from counting each other's rows."""

    status = 403
    code = "sql_scoped_unavailable"


class SqlTooLarge(SqlError):
    """The rows would pass the answer's byte cap: stopped while fetching, not after."""

    status = 422
    code = "answer_too_large"


class SqlFailed(SqlError):
    """PostgreSQL rejected or failed the statement (syntax, types, division by zero …)."""

    code = "sql_error"


# -- the lexical check -------------------------------------------------------------------------

FIRST_WORDS = ("select", "with", "values", "table", "explain")
SCOPED_EXPLAIN = ("EXPLAIN is not allowed for a token scoped to clusters: its estimates and "
                  "filtered-row counts cover every cluster's rows")

# Refused wherever they stand as unquoted words (a quoted identifier is never a keyword).
# CLUSTER is not among them: it is every table's tenancy column, and the command can only begin
# a statement, which the first-word rule already refuses.
BANNED_WORDS = {
    "writes are not allowed": (
        "insert", "update", "delete", "merge", "truncate", "copy", "into"),
    "schema changes are not allowed": (
        "create", "alter", "drop", "grant", "revoke", "comment", "security", "import",
        "refresh"),
    "maintenance commands are not allowed": (
        "vacuum", "reindex", "checkpoint", "load"),
    "session and transaction commands are not allowed": (
        "set", "reset", "discard", "do", "call", "listen", "notify", "unlisten", "lock",
        "prepare", "execute", "deallocate", "declare", "begin", "commit", "rollback",
        "savepoint", "abort"),
}

# Refused as words or quoted identifiers, compared without case; a trailing * is a prefix.
BANNED_FUNCTIONS = {
    "settings may not be changed": ("set_config",),
    "SQL inside strings is not allowed": (
        "query_to_xml*", "cursor_to_xml*", "table_to_xml*", "schema_to_xml*",
        "database_to_xml*", "ts_stat", "ts_rewrite"),
    "file access is not allowed": (
        "pg_read_file", "pg_read_binary_file", "pg_ls_*", "pg_stat_file", "pg_file_*",
        "pg_logdir_ls"),
    "large objects are not allowed": ("lo_*", "loread", "lowrite"),
    "network access is not allowed": ("dblink*",),
    "locks are not allowed": ("pg_advisory*", "pg_try_advisory*"),
    "sequences are not allowed": ("nextval", "setval", "currval", "lastval"),
    "other sessions are out of reach": (
        "pg_stat_activity", "pg_stat_get_activity", "pg_stat_get_backend_*",
        "pg_terminate_backend", "pg_cancel_backend", "pg_notify", "pg_locks",
        "pg_lock_status", "pg_blocking_pids", "pg_safe_snapshot_blocking_pids"),
    "table statistics count every cluster's rows": (
        "pg_stat_*", "pg_statio_*", "pg_class", "reltuples", "relpages", "relallvisible",
        "pg_relation_size", "pg_table_size", "pg_indexes_size", "pg_total_relation_size",
        "pg_database_size", "pg_tablespace_size"),
    "server control is not allowed": (
        "pg_reload_conf", "pg_rotate_logfile", "pg_switch_wal", "pg_promote",
        "pg_logical_*", "pg_replication_*", "pg_create_*", "pg_drop_*",
        "pg_export_snapshot", "txid_*", "pg_current_xact_id*"),
}

WORD_REASONS = {word: reason for reason, words in BANNED_WORDS.items() for word in words}
FUNCTION_REASONS = {name: reason for reason, names in BANNED_FUNCTIONS.items()
                    for name in names if not name.endswith("*")}
PREFIX_REASONS = tuple((name[:-1], reason) for reason, names in BANNED_FUNCTIONS.items()
                       for name in names if name.endswith("*"))
PREFIXES = tuple(prefix for prefix, _ in PREFIX_REASONS)

ROW_LOCKS = ("update", "share", "no", "key")       # after FOR: FOR [NO KEY] UPDATE, FOR [KEY] SHARE

WORD = re.compile(r"[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_$\u0080-\U0010ffff]*")
NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
PARAM = re.compile(r"\$\d+")
DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_\u0080-\U0010ffff][A-Za-z0-9_\u0080-\U0010ffff]*)?\$")
STANDARD_STRING = re.compile(r"'(?:[^']|'')*+'")
ESCAPE_STRING = re.compile(r"'(?:[^'\\]|''|\\.)*+'", re.DOTALL)
BIT_STRING = re.compile(r"'[^']*'")
QUOTED_NAME = re.compile(r'"(?:[^"]|"")*+"')
LINE_COMMENT = re.compile(r"--[^\n\r]*")
SPACE = " \t\n\r\f"                # PostgreSQL 15's whitespace; \v is an error there
OPERATOR_CHARS = "~!@#^&|`?+-*/%<>="
PUNCTUATION = "()[],;:."


class Token(NamedTuple):
    """One lexical token: ``kind`` is word, name (a quoted identifier), string, number, param,
    operator or punct; ``name`` is what it names (lower-cased word, or the unquoted identifier)."""

    kind: str
    text: str
    pos: int

    @property
    def end(self) -> int:
        return self.pos + len(self.text)

    @property
    def name(self) -> str:
        if self.kind == "name":
            return self.text[1:-1].replace('""', '"').lower()
        return self.text.lower()


def check_sql(sql: str, *, scoped: bool = False) -> str:
    """The statement (without a trailing ``;``) when it is one read-only query by the rules
    above; otherwise ``SqlRefused`` saying which rule. ``scoped``: the caller may see some
    clusters only, so EXPLAIN, whose estimates and filtered-row counts cover every cluster's
    rows, is refused."""
    if len(sql) > MAX_SQL_CHARS:
        raise SqlRefused(f"statement longer than {MAX_SQL_CHARS} characters ({len(sql)})")
    depth, first, previous, end = 0, None, None, None
    for token in tokens(sql):
        if end is not None:
            raise SqlRefused("only one statement is allowed")
        if token.text == ";":
            end = token.pos
            continue
        refuse_banned(token, previous)
        if first is None and token.text != "(":
            first = token
            if token.kind != "word" or token.name not in FIRST_WORDS:
                raise SqlRefused("the statement must begin with SELECT, WITH, VALUES, TABLE "
                                 f"or EXPLAIN, not {token.text[:40]}")
            if scoped and token.name == "explain":
                raise SqlRefused(SCOPED_EXPLAIN)
        if token.kind == "punct" and token.text in "()":
            depth += 1 if token.text == "(" else -1
        if depth < 0:
            raise SqlRefused(f"unbalanced parentheses: ) at character {token.pos + 1}")
        previous = token
    if first is None:
        raise SqlRefused("empty statement")
    if depth:
        raise SqlRefused("unbalanced parentheses: ( left open")
    return sql[:end].strip() if end is not None else sql.strip()


def refuse_banned(token: Token, previous: Token | None) -> None:
    if token.kind == "word":
        if previous and previous.kind == "word" and previous.name == "for" \
                and token.name in ROW_LOCKS:
            raise SqlRefused(f"row locks are not allowed: FOR {token.text.upper()}")
        if reason := WORD_REASONS.get(token.name):
            raise SqlRefused(f"{reason}: {token.text.upper()}")
    if token.kind in ("word", "name"):
        reason = FUNCTION_REASONS.get(token.name)
        if reason is None and token.name.startswith(PREFIXES):
            reason = next(why for prefix, why in PREFIX_REASONS if token.name.startswith(prefix))
        if reason:
            raise SqlRefused(f"{reason}: {token.name}")


def tokens(sql: str) -> Iterator[Token]:
    """PostgreSQL's tokens of ``sql``, whitespace and comments left out; ``SqlRefused`` for
    text it cannot split the way the server would (unterminated, Unicode escapes, stray bytes)."""
    pos = 0
    while pos < len(sql):
        if sql[pos] in SPACE:
            pos += 1
        elif sql.startswith("--", pos):
            pos = _line_end(sql, pos)
        elif sql.startswith("/*", pos):
            pos = _comment_end(sql, pos)
        else:
            token = _token(sql, pos)
            yield token
            pos = token.end


def _token(sql: str, pos: int) -> Token:
    char = sql[pos]
    if char == "'":
        return _string(sql, pos, pos, STANDARD_STRING)
    if char == '"':
        return _quoted_name(sql, pos)
    if char == "$":
        return _dollar(sql, pos)
    if char in PUNCTUATION and not (char == "." and sql[pos + 1:pos + 2].isdigit()):
        return Token("punct", char, pos)
    if char in OPERATOR_CHARS:
        return Token("operator", char, pos)
    if word := WORD.match(sql, pos):
        return _word(sql, word)
    if number := NUMBER.match(sql, pos):
        return Token("number", number.group(), pos)
    raise SqlRefused(f"unexpected character {char!r} at character {pos + 1}")


def _word(sql: str, word: re.Match) -> Token:
    """A word, or the prefix of a string: E'…' (backslash escapes), B'…' and X'…' (bits);
    U&'…' and U&"…" (Unicode escapes) are refused outright."""
    name, after = word.group().lower(), sql[word.end():word.end() + 2]
    if name == "u" and after in ("&'", '&"'):
        raise SqlRefused("Unicode escapes (U&'…', U&\"…\") are not allowed")
    if after[:1] == "'" and name in ("e", "b", "x"):
        body = ESCAPE_STRING if name == "e" else BIT_STRING
        return _string(sql, word.start(), word.end(), body)
    return Token("word", word.group(), word.start())


def _string(sql: str, start: int, quote: int, body: re.Pattern) -> Token:
    """A quoted string from ``quote``, with PostgreSQL's continuation: 'a' <newline> 'b' is one
    string, lexed on in the first part's manner (so E'…' keeps its backslash escapes)."""
    while True:
        match = body.match(sql, quote)
        if match is None:
            raise SqlRefused(f"unterminated string starting at character {start + 1}")
        quote = _continuation(sql, match.end())
        if quote is None:
            return Token("string", sql[start:match.end()], start)


def _continuation(sql: str, pos: int) -> int | None:
    """Where the next part of a string begins: a quote after whitespace or -- comments that
    hold at least one newline; None when the string ends at ``pos``."""
    newline = False
    while pos < len(sql):
        if sql[pos] in "\n\r":
            newline = True
            pos += 1
        elif sql[pos] in " \t\f":
            pos += 1
        elif sql.startswith("--", pos):
            pos = _line_end(sql, pos)
        else:
            return pos if sql[pos] == "'" and newline else None
    return None


def _quoted_name(sql: str, pos: int) -> Token:
    match = QUOTED_NAME.match(sql, pos)
    if match is None:
        raise SqlRefused(f"unterminated quoted identifier starting at character {pos + 1}")
    return Token("name", match.group(), pos)


def _dollar(sql: str, pos: int) -> Token:
    """$1 (a parameter), or a $tag$…$tag$ string."""
    if param := PARAM.match(sql, pos):
        return Token("param", param.group(), pos)
    tag = DOLLAR_TAG.match(sql, pos)
    if tag is None:
        raise SqlRefused(f"unexpected character '$' at character {pos + 1}")
    close = sql.find(tag.group(), tag.end())
    if close < 0:
        raise SqlRefused(f"unterminated dollar-quoted string starting at character {pos + 1}")
    return Token("string", sql[pos:close + len(tag.group())], pos)


def _line_end(sql: str, pos: int) -> int:
    """The end of a -- comment: PostgreSQL ends it at \\n or \\r."""
    return LINE_COMMENT.match(sql, pos).end()


def _comment_end(sql: str, pos: int) -> int:
    """The end of a /* */ comment, which nests in PostgreSQL."""
    depth, pos = 1, pos + 2
    opens, closes = sql.find("/*", pos), sql.find("*/", pos)
    while depth:
        if closes < 0:
            raise SqlRefused("unterminated /* comment")
        if 0 <= opens < closes:
            depth, pos = depth + 1, opens + 2
        else:
            depth, pos = depth - 1, closes + 2
        if 0 <= opens < pos:            # look again only past what was consumed: linear time
            opens = sql.find("/*", pos)
        if closes < pos:
            closes = sql.find("*/", pos)
    return pos
