"""The standalone server's TCP connections, made here so that their asyncio transports are
the server's own: anyio byte streams over transports it holds.

The WebSocket channel's direct path writes a partial from the plain callback that ends its
decode round (``DirectChannel``, :mod:`talkies.app.driver`): it needs the connection's
asyncio transport, to write without a task and to see its write buffer. anyio's own streams
keep theirs private, so the server accepts on anyio's listening sockets itself
(:func:`accept_tcp`) and each connection is a :class:`TcpStream`, whose ``transport`` is an
ordinary attribute that the server hands to the channel.

On asyncio only; under trio the server uses anyio's own streams, without the direct path.
A :class:`TcpStream` keeps anyio's flow control: reading is resumed only while a receive
waits, and a send returns once the transport's buffer is empty (write buffer limit 0), so the
kernel's buffers and the client's TCP window are the only queue either way.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from contextlib import suppress

import anyio
import anyio.abc
import anyio.lowlevel

__all__ = ["TcpStream", "accept_tcp", "on_asyncio"]


class _Protocol(asyncio.Protocol):
    """What the transport reports, for :class:`TcpStream` to wait on."""

    def __init__(self) -> None:
        self.read_queue: deque[bytes] = deque()
        self.read_event = asyncio.Event()
        self.write_event = asyncio.Event()
        self.write_event.set()
        self.exception: Exception | None = None
        self.at_eof = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        # Paused the moment anything is buffered: a send waits until the kernel took it all.
        transport.set_write_buffer_limits(0)

    def connection_lost(self, exc: Exception | None) -> None:
        if exc:
            self.exception = exc
        self.read_event.set()
        self.write_event.set()

    def data_received(self, data: bytes) -> None:
        self.read_queue.append(data)
        self.read_event.set()

    def eof_received(self) -> bool | None:
        self.at_eof = True
        self.read_event.set()
        return True

    def pause_writing(self) -> None:
        self.write_event = asyncio.Event()

    def resume_writing(self) -> None:
        self.write_event.set()


class TcpStream(anyio.abc.SocketStream):
    """One accepted TCP connection as an anyio socket stream, over ``transport``."""

    def __init__(self, transport: asyncio.Transport, protocol: _Protocol) -> None:
        self.transport = transport
        self._protocol = protocol
        self._receive_guard = anyio.ResourceGuard("reading from")
        self._send_guard = anyio.ResourceGuard("writing to")
        self._closed = False

    @property
    def _raw_socket(self) -> socket.socket:  # anyio's SocketStream reads its attributes here
        sock: socket.socket = self.transport.get_extra_info("socket")
        return sock

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if max_bytes < 1:
            raise ValueError("max_bytes must be a positive integer")
        protocol = self._protocol
        with self._receive_guard:
            if (
                not protocol.read_event.is_set()
                and not self.transport.is_closing()
                and not protocol.at_eof
            ):
                self.transport.resume_reading()
                try:
                    await protocol.read_event.wait()
                finally:
                    self.transport.pause_reading()
            else:
                await asyncio.sleep(0)  # a checkpoint, as anyio's (asyncio) streams have
            try:
                chunk = protocol.read_queue.popleft()
            except IndexError:
                if self._closed:
                    raise anyio.ClosedResourceError from None
                if protocol.exception is not None:
                    raise anyio.BrokenResourceError from protocol.exception
                raise anyio.EndOfStream from None
            if len(chunk) > max_bytes:
                chunk, leftover = chunk[:max_bytes], chunk[max_bytes:]
                protocol.read_queue.appendleft(leftover)
            if not protocol.read_queue:
                protocol.read_event.clear()  # the next receive waits for data
        return chunk

    async def send(self, item: bytes) -> None:
        protocol = self._protocol
        with self._send_guard:
            await anyio.lowlevel.checkpoint_if_cancelled()
            waited = False
            if not protocol.write_event.is_set():
                waited = True
                await protocol.write_event.wait()
            self._check_writable()
            try:
                self.transport.write(item)
            except RuntimeError as exc:
                if self.transport.is_closing():
                    raise anyio.BrokenResourceError from exc
                raise
            if not protocol.write_event.is_set():
                await protocol.write_event.wait()
                self._check_writable()  # aclose() aborted the transport, or the peer left
            elif not waited:
                with anyio.CancelScope(shield=True):
                    await asyncio.sleep(0)

    def _check_writable(self) -> None:
        if self._closed:
            raise anyio.ClosedResourceError
        if self._protocol.exception is not None:
            raise anyio.BrokenResourceError from self._protocol.exception

    async def send_eof(self) -> None:
        with suppress(OSError):
            self.transport.write_eof()

    async def aclose(self) -> None:
        self._closed = True
        self.transport.abort()
        await asyncio.sleep(0)


def on_asyncio() -> bool:
    """Whether this runs on an asyncio event loop (anyio's other backend, trio, has no
    asyncio transports: there, anyio's own streams serve)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def accept_tcp(listening: socket.socket) -> TcpStream:
    """The next connection on ``listening`` (a non-blocking listening socket)."""
    await anyio.lowlevel.checkpoint()
    loop = asyncio.get_running_loop()
    sock, _address = await loop.sock_accept(listening)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport, protocol = await loop.connect_accepted_socket(_Protocol, sock)
    return TcpStream(transport, protocol)
