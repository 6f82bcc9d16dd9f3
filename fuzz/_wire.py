"""The wire harness's oracle: raw client bytes through the server's own WebSocket code.

Everything after the HTTP upgrade runs as in production: ``WsprotoChannel`` (wsproto's parser,
the channel's batching, pings, close handshake and UTF-8 mapping), ``StreamDriver`` (reader,
timer and engine loops, slots) and ``StreamSession``. Only the two ends are replaced, both
in memory: the socket by :class:`MemoryWire` (no sockets, no threads) and the engine by
:class:`WireProvider`, an instant engine on the event loop whose behaviour the start
message's model slug picks (so the fuzzer reaches refusals and engine failures by mutating a
string). One asyncio event loop serves every input of a process.

Input format (``decode_wire_input``): byte 0 picks how the rest is cut into socket reads (at
once, fixed sizes, or frame by frame), the channel's read size, whether the first read arrived
with the upgrade head (h11's trailing data), and whether the client waits for the server
between reads; the remaining bytes are what the client sends, followed by EOF.

The oracle (:func:`check_wire_input`) -- "accepted, or rejected with a documented close code,
never an exception or a hang" -- checks, besides every session input through
``SessionAudit.step``:

- the driver returns within :data:`HANG_SECONDS`, raising nothing; the engine stream opened is
  closed and the server-wide slot is given back;
- what the server wrote parses as server frames (unmasked, valid) and nothing follows its
  close frame; each text message is a strict JSON event of the spec's types, at most one is an
  ``error``, and it comes last;
- the close code is documented (docs/reliability.md, "Fuzzing"): an error code's own close code
  right after that ``error`` event (reason = the code); 1000 right after ``stats``; 1002 only
  if wsproto's parser refuses the client's bytes (RFC 6455 protocol errors); the client's own
  close code echoed if the client sent a close frame; or no close frame at all when the client
  left first. 1007 never: invalid UTF-8 is the contract's ``invalid_json`` (4400);
- every pong answers a ping, in order, with its payload; while the connection stays open (no
  close frame either way, no protocol error), every ping is answered.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

import anyio
import anyio.abc
import anyio.lowlevel
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import CloseConnection, Ping, Pong, TextMessage
from wsproto.frame_protocol import CloseReason

from talkies.app.driver import StreamDriver
from talkies.engines.base import EngineEvent, Refusal
from talkies.engines.runtime.slots import Slot, Slots
from talkies.protocol import (
    Action,
    EngineEndpoint,
    EngineFailed,
    EngineFinal,
    EnginePartial,
    ErrorCode,
    Input,
    Refused,
    SessionLimits,
    State,
    StreamSession,
)
from talkies.protocol.audit import InvariantViolation, SessionAudit
from talkies.protocol.messages import StartOptions
from talkies.transport.ws import WsprotoChannel

__all__ = [
    "CHUNK_SIZES",
    "HANG_SECONDS",
    "READ_SIZES",
    "WIRE_LIMITS",
    "WireInput",
    "WireReport",
    "check_wire_input",
    "client_frame",
    "decode_wire_input",
    "encode_wire_input",
]

# Small limits so every limit is reachable by a short input; the idle timeout is far beyond
# one input's run time (ticks are the session harness's job).
WIRE_LIMITS = SessionLimits(
    max_frame_bytes=4096,
    max_duration_seconds=1.0,
    idle_timeout_seconds=600.0,
    start_timeout_seconds=600.0,
)
HANG_SECONDS = 10.0
# Byte 0 of an input: bits 0-2 pick how the client's bytes are cut into socket reads (all at
# once, fixed sizes, or FRAMES: one frame a read, by the headers' own lengths, as a client that
# writes frame by frame), bits 3-4 the channel's read size, bit 5 whether the first read came
# with the upgrade head (h11's trailing data), bit 6 whether the client is patient: it sends
# each read only once the server has nothing left to do (as a real client waits for ready
# before its audio); otherwise every read returns at once.
FRAMES = -1
CHUNK_SIZES = (0, 1, 2, FRAMES, 7, 64, 509, 4096)
READ_SIZES = (65536, 509, 4096, 16384)
_TRAILING = 0x20
_PATIENT = 0x40
_MAX_READS = 64  # past this many reads the rest arrives at once (each read costs a loop turn)

# The spec's event types; anything else on the wire is a finding.
_EVENT_TYPES = {"ready", "partial", "endpoint", "final", "stats", "error"}
_PCM_PER_WORD = 3200  # 0.1 s of audio per fake word


@dataclass(frozen=True, slots=True)
class WireInput:
    chunks: tuple[bytes, ...]  # the client's bytes, one item per socket read
    read_size: int
    trailing: bytes  # arrived with the upgrade head
    patient: bool  # each read waits until every other task of the server is blocked


def decode_wire_input(data: bytes) -> WireInput:
    flags = data[0] if data else 0
    body = data[1:]
    size = CHUNK_SIZES[flags & 7]
    read_size = READ_SIZES[(flags >> 3) & 3]
    if size == 0:
        chunks = [body] if body else []
    elif size == FRAMES:
        chunks = _frames(body)
    else:
        cut = min(len(body), size * _MAX_READS)
        chunks = [body[i : i + size] for i in range(0, cut, size)]
        if cut < len(body):
            chunks.append(body[cut:])
    trailing = b""
    if flags & _TRAILING and chunks:
        trailing = chunks.pop(0)
    return WireInput(
        chunks=tuple(chunks), read_size=read_size, trailing=trailing, patient=bool(flags & _PATIENT)
    )


def _frames(data: bytes) -> list[bytes]:
    """``data`` cut at frame boundaries, read from the headers' lengths; whatever does not
    parse as a header (or comes after the first ``_MAX_READS`` frames) is one last piece."""
    out: list[bytes] = []
    at = 0
    while at < len(data) and len(out) < _MAX_READS:
        if len(data) - at < 2:
            break
        n, head = data[at + 1] & 0x7F, 2
        if n == 126:
            n, head = int.from_bytes(data[at + 2 : at + 4], "big"), 4
        elif n == 127:
            n, head = int.from_bytes(data[at + 2 : at + 10], "big"), 10
        end = at + head + (4 if data[at + 1] & 0x80 else 0) + n
        if end > len(data):
            break
        out.append(data[at:end])
        at = end
    if at < len(data):
        out.append(data[at:])
    return out


def encode_wire_input(
    client: bytes,
    *,
    chunk_size: int = 0,
    read_size: int = 65536,
    trailing: bool = False,
    patient: bool = False,
) -> bytes:
    """The fuzz input that sends ``client`` this way (for seeds and tests)."""
    flags = CHUNK_SIZES.index(chunk_size) | (READ_SIZES.index(read_size) << 3)
    flags |= (_TRAILING if trailing else 0) | (_PATIENT if patient else 0)
    return bytes([flags]) + client


def client_frame(
    opcode: int,
    payload: bytes = b"",
    *,
    fin: bool = True,
    mask: bytes | None = b"\0\0\0\0",
    length: int | None = None,
    rsv: int = 0,
) -> bytes:
    """A client frame; the default all-zero mask key leaves the payload readable to the
    fuzzer's mutations. ``length`` may claim more (or less) than the payload."""
    n = len(payload) if length is None else length
    first = (0x80 if fin else 0) | (rsv & 7) << 4 | opcode & 0x0F
    masked = 0x80 if mask is not None else 0
    if n < 126:
        head = bytes([first, masked | n])
    elif n < 65536:
        head = bytes([first, masked | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([first, masked | 127]) + n.to_bytes(8, "big")
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


# -- the two ends --------------------------------------------------------------------------


class MemoryWire(anyio.abc.ByteStream):
    """The socket: reads come from the input's chunks, then EOF; writes are kept."""

    def __init__(self, chunks: tuple[bytes, ...], *, patient: bool) -> None:
        self._chunks = list(chunks)
        self._patient = patient
        self._pending = b""
        self.sent = bytearray()
        self.closed = False
        self.eof_seen = False

    async def receive(self, max_bytes: int = 65536) -> bytes:
        if self._patient:
            await _settle()
        else:
            await anyio.lowlevel.checkpoint()  # a read is a suspension point, as on a socket
        if self.closed:
            raise anyio.ClosedResourceError
        while not self._pending and self._chunks:
            self._pending = self._chunks.pop(0)
        if not self._pending:
            self.eof_seen = True
            raise anyio.EndOfStream
        data, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return data

    async def send(self, item: bytes) -> None:
        if self.closed:
            raise anyio.ClosedResourceError
        self.sent += item

    async def send_eof(self) -> None:
        pass

    async def aclose(self) -> None:
        self.closed = True


async def _settle(rounds: int = 64) -> None:
    """Let every other task run until it waits (anyio's wait_all_tasks_blocked sleeps 0.1 s
    whenever a task is runnable; nothing here waits on real I/O, so checkpoints suffice)."""
    me = asyncio.current_task()
    for _ in range(rounds):
        await anyio.lowlevel.checkpoint()
        waiting = (
            getattr(task, "_fut_waiter", None) for task in asyncio.all_tasks() if task is not me
        )
        if all(w is not None and not w.done() for w in waiting):
            return


class WireEngine:
    """An engine stream on the event loop: a word per 0.1 s of audio, an endpoint every third
    word, the words so far as the final. ``fail`` makes it fail at the first audio."""

    def __init__(self, provider: WireProvider, *, fail: bool) -> None:
        self._provider = provider
        self._fail = fail
        self._send, self._receive = anyio.create_memory_object_stream[EngineEvent](math.inf)
        self._bytes = 0
        self._words = 0
        self._closed = False  # no more events
        self._released = False  # aclose was called

    async def feed(self, pcm: bytes) -> None:
        if self._closed:
            return
        if self._fail:
            self._send.send_nowait(EngineFailed(detail="the fake decoder failed"))
            self._send.close()
            self._closed = True
            return
        before = self._bytes // _PCM_PER_WORD
        self._bytes += len(pcm)
        for _ in range(self._bytes // _PCM_PER_WORD - before):
            self._words += 1
            text = " ".join(f"w{i}" for i in range(1, self._words + 1))
            if self._words % 3 == 0:
                self._send.send_nowait(EngineEndpoint(text=text))
            else:
                self._send.send_nowait(EnginePartial(text=text))

    async def flush(self) -> None:
        if not self._closed:
            self._send.send_nowait(EngineFinal(text=f"{self._words} words"))
            self._send.close()
            self._closed = True

    async def events(self) -> AsyncIterator[EngineEvent]:
        async with self._receive:
            async for event in self._receive:
                yield event

    async def aclose(self) -> None:
        # Done before the first await, as ThreadedStream.aclose shields its own: a close that
        # starts must finish even if the caller is being cancelled.
        if not self._closed:
            self._send.close()
            self._closed = True
        if not self._released:
            self._released = True
            self._provider.closed += 1
        await anyio.lowlevel.checkpoint()


class WireProvider:
    """Opens a :class:`WireEngine` for any slug ending in ``test`` but the ones below; the
    others are refused as the pool would refuse them."""

    REFUSALS: ClassVar[dict[str, ErrorCode]] = {
        "offline-test": ErrorCode.STREAMING_NOT_SUPPORTED,
        "busy-test": ErrorCode.MODEL_BUSY,
        "full-test": ErrorCode.CONNECTION_LIMIT,
    }

    def __init__(self) -> None:
        self.opened = 0
        self.closed = 0

    async def open_stream(self, options: StartOptions) -> WireEngine:
        await anyio.lowlevel.checkpoint()
        code = self.REFUSALS.get(options.model)
        if code is not None:
            raise Refusal(code, f"{options.model} refused")
        if options.model == "unopenable-test":
            raise RuntimeError("the fake model cannot be opened")
        if not options.model.endswith("test"):
            raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {options.model!r}")
        self.opened += 1
        return WireEngine(self, fail=options.model == "broken-test")


class AuditedSession(StreamSession):
    """A session whose every input goes through ``SessionAudit.step``, however the driver
    delivers it (the driver calls ``handle`` then ``pull_actions``)."""

    def __init__(self, limits: SessionLimits, *, now: float) -> None:
        super().__init__(limits, now=now)
        self.audit = SessionAudit()
        self._audited: list[Action] = []
        self._inside = False  # audit.step is calling handle/pull_actions itself

    def handle(self, event: Input, now: float) -> None:
        if self._inside:
            super().handle(event, now)
            return
        self._inside = True
        try:
            self._audited += self.audit.step(self, event, now)
        finally:
            self._inside = False

    def pull_actions(self) -> list[Action]:
        if self._inside:
            return super().pull_actions()
        out, self._audited = self._audited, []
        return out


# -- the oracle ----------------------------------------------------------------------------


@dataclass
class WireReport:
    """What the server did with one input."""

    texts: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None  # of the server's close frame; None: no close frame
    close_reason: str = ""
    pongs: int = 0
    state: State | None = None
    outcome: str | None = None


@dataclass
class _ClientView:
    """The client's bytes as wsproto (the server's own parser) reads them, offline."""

    pings: list[bytes] = field(default_factory=list)
    close_code: int | None = None  # the client's first close frame
    failed: int | None = None  # the close code of wsproto's parse failure, if any


def _client_view(data: WireInput) -> _ClientView:
    view = _ClientView()
    # wsproto's parse does not depend on how the bytes are split, so one call reads them all.
    ws = Connection(ConnectionType.SERVER, trailing_data=data.trailing + b"".join(data.chunks))
    for event in ws.events():
        if isinstance(event, Ping):
            view.pings.append(bytes(event.payload))
        elif isinstance(event, CloseConnection):
            if ws.state is ConnectionState.REMOTE_CLOSING:
                view.close_code = int(event.code)
            else:
                view.failed = int(event.code)
            break
    return view


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> None:
        raise InvariantViolation(f"the server sent {name} in {text!r:.200}")

    return json.loads(text, parse_constant=refuse)


def _server_view(sent: bytes) -> WireReport:
    report = WireReport()
    ws = Connection(ConnectionType.CLIENT)
    ws.receive_data(bytes(sent))
    for event in ws.events():
        if report.close_code is not None:
            raise InvariantViolation(f"the server sent {event!r:.200} after its close frame")
        if isinstance(event, TextMessage):
            if not event.message_finished:
                raise InvariantViolation("the server fragmented a text message")
            document = _strict_json(event.data)
            if not isinstance(document, dict) or document.get("type") not in _EVENT_TYPES:
                raise InvariantViolation(f"the server sent a non-event {event.data!r:.200}")
            report.texts.append(document)
        elif isinstance(event, Pong):
            report.pongs += 1
            report.texts.append({"type": "_pong", "payload": bytes(event.payload)})
        elif isinstance(event, CloseConnection):
            if ws.state is not ConnectionState.REMOTE_CLOSING:
                raise InvariantViolation(f"the server's frames do not parse: {event.reason}")
            report.close_code = int(event.code)
            report.close_reason = event.reason or ""
        else:
            raise InvariantViolation(f"the server sent {event!r:.200}")
    return report


def _check_close(report: WireReport, client: _ClientView) -> None:
    events = [t for t in report.texts if t["type"] != "_pong"]
    errors = [e for e in events if e["type"] == "error"]
    code = report.close_code
    if len(errors) > 1 or (errors and events[-1] is not errors[0]):
        raise InvariantViolation(f"error events not last and alone: {events!r:.400}")
    if errors:
        name = errors[0].get("code")
        try:
            expected = int(ErrorCode(name).close_code)
        except ValueError:
            raise InvariantViolation(f"undocumented error code {name!r}") from None
        if code is not None and (code, report.close_reason) != (expected, name):
            raise InvariantViolation(f"error {name} closed with {code} {report.close_reason!r}")
        return
    if code is None:
        return  # the client left first (PeerGone): no close frame is due
    if client.close_code is not None and code == client.close_code:
        return  # the client's close frame, echoed (RFC 6455), whatever its code
    if code == CloseReason.INVALID_FRAME_PAYLOAD_DATA:
        raise InvariantViolation("close 1007: invalid UTF-8 must be invalid_json (4400)")
    if code == CloseReason.NORMAL_CLOSURE and events and events[-1]["type"] == "stats":
        return
    if code == client.failed:
        return  # wsproto refused the client's frames (RFC 6455)
    raise InvariantViolation(
        f"undocumented close {code} {report.close_reason!r} after {events!r:.300}; "
        f"client close {client.close_code}, parse failure {client.failed}"
    )


def _check_pongs(report: WireReport, client: _ClientView) -> None:
    pongs = [t["payload"] for t in report.texts if t["type"] == "_pong"]
    if pongs != client.pings[: len(pongs)]:
        raise InvariantViolation(f"pongs {pongs!r:.200} do not answer pings {client.pings!r:.200}")
    still_open = report.close_code is None and client.close_code is None and client.failed is None
    if still_open and len(pongs) != len(client.pings):
        raise InvariantViolation(f"{len(client.pings)} pings, {len(pongs)} pongs")


async def _serve(data: WireInput) -> tuple[MemoryWire, AuditedSession, WireProvider, Slots]:
    wire = MemoryWire(data.chunks, patient=data.patient)
    channel = WsprotoChannel(wire, data.trailing, read_size=data.read_size, send_timeout=5.0)
    # The driver's clock is time.monotonic; the session must start on it.
    session = AuditedSession(WIRE_LIMITS, now=time.monotonic())
    provider = WireProvider()
    slots = Slots(1)

    async def admit() -> Slot | Refused:
        slot = await slots.acquire()
        assert slot is not None  # one connection, one slot: never refused
        return slot

    driver = StreamDriver(session, channel, provider, close_timeout=0.0, admit=admit)
    with anyio.move_on_after(HANG_SECONDS) as scope:
        await driver.run()
    if scope.cancelled_caught:
        raise InvariantViolation(f"the server did not finish within {HANG_SECONDS} s")
    return wire, session, provider, slots


@functools.cache
def _loop() -> asyncio.AbstractEventLoop:
    """One event loop for every input of the process (a new one per input costs more than
    the input)."""
    # The channel logs protocol errors at info: a log line per input is only noise here.
    logging.getLogger("talkies.transport").setLevel(logging.CRITICAL)
    return asyncio.new_event_loop()


def check_wire_input(data: bytes) -> WireReport:
    """Run one input through the server's WebSocket code and check it; raises on a finding."""
    decoded = decode_wire_input(data)
    wire, session, provider, slots = _loop().run_until_complete(_serve(decoded))
    if session.state is not State.CLOSED:
        raise InvariantViolation(f"the session is {session.state} after the client left")
    session.audit.check_end(session)
    if provider.opened != provider.closed:
        raise InvariantViolation(
            f"{provider.opened} engine streams opened, {provider.closed} closed"
        )
    if slots.held:
        raise InvariantViolation("the server-wide slot was not given back")
    if not wire.closed:
        raise InvariantViolation("the connection was not closed")
    report = _server_view(bytes(wire.sent))
    client = _client_view(decoded)
    _check_close(report, client)
    _check_pongs(report, client)
    report.state, report.outcome = session.state, session.outcome
    return report
