"""Hypothesis strategies for protocol inputs, client messages and engine answers."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from talkies.protocol import (
    AudioBatch,
    AuthRejected,
    BinaryReceived,
    CutRequested,
    EngineEndpoint,
    EngineFailed,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    ErrorCode,
    Input,
    PeerGone,
    Refused,
    ShuttingDown,
    TextReceived,
    Tick,
    Word,
)
from talkies.protocol.table import InputKind

from .protocol_helpers import START, start_text

words = st.lists(
    st.builds(
        lambda w, a, d, c: Word(word=w, start=a, end=a + d, confidence=c),
        st.text(max_size=8),
        st.floats(0, 100),
        st.floats(0, 5),
        st.none() | st.floats(0, 1),
    ),
    max_size=3,
).map(tuple)
transcripts = st.text(max_size=20)

valid_start = st.fixed_dictionaries(
    {},
    optional={
        "language": st.sampled_from(["auto", "en", "en-US", "pt_BR", "ko"]),
        "interim_results": st.booleans(),
        "word_timestamps": st.booleans(),
    },
).map(lambda extra: start_text(**extra))

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _mutated_start(draw: st.DrawFn) -> str:
    body: dict[str, Any] = dict(START)
    key = draw(st.sampled_from([*START, "language", "interim_results", "word_timestamps", "x"]))
    if draw(st.booleans()):
        body.pop(key, None)
    else:
        body[key] = draw(json_values)
    return json.dumps(body)


control_texts = st.one_of(
    valid_start,
    st.sampled_from(['{"type":"end"}', '{"type":"cancel"}', '{"type":"ping"}', "{}", "[]", "nope"]),
    st.composite(_mutated_start)(),
    json_values.map(json.dumps),
    st.text(max_size=40),
)

frame_sizes = st.integers(0, 700) | st.sampled_from([640, 4096, 4097, 4098])


@st.composite
def client_messages(draw: st.DrawFn) -> list[Input]:
    """One client message, possibly in fragments."""
    if draw(st.booleans()):
        data: str | bytes = draw(control_texts)
        if draw(st.integers(0, 9)) == 0:
            data = data.encode() + draw(st.binary(max_size=3))
        cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=3)))
        pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        return [TextReceived(data=p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    size = draw(frame_sizes)
    payload = bytes(size)
    cuts = sorted(draw(st.lists(st.integers(0, size), max_size=2)))
    pieces_b = [payload[a:b] for a, b in zip([0, *cuts], [*cuts, size], strict=True)]
    return [BinaryReceived(data=p, final=i == len(pieces_b) - 1) for i, p in enumerate(pieces_b)]


# The engine runtime's lag on a result (seconds); the session must turn anything, even a
# value no runtime sends (NaN, negative, infinite), into a valid event.
lags = st.one_of(st.none(), st.floats(0, 30), st.floats(allow_nan=True, allow_infinity=True))

# A partial's stable prefix: any count, even past the text (the session clamps it).
stables = st.one_of(st.none(), st.integers(-2, 40))
partials = st.builds(EnginePartial, text=transcripts, words=words, lag=lags, stable=stables)
endpoints = st.builds(EngineEndpoint, text=transcripts, words=words, lag=lags, cut=st.booleans())

driver_inputs = st.one_of(
    st.just(EngineOpened()),
    st.just(CutRequested()),
    partials,
    endpoints,
    st.builds(EngineFinal, text=transcripts, words=words, lag=lags),
    st.builds(EngineFailed, detail=st.text(max_size=10)),
    st.builds(Refused, code=st.sampled_from(list(ErrorCode)), detail=st.text(max_size=10)),
    st.just(AuthRejected()),
    st.just(PeerGone()),
    st.just(ShuttingDown()),
    st.just(Tick()),
)


@st.composite
def input_sequences(draw: st.DrawFn) -> list[tuple[Input, float]]:
    """Interleaved client messages and driver inputs with a non-decreasing clock."""
    out: list[tuple[Input, float]] = []
    now = 0.0
    for _ in range(draw(st.integers(0, 25))):
        now += draw(st.sampled_from([0.0, 0.01, 1.0, 40.0]))
        if draw(st.integers(0, 2)):
            out.extend((item, now) for item in draw(client_messages()))
        else:
            out.append((draw(driver_inputs), now))
    return out


def representative(kind: InputKind) -> st.SearchStrategy[Input]:
    """Inputs that the session classifies as ``kind`` in any state."""
    texts = {
        InputKind.START: valid_start,
        InputKind.END: st.just('{"type":"end"}'),
        InputKind.CANCEL: st.just('{"type":"cancel"}'),
        InputKind.OTHER_TYPE: st.text(max_size=10)
        .filter(lambda t: t not in ("start", "end", "cancel"))
        .map(lambda t: json.dumps({"type": t})),
        InputKind.MALFORMED: st.sampled_from(["", "nope", "[]", '{"a":1}', '{"type":1}']),
    }
    if kind in texts:
        return texts[kind].map(lambda t: TextReceived(data=t))
    simple: dict[InputKind, st.SearchStrategy[Input]] = {
        InputKind.TEXT_PART: st.text(max_size=30).map(lambda t: TextReceived(data=t, final=False)),
        InputKind.AUDIO_PART: st.binary(max_size=64).map(
            lambda b: BinaryReceived(data=b, final=False)
        ),
        InputKind.AUDIO: st.binary(max_size=64).map(lambda b: BinaryReceived(data=b)),
        InputKind.AUDIO_BATCH: st.lists(st.binary(max_size=64), max_size=4).map(
            lambda frames: AudioBatch(frames=tuple(frames))
        ),
        InputKind.ENGINE_OPENED: st.just(EngineOpened()),
        InputKind.CUT: st.just(CutRequested()),
        InputKind.ENGINE_PARTIAL: partials,
        InputKind.ENGINE_ENDPOINT: endpoints,
        InputKind.ENGINE_FINAL: st.builds(EngineFinal, text=transcripts, words=words, lag=lags),
        InputKind.ENGINE_FAILED: st.builds(EngineFailed, detail=st.text(max_size=10)),
        InputKind.REFUSED: st.builds(
            Refused, code=st.sampled_from(list(ErrorCode)), detail=st.text(max_size=10)
        ),
        InputKind.AUTH_REJECTED: st.just(AuthRejected()),
        InputKind.PEER_GONE: st.just(PeerGone()),
        InputKind.SHUTTING_DOWN: st.just(ShuttingDown()),
        InputKind.TICK: st.just(Tick()),
    }
    return simple[kind]
