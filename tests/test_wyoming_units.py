"""The Wyoming handlers' own rules, without a server: how streamed text is cut for synthesis,
how a transcription's audio reaches the engine, what an unended synthesis gives back, and
events that JSON can carry but UTF-8 cannot. (Over a real server: tests/test_wyoming.py.)"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace
from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.engines.base import Refusal
from talkies.engines.tts.base import MAX_INPUT_CHARS, SpeechRequest, check_request
from talkies.wyoming import asr, tts
from talkies.wyoming.audio import PcmConverter
from talkies.wyoming.framing import EventReader, WireEvent, encode


class FakeChannel:
    """What the handlers use of their connection: settings, the busy count, sent events."""

    def __init__(self, max_frame: int = 65536) -> None:
        self.settings = SimpleNamespace(stream_max_frame_bytes=max_frame, stream_max_duration=1e9)
        self.pool = None
        self.count = 0
        self.sent: list[tuple[str, Any]] = []

    def busy(self, delta: int) -> None:
        self.count += delta

    async def send(self, kind: str, data: Any = None, payload: bytes = b"") -> None:
        self.sent.append((kind, data))

    async def error(self, text: str, code: str) -> None:
        self.sent.append(("error", {"text": text, "code": code}))


def _chunk(text: str) -> WireEvent:
    return WireEvent(type="synthesize-chunk", data={"text": text}, payload=None)


def _streaming(channel: FakeChannel) -> tuple[tts.Synthesizer, Any]:
    """A Synthesizer in a streaming synthesis (as synthesize-start leaves it, its task not
    started) and the receiving end of its text queue."""
    synth = tts.Synthesizer(channel)  # type: ignore[arg-type]
    send, receive = anyio.create_memory_object_stream[str](math.inf)
    synth.sentences = send
    synth.done = anyio.Event()
    channel.busy(+1)
    return synth, receive


def _queued(receive: Any) -> list[str]:
    out = []
    while True:
        try:
            out.append(receive.receive_nowait())
        except anyio.WouldBlock:
            return out


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["word", " ", "\n", "x" * 700, "y" * 5000]), max_size=20))
def test_pieces_fit_one_synthesis_and_keep_every_word(parts: list[str]) -> None:
    text = "".join(parts)
    pieces = tts._pieces(text)
    assert all(0 < len(p) <= MAX_INPUT_CHARS and p == p.strip() for p in pieces)
    # Nothing lost nor added, cut at white space where any fits (a word is cut only when it
    # is longer than a synthesis takes).
    assert "".join("".join(p.split()) for p in pieces) == "".join(text.split())
    if all(len(word) <= MAX_INPUT_CHARS for word in text.split()):
        assert [word for p in pieces for word in p.split()] == text.split()


def test_a_long_stream_without_a_sentence_end_is_spoken_in_pieces_one_synthesis_takes() -> None:
    async def go() -> tuple[list[str], str, int]:
        channel = FakeChannel()
        synth, receive = _streaming(channel)
        words = "word " * 800  # 4,000 characters, no sentence end
        await synth.synthesize_chunk(_chunk(words))
        await synth.synthesize_chunk(_chunk(words))
        return _queued(receive), synth.streamed, synth.owed

    queued, rest, owed = anyio.run(go)
    # Each piece is one a synthesis takes, cut between words; the rest waits for more text.
    assert queued and all(len(p) <= MAX_INPUT_CHARS for p in queued)
    assert all(set(p.split()) == {"word"} for p in queued)
    assert len(rest) <= MAX_INPUT_CHARS and rest.startswith("word")
    assert " ".join([*queued, rest.strip()]) == " ".join(["word"] * 1600)
    assert owed == len(queued)  # the client need not send while these are spoken


def test_a_sentence_longer_than_a_synthesis_takes_is_cut_too() -> None:
    async def go() -> list[str]:
        synth, receive = _streaming(FakeChannel())
        await synth.synthesize_chunk(_chunk("a" * 3000 + " "))  # a chunk is 4,096 at most
        await synth.synthesize_chunk(_chunk("b" * 3000 + ". Next"))
        return _queued(receive)

    assert anyio.run(go) == ["a" * 3000, "b" * 3000 + "."]


def test_an_unended_streaming_synthesis_gives_back_its_count_when_the_connection_ends() -> None:
    async def go() -> tuple[int, int, bool]:
        channel = FakeChannel()
        synth, _ = _streaming(channel)
        during = channel.count
        synth.end()
        synth.end()  # once only
        return during, channel.count, synth.in_progress

    assert anyio.run(go) == (1, 0, False)


def test_a_streaming_synthesis_waiting_for_text_is_not_working() -> None:
    async def go() -> list[bool]:
        synth, _ = _streaming(FakeChannel())
        states = [synth.working]
        await synth.synthesize_chunk(_chunk("Hello there. "))
        states.append(synth.working)  # text queued: the server owes audio
        return states

    assert anyio.run(go) == [False, True]


class FakeStream:
    def __init__(self, fail_at_flush: asr.Transcriber | None = None) -> None:
        self.fed: list[int] = []
        self.fail_at_flush = fail_at_flush
        self.job: Any = None

    async def feed(self, pcm: bytes) -> None:
        self.fed.append(len(pcm))

    async def flush(self) -> None:
        if self.fail_at_flush is not None:  # the engine fails while audio-stop waits
            self.fail_at_flush.dropping = True
            self.job.done.set()

    async def aclose(self) -> None:
        pass


def test_converted_audio_reaches_the_engine_in_frames_no_larger_than_a_websocket_frame() -> None:
    # One 1 MiB chunk of 4 kHz 8-bit audio (legal) is 8 MiB at 16 kHz s16le: the engine
    # stream's buffer counts frames of at most TALKIES_STREAM_MAX_FRAME_BYTES.
    async def go() -> list[int]:
        channel = FakeChannel(max_frame=65536)
        transcriber = asr.Transcriber(channel)  # type: ignore[arg-type]
        stream = FakeStream()
        job = asr._Transcription(stream, PcmConverter(4000, 1, 1))  # type: ignore[arg-type]
        transcriber.transcription = job
        chunk = {"rate": 4000, "width": 1, "channels": 1}
        await transcriber.audio_chunk(WireEvent("audio-chunk", chunk, bytes(1 << 20)))
        return stream.fed

    fed = anyio.run(go)
    assert sum(fed) > 0.99 * (8 << 20) and max(fed) <= 65536  # less what the resampler holds


def test_a_failure_while_audio_stop_waits_drops_nothing_after_it() -> None:
    async def go() -> tuple[bool, list[int]]:
        channel = FakeChannel()
        transcriber = asr.Transcriber(channel)  # type: ignore[arg-type]
        channel.busy(+1)  # as _open counts it
        stream = FakeStream(fail_at_flush=transcriber)
        job = stream.job = asr._Transcription(stream, PcmConverter(16000, 2, 1))  # type: ignore[arg-type]
        transcriber.transcription = job
        await transcriber.audio_stop(WireEvent("audio-stop", {}, None))
        # The next utterance, opened by its first chunk (no audio-start), is heard.
        second = FakeStream()
        transcriber.transcription = asr._Transcription(second, PcmConverter(16000, 2, 1))  # type: ignore[arg-type]
        chunk = {"rate": 16000, "width": 2, "channels": 1}
        await transcriber.audio_chunk(WireEvent("audio-chunk", chunk, bytes(640)))
        return transcriber.dropping, second.fed

    assert anyio.run(go) == (False, [640])


def test_an_event_with_a_lone_surrogate_is_written_escaped_and_read_back_whole() -> None:
    frame = encode("pong", {"text": "a\ud800b"})
    frame.decode("ascii")  # escaped, not invalid UTF-8
    reader = EventReader()
    reader.feed(frame)
    event = reader.next_event()
    assert event is not None and event.data == {"text": "a\ud800b"}
    # What UTF-8 can hold is written as it is.
    assert json.loads(encode("pong", {"text": "é"}).split(b"\n", 1)[1]) == {"text": "é"}
    assert "é".encode() in encode("pong", {"text": "é"})


def test_text_to_speak_with_a_lone_surrogate_is_refused_as_input() -> None:
    with pytest.raises(Refusal) as refused:
        check_request(SpeechRequest(text="a\ud800b", voice="v"), speed_range=(0.25, 4.0))
    assert refused.value.kind.value == "invalid_input"
    check_request(SpeechRequest(text="naïve café", voice="v"), speed_range=(0.25, 4.0))
