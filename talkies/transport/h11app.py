"""The application layer over h11: one request in, one response out, on an anyio stream.

Only translation lives here (and the transport's own duties: timeouts on a stalled body or a
reader that stopped reading, ``100 Continue``, noticing a client that left). Everything a
route decides is in :mod:`talkies.app`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc
import h11

from ..app.http import (
    Body,
    ClientGone,
    HttpError,
    Request,
    Response,
    UploadDeadline,
    reason_phrase,
)
from .http import HttpLimits

__all__ = ["build_request", "exchange", "send_response"]

log = logging.getLogger("talkies.transport")

_READ_ERRORS = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)
# While a request is handled, a client that pipelines the next one may have this much of it
# read and kept; past that, the server stops watching for a disconnect.
_PIPELINE_KEEP = 65536


def _has_body(request: h11.Request) -> bool:
    return any(k in (b"content-length", b"transfer-encoding") for k, _ in request.headers)


def _declared(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None if _has_body(request) else 0


def build_request(
    conn: h11.Connection,
    stream: anyio.abc.ByteStream,
    request: h11.Request,
    *,
    limits: HttpLimits,
    max_body: int,
    peer: str | None,
    upload_timeout: float | None = None,
) -> Request:
    """The app's view of an h11 request; its body is read from ``stream`` on demand, a 408
    once it sends nothing for ``limits.body_timeout`` or is not whole ``upload_timeout``
    seconds after its head (``TALKIES_UPLOAD_TIMEOUT``; None: no overall deadline)."""
    deadline = UploadDeadline(upload_timeout, stall=limits.body_timeout)

    ended: list[bool] = []  # the end of the body was parsed while joining its last data
    broken: list[h11.RemoteProtocolError] = []  # so was a malformed chunk after it

    async def receive() -> bytes:
        if ended:
            return b""
        if conn.they_are_waiting_for_100_continue:
            await stream.send(
                conn.send(
                    h11.InformationalResponse(
                        status_code=100, headers=[], reason=reason_phrase(100)
                    )
                )
            )
        while True:
            try:
                if broken:
                    raise broken.pop()
                event = conn.next_event()
            except h11.RemoteProtocolError as exc:
                # A broken chunked body (a chunk size that is not hex, a chunk not ended by
                # CRLF where its size says): the client's fault, answered as such, and the
                # connection closed after the answer (the body was not read to its end).
                reason = str(exc).partition(":")[0]  # h11's reason, without the bytes
                raise HttpError(
                    400, f"malformed request body: {reason}", code="http_error"
                ) from None
            if event is h11.NEED_DATA:
                try:
                    with deadline.scope():
                        data = await stream.receive(limits.read_size)
                except TimeoutError:
                    raise deadline.passed() from None
                except _READ_ERRORS:
                    raise ClientGone() from None
                conn.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                return _joined(event, conn, limits.read_size, ended, broken)
            if isinstance(event, h11.EndOfMessage):
                return b""
            raise ClientGone()  # ConnectionClosed

    target = request.target.decode("latin-1")
    path, _, query = target.partition("?")
    declared = _declared(request)
    body = Body(receive, limit=max_body, declared=declared)
    if declared == 0:
        body.complete.set()
    return Request(
        method=request.method.decode("latin-1"),
        path=path,
        query=query,
        headers=list(request.headers),
        body=body,
        peer=peer,
    )


async def exchange(
    handle: Callable[[Request], Awaitable[Response]],
    conn: h11.Connection,
    stream: anyio.abc.ByteStream,
    request: Request,
    *,
    limits: HttpLimits,
    send_timeout: float,
) -> bool:
    """Run the app on ``request`` and send its response. While it runs, a client that closes
    the connection cancels it (so a long transcription stops and frees its slot). Returns
    False if the client is gone (the connection must be dropped)."""
    gone = False

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal gone
        await request.body.complete.wait()
        while True:
            try:
                data = await stream.receive(limits.read_size)
            except _READ_ERRORS:
                data = b""
            if not data:
                gone = True
                scope.cancel()
                return
            conn.receive_data(data)  # a pipelined request: h11 keeps it for the next cycle
            if len(conn.trailing_data[0]) > _PIPELINE_KEEP:
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        try:
            response: Response = await handle(request)
        except ClientGone:
            gone = True
            tg.cancel_scope.cancel()
            return False
        try:
            await send_response(conn, stream, request, response, send_timeout=send_timeout)
        except (h11.LocalProtocolError, TimeoutError, *_READ_ERRORS):
            gone = True
        tg.cancel_scope.cancel()
    if not gone and request.body.declared == 0 and not request.body.done:
        await request.body.drain()  # a request without a body: h11's end of message only
    return not gone


async def send_response(
    conn: h11.Connection,
    stream: anyio.abc.ByteStream,
    request: Request | None,
    response: Response,
    *,
    send_timeout: float,
    close: bool = False,
) -> None:
    """Write ``response``; a streamed body goes out chunk by chunk (chunked encoding), and its
    iterator is closed however the sending ends."""
    headers = list(response.headers)
    body = response.body
    head_only = request is not None and request.method == "HEAD"
    if isinstance(body, bytes) and not any(k == b"content-length" for k, _ in headers):
        headers.append((b"content-length", str(len(body)).encode()))
    unread = request is not None and not request.body.done and not request.body.complete.is_set()
    if close or unread:
        headers.append((b"connection", b"close"))  # the rest of the body is not read
    try:
        with anyio.fail_after(send_timeout):
            data = conn.send(
                h11.Response(
                    status_code=response.status,
                    headers=headers,
                    reason=reason_phrase(response.status),
                )
            )
            if isinstance(body, bytes):
                if body and not head_only:
                    data += conn.send(h11.Data(data=body))
                await stream.send(data + conn.send(h11.EndOfMessage()))
                return
            await stream.send(data)
        if not head_only:
            async for chunk in body:
                if chunk:
                    with anyio.fail_after(send_timeout):
                        await stream.send(conn.send(h11.Data(data=chunk)))
        with anyio.fail_after(send_timeout):
            await stream.send(conn.send(h11.EndOfMessage()))
    finally:
        await response.close_body()


def _joined(
    first: h11.Data,
    conn: h11.Connection,
    most: int,
    ended: list[bool],
    broken: list[h11.RemoteProtocolError],
) -> bytes:
    """``first`` and the body data h11 has already parsed after it, up to ``most`` bytes, as
    one chunk: a chunked body of 1-byte chunks would otherwise be one chunk (and one write to
    disk, one thread hop) per byte of it. Nothing more is read from the socket; the body's
    end, or a malformed chunk after the data, is noted for the next call (``ended``,
    ``broken``)."""
    data = bytearray(first.data)
    while len(data) < most:
        try:
            event = conn.next_event()
        except h11.RemoteProtocolError as exc:
            broken.append(exc)
            break
        if isinstance(event, h11.Data):
            data += event.data
            continue
        if isinstance(event, h11.EndOfMessage):
            ended.append(True)
        elif event is not h11.NEED_DATA:  # ConnectionClosed: the next call finds it gone
            raise ClientGone()
        break
    return bytes(data)
