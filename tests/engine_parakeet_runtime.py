"""The parakeet_cpp executor against the real parakeet.cpp runtime (PyPI ``parakeet-cpp-cuda``)
and a model written by :mod:`tests.modelgen.parakeet`, which hears five tones as five words.

The runtime needs the NVIDIA driver's ``libcuda.so.1`` to load at all. On a machine without
one, ``tests/test_engine_parakeet.py`` runs this module in a child process whose
``LD_LIBRARY_PATH`` holds a test-only stand-in that reports "no CUDA device", so the runtime
takes its CPU path (see ``tests/modelgen/libcuda_nodevice.c``); that keeps the stand-in out of
the main test process, where other tests check the message for a missing runtime. With a
driver, ``pytest tests/engine_parakeet_runtime.py`` runs it directly.

The model's words are known in advance, so these tests check the exact transcript, where
utterances end, word times against the tones, and that neither the client's framing, the
batching, threads nor the wire changes any of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from talkies.engines import parakeet as engine
from talkies.engines.base import EngineUnavailable, Refusal, TranscriptionRequest
from talkies.engines.supply.registry import ModelEntry
from talkies.engines.supply.validate import validate_in_child
from talkies.protocol import EngineEndpoint, EngineFinal, EnginePartial, ErrorCode, Word
from talkies.protocol.messages import StartOptions

from .conftest import run_server
from .engine_provider import LoadedModelProvider
from .modelgen import parakeet as gen
from .wire import ws_connect

SLUG = "parakeet-tones"
UTTERANCES = (("alpha", "bravo", "charlie"), ("delta", "echo", "alpha"), ("bravo",))
LEAD, TONE, GAP = 0.3, 0.32, 0.8  # gen.speech's defaults: seconds
MAX_FRAME = 4096  # the test server's TALKIES_STREAM_MAX_FRAME_BYTES

Event = EnginePartial | EngineEndpoint | EngineFinal


@pytest.fixture(scope="module", autouse=True)
def _runtime() -> None:
    try:
        engine.runtime()
    except engine.RuntimeMissing as exc:
        pytest.fail(f"the parakeet.cpp runtime does not load here: {exc}")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("parakeet-model")
    gen.tone_transducer(folder / "tones.gguf")
    return folder


@pytest.fixture(scope="module")
def entry(root: Path) -> ModelEntry:
    return ModelEntry(slug=SLUG, executor="parakeet_cpp", path=root)


@pytest.fixture(scope="module")
def model(entry: ModelEntry, root: Path) -> Iterator[engine.ParakeetModel]:
    loaded = engine.load(entry, root, "auto")
    assert isinstance(loaded, engine.ParakeetModel)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def speech() -> bytes:
    return gen.speech(*UTTERANCES)


def frames(pcm: bytes, sizes: Sequence[int]) -> Iterator[bytes]:
    offset = index = 0
    while offset < len(pcm):
        size = sizes[index % len(sizes)]
        yield pcm[offset : offset + size]
        offset += size
        index += 1


def run(
    model: engine.ParakeetModel,
    pcm: bytes,
    sizes: Sequence[int] = (640,),
    *,
    words: bool = True,
    interim: bool = True,
    language: str | None = None,
) -> list[Event]:
    """The engine's events for ``pcm`` given in ``sizes``-byte calls to ``accept``."""
    options = StartOptions(
        model=SLUG, word_timestamps=words, interim_results=interim, language=language
    )
    recognition = model.recognition(options)
    events: list[Event] = []
    try:
        for frame in frames(pcm, sizes):
            events.extend(recognition.accept(frame))
        events.append(recognition.finish())
    finally:
        recognition.close()
    return events


def utterances(events: Sequence[Event]) -> list[Event]:
    return [e for e in events if not isinstance(e, EnginePartial)]


def texts(events: Sequence[Event]) -> list[str]:
    return [e.text for e in events]


def revisions(events: Sequence[Event]) -> list[str]:
    """The partials' texts as a client sees them: the engine reports its text after every
    decoded block, and the protocol session drops empty and unchanged ones."""
    out: list[str] = []
    last = ""
    for event in events:
        if isinstance(event, EnginePartial):
            if event.text and event.text != last:
                out.append(event.text)
            last = event.text
        else:
            last = ""
    return out


@pytest.fixture(scope="module")
def baseline(model: engine.ParakeetModel, speech: bytes) -> list[Event]:
    """20 ms frames, words and partials."""
    return run(model, speech)


def tone_starts() -> list[list[float]]:
    """When each word's tone begins, per utterance (gen.speech's layout)."""
    starts: list[list[float]] = []
    t = LEAD
    for words in UTTERANCES:
        starts.append([t + i * TONE for i in range(len(words))])
        t += len(words) * TONE + GAP
    return starts


# -- loading ------------------------------------------------------------------------------------


def test_load_reads_the_runtime_and_the_header(model: engine.ParakeetModel, entry: Any) -> None:
    assert engine.require_runtime(entry).startswith("parakeet-cpp-cuda 0.2.2 (libparakeet ABI")
    assert model.header == engine.ModelHeader(
        languages=tuple(gen.LANGUAGES), default_language="auto"
    )


def test_a_model_that_cannot_stream_is_refused_at_load(tmp_path: Path) -> None:
    gen.tone_transducer(tmp_path / "offline.gguf", streaming=False)
    offline = ModelEntry(slug="offline-tones", executor="parakeet_cpp", path=tmp_path)
    with pytest.raises(EngineUnavailable, match="cannot stream: model is not a cache-aware"):
        engine.load(offline, tmp_path, "cpu")


def test_a_file_parakeet_cpp_rejects_is_refused_by_name(tmp_path: Path, root: Path) -> None:
    # A valid header over a cut-off file: the header reads, the runtime refuses the rest.
    data = (root / "tones.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
    cut = ModelEntry(slug="cut", executor="parakeet_cpp", path=tmp_path)
    with pytest.raises(EngineUnavailable, match=r"'cut': parakeet\.cpp could not load 'cut.gguf'"):
        engine.load(cut, tmp_path, "cpu")


def test_the_load_check_passes_in_a_child(entry: ModelEntry, root: Path) -> None:
    validate_in_child(entry, root, "cpu", timeout=120)


# -- what the model hears --------------------------------------------------------------------


def test_partials_endpoints_and_final(baseline: list[Event]) -> None:
    expected = [" ".join(words) for words in UTTERANCES]
    assert texts(utterances(baseline)) == [*expected, ""]  # the last pause ended the last one
    assert all(isinstance(e, EngineEndpoint) for e in utterances(baseline)[:-1])
    assert isinstance(baseline[-1], EngineFinal)
    # 20 ms frames: a new partial after each word, as the runtime finalises it (it has no
    # revisable hypothesis), then the endpoint.
    prefixes = [" ".join(words[: i + 1]) for words in UTTERANCES for i in range(len(words))]
    assert revisions(baseline) == prefixes


def test_word_times(baseline: list[Event], speech: bytes) -> None:
    endpoints = [e for e in baseline if isinstance(e, EngineEndpoint)]
    for event, starts in zip(endpoints, tone_starts(), strict=True):
        # The runtime times a word when the next one starts: the last word of an utterance
        # is untimed when its endpoint comes, and not reported.
        assert [w.word for w in event.words] == event.text.split()[:-1]
        for word, start in zip(event.words, starts[:-1], strict=True):
            # The word is decoded within 0.2 s of its tone's onset (one 80 ms encoder frame
            # of right context, a frame of subsampling delay).
            assert start - 0.01 <= word.start <= start + 0.2, (word, start)
            assert word.start <= word.end <= start + TONE + 0.2
            assert word.confidence is not None and 0.0 < word.confidence <= 1.0
    # Partials carry the words timed so far.
    for partial in baseline:
        if isinstance(partial, EnginePartial):
            assert [w.word for w in partial.words] == partial.text.split()[: len(partial.words)]


def test_the_final_has_every_word(model: engine.ParakeetModel) -> None:
    # No pause at the end: no endpoint, and finishing times the last word too.
    words = ("echo", "charlie", "alpha", "delta")
    events = run(model, gen.speech(words, gap=0.0))
    final = events[-1]
    assert isinstance(final, EngineFinal) and final.text == " ".join(words)
    assert [w.word for w in final.words] == list(words)
    for word, start in zip(final.words, tone_starts()[0], strict=False):
        assert start - 0.01 <= word.start <= start + 0.2, (word, start)
    assert not any(isinstance(e, EngineEndpoint) for e in events)


def test_no_words_or_partials_unless_requested(
    model: engine.ParakeetModel, speech: bytes, baseline: list[Event]
) -> None:
    events = run(model, speech, words=False, interim=False)
    assert not any(isinstance(e, EnginePartial) for e in events)
    assert all(e.words == () for e in events)
    assert texts(events) == texts(utterances(baseline))


# -- framing, threads, determinism -------------------------------------------------------------


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sizes=st.lists(st.integers(1, 8192).map(lambda n: 2 * n), min_size=1, max_size=5))
def test_framing_changes_no_utterance(
    model: engine.ParakeetModel, speech: bytes, baseline: list[Event], sizes: list[int]
) -> None:
    events = run(model, speech, sizes)
    assert utterances(events) == utterances(baseline)
    # However the audio was batched, each partial is the start of the utterance it grows.
    ends = iter(utterances(events))
    current = next(ends)
    for event in events:
        if isinstance(event, EnginePartial):
            assert current.text.startswith(event.text), (event, current)
        else:
            current = next(ends, current)


def test_streams_decode_side_by_side(
    model: engine.ParakeetModel, speech: bytes, baseline: list[Event]
) -> None:
    """Streams of one model in several threads at once (how the runtime runs them)."""
    with ThreadPoolExecutor(3) as pool:
        results = list(
            pool.map(lambda sizes: run(model, speech, sizes), [(640,), (4096,), (2, 30000)])
        )
    for events in results:
        assert utterances(events) == utterances(baseline)


def test_close_without_audio_and_after_finish(model: engine.ParakeetModel) -> None:
    unused = model.recognition(StartOptions(model=SLUG))
    unused.close()
    unused.close()
    short = model.recognition(StartOptions(model=SLUG))
    assert short.accept(bytes(1000)) == []  # less than a block: nothing decoded yet
    assert short.finish() == EngineFinal(text="", words=())
    short.close()


# -- languages ---------------------------------------------------------------------------------


def test_languages(model: engine.ParakeetModel, speech: bytes, baseline: list[Event]) -> None:
    # The model's prompt kernel ignores the language: every known one hears the same words.
    for language in ("en", "en-US", "de", "auto", "en-GB", "de-AT"):
        assert utterances(run(model, speech, (4096,), language=language)) == utterances(baseline), (
            language
        )
    for language in ("fr", "zh-CN"):
        with pytest.raises(Refusal) as refused:
            model.recognition(StartOptions(model=SLUG, language=language))
        assert refused.value.code is ErrorCode.INVALID_LANGUAGE
        assert refused.value.detail == (
            f"model {SLUG!r} has no language {language!r} (it knows de, en, en-US)"
        )


# -- whole files -------------------------------------------------------------------------------


def test_transcribe(model: engine.ParakeetModel, speech: bytes, baseline: list[Event]) -> None:
    result = model.transcribe(speech, TranscriptionRequest(word_timestamps=True))
    assert result.text == " ".join(" ".join(words) for words in UTTERANCES)
    assert result.language is None and result.duration == len(speech) / 32000
    assert [s.text for s in result.segments] == [" ".join(words) for words in UTTERANCES]
    endpoints = [e for e in baseline if isinstance(e, EngineEndpoint)]
    assert [s.words for s in result.segments] == [e.words for e in endpoints]
    # Contiguous segments, each ending in the 80 ms block where the runtime ended it: just
    # after the last tone plus the runtime's latency.
    assert result.segments[0].start == 0.0
    ends = [starts[-1] + TONE for starts in tone_starts()]
    for before, after in zip(result.segments, result.segments[1:], strict=False):
        assert before.end == after.start
    for segment, end in zip(result.segments, ends, strict=True):
        assert end < segment.end <= end + 0.5, (segment, end)
    english = model.transcribe(speech, TranscriptionRequest(language="en"))
    assert english.language == "en" and english.text == result.text
    assert english.words == ()
    with pytest.raises(Refusal) as refused:
        model.transcribe(speech, TranscriptionRequest(language="fr"))
    assert refused.value.code is ErrorCode.INVALID_LANGUAGE


# -- over the wire ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(model: engine.ParakeetModel) -> Iterator[Any]:
    provider = LoadedModelProvider({SLUG: model})
    with run_server(provider=provider, stream_max_duration=60.0) as running:
        yield running


def over_the_wire(url: str, pcm: bytes, sizes: Sequence[int], **start: Any) -> list[dict[str, Any]]:
    ws = ws_connect(url, max_queue=None)
    try:
        message = {"type": "start", "model": SLUG, "encoding": "pcm_s16le", **start}
        ws.send(json.dumps({**message, "sample_rate": 16000, "channels": 1}))
        ready = json.loads(ws.recv(timeout=10))
        if ready["type"] != "ready":
            return [ready]
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
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(sizes=st.lists(st.integers(1, MAX_FRAME // 2).map(lambda n: 2 * n), min_size=1, max_size=4))
def test_over_the_wire(server: Any, speech: bytes, baseline: list[Event], sizes: list[int]) -> None:
    events = over_the_wire(server.url, speech, sizes, word_timestamps=True)
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["final", "stats"], events[-3:]
    assert set(kinds[:-2]) <= {"partial", "endpoint"}
    assert events[-1]["audio_seconds"] == pytest.approx(len(speech) / 32000)
    revisions = [e["revision"] for e in events[:-1]]
    assert revisions == sorted(set(revisions))
    done = [e for e in events if e["type"] in ("endpoint", "final")]
    expected = utterances(baseline)
    assert [e["text"] for e in done] == texts(expected)
    assert [[Word(**w) for w in e["words"]] for e in done] == [list(e.words) for e in expected]


def test_an_unknown_language_is_refused_over_the_wire(server: Any, speech: bytes) -> None:
    events = over_the_wire(server.url, speech[:3200], (3200,), language="fr")
    assert len(events) == 1 and events[0]["type"] == "error", events
    assert events[0]["code"] == "invalid_language"
