"""Errors raised by the code the daemons share.

    IngeroError
    ├── ConfigError        a setting is missing, malformed or out of range
    ├── KeyFileError       a CURVE key file or directory is missing or unreadable
    ├── ApiCallError       echod's HTTP API refused a call or did not answer
    └── FrameError         a wire frame failed a check; ``reason`` is a short metric label
        ├── FrameTooLarge
        ├── BadVersion
        └── BadSchema

Library code raises these; only the command lines turn them into exit messages.
"""


class IngeroError(Exception):
    """Base of every error ingero raises on purpose."""


class ConfigError(IngeroError):
    """A setting is missing, malformed or out of range."""


class KeyFileError(IngeroError):
    """A CURVE key file or directory is missing or unreadable."""


class FrameError(IngeroError):
    """A frame failed a check; ``reason`` labels the rejection counter."""

    reason = "malformed"

    def __init__(self, message: str, reason: str | None = None):
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class FrameTooLarge(FrameError):
    reason = "too_large"


class BadVersion(FrameError):
    reason = "bad_version"


class BadSchema(FrameError):
    reason = "bad_schema"


class ApiCallError(IngeroError):
    """echod did not answer a call: ``code`` is its error code (or ``unreachable``), ``status``
    the HTTP status (None when nothing answered), ``retry_after`` seconds when it said."""

    def __init__(self, message: str, code: str, status: int | None = None,
                 retry_after: int | None = None):
        super().__init__(message)
        self.code, self.status, self.retry_after = code, status, retry_after

    def describe(self) -> str:
        facts = [self.code, f"HTTP {self.status}" if self.status else "no answer"]
        if self.retry_after is not None:
            facts.append(f"retry after {self.retry_after} s")
        return f"{self} [{', '.join(facts)}]"
