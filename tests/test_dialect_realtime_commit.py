"""Realtime manual commits (a native cut) and deltas streamed from the engine's stable prefix,
through the translator and the real native session (fuzz/_realtime.py's pair)."""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz._realtime import RealtimePair
from talkies.dialects.realtime import RealtimeConfig
from talkies.protocol import (
    CutRequested,
    EngineEndpoint,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    Input,
    TextReceived,
    Word,
)

MANUAL = RealtimeConfig(model="tiny-test", turn_detection=None)
SERVER_VAD = RealtimeConfig(model="tiny-test")
SECOND = 48000  # bytes of 24 kHz PCM16


class CountingPair(RealtimePair):
    """The pair, counting the cuts the translator asked the session for."""

    cuts = 0

    def _handle(self, item: Input) -> None:
        if isinstance(item, CutRequested):
            self.cuts += 1
        super()._handle(item)


def _event(kind: str, **fields: Any) -> TextReceived:
    return TextReceived(data=json.dumps({"type": kind, **fields}))


def _append(seconds: float) -> list[TextReceived]:
    """Appends of ``seconds`` of audio, 40 ms each (within the pair's event limit)."""
    pcm = b"\x01\x00" * round(seconds * SECOND / 2)
    step = SECOND // 25
    return [
        _event("input_audio_buffer.append", audio=base64.b64encode(pcm[i : i + step]).decode())
        for i in range(0, len(pcm), step)
    ]


def _utterance(count: int, start: float = 0.0) -> tuple[str, tuple[Word, ...]]:
    words = tuple(
        Word(word=f"w{i}", start=round(start + 0.2 * i, 3), end=round(start + 0.2 * (i + 1), 3))
        for i in range(count)
    )
    return " ".join(w.word for w in words), words


def _pair(config: RealtimeConfig, *, beta: bool = False) -> CountingPair:
    pair = CountingPair(config)
    if beta:
        session: dict[str, Any] = {"turn_detection": config.turn_detection}
        pair.client([_event("transcription_session.update", session=session)])
    else:
        inputs = {"turn_detection": config.turn_detection}
        session = {"type": "transcription", "audio": {"input": inputs}}
        pair.client([_event("session.update", session=session)])
    pair.engine(EngineOpened())
    return pair


def _kinds(pair: RealtimePair) -> list[str]:
    return [e["type"] for e in pair.events[1:]]  # after session.created


def test_turn_detection_null_is_accepted_and_echoed() -> None:
    pair = _pair(MANUAL)
    assert pair.events[1]["type"] == "session.updated"
    assert pair.events[1]["session"]["audio"]["input"]["turn_detection"] is None
    assert pair.translator.config.turn_detection is None


def test_a_manual_commit_is_committed_at_once_and_transcribed_when_the_cut_answers() -> None:
    pair = _pair(MANUAL)
    pair.client(_append(1.0))
    text, words = _utterance(2)
    pair.engine(EnginePartial(text=text, words=words))  # no speech_started: items are commits
    pair.client([_event("input_audio_buffer.commit", event_id="c1")])
    assert pair.cuts == 1
    assert _kinds(pair)[-2:] == ["input_audio_buffer.committed", "conversation.item.added"]
    committed = pair.events[-2]
    assert committed["previous_item_id"] is None
    item = committed["item_id"]
    text, words = _utterance(3)
    pair.engine(EngineEndpoint(text=text, words=words, cut=True))
    assert _kinds(pair)[-3:] == [
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.done",
    ]
    assert pair.items() == {item: ("w0 w1 w2", "w0 w1 w2")}
    assert "input_audio_buffer.speech_started" not in _kinds(pair)
    # The next commit's item follows this one.
    pair.client([*_append(0.5), _event("input_audio_buffer.commit")])
    assert pair.events[-2]["previous_item_id"] == item
    assert pair.cuts == 2
    assert pair.close_code is None


def test_each_manual_items_usage_is_the_audio_between_its_commits() -> None:
    """usage.seconds is the audio from the last commit to this one, wherever the session was
    when the cut answered: here both commits are sent before the first answer, which then
    said 9 s of audio (it charged 9.3 s to the first item and 0 to the second)."""
    pair = _pair(MANUAL)
    pair.client([*_append(3.3), _event("input_audio_buffer.commit")])
    pair.client([*_append(6.0), _event("input_audio_buffer.commit")])
    for start in (0.0, 3.3):
        text, words = _utterance(2, start)
        pair.engine(EngineEndpoint(text=text, words=words, cut=True))
    usage = [
        e["usage"]["seconds"]
        for e in pair.events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    assert usage == [3.3, 6.0]


def test_a_manual_items_transcript_joins_the_engines_own_endpoints_since_the_last_commit() -> None:
    pair = _pair(MANUAL, beta=True)
    pair.client(_append(3.0))
    text, words = _utterance(2)
    pair.engine(EngineEndpoint(text=text, words=words))  # a pause: held for the commit
    assert "input_audio_buffer.committed" not in _kinds(pair)
    pair.client([_event("input_audio_buffer.commit")])
    pair.engine(EngineEndpoint(text="w9", words=(Word(word="w9", start=1.0, end=1.2),), cut=True))
    ((joined, completed),) = pair.items().values()
    assert joined == completed == "w0 w1 w9"
    assert "conversation.item.created" in _kinds(pair)  # the beta dialect
    assert "conversation.item.done" not in _kinds(pair)


def test_committing_less_than_100_ms_is_openais_commit_empty_error() -> None:
    pair = _pair(MANUAL)
    pair.client([_event("input_audio_buffer.commit", event_id="e1")])
    error = pair.events[-1]["error"]
    assert (error["code"], error["event_id"]) == ("input_audio_buffer_commit_empty", "e1")
    pair.client([*_append(0.05), _event("input_audio_buffer.commit")])
    assert pair.events[-1]["error"]["code"] == "input_audio_buffer_commit_empty"
    pair.client([*_append(0.05), _event("input_audio_buffer.commit")])  # 100 ms in all
    assert pair.events[-1]["type"] == "conversation.item.added"
    assert pair.cuts == 1
    # A clear empties the buffer again.
    pair.client([*_append(1.0), _event("input_audio_buffer.clear")])
    pair.client([_event("input_audio_buffer.commit")])
    assert pair.events[-1]["error"]["code"] == "input_audio_buffer_commit_empty"
    assert pair.close_code is None


def test_a_commit_before_the_native_ready_is_held_behind_its_audio() -> None:
    pair = CountingPair(MANUAL)
    pair.client([_event("session.update", session={"type": "transcription"}), *_append(0.2)])
    pair.client([_event("input_audio_buffer.commit"), *_append(0.2)])
    assert pair.cuts == 0  # held with the audio
    pair.engine(EngineOpened())
    assert pair.cuts == 1
    assert len(pair.audio()) == round(0.4 * SECOND)


def test_a_commit_under_server_vad_ends_the_open_item_at_the_cut() -> None:
    pair = _pair(SERVER_VAD)
    pair.client(_append(1.0))
    text, words = _utterance(2)
    pair.engine(EnginePartial(text=text, words=words))
    pair.client([_event("input_audio_buffer.commit")])
    assert pair.cuts == 1
    pair.engine(EngineEndpoint(text=text, words=words, cut=True))
    ((joined, completed),) = pair.items().values()
    assert joined == completed == "w0 w1"
    assert _kinds(pair)[:4] == [
        "session.updated",
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
    ]


def test_the_final_of_uncommitted_manual_audio_is_dropped() -> None:
    pair = _pair(MANUAL)
    pair.client(_append(1.0))
    text, words = _utterance(2)
    pair.engine(EngineFinal(text=text, words=words))
    assert pair.items() == {}


def test_stable_prefixes_stream_as_deltas_before_the_endpoint() -> None:
    pair = _pair(SERVER_VAD)
    pair.engine(EnginePartial(text="go", words=(), stable=0))
    pair.engine(EnginePartial(text="go forward", words=(), stable=2))
    pair.engine(EnginePartial(text="go forward ten", words=(), stable=len("go forward")))
    deltas = [e["delta"] for e in pair.events if e["type"].endswith(".delta")]
    assert deltas == ["go", " forward"]
    assert "input_audio_buffer.committed" not in _kinds(pair)  # still speaking
    pair.engine(EngineEndpoint(text="go forward ten meters", words=()))
    ((joined, completed),) = pair.items().values()
    assert joined == completed == "go forward ten meters"


def test_a_clear_after_deltas_ends_the_item_with_what_was_sent() -> None:
    pair = _pair(SERVER_VAD)
    text, words = _utterance(3)
    pair.engine(EnginePartial(text=text, words=words, stable=len("w0 w1")))
    pair.client([_event("input_audio_buffer.clear")])
    text, words = _utterance(5)
    pair.engine(EngineEndpoint(text=text, words=words))
    items = list(pair.items().values())
    assert items == [("w0 w1", "w0 w1"), ("w3 w4", "w3 w4")]


def test_after_a_clear_the_rest_of_the_utterance_still_streams_deltas() -> None:
    """A clear in the middle of speech: the words after it that the engine holds stable are
    streamed as the next item's deltas before the endpoint (they came all at once at its
    end), and the item still adds up."""
    pair = _pair(SERVER_VAD)
    text, words = _utterance(3)
    pair.engine(EnginePartial(text=text, words=words, stable=len("w0 w1")))
    pair.client([_event("input_audio_buffer.clear")])
    before = len(pair.events)
    text, words = _utterance(5)
    pair.engine(EnginePartial(text=text, words=words, stable=len("w0 w1 w2 w3")))
    streamed = [e["delta"] for e in pair.events[before:] if e["type"].endswith(".delta")]
    assert streamed == ["w3"]
    pair.engine(EngineEndpoint(text=text, words=words))
    assert list(pair.items().values()) == [("w0 w1", "w0 w1"), ("w3 w4", "w3 w4")]


# -- the invariant, over any program -------------------------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("partial"), st.integers(0, 5), st.integers(0, 5)),
        st.tuples(st.just("endpoint"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("answer"), st.integers(0, 5), st.just(0)),
        st.tuples(st.just("commit"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("clear"), st.just(0), st.just(0)),
        st.tuples(st.just("mode"), st.integers(0, 1), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=200, deadline=None)
@given(ops, st.booleans(), st.booleans(), st.booleans())
def test_every_item_adds_up_and_every_commit_gets_its_item(
    program: list[tuple[str, int, int]], manual: bool, timed: bool, beta: bool
) -> None:
    """Partials with growing stable prefixes, the engine's endpoints, commits (each answered
    in order by a cut endpoint, as the runtime answers them), clears and mode switches: the
    deltas of every item add up to its completed transcript, no delta comes after it, every
    manual commit's item is completed once its cut is answered, and nothing closes."""
    pair = _pair(MANUAL if manual else SERVER_VAD, beta=beta)
    start = 0.0
    promised = 0  # words of the open utterance the engine said were stable
    answered = 0
    for op, n, k in program:
        if op == "commit":
            pair.client([*_append(0.1 * n), _event("input_audio_buffer.commit")])
        elif op == "clear":
            pair.client([_event("input_audio_buffer.clear")])
        elif op == "mode":
            detection = None if n else {"type": "server_vad"}
            inputs = {"turn_detection": detection}
            update = {"type": "transcription", "audio": {"input": inputs}}
            pair.client([_event("session.update", session=update)])
        elif op == "partial":
            count = max(n, promised)
            promised = max(promised, min(k, count))
            text, words = _utterance(count, start)
            stable = len(" ".join(text.split()[:promised]))
            pair.engine(EnginePartial(text=text, words=words if timed else (), stable=stable))
        elif op == "answer" and answered >= pair.cuts:
            continue  # no cut to answer
        else:  # an endpoint of the engine's own, or the answer to the oldest cut
            cut = op == "answer"
            answered += cut
            text, words = _utterance(max(n, promised), start)
            pair.engine(EngineEndpoint(text=text, words=words if timed else (), cut=cut))
            start += 0.2 * (max(n, promised) + 1)
            promised = 0
        assert pair.close_code is None
    items = pair.items()
    for joined, completed in items.values():
        assert completed is None or joined == completed
    completed_items = [item for item, (_, done) in items.items() if done is not None]
    assert len(completed_items) == len(set(completed_items))


# -- what a review against a real server found (2026-12-02) -----------------------------------


def test_a_turn_detection_value_json_cannot_echo_is_an_error_event() -> None:
    pair = _pair(SERVER_VAD)
    for value in ("NaN", "Infinity", "1e999"):
        session = '{"type": "transcription", "audio": {"input": {"turn_detection": '
        session += '{"type": "server_vad", "threshold": ' + value + "}}}}"
        pair.client([TextReceived(data='{"type": "session.update", "session": ' + session + "}")])
        error = pair.events[-1]["error"]
        assert (error["code"], error["param"]) == (
            "invalid_value",
            "session.audio.input.turn_detection.threshold",
        )
    assert pair.close_code is None and not pair.closed


def test_audio_appended_after_an_items_speech_can_be_committed() -> None:
    # The engine answers a pause later than the audio after it was appended; the item's end
    # does not swallow that audio (it did: the commit of the next speech was "empty").
    pair = _pair(SERVER_VAD)
    pair.client(_append(1.7))
    text, words = _utterance(3)  # w0-w2 end at 0.6 s
    pair.engine(EngineEndpoint(text=text, words=words))
    assert "conversation.item.input_audio_transcription.completed" in _kinds(pair)
    pair.client([_event("input_audio_buffer.commit")])
    assert pair.events[-1]["type"] != "error" and pair.cuts == 1


def test_a_clear_drops_audio_not_decoded_yet() -> None:
    pair = _pair(SERVER_VAD)
    pair.client(_append(1.0))
    pair.client([_event("input_audio_buffer.clear")])  # nothing decoded yet
    pair.client(_append(0.6))
    text, words = _utterance(8)  # w0-w4 were said before the clear (they end by 1.0 s)
    pair.engine(EngineEndpoint(text=text, words=words))
    ((joined, completed),) = pair.items().values()
    assert joined == completed == "w5 w6 w7"


def test_a_clear_before_ready_drops_the_held_audio_but_not_a_held_commit() -> None:
    pair = CountingPair(MANUAL)
    inputs = {"turn_detection": None}
    update = {"type": "transcription", "audio": {"input": inputs}}
    pair.client([_event("session.update", session=update), *_append(0.5)])
    pair.client([_event("input_audio_buffer.commit")])
    pair.client([*_append(0.3), _event("input_audio_buffer.clear")])
    pair.engine(EngineOpened())
    # The committed half second reached the session; the cleared 0.3 s never did.
    assert len(pair.audio()) == SECOND // 2 and pair.cuts == 1


def test_a_clear_with_an_item_of_nothing_sent_makes_no_empty_item() -> None:
    pair = _pair(SERVER_VAD)
    pair.client(_append(1.0))
    text, words = _utterance(2)
    pair.engine(EnginePartial(text=text, words=words))  # speech_started
    pair.client([_event("input_audio_buffer.clear")])
    pair.engine(EngineEndpoint(text=text, words=words))  # nothing after the clear
    assert pair.items() == {}
    assert "input_audio_buffer.committed" not in _kinds(pair)


def test_switching_to_server_vad_commits_the_manual_text_it_held() -> None:
    pair = _pair(MANUAL)
    pair.client(_append(1.0))
    text, words = _utterance(1)
    pair.engine(EngineEndpoint(text=text, words=words))  # held for the next commit
    session = {"type": "transcription", "audio": {"input": {"turn_detection": {}}}}
    pair.client([_event("session.update", session=session)])
    assert pair.cuts == 1
    pair.engine(EngineEndpoint(text="", words=(), cut=True))
    pair.client(_append(1.0))
    text, words = _utterance(1, start=1.2)
    pair.engine(EngineEndpoint(text=text, words=words))  # a server-VAD item of its own
    assert sorted(pair.items().values()) == [("w0", "w0"), ("w0", "w0")]
