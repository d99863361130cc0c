"""The API's front: the only thing on --api-bind, so that slow or idle clients cannot starve it.

gunicorn's threaded workers do a client's TLS handshake and read its request in a worker
thread, with blocking sockets: a few dozen connections that send half a handshake and stop
hold every thread, and the API answers no one (gunicorn's documentation says as much: behind a
buffering proxy, or async workers, when clients can be slow). This front is that proxy, in
echod's own process: one asyncio loop in a thread of its own, which does the handshakes and
reads each request whole (headers within ``HEADER_TIMEOUT_S``, the body within
``BODY_TIMEOUT_S``) without tying up anything but a file descriptor per client, and only then
hands it to gunicorn on a unix socket in echod's private runtime directory, one request per
upstream connection, streaming the answer back.

On the way the request is normalised: a chunked body arrives de-chunked with its length, and
the client's own ``X-Forwarded-*`` and ``X-Ingero-*`` headers are dropped, replaced by the
peer's address (the app trusts one proxy hop) and, for a body over the limit (read and thrown
away, up to the drain limit, so that the client hears the answer), ``X-Ingero-Refused:
too_large``, which the app answers as its own 413: one error shape, counted and audited.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import threading

from .envelope import REFUSED

log = logging.getLogger("echod")

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
HANDSHAKE_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 900.0
HEADER_LIMIT = 64 * 1024
CHUNK_LINE_LIMIT = 1024
COPY_BYTES = 64 * 1024
DROPPED = ("connection", "keep-alive", "proxy-connection", "transfer-encoding",
           "content-length", "expect", "te", "upgrade", "x-forwarded-for",
           "x-forwarded-proto", "x-forwarded-host", "x-forwarded-port", "x-forwarded-prefix",
           "forwarded")


class BadRequest(Exception):
    """The client's request cannot be read as HTTP/1.1; answered 400 by the front itself."""


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert, key)
    return context


class Front:
    def __init__(self, host: str, port: int, upstream: str, tls: ssl.SSLContext | None,
                 max_body: int, drain_limit: int):
        self.host, self.port = host, port
        self.upstream = upstream
        self.tls = tls
        self.max_body = max_body
        self.drain_limit = drain_limit
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.AbstractServer | None = None
        self.thread = threading.Thread(target=self.loop.run_forever, name="echod-api-front",
                                       daemon=True)

    def start(self) -> None:
        """Listen (an error here, such as the port in use, is raised to the caller)."""
        self.thread.start()
        self.server = asyncio.run_coroutine_threadsafe(asyncio.start_server(
            self.serve, self.host, self.port, ssl=self.tls, limit=HEADER_LIMIT, backlog=1024,
            ssl_handshake_timeout=HANDSHAKE_TIMEOUT_S if self.tls else None),
            self.loop).result(30)

    def alive(self) -> bool:
        return self.thread.is_alive()

    def stop(self) -> None:
        if self.server is not None:
            self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    # -- one client ----------------------------------------------------------------------------

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = (writer.get_extra_info("peername") or ("",))[0]
        try:
            request = await self.read_request(reader, writer, peer)
            if request is not None:
                await self.forward(request, writer)
        except BadRequest as exc:
            await self.refuse(writer, 400, "bad_request", str(exc))
        except asyncio.TimeoutError:
            await self.refuse(writer, 408, "timeout", "the request did not arrive in time")
        except asyncio.LimitOverrunError:
            await self.refuse(writer, 431, "headers_too_large",
                              f"the request's headers are over {HEADER_LIMIT} bytes")
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError, OSError):
            pass                                   # the client went away: nobody to answer
        except Exception:   # a bug must cost one request, never the front
            log.exception("API front: internal error; dropped a request")
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           peer: str) -> bytes | None:
        """The request as gunicorn gets it; None when the client closed before sending one."""
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEADER_TIMEOUT_S)
        except asyncio.IncompleteReadError as exc:
            if exc.partial.strip():
                raise BadRequest("the request ends inside its headers") from None
            return None
        line, *fields = head[:-4].decode("latin-1").split("\r\n")
        parts = line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            raise BadRequest("not an HTTP/1.x request line")
        headers = []
        for field in fields:
            name, colon, value = field.partition(":")
            if not colon or not name or name != name.strip():
                raise BadRequest(f"malformed header line {field[:60]!r}")
            headers.append((name, value.strip()))
        names = {name.lower(): value for name, value in headers}
        if names.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body, over = await asyncio.wait_for(self.read_body(reader, names), BODY_TIMEOUT_S)
        kept = [(n, v) for n, v in headers
                if n.lower() not in DROPPED and not n.lower().startswith("x-ingero-")]
        kept += [("X-Forwarded-For", peer), ("X-Forwarded-Proto", "https" if self.tls else "http"),
                 ("Connection", "close")]
        if over:
            kept.append((REFUSED, "too_large"))
        if body or names.get("content-length") or "transfer-encoding" in names:
            kept.append(("Content-Length", str(len(body))))
        return ("\r\n".join([line, *(f"{n}: {v}" for n, v in kept)]) + "\r\n\r\n"
                ).encode("latin-1") + body

    async def read_body(self, reader: asyncio.StreamReader, names: dict) -> tuple[bytes, bool]:
        """(body, whether it was over the limit: then it is read and thrown away, up to the
        drain limit, and comes back empty)."""
        if "chunked" in names.get("transfer-encoding", "").lower():
            return await self.read_chunked(reader)
        try:
            length = int(names.get("content-length", "0"))
        except ValueError:
            raise BadRequest("Content-Length is not a number") from None
        if length < 0:
            raise BadRequest("Content-Length is negative")
        if length <= self.max_body:
            return await reader.readexactly(length), False
        if length <= self.drain_limit:
            await self.discard(reader, length)
        return b"", True

    async def read_chunked(self, reader: asyncio.StreamReader) -> tuple[bytes, bool]:
        body, total = bytearray(), 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            if len(size_line) > CHUNK_LINE_LIMIT:
                raise BadRequest("a chunk size line is too long")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError:
                raise BadRequest("a chunk size is not hexadecimal") from None
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":   # trailers, ignored
                    pass
                return (b"", True) if total > self.max_body else (bytes(body), False)
            total += size
            if total > self.drain_limit:
                return b"", True
            if total <= self.max_body:
                body += await reader.readexactly(size)
            else:
                body.clear()
                await self.discard(reader, size)
            if await reader.readexactly(2) != b"\r\n":
                raise BadRequest("a chunk does not end with CRLF")

    @staticmethod
    async def discard(reader: asyncio.StreamReader, size: int) -> None:
        while size > 0:
            data = await reader.read(min(size, COPY_BYTES))
            if not data:
                raise asyncio.IncompleteReadError(b"", size)
            size -= len(data)

    async def forward(self, request: bytes, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(self.upstream)
        except OSError as exc:
            log.warning("API front: gunicorn is not answering on %s: %s", self.upstream, exc)
            await self.refuse(writer, 503, "unavailable", "the API is restarting; try again")
            return
        try:
            up_writer.write(request)
            await up_writer.drain()
            async with asyncio.timeout(ANSWER_TIMEOUT_S):
                while data := await up_reader.read(COPY_BYTES):
                    writer.write(data)
                    await writer.drain()
        finally:
            up_writer.close()

    @staticmethod
    async def refuse(writer: asyncio.StreamWriter, status: int, code: str, message: str) -> None:
        """An answer the front gives itself, in the API's one error shape."""
        body = json.dumps({"error": message, "code": code}).encode()
        reason = {400: "Bad Request", 408: "Request Timeout", 431: "Request Header Fields Too "
                  "Large", 503: "Service Unavailable"}[status]
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        try:
            await asyncio.wait_for(writer.drain(), 5)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            pass
