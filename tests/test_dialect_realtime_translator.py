"""The Realtime translator (talkies/dialects/realtime.py): unit and property tests.

Driven through fuzz/_realtime.py's :class:`RealtimePair` (the translator and the real native
session, wired as talkies/app/realtime.py wires them). Its purity is checked with the other
dialects' in tests/test_dialect_deepgram_translator.py (every module of talkies/dialects).
"""

from __future__ import annotations

import base64
import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz._realtime import REALTIME_LIMITS, RealtimePair
from talkies.dialects.realtime import (
    EventError,
    QueryError,
    RealtimeConfig,
    configure,
    event_limit,
    parse_realtime_query,
)
from talkies.protocol import (
    EngineEndpoint,
    EngineFailed,
    EngineOpened,
    EnginePartial,
    ErrorCode,
    TextReceived,
    Tick,
    Word,
)

CONFIG = RealtimeConfig(model="tiny-test")


def _event(kind: str, **fields: Any) -> TextReceived:
    return TextReceived(data=json.dumps({"type": kind, **fields}))


def _append(pcm: bytes) -> TextReceived:
    return _event("input_audio_buffer.append", audio=base64.b64encode(pcm).decode())


def _words(tokens: list[str], start: float = 0.0) -> tuple[str, tuple[Word, ...]]:
    words = tuple(
        Word(word=t, start=round(start + 0.2 * i, 3), end=round(start + 0.2 * (i + 1), 3))
        for i, t in enumerate(tokens)
    )
    return " ".join(tokens), words


def _streaming() -> RealtimePair:
    pair = RealtimePair(CONFIG)
    pair.client([_event("session.update", session={"type": "transcription"})])
    pair.engine(EngineOpened())
    assert pair.translator.streaming
    return pair


# -- the query ------------------------------------------------------------------------------

_KEYS = ["intent", "model", "api_key", "token", "key", "x"]
_VALUES = ["transcription", "conversation", "tiny-test", "whisper-base-en", "", "%FF", "a b"]
queries = st.one_of(
    st.text(max_size=200),
    st.lists(st.tuples(st.sampled_from(_KEYS), st.sampled_from(_VALUES)), max_size=6).map(
        lambda pairs: "&".join(f"{k}={v}" for k, v in pairs)
    ),
)


@given(queries)
def test_a_query_is_a_model_or_a_query_error(query: str) -> None:
    try:
        parsed = parse_realtime_query(query, default_model="tiny-test")
    except QueryError as exc:
        assert exc.code in ErrorCode and exc.detail
        return
    assert "intent=transcription" in query and parsed.model


def test_credentials_in_the_url_are_refused() -> None:
    for name in ("api_key", "token", "key"):
        try:
            parse_realtime_query(f"intent=transcription&{name}=sk", default_model="m")
        except QueryError as exc:
            assert exc.code is ErrorCode.UNKNOWN_FIELD
        else:
            raise AssertionError(name)


# -- session objects ------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_SESSION_KEYS = ["type", "audio", "include", "input_audio_format", "turn_detection", "x"]
sessions = st.one_of(
    json_values,
    st.dictionaries(st.sampled_from(_SESSION_KEYS), json_values, max_size=4),
)


@given(sessions, st.booleans(), st.booleans())
def test_a_session_object_is_a_config_or_an_event_error(
    session: object, beta: bool, opened: bool
) -> None:
    try:
        config = configure(CONFIG, session, beta=beta, opened=opened)
    except EventError as exc:
        assert exc.code and exc.message
        return
    assert json.loads(config.start_message())["model"] == config.model


def test_what_is_not_supported_is_refused() -> None:
    cases = [
        (
            {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}},
            "unsupported_turn_detection",
        ),
        ({"audio": {"input": {"format": {"type": "audio/pcmu"}}}}, "unsupported_audio_format"),
        (
            {"audio": {"input": {"noise_reduction": {"type": "near_field"}}}},
            "unsupported_parameter",
        ),
        ({"audio": {"input": {"transcription": {"prompt": "names"}}}}, "unsupported_parameter"),
        ({"audio": {"output": {}}}, "unknown_parameter"),
        ({"type": "realtime"}, "invalid_value"),
        ({"include": ["item.input_audio_transcription.logprobs", "x"]}, "invalid_value"),
    ]
    for session, code in cases:
        try:
            configure(CONFIG, session, beta=False)
        except EventError as exc:
            assert exc.code == code, (session, exc)
        else:
            raise AssertionError(session)


def test_the_model_cannot_change_once_audio_has_begun() -> None:
    pair = _streaming()
    update = {"type": "transcription", "audio": {"input": {"transcription": {"model": "other"}}}}
    pair.client([_event("session.update", session=update)])
    assert pair.events[-1]["error"]["code"] == "session_already_started"
    assert pair.translator.config.model == "tiny-test"


# -- audio ----------------------------------------------------------------------------------


@settings(max_examples=60)
@given(
    st.binary(min_size=0, max_size=6000).map(lambda b: b[: len(b) & ~1]),
    st.lists(st.integers(min_value=0, max_value=6000), max_size=8),
    st.integers(min_value=1, max_value=200),
    st.booleans(),
)
def test_any_fragmentation_of_appends_gives_the_session_the_same_audio(
    pcm: bytes, cuts: list[int], fragment: int, before_ready: bool
) -> None:
    """The same audio in any appends (each even-sized), each event's text in any fragments,
    before or after the native ready: the session is given exactly that audio, and the
    client hears nothing but session.created and its update's answer."""
    points = sorted({c & ~1 for c in cuts if 0 < c < len(pcm)})
    pieces = [pcm[a:b] for a, b in zip([0, *points], [*points, len(pcm)], strict=True)]
    pair = RealtimePair(CONFIG)
    if not before_ready:
        pair.client([_event("session.update", session={"type": "transcription"})])
        pair.engine(EngineOpened())
    for piece in pieces:
        text = _append(piece).data
        assert isinstance(text, str)
        parts = [text[i : i + fragment] for i in range(0, len(text), fragment)] or [""]
        pair.client([TextReceived(data=p, final=i == len(parts) - 1) for i, p in enumerate(parts)])
    if before_ready:
        assert pair.opened == bool(pcm)  # an empty append opens nothing
        if pair.opened:
            pair.engine(EngineOpened())
    assert pair.audio() == pcm
    kinds = [e["type"] for e in pair.events]
    assert kinds in (["session.created"], ["session.created", "session.updated"])
    assert pair.close_code is None


# -- items: the append-only delta invariant ------------------------------------------------

steps = st.lists(
    st.one_of(
        st.tuples(st.just("partial"), st.integers(min_value=0, max_value=5)),
        st.tuples(st.just("endpoint"), st.integers(min_value=0, max_value=5)),
        st.tuples(st.just("clear"), st.just(0)),
    ),
    max_size=20,
)


@settings(max_examples=150)
@given(steps, st.booleans(), st.booleans())
def test_deltas_of_every_item_add_up_to_its_completed_transcript(
    program: list[tuple[str, int]], timed: bool, beta: bool
) -> None:
    pair = RealtimePair(CONFIG)
    kind = "transcription_session.update" if beta else "session.update"
    pair.client([_event(kind, session={} if beta else {"type": "transcription"})])
    pair.engine(EngineOpened())
    start = 0.0
    for step, count in program:
        if step == "clear":
            pair.client([_event("input_audio_buffer.clear")])
            continue
        text, words = _words([f"w{i}" for i in range(count)], start)
        words = words if timed else ()
        if step == "partial":
            pair.engine(EnginePartial(text=text, words=words))
        else:
            pair.engine(EngineEndpoint(text=text, words=words))
            start += 0.2 * (count + 1)
    items = pair.items()
    for joined, completed in items.values():
        assert completed is not None and joined == completed
    # Each item: started, stopped, committed, added, (delta), completed, (done), in order.
    order = [e["type"] for e in pair.events if "item_id" in e or "item" in e]
    for item in items:
        mine = [
            e["type"]
            for e in pair.events
            if e.get("item_id") == item or e.get("item", {}).get("id") == item
        ]
        added = "conversation.item.created" if beta else "conversation.item.added"
        expected = ["input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"]
        expected += ["input_audio_buffer.committed", added]
        if items[item][1]:
            expected.append("conversation.item.input_audio_transcription.delta")
        expected.append("conversation.item.input_audio_transcription.completed")
        if not beta:
            expected.append("conversation.item.done")
        assert mine == expected, (mine, order)
    assert pair.close_code is None


def test_a_clear_drops_the_words_heard_so_far_from_the_item() -> None:
    pair = _streaming()
    text, words = _words(["a", "b"])
    pair.engine(EnginePartial(text=text, words=words))
    pair.client([_event("input_audio_buffer.clear")])
    text, words = _words(["a", "b", "c"])
    pair.engine(EngineEndpoint(text=text, words=words))
    ((joined, completed),) = pair.items().values()
    assert completed == joined == "c"


def test_an_item_stops_where_its_speech_ends_not_where_the_engine_said_so() -> None:
    """The engine's endpoint comes a pause after the last word; with a short pause the next
    item's speech has begun by then. ``speech_stopped`` gives the item's last word's end, so
    that it comes before the next ``speech_started`` (it gave the endpoint's time: 1000 ms
    here, after the next item's start at 600 ms)."""
    pair = _streaming()
    for _ in range(16):  # a second of audio, as the session counts it (16 kHz)
        pair.client([_append(bytes(2000))])
    text, words = _words(["a", "b"])  # 0-0.4 s
    pair.engine(EnginePartial(text=text, words=words))
    pair.engine(EngineEndpoint(text=text, words=words))  # audio_seconds 1.0
    text, words = _words(["c"], 0.6)
    pair.engine(EnginePartial(text=text, words=words))
    stopped = [e for e in pair.events if e["type"] == "input_audio_buffer.speech_stopped"]
    started = [e for e in pair.events if e["type"] == "input_audio_buffer.speech_started"]
    assert [e["audio_end_ms"] for e in stopped] == [400]
    assert [e["audio_start_ms"] for e in started] == [0, 600]
    completed = [
        e
        for e in pair.events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    assert completed[0]["usage"]["seconds"] == 0.4


def test_an_endpoint_without_words_makes_no_item() -> None:
    pair = _streaming()
    pair.engine(EngineEndpoint(text="", words=()))
    assert pair.items() == {}


def test_an_empty_commit_and_conversation_events_are_error_events_and_the_session_goes_on() -> None:
    pair = _streaming()
    pair.client([_event("input_audio_buffer.commit", event_id="e1")])
    error = pair.events[-1]["error"]
    assert (error["code"], error["event_id"]) == ("input_audio_buffer_commit_empty", "e1")
    pair.client([_event("response.create")])
    assert pair.events[-1]["error"]["code"] == "unsupported_event"
    pair.client([TextReceived(data=b"\xff{")])
    assert pair.events[-1]["error"]["code"] == "invalid_json"
    pair.client([_event("input_audio_buffer.append", audio="!!")])
    assert pair.events[-1]["error"]["param"] == "audio"
    pair.client([_event("input_audio_buffer.append", audio=base64.b64encode(b"abc").decode())])
    assert pair.events[-1]["error"]["code"] == "invalid_value"
    assert pair.close_code is None and not pair.closed


def test_an_engine_failure_fails_the_open_item_then_errors_and_closes() -> None:
    pair = _streaming()
    text, words = _words(["a"])
    pair.engine(EnginePartial(text=text, words=words))
    pair.engine(EngineFailed(detail="the speech engine failed"))
    kinds = [e["type"] for e in pair.events]
    assert kinds[-2:] == ["conversation.item.input_audio_transcription.failed", "error"]
    assert pair.events[-1]["error"]["code"] == ErrorCode.SERVER_ERROR.value
    assert pair.close_code == 4500


def test_an_event_over_the_limit_is_refused_by_the_session() -> None:
    pair = _streaming()
    limit = event_limit(REALTIME_LIMITS.max_frame_bytes)
    pair.client([TextReceived(data="x" * limit, final=False), TextReceived(data="xx")])
    assert pair.events[-1]["error"]["code"] == ErrorCode.MESSAGE_TOO_LARGE.value
    assert pair.close_code == 4400


def test_an_event_over_the_limit_in_fragments_is_one_refusal_naming_its_limit() -> None:
    """The rest of its fragments are not a message of their own (they were parsed as one:
    an invalid_json error came first), and the refusal names the event limit, not the
    native control messages' 4 KB."""
    pair = _streaming()
    limit = event_limit(REALTIME_LIMITS.max_frame_bytes)
    before = len(pair.events)
    pair.client(
        [
            TextReceived(data="{" + "x" * limit, final=False),
            TextReceived(data="x" * 100, final=False),
            TextReceived(data="x}"),
        ]
    )
    errors = [e["error"] for e in pair.events[before:] if e["type"] == "error"]
    assert [e["code"] for e in errors] == [ErrorCode.MESSAGE_TOO_LARGE.value], errors
    assert errors[0]["message"] == f"the event exceeds the limit of {limit} bytes"
    assert pair.close_code == 4400


def test_a_silent_connection_is_told_what_it_did_not_send() -> None:
    pair = RealtimePair(RealtimeConfig(model="tiny-test"))
    pair.now = REALTIME_LIMITS.start_timeout_seconds
    pair.engine(Tick())
    assert pair.events[-1]["error"]["code"] == ErrorCode.IDLE_TIMEOUT.value
    assert "no session.update nor audio" in pair.events[-1]["error"]["message"]


@given(st.lists(st.binary(max_size=64), max_size=8))
def test_any_client_text_is_answered_never_raised(texts: list[bytes]) -> None:
    pair = _streaming()
    for text in texts:
        pair.client([TextReceived(data=text)])
    pair.finish()
    assert pair.closed


def test_the_fuzz_seeds_are_current_and_pass() -> None:
    from fuzz import fuzz_realtime

    corpus = fuzz_realtime.CORPUS
    assert sorted(p.name for p in corpus.iterdir()) == sorted(fuzz_realtime.SEEDS)
    for name, data in fuzz_realtime.SEEDS.items():
        assert (corpus / name).read_bytes() == data, f"rerun fuzz_realtime.py --write-seeds: {name}"
    assert fuzz_realtime.replay(corpus) == len(fuzz_realtime.SEEDS)
