"""Errors raised by the code the daemons share.

    IngeroError
    ├── ConfigError        a setting is missing, malformed or out of range
    ├── KeyFileError       a CURVE key file or directory is missing or unreadable
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
