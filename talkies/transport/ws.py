"""The driver's :class:`~talkies.transport.driver.Channel` over wsproto and an anyio stream."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import anyio
import anyio.abc
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError

from ..protocol import AudioBatch, BinaryReceived, PeerGone, TextReceived
from .driver import ClientMessage

__all__ = ["WsprotoChannel"]

log = logging.getLogger("talkies.transport")

_TRANSPORT_ERRORS = (
    anyio.EndOfStream,
    anyio.BrokenResourceError,
    anyio.ClosedResourceError,
    OSError,
)
# wsproto validates UTF-8 in text frames itself and reports it as this close code; the
# contract wants invalid_json (4400) with an error object instead (docs/protocol.md).
_INVALID_UTF8 = CloseReason.INVALID_FRAME_PAYLOAD_DATA
_UNDECODABLE = b"\xff"


class WsprotoChannel:
    """One server-side WebSocket after the HTTP upgrade (no extensions negotiated)."""

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        trailing_data: bytes = b"",
        *,
        read_size: int = 65536,
        send_timeout: float = 30.0,
    ) -> None:
        self._stream = stream
        self._ws = Connection(ConnectionType.SERVER, trailing_data=trailing_data)
        # Frames that came with the upgrade head are parsed now, not after the next read: a
        # client that sent start (or a ping) early and then waits would otherwise wait forever.
        self._events: Iterator[Event] = self._ws.events()
        self._read_size = read_size
        self._send_timeout = send_timeout
        self._send_lock = anyio.Lock()
        self._gone = False  # the TCP connection is closed
        self._peer_closed = False  # the client's close frame arrived; nothing more to read
        self._close_reply: CloseConnection | None = None  # our answer, sent by aclose()
        self._broken = False  # wsproto's parser failed: nothing more can be read
        self._binary_open = False  # a fragmented binary message is half received

    async def receive(self) -> list[ClientMessage]:
        """Every message (fragment) wsproto parsed from the next read; PeerGone ends it.

        Runs of whole binary messages come as one AudioBatch, so the session and the engine
        are called once per read rather than once per 20 ms frame. One socket read
        (``read_size``) bounds a batch; the driver handles it before reading again.
        """
        out: list[ClientMessage] = []
        run: list[bytes | bytearray] = []  # whole binary messages not yet in ``out``
        while not (self._gone or self._peer_closed):
            for event in self._events:
                # Data first, inline: this loop runs once per frame.
                if type(event) is BytesMessage:
                    if event.message_finished and not self._binary_open:
                        run.append(event.data)  # copied once, when the batch is joined
                        continue
                    if run:
                        out.append(AudioBatch(frames=tuple(run)))
                        run = []
                    self._binary_open = not event.message_finished
                    out.append(BinaryReceived(data=bytes(event.data), final=event.message_finished))
                    continue
                if run:
                    out.append(AudioBatch(frames=tuple(run)))
                    run = []
                message = await self._on_event(event)
                if message is not None:
                    out.append(message)
                if self._gone or self._peer_closed:
                    break
            if run:
                out.append(AudioBatch(frames=tuple(run)))
                run = []
            if out or self._gone or self._peer_closed:
                break
            try:
                data = await self._stream.receive(self._read_size)
            except _TRANSPORT_ERRORS:
                await self.aclose()
                break
            self._ws.receive_data(data)
            self._events = self._ws.events()
        if self._gone or self._peer_closed:
            out.append(PeerGone())
        return out

    async def _on_event(self, event: Event) -> TextReceived | BinaryReceived | None:
        if isinstance(event, TextMessage):
            return TextReceived(data=event.data, final=event.message_finished)
        if isinstance(event, BytesMessage):
            return BinaryReceived(data=bytes(event.data), final=event.message_finished)
        if isinstance(event, Ping):
            # Answered at once, whatever the decoder is doing.
            await self._send_event(event.response())
            return None
        if isinstance(event, CloseConnection):
            if self._ws.state in (ConnectionState.OPEN, ConnectionState.LOCAL_CLOSING):
                # Not the peer's close: wsproto's parser failed on what the peer sent.
                self._broken = True
                self._events = iter(())
                if event.code == _INVALID_UTF8 and self._ws.state is ConnectionState.OPEN:
                    return TextReceived(data=_UNDECODABLE)
                log.info("websocket protocol error: %s (%s)", event.reason, event.code)
                await self._send_event(CloseConnection(code=event.code, reason=""))
                await self.aclose()
                return None
            if self._ws.state is ConnectionState.REMOTE_CLOSING:
                # The peer started the handshake. The answer waits for aclose(), which the
                # driver calls once the stream's slots are free; then TCP closes at once.
                self._close_reply = event.response()
                self._peer_closed = True
                return None
            await self.aclose()  # the answer to our own close frame
            return None
        return None  # Pong

    async def send_text(self, text: str) -> None:
        await self._send_event(Message(data=text))

    async def close(self, code: int, reason: str) -> None:
        if self._ws.state is ConnectionState.OPEN:
            await self._send_event(CloseConnection(code=code, reason=reason))
        if self._broken:
            await self.aclose()  # nothing more can be parsed; don't wait for an answer

    async def _send_event(self, event: Event) -> None:
        if self._gone:
            return
        try:
            data = self._ws.send(event)
        except LocalProtocolError:
            return  # the connection is closing: nothing more may be sent
        # Uncontended (the usual case), the lock is taken without a trip through the loop.
        try:
            self._send_lock.acquire_nowait()
        except anyio.WouldBlock:
            await self._send_lock.acquire()
        try:
            with anyio.move_on_after(self._send_timeout) as scope:
                try:
                    await self._stream.send(data)
                except _TRANSPORT_ERRORS:
                    await self.aclose()
            if scope.cancelled_caught:
                # The client stopped reading; holding its events in memory is not an option.
                log.info("client stopped reading for %.0f s; closing", self._send_timeout)
                await self.aclose()
        finally:
            self._send_lock.release()

    async def aclose(self) -> None:
        reply, self._close_reply = self._close_reply, None
        if reply is not None:
            await self._send_event(reply)
        if self._gone:
            return
        self._gone = True
        await anyio.aclose_forcefully(self._stream)
