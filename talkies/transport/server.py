"""The standalone server: anyio TCP (optionally TLS), HTTP/1.1 by h11, WebSockets by wsproto.

One task per TCP connection. HTTP requests are served in a keep-alive loop with a deadline on
every request head; a valid upgrade on the stream route turns the connection into a
:class:`~talkies.transport.driver.StreamDriver` for the rest of its life.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import h11
from anyio.streams.tls import TLSListener

from ..config import Settings
from ..engines.base import NoModels, StreamProvider
from ..engines.slots import Slot, Slots
from ..protocol import AuthRejected, ErrorCode, Input, Refused, SessionLimits, StreamSession
from .driver import StreamDriver
from .http import (
    HttpLimits,
    Upgrade,
    authorized,
    error_body,
    read_event,
    reason,
    send_json,
    upgrade_problem,
)
from .routes import is_models_path, models_route
from .ws import WsprotoChannel

__all__ = ["STREAM_PATH", "ListenError", "Server", "ServerOptions", "session_limits"]

log = logging.getLogger("talkies.transport")

STREAM_PATH = b"/v1/audio/transcriptions/stream"
_READ_ERRORS = (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError)


class ListenError(OSError):
    """The server cannot listen on its address; the message names the setting to change."""


def _listen_problem(host: str, port: int, exc: OSError) -> ListenError:
    reason = exc.strerror or str(exc)
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        setting = "set TALKIES_HOST or --host"
    else:  # in use, privileged, ...
        setting = "set TALKIES_PORT or --port"
    return ListenError(f"cannot listen on {host}:{port}: {reason.lower()} ({setting})")


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerOptions:
    """Transport settings that are not part of the environment contract."""

    http: HttpLimits = field(default_factory=HttpLimits)
    close_timeout: float = 5.0  # how long to wait for the client's answer to our close frame
    shutdown_grace: float = 10.0  # how long active streams may finish after SIGTERM


def session_limits(settings: Settings) -> SessionLimits:
    return SessionLimits(
        max_frame_bytes=settings.stream_max_frame_bytes,
        max_duration_seconds=settings.stream_max_duration,
        idle_timeout_seconds=settings.stream_idle_timeout,
    )


class Server:
    """Serve the live-ASR WebSocket route and the HTTP routes of this build."""

    def __init__(
        self,
        settings: Settings,
        provider: StreamProvider | None = None,
        *,
        ssl_context: ssl.SSLContext | None = None,
        options: ServerOptions | None = None,
    ) -> None:
        self.settings = settings
        self.provider: StreamProvider = provider if provider is not None else NoModels()
        self.options = options if options is not None else ServerOptions()
        self._ssl_context = ssl_context
        self._limits = session_limits(settings)
        # Server-wide stream slots (TALKIES_STREAM_MAX_CONNECTIONS); a driver gives its slot
        # back before its close frame leaves, so a client reconnecting at once gets it.
        self._slots = Slots(settings.stream_max_connections)
        self._drivers: set[StreamDriver] = set()  # live WebSocket connections (for shutdown)
        self.connections = 0  # open TCP connections, HTTP or WebSocket
        self._idle_http: set[anyio.CancelScope] = set()
        self._no_streams = anyio.Event()
        self._no_streams.set()
        self._accept_scope: anyio.CancelScope | None = None
        self._connections: anyio.abc.TaskGroup | None = None
        self._stopping = False
        self.port: int | None = None

    @property
    def active_streams(self) -> int:
        """WebSocket streams holding a server-wide slot right now."""
        return self._slots.held

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[Server] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until :meth:`shutdown` finishes; ``task_status`` gets the server when bound."""
        host, port = self.settings.host, self.settings.port
        try:
            tcp = await anyio.create_tcp_listener(local_host=host, local_port=port)
        except OSError as exc:
            raise _listen_problem(host, port, exc) from exc
        self.port = tcp.listeners[0].extra(anyio.abc.SocketAttribute.local_port)
        listener: anyio.abc.Listener[Any] = tcp
        if self._ssl_context is not None:
            # One port for both: the TLS layer is below HTTP, so wss:// and https:// share it.
            listener = TLSListener(tcp, self._ssl_context, standard_compatible=False)
        log.info(
            "listening",
            extra={"host": self.settings.host, "port": self.port, "tls": bool(self._ssl_context)},
        )
        async with anyio.create_task_group() as connections:
            self._connections = connections
            with anyio.CancelScope() as accept:
                self._accept_scope = accept
                task_status.started(self)
                await listener.serve(self._connection, task_group=connections)
            await listener.aclose()

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting, let streams finish for ``grace`` seconds, then close them (1001)."""
        grace = self.options.shutdown_grace if grace is None else grace
        self._stopping = True
        if self._accept_scope is not None:
            self._accept_scope.cancel()
        for scope in list(self._idle_http):
            scope.cancel()
        with anyio.move_on_after(grace):
            await self._no_streams.wait()
        if self._drivers:
            log.info("closing %d streams after the grace period", len(self._drivers))
            async with anyio.create_task_group() as tg:
                for driver in list(self._drivers):
                    tg.start_soon(driver.shutdown)
            with anyio.move_on_after(self.options.close_timeout + 1):
                await self._no_streams.wait()
        if self._connections is not None:
            self._connections.cancel_scope.cancel()

    # -- one TCP connection ------------------------------------------------------------------

    async def _connection(self, stream: anyio.abc.ByteStream) -> None:
        self.connections += 1
        try:
            await self._serve_http(stream)
        except Exception:
            log.exception("connection failed")
        finally:
            self.connections -= 1
            await anyio.aclose_forcefully(stream)

    async def _next_request(
        self, conn: h11.Connection, stream: anyio.abc.ByteStream, first: bool
    ) -> h11.Request | None:
        limits = self.options.http
        try:
            event = conn.next_event()  # a pipelined request may already be buffered
            if event is h11.NEED_DATA and not first:
                # Between keep-alive requests: wait for the first byte, abandon on shutdown.
                with anyio.move_on_after(limits.keepalive_timeout) as idle:
                    self._idle_http.add(idle)
                    try:
                        data = await stream.receive(limits.read_size)
                    except _READ_ERRORS:
                        data = b""
                    finally:
                        self._idle_http.discard(idle)
                if idle.cancel_called:
                    return None
                conn.receive_data(data)
                event = conn.next_event()
            if event is h11.NEED_DATA:
                # The whole head must arrive within head_timeout: a slow client holds nothing.
                with anyio.move_on_after(limits.head_timeout) as head:
                    event = await read_event(conn, stream, limits.read_size)
                if head.cancelled_caught:
                    await self._reply_error(conn, stream, 408, "request head took too long")
                    return None
        except h11.RemoteProtocolError as exc:
            await self._reply_error(conn, stream, exc.error_status_hint, "malformed request")
            return None
        return event if isinstance(event, h11.Request) else None

    async def _reply_error(
        self, conn: h11.Connection, stream: anyio.abc.ByteStream, status: int, message: str
    ) -> None:
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        try:
            body = error_body(status, message, "http_error")
            await send_json(conn, stream, status, body, close=True)
        except (h11.LocalProtocolError, *_READ_ERRORS):
            pass

    async def _serve_http(self, stream: anyio.abc.ByteStream) -> None:
        limits = self.options.http
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_head_bytes)
        first = True
        while True:
            request = await self._next_request(conn, stream, first)
            first = False
            if request is None:
                return
            if len(request.headers) > limits.max_headers:
                await self._reply_error(conn, stream, 431, "too many headers")
                return
            # h11 bounds only heads that arrive incomplete; a whole one read at once is
            # measured here, so the limit holds however the bytes were split.
            size = len(request.method) + len(request.target) + 12
            size += sum(len(k) + len(v) + 4 for k, v in request.headers)
            if size > limits.max_head_bytes:
                await self._reply_error(conn, stream, 431, "request head too large")
                return
            upgraded = await self._route(conn, stream, request)
            if upgraded:
                return
            # Keep the connection only if the request was read to its end.
            if conn.their_state is not h11.DONE:
                with anyio.move_on_after(limits.head_timeout):
                    while conn.their_state is h11.SEND_BODY:
                        if isinstance(
                            await read_event(conn, stream, limits.read_size), h11.ConnectionClosed
                        ):
                            break
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()

    async def _route(
        self, conn: h11.Connection, stream: anyio.abc.ByteStream, request: h11.Request
    ) -> bool:
        """Answer one request; True if the connection became a WebSocket."""
        path = request.target.split(b"?", 1)[0]
        method = request.method
        if path == b"/healthz":
            if method not in (b"GET", b"HEAD"):
                await self._method_not_allowed(conn, stream, b"GET, HEAD")
            else:
                await send_json(conn, stream, 200, {"status": "ok"}, head=method == b"HEAD")
            return False
        token = self.settings.auth_token
        if path == STREAM_PATH:
            if method != b"GET":
                await self._method_not_allowed(conn, stream, b"GET")
                return False
            check = upgrade_problem(request)
            if isinstance(check, Upgrade):
                await self._websocket(conn, stream, request, check)
                return True
            if not authorized(request, token):
                await self._unauthorized(conn, stream)
                return False
            status, message, headers = check
            await send_json(
                conn, stream, status, error_body(status, message, "upgrade_required"), headers
            )
            return False
        if not authorized(request, token):
            await self._unauthorized(conn, stream)
            return False
        if is_models_path(path.decode("utf-8", "replace")):
            await self._models(conn, stream, method, path)
            return False
        await send_json(conn, stream, 404, error_body(404, "not found", "not_found"))
        return False

    async def _models(
        self, conn: h11.Connection, stream: anyio.abc.ByteStream, method: bytes, path: bytes
    ) -> None:
        status, body, headers = await models_route(
            self.provider, method.decode("ascii", "replace"), path.decode("utf-8", "replace")
        )
        await send_json(conn, stream, status, body, headers)

    async def _method_not_allowed(
        self, conn: h11.Connection, stream: anyio.abc.ByteStream, allow: bytes
    ) -> None:
        body = error_body(405, "method not allowed", "method_not_allowed")
        await send_json(conn, stream, 405, body, [(b"allow", allow)])

    async def _unauthorized(self, conn: h11.Connection, stream: anyio.abc.ByteStream) -> None:
        body = error_body(401, "missing or invalid bearer token", "invalid_api_key")
        await send_json(conn, stream, 401, body, [(b"www-authenticate", b"Bearer")])

    # -- one WebSocket stream ----------------------------------------------------------------

    async def _websocket(
        self,
        conn: h11.Connection,
        stream: anyio.abc.ByteStream,
        request: h11.Request,
        upgrade: Upgrade,
    ) -> None:
        await stream.send(
            conn.send(
                h11.InformationalResponse(
                    status_code=101, headers=upgrade.headers, reason=reason(101)
                )
            )
        )
        trailing, _closed = conn.trailing_data
        channel = WsprotoChannel(
            stream,
            trailing,
            read_size=self.options.http.read_size,
            send_timeout=self.settings.stream_idle_timeout,
        )
        session = StreamSession(self._limits, now=time.monotonic())
        first: Input | None = None
        slot: Slot | None = None
        # Spec: a rejected token completes the handshake and closes 4401, no error object.
        if not authorized(request, self.settings.auth_token):
            first = AuthRejected()
        elif self._stopping or (slot := await self._slots.acquire()) is None:
            # Rejected, never queued (spec: "Each stream consumes one slot ...").
            first = Refused(
                code=ErrorCode.CONNECTION_LIMIT,
                detail=f"the server's limit of {self.settings.stream_max_connections} "
                "concurrent streams is reached",
            )
        driver = StreamDriver(
            session, channel, self.provider, close_timeout=self.options.close_timeout, slot=slot
        )
        self._drivers.add(driver)
        self._no_streams = anyio.Event() if self._no_streams.is_set() else self._no_streams
        started = time.monotonic()
        peer = _peer(stream)  # read now: the socket is closed when run() returns
        try:
            await driver.run(first)
        finally:
            self._drivers.discard(driver)
            if not self._drivers:
                self._no_streams.set()
            options = session.options
            log.info(
                "stream closed",
                extra={
                    "peer": peer,
                    "model": options.model if options else None,
                    "outcome": session.outcome,
                    "close_code": int(session.close_code) if session.close_code else None,
                    "error": session.error.code.value if session.error else None,
                    "audio_seconds": session.audio_seconds,
                    "frames": session.frames,
                    "duration": round(time.monotonic() - started, 3),
                },
            )


def _peer(stream: anyio.abc.ByteStream) -> str | None:
    address = stream.extra(anyio.abc.SocketAttribute.remote_address, None)
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return None if address is None else str(address)
