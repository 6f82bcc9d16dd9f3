"""The live-ASR session inside any ASGI server (uvicorn, hypercorn, Starlette, FastAPI).

``create_app(settings, provider)`` returns an ASGI application serving the same routes, limits
and close codes as the standalone server; with no arguments it reads ``TALKIES_*`` and serves
the configured registry exactly as ``talkies serve`` does, so a host can build it itself::

    uvicorn --factory talkies.transport.asgi:create_app --ws-max-size 65536 \
        --ws-per-message-deflate false

What the host server must be told, because ASGI hands over whole messages and owns the socket:

- its WebSocket message size limit, to ``max(4096, TALKIES_STREAM_MAX_FRAME_BYTES)``
  (uvicorn ``--ws-max-size``, hypercorn ``websocket_max_message_size``), so oversized frames
  are refused before the host buffers them; the session checks every size again anyway;
- no permessage-deflate (uvicorn ``--ws-per-message-deflate false``), so a small compressed
  message cannot inflate past the limits inside the host;
- its own ping interval and timeouts; the session's idle timeout runs here regardless.

The host answers a client's close frame itself, before the application hears of it; every
close the server starts is sent only once the stream's slots are free, as in the standalone
server.
"""

from __future__ import annotations

import logging
import os

import anyio

from ..app import WEBSOCKET_PATHS, TalkiesApp
from ..app.asgi import Message, Receive, Scope, Send, request_from_scope, send_response
from ..app.driver import ClientMessage
from ..app.http import ClientGone, error_response
from ..config import Settings
from ..engines.base import StreamProvider
from ..engines.pool import ModelPool
from ..protocol import BinaryReceived, PeerGone, TextReceived
from .http import HttpLimits, framing_problem

log = logging.getLogger("talkies.transport")

__all__ = ["TalkiesASGI", "create_app"]


class _AsgiChannel:
    """The driver's channel over ASGI ``websocket.*`` messages."""

    def __init__(self, receive: Receive, send: Send, *, send_timeout: float) -> None:
        self._receive = receive
        self._send = send
        self._send_timeout = send_timeout
        self._lock = anyio.Lock()
        self._closed = False  # we sent websocket.close
        self._gone = False  # the peer disconnected

    async def receive(self) -> list[ClientMessage]:
        # ASGI hands over one whole message per receive.
        while not self._gone:
            message = await self._receive()
            kind = message["type"]
            if kind == "websocket.disconnect":
                self._gone = True
            elif kind == "websocket.receive":
                if message.get("text") is not None:
                    return [TextReceived(data=message["text"])]
                if message.get("bytes") is not None:
                    return [BinaryReceived(data=bytes(message["bytes"]))]
        return [PeerGone()]

    async def _emit(self, message: Message) -> None:
        if self._gone or self._closed:
            return
        async with self._lock:
            if self._gone:
                return
            try:
                # A host's send waits while its write buffer is full: a client that stopped
                # reading would hold the stream (and its slots) for as long as it stays
                # connected. Past the idle timeout it is taken as gone, as the standalone
                # server's sends are; the close frame is not tried (it would wait too).
                with anyio.fail_after(self._send_timeout):
                    await self._send(message)
            except TimeoutError:
                log.info("client stopped reading for %.0f s; closing", self._send_timeout)
                self._gone = True
            except Exception:  # the host raises once the client is gone; that is PeerGone
                self._gone = True

    async def send_text(self, text: str) -> None:
        await self._emit({"type": "websocket.send", "text": text})

    async def close(self, code: int, reason: str) -> None:
        await self._emit({"type": "websocket.close", "code": code, "reason": reason})
        self._closed = True

    async def aclose(self) -> None:
        await self.close(1000, "")


class TalkiesASGI:
    """The ASGI application; one instance per server process."""

    def __init__(
        self,
        settings: Settings,
        provider: StreamProvider,
        *,
        close_timeout: float = 5.0,
        http: HttpLimits | None = None,
    ) -> None:
        self.settings = settings
        self.provider = provider
        self.app = TalkiesApp(settings, provider)
        self._close_timeout = close_timeout
        # The standalone server's head and body limits, held here too: hosts bound only an
        # incomplete head (uvicorn served 10,000 headers that arrived in one read) and no host
        # times out a body that stops coming (a stalled upload held its temp file forever).
        self._http_limits = http if http is not None else HttpLimits()

    @property
    def active_streams(self) -> int:
        """WebSocket streams holding a server-wide slot right now."""
        return self.app.stream_slots.held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """The app's lifespan (the idle-model sweeper; models unloaded at the end) for as
        long as the host runs."""
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        async with self.app.lifespan():
            await send({"type": "lifespan.startup.complete"})
            while (await receive())["type"] != "lifespan.shutdown":
                pass
        await send({"type": "lifespan.shutdown.complete"})

    # -- HTTP: translation to and from the application layer (talkies.app.asgi) -----------

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        limits = self._http_limits
        request = request_from_scope(
            scope,
            receive,
            max_body=self.settings.max_upload_bytes,
            body_timeout=limits.body_timeout,
            upload_timeout=self.settings.upload_timeout,
        )
        # The same head checks as the standalone server's; "connection: close" has the host
        # close the connection after the answer (RFC 9112 section 6.1 requires it for a
        # request framed two ways; the rest of such a body is never read).
        # Framing first, as the standalone server checks: one answer to a smuggling attempt.
        for status, problem in (
            (400, framing_problem(request)),
            (431, limits.head_problem(request)),
        ):
            if problem is not None:
                response = error_response(
                    status, problem, code="http_error", headers=[(b"connection", b"close")]
                )
                await send_response(
                    send, request, response, send_timeout=self.settings.stream_idle_timeout
                )
                return

        async def watch(cancel: anyio.CancelScope) -> None:
            # Once the body is in, the next message can only be the client leaving.
            await request.body.complete.wait()
            while (await receive())["type"] != "http.disconnect":
                pass
            cancel.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(watch, tg.cancel_scope)
            try:
                response = await self.app.handle(request)
                await send_response(
                    send, request, response, send_timeout=self.settings.stream_idle_timeout
                )
            except ClientGone:
                pass
            tg.cancel_scope.cancel()

    # -- WebSocket ---------------------------------------------------------------------------

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        if scope["path"] not in WEBSOCKET_PATHS:
            await send({"type": "websocket.close", "code": 1008, "reason": "not found"})
            return

        async def accept(subprotocol: str | None) -> _AsgiChannel:
            message: Message = {"type": "websocket.accept"}
            if subprotocol is not None:
                message["subprotocol"] = subprotocol
            await send(message)
            return _AsgiChannel(receive, send, send_timeout=self.settings.stream_idle_timeout)

        client = scope.get("client")
        await self.app.serve_websocket(
            scope["path"],
            scope.get("query_string", b""),
            scope.get("headers", []),
            scope.get("subprotocols", []),
            accept,
            peer=f"{client[0]}:{client[1]}" if client else None,
            close_timeout=self._close_timeout,
        )


def create_app(
    settings: Settings | None = None, provider: StreamProvider | None = None
) -> TalkiesASGI:
    """An ASGI application for ``settings`` (default: from ``TALKIES_*``), opening streams
    from ``provider`` (default: the configured registry, as ``talkies serve`` has it)."""
    if settings is None:
        settings = Settings.from_env(os.environ)
    if provider is None:
        provider = ModelPool.from_settings(settings)
    return TalkiesASGI(settings, provider)
