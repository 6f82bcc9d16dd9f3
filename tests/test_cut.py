"""Cutting an utterance and going on (``CutRequested`` -> ``Cut`` -> an endpoint marked ``cut``):
the session's side and the engine runtime's (talkies/engines/runtime/rounds.py, "cut")."""

from __future__ import annotations

import json
from collections.abc import Sequence

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.engines.base import EngineEvent, EngineUpdate, Recognition
from talkies.engines.runtime.rounds import CANNOT_CUT, ThreadedStream
from talkies.protocol import (
    Cut,
    CutRequested,
    EngineEndpoint,
    EngineFailed,
    EngineFinal,
    EnginePartial,
    Send,
    State,
    Word,
)

from .protocol_helpers import session_in

BYTES_PER_SECOND = 32000


class Counting:
    """A decoder that hears bytes: a partial per call; its final is the bytes it heard, with
    one word spanning them (so the stream's time shift shows)."""

    def __init__(self, made: list[Counting]) -> None:
        made.append(self)
        self.total = 0
        self.closed = False

    def _words(self) -> tuple[Word, ...]:
        return (Word(word=f"b{self.total}", start=0.0, end=self.total / BYTES_PER_SECOND),)

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        assert not self.closed
        self.total += len(pcm)
        return [EnginePartial(text=f"b{self.total}", words=self._words(), stable=0)]

    def finish(self) -> EngineFinal:
        assert not self.closed
        return EngineFinal(text=f"b{self.total}", words=self._words())

    def close(self) -> None:
        assert not self.closed
        self.closed = True


# -- the session ----------------------------------------------------------------------------


def test_a_cut_while_streaming_asks_the_engine_and_its_answer_is_always_sent() -> None:
    s = session_in(State.STREAMING, now=0.0)
    s.handle(CutRequested(), 1.0)
    assert s.pull_actions() == [Cut()]
    assert s.state is State.STREAMING
    # Nothing was heard: a plain empty endpoint is silence, a cut's is its answer.
    s.handle(EngineEndpoint(text=""), 1.1)
    assert s.pull_actions() == []
    s.handle(EngineEndpoint(text="", cut=True), 1.2)
    (send,) = s.pull_actions()
    assert isinstance(send, Send)
    sent = json.loads(send.event.to_json())
    assert sent["type"] == "endpoint" and sent["text"] == "" and sent["cut"] is True
    s.handle(EngineEndpoint(text="a b"), 1.3)
    (send,) = s.pull_actions()
    assert isinstance(send, Send)
    assert "cut" not in json.loads(send.event.to_json())  # native clients never see it


@pytest.mark.parametrize("state", [State.AWAITING_START, State.OPENING, State.FLUSHING])
def test_a_cut_outside_streaming_is_the_translators_bug(state: State) -> None:
    s = session_in(state, now=0.0)
    s.handle(CutRequested(), 1.0)
    assert s.state is State.CLOSED
    codes = [a.code for a in s.pull_actions() if hasattr(a, "code")]
    assert codes and int(codes[-1]) == 4500


def test_a_partials_stable_prefix_is_sent_clamped_and_counts_as_a_change() -> None:
    s = session_in(State.STREAMING, now=0.0)
    s.handle(EnginePartial(text="go forward", stable=None), 1.0)
    s.handle(EnginePartial(text="go forward", stable=2), 1.1)  # same text, more stable
    s.handle(EnginePartial(text="go forward", stable=99), 1.2)
    sent = [json.loads(a.event.to_json()) for a in s.pull_actions() if isinstance(a, Send)]
    assert [m.get("stable") for m in sent] == [None, 2, len("go forward")]


# -- the runtime ----------------------------------------------------------------------------


async def _drain(stream: ThreadedStream, until: int) -> list[EngineEvent]:
    """Events until ``until`` endpoints marked cut and then the final (or a failure)."""
    out: list[EngineEvent] = []
    with anyio.fail_after(10):
        async for event in stream.events():
            out.append(event)
            if isinstance(event, EngineFinal | EngineFailed):
                break
    return out


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(st.integers(1, 3000).map(lambda n: n * 2), st.just("cut")),
        max_size=12,
    ),
    st.integers(2, 4).map(lambda n: n * 640),
)
def test_cuts_split_the_audio_exactly_where_asked(plan: list[int | str], buffer: int) -> None:
    """Whatever the framing and however the rounds fall: the recognitions before and after
    each cut heard exactly the audio between the cuts, every cut is answered in order by an
    endpoint marked cut with stream times, each old recognition is closed, and the stream's
    last one is closed with it."""

    async def main() -> None:
        made: list[Counting] = []

        def create() -> Recognition:
            return Counting(made)

        stream = ThreadedStream(create(), max_buffered_bytes=buffer, create=create)
        expected: list[int] = [0]
        async with anyio.create_task_group() as tg:
            events: list[EngineEvent] = []

            async def consume() -> None:
                events.extend(await _drain(stream, plan.count("cut")))

            tg.start_soon(consume)
            for step in plan:
                if step == "cut":
                    await stream.cut()
                    expected.append(0)
                else:
                    assert isinstance(step, int)
                    for i in range(0, step, buffer):
                        chunk = min(buffer, step - i)
                        await stream.feed(bytes(chunk))
                        expected[-1] += chunk
            await stream.flush()
        await stream.aclose()
        cuts = [e for e in events if isinstance(e, EngineEndpoint)]
        assert all(e.cut for e in cuts)
        final = events[-1]
        assert isinstance(final, EngineFinal)
        assert [e.text for e in [*cuts, final]] == [f"b{n}" for n in expected]
        assert len(made) == len(expected)
        assert all(r.closed for r in made)
        # Word times in the stream's time: each answer's word ends where its audio ended.
        ends = [round(e.words[0].end * BYTES_PER_SECOND) for e in [*cuts, final]]
        running = [sum(expected[: i + 1]) for i in range(len(expected))]
        assert ends == running
        for e in events:
            if isinstance(e, EnginePartial):
                assert e.stable == 0  # the runtime keeps what the engine said

    anyio.run(main)


def test_a_stream_that_cannot_make_a_new_recognition_fails_the_cut() -> None:
    async def main() -> None:
        made: list[Counting] = []
        stream = ThreadedStream(Counting(made), max_buffered_bytes=64000)
        await stream.feed(bytes(640))
        await stream.cut()
        events = await _drain(stream, 1)
        await stream.aclose()
        assert isinstance(events[-1], EngineFailed) and events[-1].detail == CANNOT_CUT
        assert made[0].closed

    anyio.run(main)


def test_a_failed_renewal_fails_the_stream_and_closes_the_old_recognition_once() -> None:
    async def main() -> None:
        made: list[Counting] = []
        calls = 0

        def create() -> Recognition:
            nonlocal calls
            calls += 1
            if calls > 1:
                raise RuntimeError("model gone")
            return Counting(made)

        stream = ThreadedStream(create(), max_buffered_bytes=64000, create=create)
        await stream.feed(bytes(640))
        await stream.cut()
        events = await _drain(stream, 1)
        await stream.aclose()
        assert isinstance(events[-1], EngineFailed)
        assert len(made) == 1 and made[0].closed

    anyio.run(main)
