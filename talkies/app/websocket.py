"""The live-ASR WebSocket route, written once for both hosts.

A host translates the handshake and the frames and nothing else: the standalone server's h11
upgrade and wsproto channel, an ASGI host's ``websocket.*`` messages. Everything the route
decides is here, in one order:

1. the bearer token, from ``Authorization`` or a ``talkies.bearer.<token>`` subprotocol, and
   the subprotocol to select (:func:`websocket_admission`);
2. the handshake completed through the host's ``accept``, whatever the verdict: the spec
   closes a bad token with 4401 and a full server with 4429, both after the handshake;
3. a server-wide slot (``TALKIES_STREAM_MAX_CONNECTIONS``), refused at once, never queued
   for, and refused to every stream while the server is stopping. It is taken only once the
   connection's start is accepted (:meth:`StreamRoute.admit`, called by the driver): a
   connection that has not sent one counts against no limit, and is closed with 4408 when
   ``TALKIES_STREAM_START_TIMEOUT`` passes without one (the session's start deadline). A
   server already full of started streams refuses an upgrade at once, without waiting for
   its start;
4. the :class:`~talkies.app.driver.StreamDriver` over the host's channel, started with the
   refusal when there is one; its close frame leaves only once the stream's slots are free;
5. one log line and the stream's counters (:meth:`StreamRoute.closed`).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import anyio

from .. import metrics
from ..config import Settings
from ..engines.base import StreamProvider
from ..engines.runtime.slots import Slot, Slots
from ..protocol import AuthRejected, ErrorCode, Input, Refused, SessionLimits, StreamSession
from .driver import Channel, StreamDriver
from .http import bearer_ok

__all__ = [
    "STREAM_PATH",
    "SUBPROTOCOL",
    "Accept",
    "Dialect",
    "StreamRoute",
    "session_limits",
    "websocket_admission",
]

log = logging.getLogger("talkies.app")

STREAM_PATH = "/v1/audio/transcriptions/stream"

# Browsers cannot set Authorization on a WebSocket and the spec forbids tokens in URLs, so a
# browser may offer the token as a subprotocol beside "talkies" (docs/protocol.md, an
# extension); the server selects "talkies" and never logs what was offered.
SUBPROTOCOL = "talkies"
_BEARER_PROTOCOL = "talkies.bearer."

# The host's side of the handshake: complete it, selecting this subprotocol (or none), and
# return the channel the stream runs over.
Accept = Callable[[str | None], Awaitable[Channel]]


class Dialect(Protocol):
    """Another client protocol on the stream route (``talkies/app/dialects.py``): its own
    handshake credentials and limits, a channel that translates its messages to the native
    session's and back, and a refusal of its request before anything is read."""

    name: str

    def admission(
        self, headers: Iterable[tuple[bytes, bytes]], subprotocols: Iterable[str], token: str | None
    ) -> tuple[bool, str | None]: ...

    def limits(self, native: SessionLimits) -> SessionLimits: ...

    def refusal(self) -> Refused | None: ...

    def wrap(self, channel: Channel) -> Channel: ...


def websocket_admission(
    headers: Iterable[tuple[bytes, bytes]], subprotocols: Iterable[str], token: str | None
) -> tuple[bool, str | None]:
    """(authorized, the subprotocol to select) for a WebSocket handshake. The Authorization
    header is the primary way; a ``talkies.bearer.<token>`` subprotocol is the browsers' way."""
    offered = [p.strip() for p in subprotocols]
    selected = SUBPROTOCOL if SUBPROTOCOL in offered else None
    headers = list(headers)
    if any(name.lower() == b"authorization" for name, _ in headers):
        return bearer_ok(headers, token), selected
    if token is None:
        return True, selected
    for protocol in offered:
        if protocol.startswith(_BEARER_PROTOCOL) and selected is not None:
            candidate = protocol[len(_BEARER_PROTOCOL) :].encode("utf-8", "surrogateescape")
            return hmac.compare_digest(candidate, token.encode("utf-8")), selected
    return False, selected


def session_limits(settings: Settings) -> SessionLimits:
    return SessionLimits(
        max_frame_bytes=settings.stream_max_frame_bytes,
        max_duration_seconds=settings.stream_max_duration,
        idle_timeout_seconds=settings.stream_idle_timeout,
        start_timeout_seconds=settings.stream_start_timeout,
    )


def surface_of(route: str) -> str:
    """The metrics surface of a stream route: "websocket" for the native one, a dialect's
    own series under its name."""
    return "websocket" if route == "native" else route


class StreamRoute:
    """The stream route of one :class:`~talkies.app.TalkiesApp`: admission, the streams it
    runs (for a host's shutdown), and what each leaves behind."""

    def __init__(self, settings: Settings, provider: StreamProvider, slots: Slots) -> None:
        self.settings = settings
        self.provider = provider
        self.slots = slots
        self.stopping = False  # set by a host that is shutting down: new streams are refused
        self._limits = session_limits(settings)
        self._drivers: set[StreamDriver] = set()
        self._none_running: anyio.Event | None = None  # set when the last stream ends

    @property
    def running(self) -> int:
        """Streams being served right now (admitted or being refused)."""
        return len(self._drivers)

    async def serve(
        self,
        headers: Iterable[tuple[bytes, bytes]],
        subprotocols: Iterable[str],
        accept: Accept,
        *,
        peer: str | None,
        close_timeout: float,
        dialect: Dialect | None = None,
    ) -> None:
        """One WebSocket handshake on the stream route, served until its connection closes.

        ``dialect``: another client protocol translated over the same session, driver,
        admission and slots (``talkies/app/dialects.py``); None for the native one."""
        settings = self.settings
        admission = websocket_admission if dialect is None else dialect.admission
        authorized, subprotocol = admission(headers, subprotocols, settings.auth_token)
        channel = await accept(subprotocol)
        limits = self._limits if dialect is None else dialect.limits(self._limits)
        session = StreamSession(limits, now=time.monotonic())
        first: Input | None = None
        if dialect is not None:
            channel = dialect.wrap(channel)
        # Spec: a rejected token completes the handshake and closes 4401, no error object.
        if not authorized:
            first = AuthRejected()
        elif dialect is not None and (problem := dialect.refusal()) is not None:
            first = problem
        elif self.stopping or self._full():
            first = self._refusal()
        route = "native" if dialect is None else dialect.name
        driver = StreamDriver(
            session,
            channel,
            self.provider,
            close_timeout=close_timeout,
            admit=self.admit,
            surface=surface_of(route),
        )
        self._drivers.add(driver)
        started = time.monotonic()
        try:
            await driver.run(first)
        finally:
            self._drivers.discard(driver)
            if not self._drivers and self._none_running is not None:
                self._none_running.set()
                self._none_running = None
            self.closed(
                session,
                peer=peer,
                seconds=time.monotonic() - started,
                route=route,
            )

    async def admit(self) -> Slot | Refused:
        """A server-wide slot for a stream whose start was accepted, or its refusal: at once,
        never queued for (spec: "Each stream consumes one slot ..."), waiting only for a slot
        already being given back (a client reconnecting the instant its stream closed)."""
        slot = None if self.stopping else await self.slots.acquire()
        return self._refusal() if slot is None else slot

    def _full(self) -> bool:
        """Every slot is held by a started stream and none is being given back: an upgrade
        is refused at once rather than after its start (a flood is answered, not kept)."""
        slots = self.slots
        return slots.held >= slots.limit and not slots.leaving

    def _refusal(self) -> Refused:
        return Refused(
            code=ErrorCode.CONNECTION_LIMIT,
            detail=f"the server's limit of {self.settings.stream_max_connections} "
            "concurrent streams is reached",
        )

    async def wait_none_running(self) -> None:
        """Return once no stream is being served."""
        if self._drivers:
            if self._none_running is None:
                self._none_running = anyio.Event()
            await self._none_running.wait()

    async def shut_down(self) -> None:
        """Close every stream being served with 1001 (``ShuttingDown``), all at once."""
        async with anyio.create_task_group() as tg:
            for driver in list(self._drivers):
                tg.start_soon(driver.shutdown)

    def closed(
        self, session: StreamSession, *, peer: str | None, seconds: float, route: str = "native"
    ) -> None:
        """One JSON log line per stream (never the token: nothing from the request head),
        and the stream's counters."""
        options = session.options
        code = session.error.code.value if session.error else None
        log.info(
            "stream closed",
            extra={
                "peer": peer,
                "route": route,
                "model": options.model if options else None,
                "outcome": session.outcome,
                "close_code": int(session.close_code) if session.close_code else None,
                "error": code,
                "audio_seconds": session.audio_seconds,
                "frames": session.frames,
                "duration": round(seconds, 3),
            },
        )
        surface = surface_of(route)
        metrics.STREAMS.labels(surface, session.outcome or "", code or "").inc()
        metrics.FRAMES.labels(surface).inc(session.frames)
        metrics.AUDIO_SECONDS.labels(surface).inc(session.audio_seconds)
