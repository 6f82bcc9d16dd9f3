"""HTTP as the application sees it: a request in, a response out, no socket in sight.

The standalone server (h11) and the ASGI adapter translate bytes to :class:`Request` and a
:class:`Response` back to bytes, and nothing else; every route, limit and error shape lives
behind :meth:`talkies.app.TalkiesApp.handle`, so the two hosts cannot answer differently.

- A request body is read chunk by chunk through :class:`Body`, which enforces the upload cap
  before anything past it is buffered (declared ``Content-Length`` first, then counted bytes),
  so no route ever holds a whole upload in memory unless it chooses to.
- A response body is bytes, or an async iterator of chunks that the host writes as they come
  (chunked transfer); the host closes the iterator when the client leaves, so a generator's
  ``finally`` frees whatever it held.
- Errors have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs

import anyio

__all__ = [
    "Body",
    "ClientGone",
    "Headers",
    "HttpError",
    "PayloadTooLarge",
    "Request",
    "Response",
    "UploadDeadline",
    "bearer_ok",
    "error_response",
    "json_response",
    "reason_phrase",
]

Headers = list[tuple[bytes, bytes]]  # names in lower case
ReceiveChunk = Callable[[], Awaitable[bytes]]  # the next body chunk; b"" at the end


def reason_phrase(status: int) -> bytes:
    """The status line's reason phrase (``200 OK``)."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


def bearer_ok(
    headers: Iterable[tuple[bytes, bytes]],
    token: str | None,
    *,
    schemes: tuple[bytes, ...] = (b"bearer",),
) -> bool:
    """``Authorization: Bearer <token>`` (or another of ``schemes``: Deepgram's ``Token`` on
    its route), compared in constant time. Never the query string."""
    if token is None:
        return True
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, credentials = bytes(value).partition(b" ")
            if scheme.lower() in schemes:
                return hmac.compare_digest(credentials.strip(), token.encode("utf-8"))
            return False
    return False


class HttpError(Exception):
    """A request the app refuses: becomes an OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str | None = None,
        param: str | None = None,
        headers: Headers | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or []

    def response(self) -> Response:
        return error_response(
            self.status, self.message, code=self.code, param=self.param, headers=self.headers
        )


class PayloadTooLarge(HttpError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"request body exceeds the limit of {limit} bytes (TALKIES_MAX_UPLOAD_BYTES)",
            code="request_too_large",
        )


class ClientGone(Exception):
    """The client closed the connection before its request body was complete."""


class Body:
    """A request body read chunk by chunk, never past ``limit`` bytes."""

    def __init__(self, receive: ReceiveChunk, *, limit: int, declared: int | None) -> None:
        self._receive = receive
        self.limit = limit
        self.declared = declared
        self.received = 0
        self._done = False
        self.complete = anyio.Event()  # set once the whole body was read

    @property
    def done(self) -> bool:
        return self._done

    def check_declared(self) -> None:
        """Refuse a body whose Content-Length already says it is too large."""
        if self.declared is not None and self.declared > self.limit:
            raise PayloadTooLarge(self.limit)

    async def chunks(self) -> AsyncIterator[bytes]:
        """Every chunk, in order; raises :class:`PayloadTooLarge` before buffering past the
        limit and :class:`ClientGone` if the client leaves midway."""
        self.check_declared()
        while not self._done:
            chunk = await self._receive()
            if not chunk:
                self._done = True
                self.complete.set()
                return
            self.received += len(chunk)
            if self.received > self.limit:
                raise PayloadTooLarge(self.limit)
            yield chunk

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body, for the small bodies of JSON routes (``limit`` caps it further)."""
        parts: list[bytes] = []
        size = 0
        async for chunk in self.chunks():
            size += len(chunk)
            if limit is not None and size > limit:
                raise HttpError(413, f"request body exceeds {limit} bytes for this route")
            parts.append(chunk)
        return b"".join(parts)

    async def drain(self) -> None:
        """Read what is left (bounded by the limit), so the connection can be reused."""
        async for _ in self.chunks():
            pass


class UploadDeadline:
    """The two deadlines of a request body, from when its head was read (both hosts use
    it): ``stall`` seconds without a byte, and ``total`` seconds for the whole body (None:
    none), so a body trickled a byte at a time cannot hold a request forever."""

    def __init__(self, total: float | None, *, stall: float) -> None:
        self.total = total
        self.stall = stall
        self._end = None if total is None else anyio.current_time() + total

    def scope(self) -> AbstractContextManager[anyio.CancelScope]:
        """The deadline of the next read: its stall, or the time left, whichever is less."""
        if self._end is None:
            return anyio.fail_after(self.stall)
        return anyio.fail_after(max(0.0, min(self.stall, self._end - anyio.current_time())))

    def passed(self) -> HttpError:
        """The 408 for a read that :meth:`scope` timed out."""
        if self._end is not None and anyio.current_time() >= self._end:
            return HttpError(
                408,
                f"the request body did not arrive within {self.total:g} s (TALKIES_UPLOAD_TIMEOUT)",
            )
        return HttpError(408, "the request body stalled")


async def _no_body() -> bytes:
    return b""


@dataclass(eq=False, kw_only=True)
class Request:
    method: str
    path: str  # as sent, without the query string
    query: str = ""
    headers: Headers = field(default_factory=list)
    body: Body = field(default_factory=lambda: Body(_no_body, limit=0, declared=0))
    peer: str | None = None

    def header(self, name: str) -> str | None:
        """A header's value (repeated headers joined with ", "), decoded as Latin-1."""
        key = name.lower().encode("latin-1")
        values = [v for k, v in self.headers if k == key]
        return b", ".join(values).decode("latin-1") if values else None

    def query_params(self) -> dict[str, list[str]]:
        return parse_qs(self.query, keep_blank_values=True)


Chunks = AsyncIterator[bytes]


@dataclass(eq=False, kw_only=True)
class Response:
    status: int
    headers: Headers = field(default_factory=list)
    body: bytes | Chunks = b""

    @property
    def streaming(self) -> bool:
        return not isinstance(self.body, bytes)

    async def close_body(self) -> None:
        """Close a streamed body (its ``aclose``), however sending it ended: shielded, and
        whatever the body raises on the way out is dropped. Every host calls it."""
        closer = getattr(self.body, "aclose", None)
        if closer is not None:
            with anyio.CancelScope(shield=True), suppress(Exception):
                await closer()


def json_response(status: int, document: Any, headers: Headers | None = None) -> Response:
    payload = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return Response(
        status=status,
        headers=[(b"content-type", b"application/json"), *(headers or [])],
        body=payload,
    )


def error_response(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: Headers | None = None,
) -> Response:
    """OpenAI's error object: what its SDKs parse into ``APIStatusError``."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 401:
        kind = "authentication_error"
    elif status == 429:
        kind = "rate_limit_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return json_response(status, body, headers)
