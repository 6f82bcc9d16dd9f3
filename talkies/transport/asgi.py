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

import json
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import anyio

from ..config import Settings
from ..engines.base import StreamProvider
from ..engines.pool import ModelPool
from ..engines.slots import Slot, Slots
from ..protocol import (
    AuthRejected,
    BinaryReceived,
    ErrorCode,
    Input,
    PeerGone,
    Refused,
    StreamSession,
    TextReceived,
)
from .driver import ClientMessage, StreamDriver
from .http import bearer_ok, error_body
from .routes import is_models_path, models_route
from .server import STREAM_PATH, session_limits

__all__ = ["TalkiesASGI", "create_app"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_STREAM_PATH = STREAM_PATH.decode()


class _AsgiChannel:
    """The driver's channel over ASGI ``websocket.*`` messages."""

    def __init__(self, receive: Receive, send: Send) -> None:
        self._receive = receive
        self._send = send
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
            try:
                await self._send(message)
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
    ) -> None:
        self.settings = settings
        self.provider = provider
        self._limits = session_limits(settings)
        self._close_timeout = close_timeout
        self._slots = Slots(settings.stream_max_connections)

    @property
    def active_streams(self) -> int:
        """WebSocket streams holding a server-wide slot right now."""
        return self._slots.held

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        """Run the pool's idle-model sweeper while the host runs; unload models at the end."""
        pool = self.provider if isinstance(self.provider, ModelPool) else None
        async with anyio.create_task_group() as tg:
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    if pool is not None:
                        tg.start_soon(pool.run_sweeper)
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    tg.cancel_scope.cancel()
                    if pool is not None:
                        await pool.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    def _authorized(self, scope: Scope) -> bool:
        return bearer_ok(scope.get("headers", []), self.settings.auth_token)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        headers = [(b"content-type", b"application/json")]
        if path == "/healthz":
            status, body = 200, {"status": "ok"}
        elif not self._authorized(scope):
            status, body = (
                401,
                error_body(401, "missing or invalid bearer token", "invalid_api_key"),
            )
        elif path == _STREAM_PATH:
            status = 405 if method != "GET" else 426
            body = error_body(status, "this route needs a WebSocket upgrade", "upgrade_required")
        elif is_models_path(path):
            status, body, extra = await models_route(self.provider, method, path)
            headers += extra
        else:
            status, body = 404, error_body(404, "not found", "not_found")
        payload = json.dumps(body, separators=(",", ":")).encode()
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        connect = await receive()
        if connect["type"] != "websocket.connect":
            return
        if scope["path"] != _STREAM_PATH:
            await send({"type": "websocket.close", "code": 1008, "reason": "not found"})
            return
        await send({"type": "websocket.accept"})
        channel = _AsgiChannel(receive, send)
        session = StreamSession(self._limits, now=time.monotonic())
        first: Input | None = None
        slot: Slot | None = None
        if not self._authorized(scope):
            first = AuthRejected()
        elif (slot := await self._slots.acquire()) is None:
            first = Refused(
                code=ErrorCode.CONNECTION_LIMIT,
                detail=f"the server's limit of {self.settings.stream_max_connections} "
                "concurrent streams is reached",
            )
        driver = StreamDriver(
            session, channel, self.provider, close_timeout=self._close_timeout, slot=slot
        )
        await driver.run(first)


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
