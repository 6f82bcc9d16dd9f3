"""Property tests: invariants over arbitrary input sequences, and fragmentation invariance."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.protocol import (
    Action,
    AudioBatch,
    BinaryReceived,
    EngineEndpoint,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    Feed,
    Input,
    PeerGone,
    Send,
    SessionLimits,
    State,
    Stats,
    StreamSession,
    TextReceived,
    Tick,
)
from talkies.protocol.audit import SessionAudit

from .protocol_helpers import LIMITS, error_of, session_in, start_text
from .strategies import client_messages, driver_inputs, input_sequences, transcripts, valid_start


def run(inputs: list[tuple[Input, float]]) -> tuple[StreamSession, list[Action]]:
    s = StreamSession(LIMITS, now=0.0)
    audit = SessionAudit()
    out: list[Action] = []
    for item, now in inputs:
        s.handle(item, now)  # never raises: that is the property
        batch = s.pull_actions()
        audit.observe(batch)
        audit.check_end(s)
        out.extend(batch)
    return s, out


@settings(max_examples=400, deadline=None)
@given(input_sequences())
def test_arbitrary_sequences_keep_every_invariant(inputs: list[tuple[Input, float]]) -> None:
    # Whatever happened before, a vanished peer always ends with the stream released
    # (run() audits Open/Release pairing after every step).
    s, _ = run([*inputs, (PeerGone(), 1e9)])
    assert not s.stream_held
    assert s.state is State.CLOSED


@settings(max_examples=300, deadline=None)
@given(input_sequences())
def test_client_inputs_alone_never_cause_a_server_error(inputs: list[tuple[Input, float]]) -> None:
    client_only = [(i, t) for i, t in inputs if isinstance(i, TextReceived | BinaryReceived)]
    s, _ = run(client_only)
    assert s.error is None or s.error.code.close_code != 4500


def _fragment_text(data: str, cuts: list[int], as_bytes: bool) -> list[Input]:
    raw: str | bytes = data.encode() if as_bytes else data
    points = sorted({min(c, len(raw)) for c in cuts})
    pieces = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)], strict=True)]
    return [TextReceived(data=p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]


def _fragment_binary(data: bytes, cuts: list[int]) -> list[Input]:
    points = sorted({min(c, len(data)) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    return [BinaryReceived(data=p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]


@st.composite
def scripts(draw: st.DrawFn) -> list[Input]:
    """Whole client messages and engine answers: a plausible conversation, sometimes broken."""
    out: list[Input] = [TextReceived(data=draw(valid_start)), EngineOpened()]
    for _ in range(draw(st.integers(0, 12))):
        choice = draw(st.integers(0, 5))
        if choice < 3:
            size = draw(st.integers(1, 400)) * 2
            if draw(st.integers(0, 20)) == 0:
                size += 1
            out.append(BinaryReceived(data=draw(st.binary(min_size=size, max_size=size))))
        elif choice == 3:
            out.append(draw(st.builds(EnginePartial, text=transcripts)))
        elif choice == 4:
            out.append(draw(st.builds(EngineEndpoint, text=transcripts)))
        else:
            out.extend(draw(client_messages()))
    out.append(TextReceived(data='{"type":"end"}'))
    out.append(EngineFinal(text=draw(transcripts)))
    return out


@settings(max_examples=300, deadline=None)
@given(script=scripts(), data=st.data())
def test_fragmenting_messages_changes_nothing(script: list[Input], data: st.DataObject) -> None:
    whole = [(item, 1.0) for item in script]
    split: list[tuple[Input, float]] = []
    for item in script:
        if isinstance(item, TextReceived) and item.final and isinstance(item.data, str):
            byte_by_byte = data.draw(st.booleans())
            if byte_by_byte:
                cuts = list(range(1, len(item.data.encode())))
                parts = _fragment_text(item.data, cuts, as_bytes=True)
            else:
                cuts = data.draw(st.lists(st.integers(0, len(item.data)), max_size=4))
                parts = _fragment_text(item.data, cuts, as_bytes=data.draw(st.booleans()))
        elif isinstance(item, BinaryReceived) and item.final:
            cuts = data.draw(st.lists(st.integers(0, len(item.data)), max_size=4))
            parts = _fragment_binary(item.data, cuts)
        else:
            parts = [item]
        split.extend((p, 1.0) for p in parts)
    _, expected = run(whole)
    _, got = run(split)
    assert got == expected


@settings(max_examples=200, deadline=None)
@given(
    audio=st.binary(min_size=0, max_size=6000).map(lambda b: b[: len(b) // 2 * 2]),
    cuts=st.lists(st.integers(0, 6000), max_size=20),
)
def test_a_pcm_stream_split_anywhere_is_accepted_identically(audio: bytes, cuts: list[int]) -> None:
    points = sorted({c // 2 * 2 for c in cuts if 0 < c < len(audio)})
    frames = [audio[a:b] for a, b in zip([0, *points], [*points, len(audio)], strict=True)]
    frames = [f for f in frames if f]
    s = session_in(State.STREAMING)
    fed = b""
    for frame in frames:
        s.handle(BinaryReceived(data=frame), 1.0)
        for action in s.pull_actions():
            assert isinstance(action, Feed)
            fed += action.pcm
    assert fed == audio
    assert s.samples == len(audio) // 2 and s.frames == len(frames)
    s.handle(TextReceived(data='{"type":"end"}'), 1.0)
    s.handle(EngineFinal(text=""), 1.0)
    stats = [a.event for a in s.pull_actions() if isinstance(a, Send)][-1]
    assert isinstance(stats, Stats)
    assert stats.audio_seconds == len(audio) / 2 / 16000
    assert stats.frames == len(frames)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(driver_inputs, st.builds(EnginePartial, text=transcripts)), max_size=30))
def test_revisions_strictly_increase_whatever_the_engine_says(engine: list[Input]) -> None:
    s = session_in(State.STREAMING, word_timestamps=True)
    revisions = []
    for item in [*engine, TextReceived(data='{"type":"end"}'), EngineFinal(text="x")]:
        s.handle(item, 1.0)
        for action in s.pull_actions():
            if isinstance(action, Send):
                revision = json.loads(action.event.to_json()).get("revision")
                if revision is not None:
                    revisions.append(revision)
    assert revisions == list(range(1, len(revisions) + 1))


@settings(max_examples=300, deadline=None)
@given(
    frames=st.lists(
        st.integers(0, 2100).map(lambda n: bytes([n % 251]) * n), min_size=0, max_size=12
    ),
    split=st.data(),
)
def test_an_audio_batch_is_its_frames_one_by_one(frames: list[bytes], split: st.DataObject) -> None:
    """AudioBatch(frames) == BinaryReceived(frame) for each frame: same accepted audio, same
    counters, same error, same close; only the Feed boundaries may differ."""
    limits = SessionLimits(max_frame_bytes=2048, max_duration_seconds=0.1, idle_timeout_seconds=30)
    one = session_in(State.STREAMING, limits=limits)
    batched = session_in(State.STREAMING, limits=limits)
    one_actions: list[Action] = []
    for frame in frames:
        one.handle(BinaryReceived(data=frame), 1.0)
        one_actions.extend(one.pull_actions())
    # The same frames, in batches of random sizes.
    cuts = sorted(split.draw(st.lists(st.integers(0, len(frames)), max_size=3)))
    batched_actions: list[Action] = []
    for a, b in zip([0, *cuts], [*cuts, len(frames)], strict=True):
        if a < b:
            batched.handle(AudioBatch(frames=tuple(frames[a:b])), 1.0)
            batched_actions.extend(batched.pull_actions())

    def fed(actions: list[Action]) -> bytes:
        return b"".join(a.pcm for a in actions if isinstance(a, Feed))

    def rest(actions: list[Action]) -> list[Action]:
        return [a for a in actions if not isinstance(a, Feed)]

    assert fed(batched_actions) == fed(one_actions)
    assert rest(batched_actions) == rest(one_actions)
    assert (batched.frames, batched.samples, batched.state) == (one.frames, one.samples, one.state)
    assert sum(a.frames for a in batched_actions if isinstance(a, Feed)) == batched.frames


@settings(max_examples=300, deadline=None)
@given(
    accepted_at=st.integers(0, 10**6).map(lambda n: n / 4),
    idle=st.sampled_from([1.0, 2.0, 30.0]),
    steps=st.lists(
        st.tuples(
            st.one_of(client_messages(), st.just([Tick()])),
            st.floats(0, 4.99),
        ),
        max_size=12,
    ),
)
def test_nothing_the_client_sends_moves_the_start_deadline(
    accepted_at: float, idle: float, steps: list[tuple[list[Input], float]]
) -> None:
    """Issue 21, point 2: whatever arrives before a start is accepted (fragments of one that
    never ends, refused messages, ticks), the connection is closed 4408 at its start
    deadline at the latest; a start accepted in time leaves the start deadline behind."""
    limits = SessionLimits(idle_timeout_seconds=idle, start_timeout_seconds=5.0)
    s = StreamSession(limits, now=accepted_at)
    audit = SessionAudit()  # checks deadline <= start_deadline while awaiting start
    start_deadline = accepted_at + 5.0
    assert s.start_deadline == start_deadline
    for items, offset in sorted(steps, key=lambda step: step[1]):
        for item in items:
            audit.step(s, item, accepted_at + offset)
    state = s.state
    actions = audit.step(s, Tick(), start_deadline)
    assert s.start_deadline == start_deadline
    if state is State.AWAITING_START:
        assert error_of(actions) == ("idle_timeout", 4408)
        assert s.state is State.CLOSED and not s.stream_held
    else:
        assert actions == []  # opening (no timer) or already closed


@settings(max_examples=200, deadline=None)
@given(
    start_at=st.floats(0, 4.99),
    opened_after=st.floats(0, 100),
    ticks=st.lists(st.floats(0, 29.99), max_size=6),
)
def test_an_accepted_start_is_never_timed_out_by_the_start_deadline(
    start_at: float, opened_after: float, ticks: list[float]
) -> None:
    s = StreamSession(LIMITS, now=0.0)
    audit = SessionAudit()
    audit.step(s, TextReceived(data=start_text()), start_at)
    assert s.state is State.OPENING
    assert audit.step(s, Tick(), start_at + opened_after) == []  # the server's time
    opened = start_at + opened_after
    audit.step(s, EngineOpened(), opened)
    for at in sorted(ticks):
        assert audit.step(s, Tick(), opened + at) == []
    assert s.state is State.STREAMING
