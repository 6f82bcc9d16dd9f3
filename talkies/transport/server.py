"""The standalone server: anyio TCP (optionally TLS), HTTP/1.1 by h11, WebSockets by wsproto.

One task per TCP connection. HTTP requests are served in a keep-alive loop with a deadline on
every request head; a valid upgrade on the stream route hands the connection, as a
:class:`~talkies.transport.ws.WsprotoChannel`, to the app's stream route
(:class:`~talkies.app.websocket.StreamRoute`) for the rest of its life.
"""

from __future__ import annotations

import errno
import logging
import socket
import ssl
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.abc
import h11
from anyio.streams.stapled import MultiListener
from anyio.streams.tls import TLSListener

from ..app import STREAM_PATH, WEBSOCKET_PATHS, TalkiesApp, auth_schemes, bearer_ok
from ..app.http import Request, error_response, reason_phrase
from ..config import Settings
from ..engines.base import NoModels, StreamProvider
from .h11app import build_request, exchange, send_response
from .http import HttpLimits, Upgrade, framing_problem, header, read_event, upgrade_problem
from .tcp import TcpStream, accept_tcp, on_asyncio
from .ws import SendWatch, WsprotoChannel

__all__ = ["STREAM_PATH", "ListenError", "Server", "ServerOptions"]

log = logging.getLogger("talkies.transport")

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


# accept() fails with these when the process (or system) is out of file descriptors or socket
# memory; the connection waits in the kernel's backlog until one is freed.
_ACCEPT_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_RETRY_SECONDS = 0.1


class _SteadyListener(anyio.abc.Listener[anyio.abc.SocketStream]):
    """A TCP listener that outlives running out of file descriptors, and on asyncio makes
    its connections itself (:mod:`.tcp`: their asyncio transports are the server's to use).

    anyio's own serve loop lets an ``EMFILE`` from accept() escape, which ended the whole
    server the moment a client flood (or a slow leak) reached the descriptor limit. Here
    accept() waits and retries instead, so the server keeps serving the connections it has
    and takes new ones as soon as descriptors are free (asyncio's create_server does the same).
    """

    def __init__(self, inner: anyio.abc.SocketListener) -> None:
        self._inner = inner  # anyio's: it bound the socket, and closes it
        own = on_asyncio()
        self._socket = inner.extra(anyio.abc.SocketAttribute.raw_socket) if own else None

    async def accept(self) -> anyio.abc.SocketStream:
        exhausted = False
        while True:
            try:
                if self._socket is not None:
                    stream: anyio.abc.SocketStream = await accept_tcp(self._socket)
                else:
                    stream = await self._inner.accept()
            except OSError as exc:
                if exc.errno not in _ACCEPT_EXHAUSTED:
                    raise
                if not exhausted:  # once per episode: a flood must not flood the log too
                    log.warning("cannot accept connections: %s; retrying", exc.strerror)
                    exhausted = True
                await anyio.sleep(_ACCEPT_RETRY_SECONDS)
                continue
            if exhausted:
                log.info("accepting connections again")
            return stream

    async def serve(
        self,
        handler: Callable[[anyio.abc.SocketStream], Any],
        task_group: anyio.abc.TaskGroup | None = None,
    ) -> None:
        assert task_group is not None  # Server.serve always passes its own
        while True:
            task_group.start_soon(handler, await self.accept())

    async def aclose(self) -> None:
        await self._inner.aclose()

    @property
    def extra_attributes(self) -> Mapping[Any, Callable[[], Any]]:
        return self._inner.extra_attributes


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerOptions:
    """Transport settings that are not part of the environment contract."""

    http: HttpLimits = field(default_factory=HttpLimits)
    close_timeout: float = 5.0  # how long to wait for the client's answer to our close frame
    shutdown_grace: float = 10.0  # how long active streams may finish after SIGTERM


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
        self.app = TalkiesApp(settings, self.provider)
        self.options = options if options is not None else ServerOptions()
        self._ssl_context = ssl_context
        self.connections = 0  # open TCP connections, HTTP or WebSocket
        self._idle_http: set[anyio.CancelScope] = set()
        self._exchanges = 0  # HTTP requests being answered (for shutdown)
        self._no_exchanges = anyio.Event()
        self._no_exchanges.set()
        self._accept_scope: anyio.CancelScope | None = None
        self._connections: anyio.abc.TaskGroup | None = None
        self._send_watch: SendWatch | None = None  # the streams' send timeout, one task
        self._stopping = False
        self.port: int | None = None

    @property
    def active_streams(self) -> int:
        """WebSocket streams holding a server-wide slot right now."""
        return self.app.stream_slots.held

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
        # create_tcp_listener's listeners are SocketListeners (typed as plain Listeners).
        inner = [cast(anyio.abc.SocketListener, each) for each in tcp.listeners]
        steady = MultiListener([_SteadyListener(each) for each in inner])
        listener: anyio.abc.Listener[Any] = steady
        if self._ssl_context is not None:
            # One port for both: the TLS layer is below HTTP, so wss:// and https:// share it.
            listener = TLSListener(steady, self._ssl_context, standard_compatible=False)
        log.info(
            "listening",
            extra={"host": self.settings.host, "port": self.port, "tls": bool(self._ssl_context)},
        )
        async with self.app.lifespan(), anyio.create_task_group() as connections:
            self._connections = connections
            # Checked 4 times per timeout (at most once a second): a client that stopped
            # reading is dropped within a quarter of the timeout after it.
            period = min(1.0, self.settings.stream_idle_timeout / 4)
            self._send_watch = SendWatch(connections, period)
            with anyio.CancelScope() as accept:
                self._accept_scope = accept
                task_status.started(self)
                await listener.serve(self.serve_connection, task_group=connections)
            await listener.aclose()

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting, let streams and HTTP requests in progress finish for ``grace``
        seconds, then close the streams (1001) and drop what is left."""
        grace = self.options.shutdown_grace if grace is None else grace
        streams = self.app.streams
        self._stopping = streams.stopping = True
        if self._accept_scope is not None:
            self._accept_scope.cancel()
        for scope in list(self._idle_http):
            scope.cancel()
        with anyio.move_on_after(grace):
            await streams.wait_none_running()
            await self._no_exchanges.wait()
        if streams.running:
            log.info("closing %d streams after the grace period", streams.running)
            await streams.shut_down()
            with anyio.move_on_after(self.options.close_timeout + 1):
                await streams.wait_none_running()
        if self._connections is not None:
            self._connections.cancel_scope.cancel()

    # -- one TCP connection ------------------------------------------------------------------

    async def serve_connection(self, stream: anyio.abc.ByteStream) -> None:
        """Serve one accepted connection until it ends, then close it. Raises nothing: what
        escapes is logged ("connection failed"), and is a bug (fuzz/fuzz_http.py drives this
        with in-memory connections and fails on that log line)."""
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
                if self._stopping:
                    return None
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
            # h11 hints 431 for a head too large, 501 for a transfer coding other than
            # chunked (RFC 9112 6.1: SHOULD), 400 otherwise. A request is the client's fault:
            # 400 for that one too, as uvicorn answers (fuzz/fuzz_http.py found the 501).
            status = exc.error_status_hint if exc.error_status_hint < 500 else 400
            await self._reply_error(conn, stream, status, "malformed request")
            return None
        return event if isinstance(event, h11.Request) else None

    async def _reply_error(
        self,
        conn: h11.Connection,
        stream: anyio.abc.ByteStream,
        status: int,
        message: str,
        request: Request | None = None,
    ) -> None:
        """A transport-level refusal (malformed or oversized head, too slow, framed two ways),
        then close. ``request``, once its head is parsed: a HEAD's answer has no body (h11
        refuses to send one, and the answer was lost; found by fuzz/fuzz_http.py)."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        with suppress(h11.LocalProtocolError, TimeoutError, *_READ_ERRORS):
            response = error_response(status, message, code="http_error")
            await send_response(conn, stream, request, response, send_timeout=5.0, close=True)

    async def _serve_http(self, stream: anyio.abc.ByteStream) -> None:
        limits = self.options.http
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_head_bytes)
        peer = _peer(stream)
        first = True
        while True:
            request = await self._next_request(conn, stream, first)
            first = False
            if request is None:
                return
            app_request = build_request(
                conn,
                stream,
                request,
                limits=limits,
                max_body=self.settings.max_upload_bytes,
                peer=peer,
                upload_timeout=self.settings.upload_timeout,
            )
            # Framing first: a request framed two ways is refused as such (400) even when its
            # head is also too large, so both hosts give the smuggling attempt one answer.
            problem = framing_problem(app_request)
            if problem is not None:
                await self._reply_error(conn, stream, 400, problem, app_request)
                return
            problem = limits.head_problem(app_request)
            if problem is not None:
                await self._reply_error(conn, stream, 431, problem, app_request)
                return
            if _is_upgrade(request):
                check = upgrade_problem(request)
                if isinstance(check, Upgrade):
                    await self._websocket(conn, stream, app_request, check)
                    return
                status, message, headers = check
                response = error_response(status, message, code="upgrade_required", headers=headers)
                path = request.target.split(b"?", 1)[0].decode("ascii", "replace")
                if not bearer_ok(
                    request.headers, self.settings.auth_token, schemes=auth_schemes(path)
                ):
                    response = error_response(
                        401,
                        "missing or invalid bearer token",
                        code="invalid_api_key",
                        headers=[(b"www-authenticate", b"Bearer")],
                    )
                # As any answer: "connection: close" if a body was left unread; else the end of
                # the request is read, so that the connection serves the next one (it used to
                # be closed unannounced; found by fuzz/fuzz_http.py).
                await send_response(
                    conn,
                    stream,
                    app_request,
                    response,
                    send_timeout=self.settings.stream_idle_timeout,
                )
                if app_request.body.declared == 0:
                    await app_request.body.drain()
            else:
                self._exchanges += 1
                self._no_exchanges = anyio.Event() if self._exchanges == 1 else self._no_exchanges
                try:
                    alive = await exchange(
                        self.app.handle,
                        conn,
                        stream,
                        app_request,
                        limits=limits,
                        send_timeout=self.settings.stream_idle_timeout,
                    )
                finally:
                    self._exchanges -= 1
                    if not self._exchanges:
                        self._no_exchanges.set()
                if not alive:
                    return
            if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return  # a body was left unread (the response said "connection: close")
            conn.start_next_cycle()

    # -- one WebSocket stream ----------------------------------------------------------------

    async def _websocket(
        self,
        conn: h11.Connection,
        stream: anyio.abc.ByteStream,
        request: Request,
        upgrade: Upgrade,
    ) -> None:
        """The 101 and the WebSocket channel; what the stream is served is the app's."""

        async def accept(subprotocol: str | None) -> WsprotoChannel:
            headers = list(upgrade.headers)
            if subprotocol is not None:
                headers.append((b"sec-websocket-protocol", subprotocol.encode()))
            await stream.send(
                conn.send(
                    h11.InformationalResponse(
                        status_code=101, headers=headers, reason=reason_phrase(101)
                    )
                )
            )
            trailing, _closed = conn.trailing_data
            return WsprotoChannel(
                stream,
                trailing,
                read_size=self.options.http.read_size,
                send_timeout=self.settings.stream_idle_timeout,
                send_watch=self._send_watch,
                # Plain TCP only: under TLS the stream encrypts, and the transport must not
                # be written to around it.
                transport=stream.transport if isinstance(stream, TcpStream) else None,
            )

        offered = request.header("sec-websocket-protocol")
        await self.app.serve_websocket(
            request.path,
            request.query.encode("latin-1"),  # h11app decoded the target as latin-1
            request.headers,
            offered.split(",") if offered else [],
            accept,
            peer=request.peer,  # read now: the socket is closed when the stream ends
            close_timeout=self.options.close_timeout,
        )


_WEBSOCKET_TARGETS = frozenset(path.encode() for path in WEBSOCKET_PATHS)


def _is_upgrade(request: h11.Request) -> bool:
    """A WebSocket handshake on a stream route (anything else there is the app's to answer:
    426 for a plain GET, 405 for other methods)."""
    if request.method != b"GET" or request.target.split(b"?", 1)[0] not in _WEBSOCKET_TARGETS:
        return False
    upgrade = header(request, b"upgrade") or b""
    return b"websocket" in {t.strip().lower() for t in upgrade.split(b",")}


def _peer(stream: anyio.abc.ByteStream) -> str | None:
    address = stream.extra(anyio.abc.SocketAttribute.remote_address, None)
    if isinstance(address, tuple):
        return f"{address[0]}:{address[1]}"
    return None if address is None else str(address)
