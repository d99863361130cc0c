"""Messages kept on disk (fleetd's spool, ingerod's queue): one message per file, its frames
length-prefixed behind a magic line and followed by a CRC-32, written under a temporary name
and renamed, so that a file under its final name is whole or is known not to be."""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

MAGIC = b"INGSPOOL1\n"
LENGTH = struct.Struct(">I")


def encode(frames: list[bytes]) -> bytes:
    body = b"".join(LENGTH.pack(len(f)) + f for f in frames)
    return MAGIC + body + LENGTH.pack(zlib.crc32(body))


def decode(data: bytes) -> list[bytes]:
    """The frames of a kept message; ValueError when the data is not one, whole."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + LENGTH.size:
        raise ValueError("not a kept message")
    body, (crc,) = data[len(MAGIC):-LENGTH.size], LENGTH.unpack(data[-LENGTH.size:])
    if zlib.crc32(body) != crc:
        raise ValueError("checksum mismatch")
    frames, at = [], 0
    while at < len(body):
        (size,) = LENGTH.unpack_from(body, at)
        at += LENGTH.size
        if at + size > len(body):
            raise ValueError("truncated frame")
        frames.append(body[at:at + size])
        at += size
    return frames


def write_file(path: Path, data: bytes, sync: bool) -> None:
    """``data`` under ``path``, whole or not at all; ``sync`` also survives a power cut (the
    directory is the caller's to fsync)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
