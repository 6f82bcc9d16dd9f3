"""HTTP/1.1 over h11: reading request heads within limits, JSON responses, the upgrade check."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import anyio
import anyio.abc
import h11
from wsproto.utilities import generate_accept_token

__all__ = [
    "HttpLimits",
    "Upgrade",
    "authorized",
    "bearer_ok",
    "error_body",
    "header",
    "read_event",
    "reason",
    "send_json",
    "upgrade_problem",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class HttpLimits:
    """Bounds on what one HTTP client may make the server hold."""

    max_head_bytes: int = 16384  # request line + headers
    max_headers: int = 100
    head_timeout: float = 10.0  # from the first byte of a request to its last header
    keepalive_timeout: float = 60.0  # an idle keep-alive connection is closed after this
    read_size: int = 262144


def header(request: h11.Request, name: bytes) -> bytes | None:
    """The value of a header (h11 lower-cases names); repeated headers are joined by ", "."""
    values = [v for k, v in request.headers if k == name]
    return b", ".join(values) if values else None


def _tokens(value: bytes | None) -> set[bytes]:
    return {t.strip().lower() for t in value.split(b",")} if value else set()


def bearer_ok(headers: Iterable[tuple[bytes, bytes]], token: str | None) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time. Never the query string."""
    if token is None:
        return True
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, credentials = bytes(value).partition(b" ")
            if scheme.lower() == b"bearer":
                return hmac.compare_digest(credentials.strip(), token.encode("utf-8"))
            return False
    return False


def authorized(request: h11.Request, token: str | None) -> bool:
    return bearer_ok(request.headers, token)


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


async def send_json(
    conn: h11.Connection,
    stream: anyio.abc.ByteStream,
    status: int,
    body: dict[str, Any],
    headers: list[tuple[bytes, bytes]] | None = None,
    *,
    close: bool = False,
    head: bool = False,
) -> None:
    payload = json.dumps(body, separators=(",", ":")).encode("utf-8")
    all_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *(headers or []),
    ]
    if close:
        all_headers.append((b"connection", b"close"))
    data = conn.send(h11.Response(status_code=status, headers=all_headers, reason=reason(status)))
    if not head:  # a HEAD response carries the headers of the GET, and no body
        data += conn.send(h11.Data(data=payload))
    data += conn.send(h11.EndOfMessage())
    await stream.send(data)


def reason(status: int) -> bytes:
    """The status line's reason phrase (``200 OK``); h11 sends none unless given one."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


def error_body(status: int, message: str, code: str) -> dict[str, Any]:
    """OpenAI-shaped error object, the shape the HTTP API's clients already parse."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": code}}
