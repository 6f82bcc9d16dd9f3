"""How the engine runtime spaces its decode rounds and hands results over
(talkies/engines/runtime/schedule.py: "Spacing", "Results"; talkies/transport/driver.py).

A cheap decoder (microseconds per call, as the transport benchmarks' echo engine) is where a
thread hop per frame was the whole cost: its rounds start at most every ``_MIN_GAP``, one at
a time while the running one is quick, so under load one round serves many streams; a model
out of idle still starts at once, and a round that hangs holds the others back
``_SLOW_ROUND`` at most. Over the standalone server, partials are written in the callback
that ends their round.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import anyio
import pytest

from talkies.app.driver import StreamDriver
from talkies.engines.base import EngineEvent, EngineUpdate
from talkies.engines.runtime import schedule as runner
from talkies.engines.runtime.rounds import DecodeRounds, ThreadedStream
from talkies.protocol import EngineFinal, EnginePartial

from .conftest import run_server
from .fake_engine import speech
from .reliability.clients import STREAM, FrameReader, frame, read_until_ready, upgrade
from .wire import START, drain, open_stream

pytestmark = pytest.mark.anyio

BUFFER = 5 * 32000


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Cheap:
    """A decoder that costs microseconds: a partial per call, counting the bytes so far."""

    def __init__(self) -> None:
        self.total = 0

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        self.total += len(pcm)
        return [EnginePartial(text=str(self.total))]

    def finish(self) -> EngineFinal:
        return EngineFinal(text=str(self.total))

    def close(self) -> None:
        pass


class Blocking(Cheap):
    """:class:`Cheap`, whose ``accept`` waits for ``gate`` once it is armed."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.armed = False
        self.entered = threading.Event()

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        if self.armed:
            self.entered.set()
            self.gate.wait(10)
        return super().accept(pcm)


async def _next_event(stream: ThreadedStream, timeout: float = 5.0) -> EngineEvent:
    with anyio.fail_after(timeout):
        async for event in stream.events():
            return event
    raise AssertionError("the stream ended")


@contextlib.asynccontextmanager
async def _streams(count: int, parallel: int = 2) -> AsyncIterator[list[ThreadedStream]]:
    """``count`` streams of :class:`Cheap` on one model's rounds, closed at the end."""
    rounds = DecodeRounds(parallel)
    streams = [
        ThreadedStream(Cheap(), max_buffered_bytes=BUFFER, rounds=rounds) for _ in range(count)
    ]
    try:
        yield streams
    finally:
        for stream in streams:
            await stream.aclose()


async def test_an_idle_model_starts_a_round_at_once() -> None:
    rounds = DecodeRounds(2)
    stream = ThreadedStream(Cheap(), max_buffered_bytes=BUFFER, rounds=rounds)
    other = ThreadedStream(Cheap(), max_buffered_bytes=BUFFER, rounds=rounds)
    try:
        await stream.feed(speech(0.1))
        assert rounds.rounds == 1  # started in feed itself: no timer, no wait
        assert isinstance(await _next_event(stream), EnginePartial)
    finally:
        await stream.aclose()
        await other.aclose()


async def test_rounds_of_a_cheap_decoder_are_spaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_MIN_GAP", 1.0)  # long enough to see, whatever the machine
    rounds = DecodeRounds(2)
    first, second, idle = (
        ThreadedStream(Cheap(), max_buffered_bytes=BUFFER, rounds=rounds) for _ in range(3)
    )
    try:
        began = anyio.current_time()
        await first.feed(speech(0.02))  # out of idle: at once
        assert rounds.rounds == 1
        await second.feed(speech(0.02))  # within the gap, another stream open and idle
        await _next_event(first)
        # The next round was handed to a thread when the first ended; it waits for the gap,
        # and audio that comes meanwhile joins it.
        assert rounds.rounds == 2
        await first.feed(speech(0.02))
        assert rounds.rounds == 2
        await _next_event(second)
        assert anyio.current_time() - began >= 0.95  # a gap after the first round began
        assert isinstance(await _next_event(first), EnginePartial)
        assert rounds.rounds == 2  # first's audio was in that same round
        # When every open stream has work there is nothing to wait for: at once.
        await idle.aclose()
        again = anyio.current_time()
        await first.feed(speech(0.02))
        await second.feed(speech(0.02))
        assert rounds.rounds == 3
        await _next_event(first)
        await _next_event(second)
        assert anyio.current_time() - again < 0.5
    finally:
        for stream in (first, second, idle):
            await stream.aclose()


async def test_more_audio_and_the_end_join_the_round_that_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "_MIN_GAP", 1.0)
    frame = speech(0.02)
    async with _streams(3) as (first, second, _idle):
        rounds = first._rounds
        await first.feed(frame)
        await _next_event(first)
        await second.feed(frame)  # within the gap: a round that waits for it
        assert rounds.rounds == 2
        await second.feed(frame)  # the same stream's next frame and its end go in it too
        await second.flush()
        with anyio.fail_after(5):
            events = [e async for e in second.events()]
        assert rounds.rounds == 2
        assert isinstance(events[-1], EngineFinal) and events[-1].text == str(2 * len(frame))


async def test_a_round_that_starts_early_counts_the_next_gap_from_then(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "_MIN_GAP", 1.0)
    async with _streams(2) as (first, second):
        await first.feed(speech(0.02))
        await _next_event(first)
        await second.feed(speech(0.02))  # waits for the gap ...
        began = anyio.current_time()
        await first.feed(speech(0.02))  # ... until every open stream is in it
        await _next_event(first)
        await _next_event(second)
        assert anyio.current_time() - began < 0.5
        # the next gap counts from that start, not from the gap's end that did not come
        assert first._rounds._last_start <= time.monotonic()


async def test_closing_the_stream_a_round_waits_for_starts_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(runner, "_MIN_GAP", 1.0)
    async with _streams(3) as (first, second, idle):
        await first.feed(speech(0.02))
        await _next_event(first)
        await second.feed(speech(0.02))
        await first.feed(speech(0.02))  # both in the waiting round; idle has nothing
        began = anyio.current_time()
        await idle.aclose()
        await _next_event(second)
        await _next_event(first)
        assert anyio.current_time() - began < 0.5


async def test_a_model_that_gathers_is_not_spaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_MIN_GAP", 1.0)
    rounds = DecodeRounds(1, gather=0.01)  # sherpa's way: its own max_wait batches
    one, two, idle = (
        ThreadedStream(Cheap(), max_buffered_bytes=BUFFER, rounds=rounds) for _ in range(3)
    )
    try:
        began = anyio.current_time()
        await one.feed(speech(0.02))
        await _next_event(one)
        await two.feed(speech(0.02))
        await _next_event(two)
        assert anyio.current_time() - began < 0.9
    finally:
        for stream in (one, two, idle):
            await stream.aclose()


async def test_a_slow_round_holds_the_others_back_briefly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "_SLOW_ROUND", 0.05)
    rounds = DecodeRounds(2)
    hung = Blocking()
    stuck = ThreadedStream(hung, max_buffered_bytes=BUFFER, rounds=rounds)
    fine = ThreadedStream(Cheap(), max_buffered_bytes=BUFFER, rounds=rounds)
    idle = ThreadedStream(Cheap(), max_buffered_bytes=BUFFER, rounds=rounds)  # not all ready
    try:
        hung.armed = True
        await stuck.feed(speech(0.1))
        assert await anyio.to_thread.run_sync(hung.entered.wait, 5)
        await fine.feed(speech(0.1))  # a quick round is running: this one waits
        assert rounds.rounds == 1
        event = await _next_event(fine)  # ... until the running one counts as slow
        assert isinstance(event, EnginePartial)
        assert rounds.rounds == 2 and not hung.gate.is_set()
    finally:
        hung.gate.set()
        for stream in (stuck, fine, idle):
            await stream.aclose()


async def test_a_listener_takes_results_in_the_rounds_callback() -> None:
    rounds = DecodeRounds(1)
    stream = ThreadedStream(Cheap(), max_buffered_bytes=BUFFER, rounds=rounds)
    taken: list[EngineEvent] = []
    refuse = False

    def listener(outbox: Any) -> bool:
        if refuse:
            return False
        while outbox:
            taken.append(outbox.popleft())
        return True

    stream.listen(listener)
    frame = speech(0.02)
    try:
        for _ in range(5):
            await stream.feed(frame)
            await anyio.sleep(0.01)
        with anyio.fail_after(5):
            while not taken or taken[-1].text != str(5 * len(frame)):  # type: ignore[attr-defined]
                await anyio.sleep(0.005)
        refuse = True  # what the listener leaves goes to events(), in order
        await stream.feed(frame)
        await stream.flush()
        rest = [e async for e in stream.events()]
    finally:
        await stream.aclose()
    assert all(isinstance(e, EnginePartial) for e in taken)
    counts = [int(e.text) for e in [*taken, *rest]]  # type: ignore[attr-defined]
    assert counts == sorted(counts) and counts[-1] == 6 * len(frame), counts
    assert isinstance(rest[-1], EngineFinal)


def test_partials_are_written_from_the_rounds_callback(monkeypatch: pytest.MonkeyPatch) -> None:
    """Over the standalone server (wsproto on an asyncio socket): the driver answers
    partials in the round's callback; the final still comes through the engine loop."""
    calls = {"offered": 0, "taken": 0}
    original = StreamDriver._engine_results

    def counted(self: StreamDriver, outbox: Any) -> bool:
        calls["offered"] += 1
        took = original(self, outbox)
        calls["taken"] += took
        return took

    monkeypatch.setattr(StreamDriver, "_engine_results", counted)
    with run_server() as server:
        ws = open_stream(server.url)
        early: list[dict[str, Any]] = []
        for _ in range(3):
            for _ in range(3):  # 0.3 s of speech: one more word, and its partial
                ws.send(speech(0.1))
            # Its partial is read before more audio goes: the next round ends with partials
            # alone, as on an idle machine. Sent at once, a loaded machine may fold all the
            # audio and the final into one round (CI saw it: offered 1, taken 0), and the
            # engine loop answers that.
            while True:
                early.append(json.loads(ws.recv(timeout=10)))
                if early[-1]["type"] == "partial":
                    break
        ws.send('{"type": "end"}')
        rest, code, _ = drain(ws, timeout=10)
    events = early + rest
    kinds = [e["type"] for e in events]
    assert code == 1000 and kinds[-2:] == ["final", "stats"], kinds
    revisions = [e["revision"] for e in events if "revision" in e]
    assert "partial" in kinds and revisions == sorted(set(revisions)), revisions  # in order
    assert calls["taken"] >= 1, calls  # the fast path ran (anyio's transport was reachable)


class Loud(Cheap):
    """:class:`Cheap` with partials of 20 kB: a client that does not read them fills every
    buffer on the way within a few hundred frames."""

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        self.total += len(pcm)
        return [EnginePartial(text=f"{self.total} " + "w" * 20000)]


class LoudProvider:
    def __init__(self) -> None:
        self.rounds = DecodeRounds(2)

    async def open_stream(self, options: Any) -> ThreadedStream:
        return ThreadedStream(Loud(), max_buffered_bytes=BUFFER, rounds=self.rounds)


def test_a_client_that_stops_reading_is_dropped_at_the_send_timeout() -> None:
    """Partials written from the round's callback must not bypass the send timeout: once the
    socket stops taking them, the next one waits in a send that SendWatch can see."""
    with run_server(
        provider=LoudProvider(), stream_idle_timeout=1.0, stream_max_duration=86400
    ) as server:
        sock, response, rest = upgrade(server.port, target=STREAM)
        assert response.startswith(b"HTTP/1.1 101"), response
        sock.sendall(frame(0x1, json.dumps(START).encode()))
        read_until_ready(FrameReader(sock, rest))  # and nothing more, ever
        sock.settimeout(0.5)
        audio = frame(0x2, speech(0.1))
        began = time.monotonic()
        dropped = False
        while time.monotonic() - began < 30:  # never reading what the server sends
            try:
                sock.sendall(audio)
                time.sleep(0.005)  # 20x real time: far from any duration limit
            except TimeoutError:
                continue  # the server stopped reading too (its queue is full): keep trying
            except OSError:
                dropped = True
                break
        sock.close()
        assert dropped, "the server kept a client that stopped reading"
        server.wait_connections(0, timeout=10)
