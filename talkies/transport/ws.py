"""The driver's :class:`~talkies.app.driver.Channel` over wsproto and an anyio stream."""

from __future__ import annotations

import asyncio
import logging
import time
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

from ..app.driver import ClientMessage
from ..protocol import AudioBatch, BinaryReceived, PeerGone, TextReceived

__all__ = ["SendWatch", "WsprotoChannel"]

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
_clock = time.monotonic


class SendWatch:
    """The send timeout of many channels, checked by one task every ``period`` seconds.

    A send only waits when the client stops reading (asyncio's write buffer is full), yet a
    cancel scope with a deadline around every send arms and cancels a timer each time: about
    12 us per partial on the per-frame path, more than the write itself. Here a send just
    notes when it started, and this task closes the connection of a send that has waited
    ``send_timeout``: the send then fails like any send on a closed stream. A channel is
    closed within ``period`` after its timeout.

    Channels register at their first send and leave when closed. The task runs in
    ``task_group`` while channels are registered, and ends one period after the last one.
    """

    def __init__(self, task_group: anyio.abc.TaskGroup, period: float) -> None:
        self._tg = task_group
        self._period = period
        self._channels: set[WsprotoChannel] = set()
        self._running = False

    def add(self, channel: WsprotoChannel) -> None:
        self._channels.add(channel)
        if not self._running:
            self._running = True
            self._tg.start_soon(self._run)

    def discard(self, channel: WsprotoChannel) -> None:
        self._channels.discard(channel)

    async def _run(self) -> None:
        try:
            while self._channels:
                await anyio.sleep(self._period)
                now = _clock()
                for channel in [c for c in self._channels if c.send_overdue(now)]:
                    await channel.abort_stalled_send()
        finally:
            self._running = False


class WsprotoChannel:
    """One server-side WebSocket after the HTTP upgrade (no extensions negotiated)."""

    def __init__(
        self,
        stream: anyio.abc.ByteStream,
        trailing_data: bytes = b"",
        *,
        read_size: int = 65536,
        send_timeout: float = 30.0,
        send_watch: SendWatch | None = None,
        transport: asyncio.WriteTransport | None = None,
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
        # With a watch, the send timeout is its job (see SendWatch); without one, every send
        # runs under a deadline of its own.
        self._watch = send_watch
        self._sending_since: float | None = None  # when the send in progress started
        self._watched = False  # registered with the watch (at the first send)
        # The asyncio transport ``stream`` writes to, when the server holds it (plain TCP,
        # talkies.transport.tcp): with it a text message can be written from a plain callback
        # (send_text_now). Without it: never.
        self._transport = transport

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
                    out.append(
                        BinaryReceived(
                            data=bytes(event.data),
                            final=event.message_finished,
                            frame_end=event.frame_finished,
                        )
                    )
                    continue
                if run:
                    out.append(AudioBatch(frames=tuple(run)))
                    run = []
                if type(event) is TextMessage:  # a dialect's audio comes as text: inline too
                    out.append(
                        TextReceived(
                            data=event.data,
                            final=event.message_finished,
                            frame_end=event.frame_finished,
                        )
                    )
                    continue
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

    async def _on_event(self, event: Event) -> TextReceived | None:
        """Every event but data (which :meth:`receive` handles inline): pings, closes."""
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

    def can_send_now(self) -> bool:
        """:class:`~talkies.app.driver.DirectChannel`: a text message can be written
        from a plain callback now (an asyncio transport below, no send waiting, nothing in
        its buffer); else the driver sends it from a task, as always."""
        transport = self._transport
        # Nothing buffered, not just "under the limit": once the client stops reading, the
        # next message goes through send_text, which waits, so SendWatch sees the stall and
        # the buffer holds at most one message.
        return (
            transport is not None
            and not self._gone
            and not self._send_lock.locked()
            and transport.get_write_buffer_size() == 0
            and not transport.is_closing()
        )

    def send_text_now(self, text: str) -> None:
        """Write a text message at once (only after :meth:`can_send_now`; what the socket
        does not take is buffered, and the next message waits in :meth:`send_text`)."""
        assert self._transport is not None
        data = self._frame(Message(data=text))
        if data is not None:
            self._transport.write(data)

    async def close(self, code: int, reason: str) -> None:
        if self._ws.state is ConnectionState.OPEN:
            await self._send_event(CloseConnection(code=code, reason=reason))
        if self._broken:
            await self.aclose()  # nothing more can be parsed; don't wait for an answer

    def _frame(self, event: Event) -> bytes | None:
        """``event`` as bytes to write; None when nothing more may be sent (closed, or
        closing)."""
        if self._gone:
            return None
        try:
            return self._ws.send(event)
        except LocalProtocolError:
            return None

    async def _send_event(self, event: Event) -> None:
        data = self._frame(event)
        if data is None:
            return
        # Uncontended (the usual case), the lock is taken without a trip through the loop.
        try:
            self._send_lock.acquire_nowait()
        except anyio.WouldBlock:
            await self._send_lock.acquire()
        try:
            if self._watch is not None:
                if not self._watched:
                    self._watched = True
                    self._watch.add(self)
                self._sending_since = _clock()
                try:
                    await self._stream.send(data)
                except _TRANSPORT_ERRORS:
                    self._close_reply = None  # it could not be sent either (and we hold the lock)
                    await self.aclose()
                finally:
                    self._sending_since = None
                return
            with anyio.move_on_after(self._send_timeout) as scope:
                try:
                    await self._stream.send(data)
                except _TRANSPORT_ERRORS:
                    await self.aclose()
            if scope.cancelled_caught:
                self._log_stalled()
                await self.aclose()
        finally:
            self._send_lock.release()

    def send_overdue(self, now: float) -> bool:
        """A send has waited ``send_timeout`` or longer (for :class:`SendWatch`)."""
        since = self._sending_since
        return since is not None and now - since >= self._send_timeout and not self._gone

    async def abort_stalled_send(self) -> None:
        """Close the connection under a send that waits too long; the send then fails."""
        if self._gone:
            return
        self._log_stalled()
        self._gone = True
        self._close_reply = None  # nothing more can be sent
        if self._watch is not None:
            self._watch.discard(self)
        await anyio.aclose_forcefully(self._stream)

    def _log_stalled(self) -> None:
        # The client stopped reading; holding its events in memory is not an option.
        log.info("client stopped reading for %.0f s; closing", self._send_timeout)

    async def aclose(self) -> None:
        reply, self._close_reply = self._close_reply, None
        if reply is not None:
            await self._send_event(reply)
        if self._watch is not None:
            self._watch.discard(self)
        if self._gone:
            return
        self._gone = True
        await anyio.aclose_forcefully(self._stream)
