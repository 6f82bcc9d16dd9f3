"""StreamSession behaviour, path by path (spec: "Lifecycle", "Events")."""

from __future__ import annotations

import json

import numpy as np
import pytest

from talkies.protocol import (
    BinaryReceived,
    Close,
    CloseCode,
    EngineEndpoint,
    EngineFailed,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    ErrorCode,
    Feed,
    Flush,
    Open,
    Partial,
    PeerGone,
    Release,
    Send,
    SessionLimits,
    ShuttingDown,
    StartOptions,
    State,
    StreamSession,
    TextReceived,
    Tick,
    Word,
)
from talkies.protocol.table import Handler

from .protocol_helpers import LIMITS, error_of, events, feed, pcm, session_in, start_text, text

END = text('{"type":"end"}')
CANCEL = text('{"type":"cancel"}')
W1 = Word(word="go", start=0.1, end=0.4)
W2 = Word(word="forward", start=0.45, end=0.9, confidence=0.75)


def test_happy_path_emits_the_spec_sequence() -> None:
    s = StreamSession(LIMITS, now=0.0)
    assert s.state is State.AWAITING_START
    actions = feed(s, text(start_text(word_timestamps=True)))
    assert actions == [
        Open(options=StartOptions(model="tiny-test", word_timestamps=True)),
    ]
    assert s.state is State.OPENING
    assert events(feed(s, EngineOpened())) == [
        {
            "type": "ready",
            "model": "tiny-test",
            "encoding": "pcm_s16le",
            "sample_rate": 16000,
            "channels": 1,
        }
    ]
    frame = b"\x01\x00" * 320  # 20 ms
    for _ in range(64):
        assert feed(s, BinaryReceived(data=frame)) == [Feed(pcm=frame)]
    assert events(feed(s, EnginePartial(text="go", words=(W1,)))) == [
        {
            "type": "partial",
            "revision": 1,
            "text": "go",
            "words": [{"word": "go", "start": 0.1, "end": 0.4}],
            "audio_seconds": 1.28,
            "is_final": False,
        }
    ]
    got = events(feed(s, EngineEndpoint(text="go forward", words=(W1, W2))))
    assert got[0]["type"] == "endpoint" and got[0]["revision"] == 2
    assert got[0]["words"][1] == {"word": "forward", "start": 0.45, "end": 0.9, "confidence": 0.75}
    assert feed(s, END) == [Flush()]
    assert s.state is State.FLUSHING
    actions = feed(s, EngineFinal(text="ten meters"))
    assert actions[0] == Release()
    assert [e["type"] for e in events(actions)] == ["final", "stats"]
    final, stats = events(actions)
    assert final == {
        "type": "final",
        "revision": 3,
        "text": "ten meters",
        "words": [],
        "audio_seconds": 1.28,
        "is_final": True,
    }
    assert stats == {"type": "stats", "audio_seconds": 1.28, "frames": 64, "canceled": False}
    assert actions[-1] == Close(code=CloseCode.NORMAL, reason="")
    assert (s.state, s.outcome, s.close_code, s.error) == (State.CLOSED, "end", 1000, None)


def test_event_json_is_compact_and_utf8() -> None:
    s = session_in(State.STREAMING)
    (send,) = feed(s, EnginePartial(text="안녕하세요"))
    assert isinstance(send, Send)
    assert send.event.to_json() == (
        '{"type":"partial","revision":1,"text":"안녕하세요","words":[],'
        '"audio_seconds":0.0,"is_final":false}'
    )


@pytest.mark.parametrize("state", [State.OPENING, State.STREAMING, State.FLUSHING])
def test_cancel_releases_and_reports_stats_without_final(state: State) -> None:
    s = session_in(state)
    actions = feed(s, CANCEL)
    assert actions[0] == Release()
    assert events(actions) == [
        {"type": "stats", "audio_seconds": 0.0, "frames": 0, "canceled": True}
    ]
    assert actions[-1] == Close(code=CloseCode.NORMAL, reason="")
    assert s.outcome == "cancel"


def test_cancel_counts_accepted_audio() -> None:
    s = session_in(State.STREAMING)
    feed(s, pcm(3200), pcm(3200))
    assert events(feed(s, CANCEL))[-1] == {
        "type": "stats",
        "audio_seconds": 0.2,
        "frames": 2,
        "canceled": True,
    }


def test_interim_results_false_suppresses_partials_only() -> None:
    s = session_in(State.STREAMING, interim_results=False)
    assert feed(s, EnginePartial(text="a")) == []
    got = events(feed(s, EngineEndpoint(text="a b")))
    assert [(e["type"], e["revision"]) for e in got] == [("endpoint", 1)]
    feed(s, END)
    got = events(feed(s, EngineFinal(text="c")))
    assert [(e["type"], e.get("revision")) for e in got] == [("final", 2), ("stats", None)]


def test_words_only_when_requested() -> None:
    s = session_in(State.STREAMING)  # word_timestamps defaults to false
    (partial,) = events(feed(s, EnginePartial(text="go", words=(W1,))))
    assert partial["words"] == []
    s = session_in(State.STREAMING, word_timestamps=True)
    (partial,) = events(feed(s, EnginePartial(text="go", words=(W1,))))
    assert partial["words"] == [{"word": "go", "start": 0.1, "end": 0.4}]


def test_unchanged_hypothesis_is_not_a_revision() -> None:
    s = session_in(State.STREAMING)
    assert len(feed(s, EnginePartial(text="go"))) == 1
    assert feed(s, EnginePartial(text="go")) == []
    assert feed(s, EnginePartial(text="")) != []  # a retraction is a change
    assert feed(s, EnginePartial(text="")) == []


def test_empty_endpoints_after_silence_are_dropped() -> None:
    s = session_in(State.STREAMING)
    assert feed(s, EngineEndpoint(text="")) == []
    feed(s, EnginePartial(text="uh"))
    got = events(feed(s, EngineEndpoint(text="")))
    assert [(e["type"], e["text"]) for e in got] == [("endpoint", "")]
    assert feed(s, EngineEndpoint(text="")) == []


def test_endpoint_resets_the_hypothesis() -> None:
    s = session_in(State.STREAMING)
    feed(s, EnginePartial(text="go"), EngineEndpoint(text="go"))
    # The same text after an endpoint is a new utterance's hypothesis: it is sent.
    assert [e["revision"] for e in events(feed(s, EnginePartial(text="go")))] == [3]


def test_flushing_still_passes_partials_and_endpoints() -> None:
    s = session_in(State.FLUSHING)
    got = events(feed(s, EnginePartial(text="x"), EngineEndpoint(text="x y")))
    assert [e["type"] for e in got] == ["partial", "endpoint"]
    assert s.state is State.FLUSHING


def test_final_is_sent_even_when_empty() -> None:
    s = session_in(State.FLUSHING)
    got = events(feed(s, EngineFinal(text="")))
    assert got[0] == {
        "type": "final",
        "revision": 1,
        "text": "",
        "words": [],
        "audio_seconds": 0.0,
        "is_final": True,
    }


def test_fragments_make_one_frame_and_one_feed() -> None:
    s = session_in(State.STREAMING)
    parts = [b"\x01", b"\x02\x03", b"", b"\x04"]
    out = feed(s, *[BinaryReceived(data=p, final=False) for p in parts[:-1]])
    assert out == []
    assert feed(s, BinaryReceived(data=parts[-1])) == [Feed(pcm=b"\x01\x02\x03\x04")]
    assert (s.frames, s.samples) == (1, 2)


def test_empty_fragments_are_not_kept() -> None:
    # A client can send empty continuation frames for ever (6 bytes each on the wire): the
    # frame-size check never trips on them, so keeping each one grew memory without bound.
    s = session_in(State.STREAMING)
    feed(s, BinaryReceived(data=b"\x01", final=False))
    feed(s, *[BinaryReceived(data=b"", final=False) for _ in range(10_000)])
    assert s._audio_parts is not None and len(s._audio_parts) == 1
    assert feed(s, BinaryReceived(data=b"\x02")) == [Feed(pcm=b"\x01\x02")]


def test_text_fragments_mixing_str_and_bytes() -> None:
    s = session_in(State.AWAITING_START)
    msg = start_text(language="pt_br").encode()
    pieces = [msg[:7].decode(), msg[7:20], msg[20:].decode()]
    feed(s, text(pieces[0], final=False), text(pieces[1], final=False))
    (open_,) = feed(s, text(pieces[2]))
    assert isinstance(open_, Open)
    assert open_.options.language == "pt-BR"


def test_utf8_split_inside_a_character_across_byte_fragments() -> None:
    s = session_in(State.AWAITING_START)
    msg = json.dumps({**json.loads(start_text()), "language": "auto"}, ensure_ascii=False)
    data = (msg[:-1] + ' , "interim_results": false}').encode()
    feed(s, text(data[:10], final=False))
    (open_,) = feed(s, text(data[10:]))
    assert isinstance(open_, Open) and open_.options.interim_results is False


def test_duration_limit_accepts_exactly_the_limit() -> None:
    limits = SessionLimits(max_frame_bytes=32000, max_duration_seconds=2, idle_timeout_seconds=5)
    s = session_in(State.STREAMING, limits=limits)
    feed(s, pcm(32000), pcm(32000))
    assert s.samples == 32000 and s.audio_seconds == 2.0
    assert error_of(feed(s, pcm(2))) == ("duration_limit", 4400)
    assert s.samples == 32000, "the refused frame is not counted"


def test_deadline_follows_the_client_and_pauses_for_the_server() -> None:
    s = StreamSession(LIMITS, now=10.0)
    assert s.deadline == 15.0  # before start: the start deadline, earlier than the idle one
    s.handle(text(start_text()), 14.0)
    assert s.state is State.OPENING and s.deadline is None
    s.handle(Tick(), 1000.0)
    assert s.pull_actions() == [Open(options=StartOptions(model="tiny-test"))]
    s.handle(EngineOpened(), 1100.0)
    assert s.deadline == 1130.0  # restarts when ready is sent
    s.handle(pcm(2), 1120.0)
    assert s.deadline == 1150.0
    s.handle(Tick(), 1149.9)
    s.handle(text('{"type":', final=False), 1149.95)  # fragments are activity too
    assert s.deadline == 1179.95
    s.pull_actions()
    s.handle(text('"end"}'), 1150.0)
    assert s.state is State.FLUSHING and s.deadline is None
    s.handle(Tick(), 99999.0)
    assert s.pull_actions() == [Flush()]


def test_bytes_of_a_frame_not_yet_whole_are_not_activity() -> None:
    """A transport that hands on a frame's data as it arrives marks it ``frame_end=False``:
    a frame trickled a byte at a time does not move the idle deadline; its end does."""
    s = session_in(State.STREAMING, now=0.0)
    assert s.deadline == 30.0
    for at in (5.0, 10.0, 29.0):
        s.handle(BinaryReceived(data=b"\x00", final=False, frame_end=False), at)
        assert s.deadline == 30.0
    s.handle(BinaryReceived(data=b"\x00"), 29.5)  # the frame's end (the message's too)
    assert s.deadline == 59.5
    s.handle(TextReceived(data="{", final=False, frame_end=False), 40.0)  # text too
    assert s.deadline == 59.5
    s.pull_actions()
    s.handle(Tick(), 59.5)
    assert error_of(s.pull_actions()) == ("idle_timeout", 4408)


def test_idle_timeout_fires_at_the_deadline() -> None:
    s = session_in(State.STREAMING, now=0.0)
    s.handle(Tick(), 29.999)
    assert s.pull_actions() == []
    s.handle(Tick(), 30.0)
    assert error_of(s.pull_actions()) == ("idle_timeout", 4408)


def test_start_deadline_is_fixed_when_the_connection_is_accepted() -> None:
    # Issue 21, point 2: fragments of a start that never ends (or any other activity) do
    # not move it, as they move the idle deadline.
    s = StreamSession(LIMITS, now=10.0)
    assert s.start_deadline == 15.0
    for at in (11.0, 13.0, 14.9):
        s.handle(text('{"type"', final=False), at)
        assert s.deadline == 15.0
        s.handle(Tick(), at)
    assert s.pull_actions() == []
    s.handle(Tick(), 14.999)
    assert s.pull_actions() == []
    s.handle(Tick(), 15.0)
    actions = s.pull_actions()
    assert error_of(actions) == ("idle_timeout", 4408)
    assert events(actions)[0]["detail"] == "no start message within 5 seconds"
    assert s.outcome == "idle_timeout" and not s.stream_held


def test_start_deadline_ends_once_a_start_is_accepted() -> None:
    s = StreamSession(LIMITS, now=0.0)
    s.handle(text(start_text()), 4.9)
    assert s.state is State.OPENING and s.deadline is None
    s.handle(Tick(), 6.0)  # the model is still opening: the server's time
    s.handle(EngineOpened(), 8.0)
    assert s.deadline == 38.0  # the idle timeout alone, from ready
    s.handle(Tick(), 37.9)
    assert [type(a) for a in s.pull_actions()] == [Open, Send]  # Open, then ready
    assert s.state is State.STREAMING
    assert s.start_deadline == 5.0  # unchanged, and no longer applies


def test_an_invalid_start_is_not_accepted() -> None:
    # A start the parser refuses closes at once (4400): it never counts as accepted.
    s = StreamSession(LIMITS, now=0.0)
    assert error_of(feed(s, text(start_text(sample_rate=8000)), now=1.0)) == (
        "unsupported_sample_rate",
        4400,
    )


def test_a_shorter_idle_timeout_applies_before_start() -> None:
    limits = SessionLimits(idle_timeout_seconds=2.0, start_timeout_seconds=5.0)
    s = StreamSession(limits, now=0.0)
    assert s.deadline == 2.0
    s.handle(text("{", final=False), 1.5)  # activity moves the idle deadline only
    assert s.deadline == 3.5
    s.handle(text(" ", final=False), 3.4)
    assert s.deadline == 5.0  # now the start deadline is the earlier
    s.handle(Tick(), 5.0)
    actions = s.pull_actions()
    assert error_of(actions) == ("idle_timeout", 4408)
    assert events(actions)[0]["detail"] == "no start message within 5 seconds"
    s = StreamSession(limits, now=0.0)
    s.handle(Tick(), 2.0)
    actions = s.pull_actions()
    assert error_of(actions) == ("idle_timeout", 4408)
    assert events(actions)[0]["detail"] == "no message from the client for 2 seconds"


@pytest.mark.parametrize("state", [s for s in State if s is not State.CLOSED])
def test_peer_gone_releases_without_close(state: State) -> None:
    s = session_in(state)
    held = s.stream_held
    actions = feed(s, PeerGone())
    assert actions == ([Release()] if held else [])
    assert (s.state, s.outcome, s.close_code) == (State.CLOSED, "peer_gone", None)


def test_shutdown_closes_1001_without_error_object() -> None:
    s = session_in(State.STREAMING)
    assert feed(s, ShuttingDown()) == [Release(), Close(code=CloseCode.GOING_AWAY, reason="")]


def test_engine_failure_detail_reaches_the_client() -> None:
    s = session_in(State.STREAMING)
    actions = feed(s, EngineFailed(detail="model file is corrupt"))
    assert events(actions) == [
        {"type": "error", "code": "server_error", "detail": "model file is corrupt"}
    ]
    assert s.error is not None and s.error.code is ErrorCode.SERVER_ERROR


def test_lone_surrogates_from_an_engine_are_replaced() -> None:
    # Found by fuzz/fuzz_session.py: word text was passed through uncleaned.
    s = session_in(State.STREAMING, word_timestamps=True)
    word = Word(word="\udcff", start=0.0, end=0.1)
    (send,) = feed(s, EnginePartial(text="a\ud800b", words=(word,)))
    assert isinstance(send, Send)
    send.event.to_json().encode("utf-8")  # must not raise


def test_handler_bug_is_contained_and_kept_for_logs(monkeypatch: pytest.MonkeyPatch) -> None:
    s = session_in(State.STREAMING)

    def broken(*args: object) -> None:
        raise KeyError("bug")

    monkeypatch.setitem(s._handlers, Handler.AUDIO, broken)
    actions = feed(s, pcm(2))
    assert error_of(actions) == ("server_error", 4500)
    assert Release() in actions
    assert s.error is not None and isinstance(s.error.__cause__, KeyError)
    assert events(actions)[0]["detail"] == "internal error"  # the bug is not shown to clients


def test_language_defaults_and_normalisation() -> None:
    cases = {None: None, "auto": "auto", "en": "en", "EN-us": "en-US", "zh_hant_tw": "zh-Hant-TW"}
    for given, expected in cases.items():
        s = StreamSession(LIMITS, now=0)
        msg = start_text() if given is None else start_text(language=given)
        (open_,) = feed(s, text(msg))
        assert isinstance(open_, Open)
        assert open_.options.language == expected


def test_limits_are_validated() -> None:
    with pytest.raises(ValueError):
        SessionLimits(max_frame_bytes=1)
    with pytest.raises(ValueError):
        SessionLimits(idle_timeout_seconds=float("nan"))
    with pytest.raises(ValueError):
        SessionLimits(max_duration_seconds=0)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError):
            SessionLimits(start_timeout_seconds=bad)


def test_word_validation() -> None:
    with pytest.raises(ValueError):
        Word(word="x", start=0.5, end=0.4)
    with pytest.raises(ValueError):
        Word(word="x", start=float("nan"), end=1)
    assert Word(word="x", start=0, end=1).to_dict() == {"word": "x", "start": 0.0, "end": 1.0}


def test_word_times_go_on_the_wire_to_the_millisecond() -> None:
    # An engine's sums and float32s (Whisper: window offset + word time; Vosk) are kept
    # exact inside, and rounded where they become JSON, as the HTTP routes round them.
    word = Word(word="x", start=2.3720000000000003, end=np.float32(2.48))
    assert word.end != 2.48  # float32 noise, kept inside
    assert word.to_dict() == {"word": "x", "start": 2.372, "end": 2.48}
    event = Partial(revision=1, text="x", words=(word,), audio_seconds=2.5)
    assert '"start":2.372,"end":2.48}' in event.to_json()


def test_language_tags_are_limited_to_35_characters() -> None:
    # Both tags match the BCP-47 shape; only their length differs (the table has the reject).
    longest = "en-Latn-US-abcdefgh-abcdefgh-abcdef"
    assert len(longest) == 35
    s = session_in(State.AWAITING_START)
    (open_,) = feed(s, text(start_text(language=longest)))
    assert isinstance(open_, Open) and open_.options.language == longest
    s = session_in(State.AWAITING_START)
    actions = feed(s, text(start_text(language=longest + "g")))
    assert error_of(actions) == ("invalid_language", 4400)
