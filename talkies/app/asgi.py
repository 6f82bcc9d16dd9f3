"""ASGI as the app layer sees it: one translation between ASGI and :class:`Request` /
:class:`Response`, both ways.

- Host side (:mod:`talkies.transport.asgi`): an ASGI server's ``http`` scope and ``receive``
  become a :class:`Request` (:func:`request_from_scope`), and the app's :class:`Response`
  goes out as ``http.response.*`` messages (:func:`send_response`).
- Application side (the MCP bridge, :mod:`.mcp`): a :class:`Request` becomes an ASGI scope
  (:func:`scope_from_request`) for an ASGI application written by others (the ``mcp`` SDK),
  and the messages it sends are collected into a :class:`Response` (:func:`call_asgi`).

The field mapping lives here once, each direction beside its reverse.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import unquote

import anyio

from .http import Body, ClientGone, Headers, Request, Response, UploadDeadline

log = logging.getLogger("talkies.app")

__all__ = [
    "Asgi",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "call_asgi",
    "request_from_scope",
    "scope_from_request",
    "send_response",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]

# Framing is the host's business: it sets its own length or chunking.
_HOP_BY_HOP = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive"})


# -- an ASGI server's request, for the app ------------------------------------------------------


def request_from_scope(
    scope: Scope,
    receive: Receive,
    *,
    max_body: int,
    body_timeout: float,
    upload_timeout: float | None = None,
) -> Request:
    """The app's view of an ASGI ``http`` request; its body is read from ``receive`` on
    demand, and a body that sends nothing for ``body_timeout`` seconds, or is not whole
    ``upload_timeout`` seconds after its head, is a 408 (no host times out a body that
    stops coming)."""
    deadline = UploadDeadline(upload_timeout, stall=body_timeout)
    headers = [(bytes(k).lower(), bytes(v)) for k, v in scope.get("headers", [])]
    raw_path = scope.get("raw_path") or scope["path"].encode("utf-8")
    declared: int | None = None
    has_body = False
    for name, value in headers:
        if name == b"content-length":
            has_body = True
            try:
                declared = int(value)
            except ValueError:
                declared = None
        elif name == b"transfer-encoding":
            has_body = True
    if not has_body:
        declared = 0
    ended = False

    async def receive_chunk() -> bytes:
        nonlocal ended
        while True:
            if ended:
                return b""
            try:
                with deadline.scope():
                    message = await receive()
            except TimeoutError:
                raise deadline.passed() from None
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = bytes(message.get("body", b""))
            if not message.get("more_body", False):
                ended = True
            if chunk:
                return chunk

    body = Body(receive_chunk, limit=max_body, declared=declared)
    if declared == 0:
        body.complete.set()
    client = scope.get("client")
    return Request(
        method=scope["method"],
        path=bytes(raw_path).decode("latin-1"),
        query=bytes(scope.get("query_string", b"")).decode("latin-1"),
        headers=headers,
        body=body,
        peer=f"{client[0]}:{client[1]}" if client else None,
    )


async def send_response(
    send: Send, request: Request, response: Response, *, send_timeout: float | None = None
) -> None:
    """Send ``response`` as ``http.response.*`` messages; a streamed body goes out chunk by
    chunk, and its iterator is closed however the sending ends.

    ``send_timeout``: the longest one message may wait for the host to take it (a host's
    send waits while its write buffer is full: a client that stops reading). Past it the
    response is abandoned as if the client had gone, so a streamed body lets go of its
    model; the standalone server bounds its sends the same way."""
    headers = list(response.headers)
    body = response.body
    if isinstance(body, bytes) and not any(k == b"content-length" for k, _ in headers):
        headers.append((b"content-length", str(len(body)).encode()))
    head_only = request.method == "HEAD"

    async def out(message: Message) -> None:
        with anyio.fail_after(send_timeout):  # None: no deadline
            await send(message)

    try:
        await out({"type": "http.response.start", "status": response.status, "headers": headers})
        if isinstance(body, bytes):
            await out({"type": "http.response.body", "body": b"" if head_only else body})
            return
        if not head_only:
            async for chunk in body:
                if chunk:
                    await out({"type": "http.response.body", "body": chunk, "more_body": True})
        await out({"type": "http.response.body", "body": b""})
    except OSError:
        return  # the client is gone (hosts raise a ClientDisconnected, an OSError)
    except TimeoutError:
        log.info("http client stopped reading for %.0f s; response abandoned", send_timeout)
        return
    finally:
        await response.close_body()


# -- the app's request, for an ASGI application -------------------------------------------------


def scope_from_request(request: Request) -> Scope:
    """The ASGI ``http`` scope of ``request`` (the reverse of :func:`request_from_scope`)."""
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": unquote(request.path),
        "raw_path": request.path.encode("latin-1"),
        "query_string": request.query.encode("latin-1"),
        "root_path": "",
        "headers": list(request.headers),
        "client": None,
        "server": None,
    }


async def call_asgi(app: Asgi, request: Request, body: bytes | list[bytes]) -> Response | None:
    """Run ``app`` on ``request`` (its body already read: bytes, or the list of its chunks)
    and collect its whole response (the reverse of :func:`send_response`); None when the
    application sent none.

    A list's chunks are handed over one message each and dropped here as they go, so that a
    large body (MCP's base64 audio) is not kept as one more copy for the whole call.

    Whole responses only: the response is returned once the application has returned. A
    client that leaves cancels this call (the host cancels the handler), which is how the
    application learns of it.
    """
    chunks = body if isinstance(body, list) else [body]
    del body
    chunks.reverse()  # popped from the end, in order
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            chunk = chunks.pop() if chunks else b""
            delivered = not chunks
            return {"type": "http.request", "body": chunk, "more_body": not delivered}
        # Only the client leaving could come next, and then the host cancels this handler.
        await anyio.sleep_forever()
        return {"type": "http.disconnect"}

    status: int | None = None
    headers: Headers = []
    parts: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = [
                (bytes(name).lower(), bytes(value))
                for name, value in message.get("headers", ())
                if bytes(name).lower() not in _HOP_BY_HOP
            ]
        elif message["type"] == "http.response.body":
            parts.append(bytes(message.get("body", b"")))

    await app(scope_from_request(request), receive, send)
    if status is None:
        return None
    return Response(status=status, headers=headers, body=b"".join(parts))
