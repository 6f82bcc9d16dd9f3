"""Run one live-ASR session over a message channel: the glue between core, socket and engine.

A :class:`StreamDriver` owns three activities in one task group:
- the reader: ``channel.receive()`` -> ``session.handle`` -> execute actions. It reads the next
  message only after the previous one's actions ran, so a full engine queue (``Feed`` waits)
  stops reading and pushes back on the client's TCP window;
- the engine loop, started once the stream opens: engine results -> ``session.handle``.
  Over a :class:`DirectChannel` (the standalone server's WebSocket) partials and endpoints
  skip it: the engine stream offers them in the callback that ends their decode round
  (``listen``), and they are handled and written there when the socket can take them at
  once; the engine loop gets what is left (finals, failures, a socket that pushes back), in
  order;
- the timer: sleeps until ``session.deadline`` and delivers ``Tick``.
All three run on the event loop; decoding happens in worker threads behind the engine stream.

Admission: the server-wide ``slot`` is taken through ``admit`` once the session accepted a start
(its ``Open``), before the model is opened; a connection that has not sent one holds no slot,
so upgrades that never start cannot keep streams out (the session's start deadline closes
them).

Slots: by the time a close frame leaves (any code, ours or the answer to the client's), the
engine stream is closed (after a decode in flight, if any), so its model slot is free, and the
server-wide ``slot`` is given back. A client that reconnects the instant it sees its close is
never refused for the stream it just ended.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

import anyio
import anyio.abc

from ..engines.base import (
    EngineEvent,
    EngineStream,
    EngineUnavailable,
    ListeningStream,
    Refusal,
    StreamProvider,
)
from ..engines.runtime.slots import Slot
from ..metrics import EVENT_LATENCY_SECONDS
from ..protocol import (
    Action,
    AudioBatch,
    BinaryReceived,
    Close,
    Cut,
    CutRequested,
    EngineEndpoint,
    EngineFailed,
    EngineOpened,
    EnginePartial,
    Feed,
    Flush,
    Input,
    Open,
    PeerGone,
    Refused,
    Release,
    Send,
    ShuttingDown,
    State,
    StreamSession,
    TextReceived,
    Tick,
)
from ..protocol.messages import StartOptions
from .refusals import stream_refusal

__all__ = ["Admit", "Channel", "ClientMessage", "DirectChannel", "StreamDriver"]

# What a channel delivers: client messages (or fragments), and PeerGone last.
ClientMessage = AudioBatch | TextReceived | BinaryReceived | CutRequested | PeerGone

# The route's admission of a stream whose start was accepted: the server-wide slot, or the
# refusal to send instead (never queued for).
Admit = Callable[[], Awaitable[Slot | Refused]]

# The session's clock. Sleeps are relative, so it need not be the event loop's own clock, and
# time.monotonic costs far less per frame than anyio.current_time().
_clock = time.monotonic

log = logging.getLogger("talkies.transport")

# The engine events whose latency is measured (a tuple: isinstance with a union is slower).
_TIMED_EVENTS = (EnginePartial, EngineEndpoint)
# The states in which those events are answered with Sends and nothing else (table.py).
_ANSWERING = frozenset({State.STREAMING, State.FLUSHING})


class Channel(Protocol):
    """A WebSocket as the driver needs it; implementations swallow transport errors."""

    async def receive(self) -> list[ClientMessage]:
        """The next message fragments (at least one), ending with PeerGone once the peer
        closed or vanished."""
        ...

    async def send_text(self, text: str) -> None: ...

    async def close(self, code: int, reason: str) -> None:
        """Start the closing handshake (send a close frame)."""
        ...

    async def aclose(self) -> None:
        """Close the connection now (TCP close, or the ASGI equivalent)."""
        ...


@runtime_checkable
class DirectChannel(Channel, Protocol):
    """A channel that can also write a text message at once, from a plain callback."""

    def can_send_now(self) -> bool:
        """Whether :meth:`send_text_now` would write now: no send is waiting and the
        transport's buffer is empty (so a client that stops reading meets a waiting send,
        and the send timeout, at its next message)."""
        ...

    def send_text_now(self, text: str) -> None:
        """Write a text message now (only after :meth:`can_send_now` said so)."""
        ...


class StreamDriver:
    """Drive ``session`` over ``channel``, opening engine streams from ``provider``."""

    def __init__(
        self,
        session: StreamSession,
        channel: Channel,
        provider: StreamProvider,
        *,
        close_timeout: float = 5.0,
        admit: Admit | None = None,
        surface: str = "websocket",
    ) -> None:
        self.session = session
        # The event-latency series of the door the stream came in by: "websocket", or a
        # dialect's name ("deepgram", "realtime"), as the stream counters are labelled.
        self._event_latency = EVENT_LATENCY_SECONDS.labels(surface=surface)
        self._channel = channel
        self._provider = provider
        self._close_timeout = close_timeout
        self._admit = admit
        # The server-wide slot, from admit once a start is accepted; the model's is the
        # engine stream's.
        self._slot: Slot | None = None
        self._stream: EngineStream | None = None
        self._closing_stream: EngineStream | None = None
        self._close_started = False
        self._stream_closed = anyio.Event()
        self._opening = False  # _open is running (it may hold a model slot)
        self._opened = anyio.Event()
        self._open_scope: anyio.CancelScope | None = None
        self._fed_at = 0.0  # when audio last went to the engine (the event-latency metric)
        self._released = False
        self._peer_gone = False
        self._deadline_changed = anyio.Event()
        self._tg: anyio.abc.TaskGroup | None = None
        self._engine_busy = False  # the engine loop holds an event it has not handled yet
        self._direct: DirectChannel | None = None  # the channel, once results come direct

    # -- entry points ------------------------------------------------------------------------

    async def run(self, first: Input | None = None) -> None:
        """Serve the connection until it is closed; ``first`` is a transport fact such as
        AuthRejected or Refused to deliver before reading anything."""
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._timer_loop)
                if first is not None:
                    await self._handle(first)
                await self._reader_loop()
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                if self.session.state is not State.CLOSED:
                    # Cancelled from outside, or a bug: the session still learns the peer is
                    # gone, so its engine stream is released like on every other path.
                    self.session.handle(PeerGone(), _clock())
                    self.session.pull_actions()
                    self._release()
                await self._let_go()
                await self._channel.aclose()

    async def shutdown(self) -> None:
        """The server's grace period is over: close with 1001."""
        await self._handle(ShuttingDown())

    # -- the three activities ----------------------------------------------------------------

    async def _reader_loop(self) -> None:
        while not self._peer_gone:
            await self._handle_batch(await self._channel.receive())

    async def _handle_batch(self, batch: list[ClientMessage]) -> None:
        """Handle one read's messages; consecutive audio reaches the engine as one feed.

        The next read waits until this batch's actions ran, feeds included: a full engine
        queue stops the reading, and the client's TCP window closes.
        """
        session = self.session
        now = _clock()
        audio: list[bytes] = []
        for item in batch:
            if isinstance(item, PeerGone):
                self._peer_gone = True
            state = session.state
            session.handle(item, now)
            actions = session.pull_actions()
            if session.state is not state:
                self._deadline_changed.set()
            if len(actions) == 1 and type(actions[0]) is Feed:
                audio.append(actions[0].pcm)  # the per-frame path
                continue
            if actions:
                if audio:
                    await self._feed(audio)
                    audio = []
                await self._apply(actions)
        if audio:
            await self._feed(audio)

    async def _feed(self, audio: list[bytes]) -> None:
        if self._stream is not None:
            self._fed_at = _clock()
            await self._stream.feed(audio[0] if len(audio) == 1 else b"".join(audio))

    async def _timer_loop(self) -> None:
        while True:
            changed = self._deadline_changed
            if changed.is_set():
                self._deadline_changed = changed = anyio.Event()
            deadline = self.session.deadline
            if deadline is None:
                await changed.wait()
                continue
            delay = deadline - _clock()
            if delay > 0:
                # Woken early only when the deadline moved earlier (see _handle); a deadline
                # pushed later by client activity is noticed when this sleep ends.
                with anyio.move_on_after(delay):
                    await changed.wait()
                continue
            await self._handle(Tick())

    async def _engine_loop(self, stream: EngineStream) -> None:
        try:
            async for event in stream.events():
                if self._released:
                    break
                if isinstance(event, _TIMED_EVENTS) and self._fed_at:
                    self._event_latency.observe(_clock() - self._fed_at)
                self._engine_busy = True
                try:
                    await self._handle(event)
                finally:
                    self._engine_busy = False
        except Exception:
            log.exception("engine stream failed")
            await self._handle(EngineFailed(detail="the speech engine failed"))

    def _engine_results(self, outbox: deque[EngineEvent]) -> bool:
        """The engine stream's results, offered on the event loop the moment their round
        ends (``listen``): partials and endpoints are answered here when the channel can
        write at once, without waking the engine loop; whether all were taken. Anything
        else, or a channel that pushes back, is left to the engine loop, in order."""
        channel = self._direct
        if channel is None or self._engine_busy or self._released:
            return False
        session = self.session
        while outbox:
            event = outbox[0]
            if (
                type(event) not in _TIMED_EVENTS
                or session.state not in _ANSWERING
                or not channel.can_send_now()
            ):
                return False
            outbox.popleft()
            now = _clock()
            if self._fed_at:
                self._event_latency.observe(now - self._fed_at)
            session.handle(event, now)
            actions = session.pull_actions()
            texts = [a.event.to_json() for a in actions if isinstance(a, Send)]
            if len(texts) != len(actions):
                # Not in these states (table.py); should it ever be, run them as usual.
                assert self._tg is not None
                self._tg.start_soon(self._apply, actions)
                return False
            for text in texts:
                channel.send_text_now(text)
        return True

    async def _open(self, options: StartOptions) -> None:
        outcome: EngineStream | Refused | EngineFailed | None = None
        self._opening = True
        try:
            with anyio.CancelScope() as scope:
                self._open_scope = scope
                try:
                    admitted = await self._admit() if self._admit is not None else None
                    if isinstance(admitted, Refused):
                        outcome = admitted
                    else:
                        # Kept at once, no checkpoint between: _let_go gives it back.
                        self._slot = admitted
                        outcome = await self._provider.open_stream(options)
                except Refusal as refusal:
                    outcome = stream_refusal(refusal)
                except EngineUnavailable as exc:  # the pool logged the cause, once
                    outcome = EngineFailed(detail=str(exc))
                except Exception:
                    log.exception("could not open an engine stream for %r", options.model)
                    outcome = EngineFailed(detail="the speech engine could not be opened")
            # Outside the scope: handling the outcome may Release, which cancels that scope.
            self._open_scope = None
            if self._released and not isinstance(outcome, Refused | EngineFailed | None):
                with anyio.CancelScope(shield=True):  # its slot must be given back
                    await outcome.aclose()  # the client left just as the stream opened
                return
        finally:
            self._opening = False
            self._opened.set()
        if outcome is None:
            return  # released (peer gone, cancel) while the model was opening
        if isinstance(outcome, Refused | EngineFailed):
            await self._handle(outcome)
            return
        self._stream = outcome
        if isinstance(outcome, ListeningStream) and isinstance(self._channel, DirectChannel):
            self._direct = self._channel
            outcome.listen(self._engine_results)
        assert self._tg is not None
        self._tg.start_soon(self._engine_loop, outcome)
        await self._handle(EngineOpened())

    # -- inputs and actions ------------------------------------------------------------------

    async def _handle(self, item: Input) -> None:
        """One input from the engine, the timer or the server (not the per-frame path)."""
        session = self.session
        state = session.state
        session.handle(item, _clock())
        actions = session.pull_actions()  # no await in between: these are ours to run
        if session.state is not state:
            # The deadline only moves earlier on a state change (client activity pushes it
            # later, which the timer notices when its sleep ends): wake the timer then only.
            self._deadline_changed.set()
        await self._apply(actions)

    async def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Feed):
                if self._stream is not None:
                    self._fed_at = _clock()
                    await self._stream.feed(action.pcm)
            elif isinstance(action, Send):
                await self._channel.send_text(action.event.to_json())
            elif isinstance(action, Open):
                assert self._tg is not None
                self._tg.start_soon(self._open, action.options)
            elif isinstance(action, Flush):
                if self._stream is not None:
                    await self._stream.flush()
            elif isinstance(action, Cut):
                if self._stream is not None:
                    await self._stream.cut()
            elif isinstance(action, Release):
                self._release()
            elif isinstance(action, Close):
                await self._close(int(action.code), action.reason)

    def _release(self) -> None:
        self._released = True
        if self._slot is not None:
            self._slot.leaving()
        if self._open_scope is not None:
            self._open_scope.cancel()
        stream, self._stream = self._stream, None
        if stream is not None:
            self._closing_stream = stream
            # In the background: closing waits for a decode in flight, and the client should
            # get its last events now. The close frame waits for it (_let_go).
            if self._tg is not None and not self._tg.cancel_scope.cancel_called:
                self._tg.start_soon(self._close_stream)

    async def _close_stream(self) -> None:
        if self._close_started or self._closing_stream is None:
            return
        self._close_started = True
        try:
            await self._closing_stream.aclose()
        finally:
            self._closing_stream = None
            self._stream_closed.set()

    async def _let_go(self) -> None:
        """Wait until this connection holds no engine stream and no model slot, then give the
        server-wide slot back. Idempotent."""
        with anyio.CancelScope(shield=True):
            if self._opening:
                await self._opened.wait()  # a cancelled open gives its model slot back
            if self._closing_stream is not None:
                if self._close_started:
                    await self._stream_closed.wait()
                else:
                    await self._close_stream()
        if self._slot is not None:
            self._slot.release()

    async def _close(self, code: int, reason: str) -> None:
        await self._let_go()
        await self._channel.close(code, reason)
        if self._tg is not None and not self._peer_gone:
            self._tg.start_soon(self._close_timer)

    async def _close_timer(self) -> None:
        # Spec clients (websockets) wait for the server to close TCP after the handshake;
        # a client that never answers our close frame gets the connection closed anyway.
        await anyio.sleep(self._close_timeout)
        await self._channel.aclose()
