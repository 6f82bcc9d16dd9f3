"""HTTP/1.1 over h11: limits on what a client may make the server hold (both hosts' limits),
reading events, and the WebSocket upgrade check (RFC 6455)."""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass

import anyio
import anyio.abc
import h11
from wsproto.utilities import generate_accept_token

from ..app.http import Request

__all__ = ["HttpLimits", "Upgrade", "framing_problem", "header", "read_event", "upgrade_problem"]


@dataclass(frozen=True, kw_only=True, slots=True)
class HttpLimits:
    """Bounds on what one HTTP client may make the server hold."""

    max_head_bytes: int = 16384  # request line + headers
    max_headers: int = 100
    head_timeout: float = 10.0  # from the first byte of a request to its last header
    keepalive_timeout: float = 60.0  # an idle keep-alive connection is closed after this
    body_timeout: float = 60.0  # a request body that sends nothing for this long is cut off
    read_size: int = 262144

    def head_problem(self, request: Request) -> str | None:
        """Why ``request``'s head is refused with 431, or None; both hosts ask here.

        Measured on the parsed head, so the limits hold however its bytes arrived: h11 bounds
        only a head that arrives incomplete, and ASGI hosts bound only that too (uvicorn
        served 10,000 headers that arrived in one read)."""
        headers = request.headers
        if len(headers) > self.max_headers:
            return "too many headers"
        # The request line ("GET /path?query HTTP/1.1\r\n") and "name: value\r\n" lines.
        size = len(request.method) + len(request.path) + 12
        if request.query:
            size += len(request.query) + 1
        size += sum(len(k) + len(v) + 4 for k, v in headers)
        if size > self.max_head_bytes:
            return "request head too large"
        return None


def framing_problem(request: Request) -> str | None:
    """Why ``request`` is refused with 400 for how its body is framed, or None; both hosts ask
    here, before anything is read.

    RFC 9112 section 6.1: a request with both ``Transfer-Encoding`` and ``Content-Length`` is
    what request smuggling is made of (a proxy in front may frame it by the other header), and
    the server must close the connection after answering it. h11 (the standalone server's
    parser and uvicorn's) frames it by ``Transfer-Encoding`` alone and kept the connection
    alive, so a request pipelined behind it was served too. It is refused instead, and the
    connection closed after the answer."""
    names = {name for name, _ in request.headers}
    if b"transfer-encoding" in names and b"content-length" in names:
        return "a request must not have both Content-Length and Transfer-Encoding"
    return None


def header(request: h11.Request, name: bytes) -> bytes | None:
    """The value of a header (h11 lower-cases names); repeated headers are joined by ", "."""
    values = [v for k, v in request.headers if k == name]
    return b", ".join(values) if values else None


def _tokens(value: bytes | None) -> set[bytes]:
    return {t.strip().lower() for t in value.split(b",")} if value else set()


@dataclass(frozen=True, slots=True)
class Upgrade:
    """A valid WebSocket upgrade request: the 101 response headers to send."""

    headers: list[tuple[bytes, bytes]]


def upgrade_problem(request: h11.Request) -> tuple[int, str, list[tuple[bytes, bytes]]] | Upgrade:
    """RFC 6455 section 4.2.1 checks; an error status with a message, or the 101 headers."""
    if b"websocket" not in _tokens(header(request, b"upgrade")):
        return 426, "this route needs a WebSocket upgrade", [(b"upgrade", b"websocket")]
    if b"upgrade" not in _tokens(header(request, b"connection")):
        return 400, "Connection header must include Upgrade", []
    if header(request, b"sec-websocket-version") != b"13":
        return 426, "unsupported WebSocket version", [(b"sec-websocket-version", b"13")]
    key = header(request, b"sec-websocket-key")
    try:
        valid = key is not None and len(base64.b64decode(key, validate=True)) == 16
    except (binascii.Error, ValueError):
        valid = False
    if not valid or key is None:
        return 400, "invalid Sec-WebSocket-Key", []
    # No Sec-WebSocket-Extensions: permessage-deflate is not negotiated, so a message's size on
    # the wire is its size in memory and the limits hold before anything is inflated.
    return Upgrade(
        headers=[
            (b"upgrade", b"websocket"),
            (b"connection", b"Upgrade"),
            (b"sec-websocket-accept", generate_accept_token(key)),
        ]
    )


async def read_event(
    conn: h11.Connection, stream: anyio.abc.ByteStream, read_size: int
) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
    """The next h11 event, reading from the stream as needed; EOF becomes ConnectionClosed."""
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        try:
            data = await stream.receive(read_size)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            data = b""
        conn.receive_data(data)
