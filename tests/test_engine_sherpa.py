"""The sherpa-onnx engine against the real sherpa-onnx runtime, on generated random-weight
models (tests/modelgen/sherpa.py) and real speech (Debian ``pocketsphinx-testdata``, else
``espeak-ng``).

The reference everywhere is sherpa-onnx called directly, in-process, on the whole audio:
accept everything, decode chunk by chunk with an endpoint check (and reset) after each, then
the tail padding, ``input_finished`` and the last chunks. The engine must give the same
utterances however the audio is framed, batched or sent over the wire.

Live streams run in the one engine runtime (``talkies.engines.runtime.rounds``): batched through
``decode_many`` by default, one ``decode_stream`` per chunk with ``batch: false``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
import wave
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sherpa_onnx = pytest.importorskip("sherpa_onnx")
pytest.importorskip("onnx")

from talkies.engines import sherpa as engine  # noqa: E402
from talkies.engines.base import EngineUnavailable  # noqa: E402
from talkies.engines.runtime.rounds import ThreadedStream  # noqa: E402
from talkies.engines.supply.registry import ModelEntry  # noqa: E402
from talkies.protocol import EngineEndpoint, EngineFailed, EngineFinal, EnginePartial  # noqa: E402
from talkies.protocol.messages import StartOptions  # noqa: E402

from .conftest import run_server  # noqa: E402
from .engine_provider import LoadedModelProvider  # noqa: E402
from .modelgen import sherpa as gen  # noqa: E402
from .wire import ws_connect  # noqa: E402

GOFORWARD = Path("/usr/share/pocketsphinx/test/data/goforward.raw")
LSTM = "sherpa-tiny"
CTC = "sherpa-ctc"
FACTORY = {LSTM: "from_transducer", CTC: "from_wenet_ctc"}


# -- audio -------------------------------------------------------------------------------------


def _espeak(text: str) -> np.ndarray:
    """16 kHz int16 speech from espeak-ng (22.05 kHz), resampled linearly."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "speech.wav"
        subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
        with wave.open(str(path)) as w:
            rate = w.getframerate()
            data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    n = round(len(data) * 16000 / rate)
    resampled = np.interp(np.arange(n) * rate / 16000, np.arange(len(data)), data)
    out: np.ndarray = resampled.astype(np.int16)
    return out


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    """'go forward ten meters' (~2.8 s), int16 at 16 kHz."""
    if GOFORWARD.exists():
        return np.fromfile(GOFORWARD, dtype="<i2")
    if shutil.which("espeak-ng"):
        return _espeak("go forward ten meters")
    pytest.skip("needs Debian pocketsphinx-testdata (or espeak-ng) for real speech")


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * 16000), dtype=np.int16)


def utterances(speech: np.ndarray, gains: Sequence[float], gap: float = 1.6) -> bytes:
    """Speech at each gain, each followed by ``gap`` s of silence (an endpoint each)."""
    parts = [silence(0.3)]
    for gain in gains:
        parts += [np.clip(speech * gain, -32768, 32767).astype(np.int16), silence(gap)]
    return np.concatenate(parts).astype("<i2").tobytes()


# -- models ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("sherpa-models")
    lstm = root / "lstm"
    ctc = root / "ctc"
    dirs = {LSTM: (lstm, gen.lstm_transducer(lstm, **gen.TINY)), CTC: (ctc, gen.wenet_ctc(ctc))}
    for slug, (path, config) in dirs.items():
        gen.probe(FACTORY[slug], path, config)  # a broken model would exit this process
    return dirs


def make_entry(
    slug: str,
    path: Path,
    config: dict[str, Any],
    factory: str = "from_transducer",
    **options: Any,
) -> ModelEntry:
    return ModelEntry(
        slug=slug,
        executor="sherpa",
        path=path,
        recognizer_factory=factory,
        sherpa_config=MappingProxyType({"num_threads": 1, **config}),
        options=MappingProxyType(options),
    )


@pytest.fixture(scope="module")
def models(
    model_dirs: dict[str, tuple[Path, dict[str, str]]],
) -> Iterator[dict[str, engine.SherpaModel]]:
    loaded: dict[str, engine.SherpaModel] = {}
    for slug, (path, config) in model_dirs.items():
        model = engine.load(make_entry(slug, path, config, FACTORY[slug]), path, "cpu")
        assert isinstance(model, engine.SherpaModel)
        loaded[slug] = model
    yield loaded
    for model in loaded.values():
        model.close()


# -- the reference: sherpa-onnx called directly --------------------------------------------------


def transcript(events: Sequence[Any]) -> tuple[list[str], str]:
    endpoints = [e.text for e in events if isinstance(e, EngineEndpoint) and e.text]
    finals = [e for e in events if isinstance(e, EngineFinal)]
    assert len(finals) == 1 and events[-1] is finals[0], events[-3:]
    return endpoints, finals[0].text


def frames(pcm: bytes, sizes: Sequence[int]) -> Iterator[bytes]:
    """``pcm`` cut into frames of the given byte sizes, repeated cyclically."""
    i = k = 0
    while i < len(pcm):
        size = sizes[k % len(sizes)]
        yield pcm[i : i + size]
        i += size
        k += 1


async def decode_stream(
    model: engine.SherpaModel,
    pcm: bytes,
    sizes: Sequence[int] = (4096,),
    *,
    words: bool = False,
    max_buffered_bytes: int = 64000,
) -> list[Any]:
    """One stream through ``model.open_stream``: feed, flush, collect every event."""
    stream = await model.open_stream(
        StartOptions(model="m", word_timestamps=words), max_buffered_bytes=max_buffered_bytes
    )
    events: list[Any] = []
    try:
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async for event in stream.events():
                    events.append(event)

            tg.start_soon(consume)
            for frame in frames(pcm, sizes):
                await stream.feed(frame)
            await stream.flush()
    finally:
        await stream.aclose()
    return events


# -- loading and configuration -------------------------------------------------------------------


def test_speech_gives_endpoints_in_trailing_silence_and_words(
    models: dict[str, engine.SherpaModel], speech: np.ndarray
) -> None:
    model = models[LSTM]
    pcm = utterances(speech, [1.0, 0.5])
    recognition = model.recognition(StartOptions(model=LSTM, word_timestamps=True))
    events: list[Any] = []
    for frame in frames(pcm, [3200]):
        events += recognition.accept(frame)
    events.append(recognition.finish())
    recognition.close()
    # Endpoints are reported as sherpa finds them, empty ones in silence too: dropping those
    # is the protocol session's job.
    endpoints = [e for e in events if isinstance(e, EngineEndpoint) and e.text]
    assert len(endpoints) == 2, events
    duration = len(pcm) / 32000
    previous_end = 0.0
    for endpoint in endpoints:
        assert endpoint.text
        assert " ".join(w.word for w in endpoint.words) == endpoint.text
        for word in endpoint.words:
            assert previous_end - 1e-6 <= word.start <= word.end <= duration
            previous_end = word.end
    # The second utterance starts after the first one's speech and gap (stream time).
    assert endpoints[1].words[0].start > len(speech) / 16000
    assert isinstance(events[-1], EngineFinal) and events[-1].text == ""
    assert any(isinstance(e, EnginePartial) and e.text for e in events)
    assert (endpoints[0].text, endpoints[1].text) == tuple(
        gen.decode_directly(model.recognizer, pcm)[0]
    )


def test_silence_gives_no_text(models: dict[str, engine.SherpaModel]) -> None:
    recognition = models[LSTM].recognition(StartOptions(model=LSTM))
    updates = recognition.accept(silence(4.0).tobytes())
    final = recognition.finish()
    recognition.close()
    assert all(not u.text for u in updates), updates
    assert final.text == ""


def test_ctc_model_decodes(models: dict[str, engine.SherpaModel], speech: np.ndarray) -> None:
    model = models[CTC]
    pcm = utterances(speech, [1.0])
    events = anyio.run(decode_stream, model, pcm)
    assert transcript(events) == gen.decode_directly(model.recognizer, pcm)
    assert "".join(transcript(events)[0]) + transcript(events)[1]  # random, but not nothing


def test_path_escapes_are_rejected(
    model_dirs: dict[str, tuple[Path, dict[str, str]]], tmp_path: Path
) -> None:
    source, config = model_dirs[LSTM]
    root = tmp_path / "model"
    shutil.copytree(source, root)
    outside = tmp_path / "outside.onnx"
    shutil.copy(root / "joiner.onnx", outside)
    (root / "link.onnx").symlink_to(outside)
    cases = {
        "joiner": "../outside.onnx",
        "decoder": str(outside),
        "encoder": "link.onnx",
        "tokens": "sub/../../outside.onnx",
    }
    for key, value in cases.items():
        entry = make_entry("escape-test", root, {**config, key: value})
        with pytest.raises(ValueError, match=rf"'escape-test'.*'{key}'.*outside the model"):
            engine.load(entry, root, "cpu")
    missing = make_entry("missing-test", root, {**config, "joiner": "nope.onnx"})
    with pytest.raises(ValueError, match=r"'missing-test'.*'joiner'.*no such file"):
        engine.load(missing, root, "cpu")
    # Inside the root, an absolute path or a detour through a subdirectory is fine.
    (root / "sub").mkdir()
    fine = make_entry("inside", root, {**config, "joiner": str(root / "sub/../joiner.onnx")})
    engine.load(fine, root, "cpu").close()


def test_unknown_and_reserved_keys_are_rejected(
    model_dirs: dict[str, tuple[Path, dict[str, str]]],
) -> None:
    root, config = model_dirs[LSTM]
    bad = {
        "bogus_key": (1, r"'bogus-test'.*'bogus_key'.*is not a parameter of .*from_transducer"),
        "provider": ("cuda", r"'bogus-test'.*'provider'.*is not allowed.*TALKIES_DEVICE"),
        "device": (1, r"'bogus-test'.*'device'.*is not allowed"),
    }
    for key, (value, pattern) in bad.items():
        with pytest.raises(ValueError, match=pattern):
            engine.load(make_entry("bogus-test", root, {**config, key: value}), root, "cpu")
    ctc_root, ctc_config = model_dirs[CTC]
    lm = make_entry("ctc-lm", ctc_root, {**ctc_config, "lm_model": "model.onnx"}, "from_wenet_ctc")
    with pytest.raises(ValueError, match=r"'ctc-lm'.*'lm_model'.*is not a parameter"):
        engine.load(lm, ctc_root, "cpu")
    with pytest.raises(ValueError, match=r"'bogus-test'.*lacks 'joiner'"):
        partial = {k: v for k, v in config.items() if k != "joiner"}
        engine.load(make_entry("bogus-test", root, partial), root, "cpu")
    bad_options: list[tuple[dict[str, Any], str]] = [
        ({"batchh": True}, "unknown sherpa option.*'batchh'"),
        ({"max_batch": 0}, "'max_batch' must be"),
        ({"max_wait": -1}, "'max_wait' must be"),
        ({"batch": "yes"}, "'batch' must be"),
    ]
    for options, pattern in bad_options:
        with pytest.raises(ValueError, match=pattern):
            engine.load(make_entry("bogus-test", root, config, **options), root, "cpu")
    with pytest.raises(ValueError, match="recognizer_factory"):
        engine.load(make_entry("bogus-test", root, config, "from_nemo_ctc"), root, "cpu")


def test_recognizer_kwargs(model_dirs: dict[str, tuple[Path, dict[str, str]]]) -> None:
    root, config = model_dirs[LSTM]
    factory = sherpa_onnx.OnlineRecognizer.from_transducer
    kwargs = engine.recognizer_kwargs("k", factory, config, root, ("cuda", 2))
    assert kwargs["encoder"] == str((root / "encoder.onnx").resolve())
    assert kwargs["enable_endpoint_detection"] is True
    assert (kwargs["sample_rate"], kwargs["feature_dim"]) == (16000, 80)
    assert (kwargs["provider"], kwargs["device"]) == ("cuda", 2)
    off = {**config, "enable_endpoint_detection": False, "lm_model": "", "hotwords_file": ""}
    kwargs = engine.recognizer_kwargs("k", factory, off, root, ("cpu", 0))
    assert kwargs["enable_endpoint_detection"] is False
    assert kwargs["lm"] == "" and kwargs["hotwords_file"] == ""


def test_select_provider() -> None:
    def never() -> bool:
        raise AssertionError("only auto probes for CUDA")

    assert engine.select_provider("cpu", cuda_available=never) == ("cpu", 0)
    assert engine.select_provider("cuda", cuda_available=never) == ("cuda", 0)
    assert engine.select_provider("cuda:3", cuda_available=never) == ("cuda", 3)
    assert engine.select_provider("auto", cuda_available=lambda: True) == ("cuda", 0)
    assert engine.select_provider("auto", cuda_available=lambda: False) == ("cpu", 0)
    for bad in ("gpu", "cuda:", "cuda:01", "CPU", ""):
        with pytest.raises(ValueError, match="TALKIES_DEVICE"):
            engine.select_provider(bad, cuda_available=never)
    # The real probe: this machine's sherpa-onnx wheel has no CUDA provider.
    assert engine.select_provider("auto")[0] in {"cpu", "cuda"}


def test_words_from_tokens() -> None:
    words = engine.words_from_tokens(
        [" go", " for", "ward", " te", "n"], [0.0, 0.4, 0.5, 0.9, 1.0], offset=2.0, limit=3.1
    )
    assert [(w.word, w.start, w.end) for w in words] == [
        ("go", 2.0, 2.4),
        ("forward", 2.4, 2.9),
        ("ten", 2.9, pytest.approx(3.04)),
    ]
    clamped = engine.words_from_tokens(["▁a"], [5.0], offset=0.0, limit=1.0)
    assert [(w.start, w.end) for w in clamped] == [(1.0, 1.0)]
    assert engine.words_from_tokens(["a"], [], offset=0, limit=1) == ()
    cjk = engine.words_from_tokens(["你", "好"], [0.0, 0.1], offset=0, limit=1)
    assert [w.word for w in cjk] == ["你", "好"]


# -- batching ------------------------------------------------------------------------------------


def many_audios(speech: np.ndarray, n: int) -> list[bytes]:
    rng = np.random.default_rng(7)
    out = []
    for i in range(n):
        gains = [float(g) for g in rng.uniform(0.3, 1.5, size=1 + i % 2)]
        lead = silence(float(rng.uniform(0, 0.7)))
        body = np.frombuffer(utterances(speech, gains, gap=float(rng.uniform(1.3, 2.0))), "<i2")
        out.append(np.concatenate([lead, body]).astype("<i2").tobytes())
    return out


def test_batched_streams_equal_streams_decoded_alone(
    models: dict[str, engine.SherpaModel], speech: np.ndarray
) -> None:
    model = models[LSTM]
    assert model.options.batch
    audios = many_audios(speech, 8)
    expected = [gen.decode_directly(model.recognizer, pcm) for pcm in audios]
    calls, chunks = model.counters.decode_calls, model.counters.decoded_chunks
    results: dict[int, list[Any]] = {}

    async def main() -> None:
        async def one(i: int) -> None:
            results[i] = await decode_stream(model, audios[i], [640 * (1 + i % 4)], words=True)

        async with anyio.create_task_group() as tg:
            for i in range(len(audios)):
                tg.start_soon(one, i)

    anyio.run(main)
    for i in range(len(audios)):
        assert transcript(results[i]) == expected[i], i
        assert not any(isinstance(e, EngineFailed) for e in results[i])
    calls = model.counters.decode_calls - calls
    chunks = model.counters.decoded_chunks - chunks
    assert chunks >= len(audios) * 10
    assert calls < chunks / 2, (calls, chunks)  # most calls decoded several streams at once
    assert model.counters.live_streams == 0  # every native stream was freed
    assert model.rounds.open_streams == 0


def test_unbatched_mode_equals_reference(
    model_dirs: dict[str, tuple[Path, dict[str, str]]], speech: np.ndarray
) -> None:
    root, config = model_dirs[LSTM]
    model = engine.load(make_entry("plain", root, config, batch=False), root, "cpu")
    assert isinstance(model, engine.SherpaModel) and not model.options.batch
    try:
        audios = many_audios(speech, 3)
        for pcm in audios:
            events = anyio.run(decode_stream, model, pcm, [1000, 4096, 2])
            assert transcript(events) == gen.decode_directly(model.recognizer, pcm)
        assert model.counters.decode_calls == 0  # decoded one stream at a time, not batched

        async def together() -> list[list[Any]]:
            # Several unbatched streams share the model's rounds, each decoded on its own.
            out: list[list[Any]] = [[] for _ in audios]

            async def one(i: int) -> None:
                out[i] = await decode_stream(model, audios[i], [640 * (1 + i)])

            async with anyio.create_task_group() as tg:
                for i in range(len(audios)):
                    tg.start_soon(one, i)
            return out

        for pcm, events in zip(audios, anyio.run(together), strict=True):
            assert transcript(events) == gen.decode_directly(model.recognizer, pcm)
        assert model.counters.decode_calls == 0 and model.counters.live_streams == 0
    finally:
        model.close()


class SlowRecognizer:
    """The real recognizer, with decode_streams slowed down (or failing) and watched."""

    def __init__(self, real: Any, delay: float = 0.0, fail: bool = False) -> None:
        self._real = real
        self.delay = delay
        self.fail = fail
        self.busy: set[int] = set()
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def decode_streams(self, ss: list[Any]) -> None:
        with self.lock:
            self.busy.update(id(s) for s in ss)
        try:
            time.sleep(self.delay)
            if self.fail:
                raise RuntimeError("injected decoder failure")
            self._real.decode_streams(ss)
        finally:
            with self.lock:
                self.busy.difference_update(id(s) for s in ss)


def test_close_waits_for_the_decode_in_flight(
    models: dict[str, engine.SherpaModel], speech: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    slow = SlowRecognizer(models[LSTM].recognizer, delay=0.2)
    model = engine.SherpaModel(slow, engine.SherpaOptions(), slug="slow")
    freed_while_busy: list[int] = []
    original_free = engine.StreamDecoder.free

    def checked_free(self: Any) -> None:
        with slow.lock:
            if self.stream is not None and id(self.stream) in slow.busy:
                freed_while_busy.append(id(self.stream))
        original_free(self)

    monkeypatch.setattr(engine.StreamDecoder, "free", checked_free)
    pcm = utterances(speech, [1.0])

    async def main() -> float:
        streams = [
            await model.open_stream(StartOptions(model="slow"), max_buffered_bytes=64000)
            for _ in range(4)
        ]

        async def drain(stream: Any) -> None:
            async for _ in stream.events():
                pass

        async with anyio.create_task_group() as tg:
            for stream in streams:
                tg.start_soon(drain, stream)
            for stream in streams:
                await stream.feed(pcm[:64000])
            while not slow.busy:
                await anyio.sleep(0.001)
            started = time.monotonic()
            # Closing from a cancelled scope still waits for the decode and frees the stream.
            with anyio.CancelScope() as scope:
                scope.cancel()
                await streams[0].aclose()
            for stream in streams[1:]:
                await stream.aclose()
                await stream.aclose()  # idempotent
            return time.monotonic() - started

    try:
        waited = anyio.run(main)
        assert waited > 0.05  # the first close really waited for the batch in flight
        assert not freed_while_busy
        slow.delay = 0.0
        assert model.counters.live_streams == 0 and model.rounds.open_streams == 0
        # The model still works afterwards.
        events = anyio.run(decode_stream, model, pcm)
        assert transcript(events) == gen.decode_directly(models[LSTM].recognizer, pcm)
    finally:
        model.close()
    # A closed model opens no more streams.
    with pytest.raises(EngineUnavailable, match="unloaded"):
        anyio.run(decode_stream, model, pcm)


def test_decode_errors_fail_the_streams_in_the_batch(
    models: dict[str, engine.SherpaModel], speech: np.ndarray
) -> None:
    broken = SlowRecognizer(models[LSTM].recognizer, fail=True)
    model = engine.SherpaModel(broken, engine.SherpaOptions(), slug="broken")
    pcm = utterances(speech, [1.0])

    async def main() -> list[list[Any]]:
        results: list[list[Any]] = [[], []]

        async def one(i: int) -> None:
            stream = await model.open_stream(StartOptions(model="b"), max_buffered_bytes=64000)
            async with anyio.create_task_group() as tg:
                tg.start_soon(stream.feed, pcm[:64000])
                async for event in stream.events():
                    results[i].append(event)
            await stream.aclose()

        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                for i in range(2):
                    tg.start_soon(one, i)
        return results

    try:
        for events in anyio.run(main):
            assert len(events) == 1 and isinstance(events[0], EngineFailed)
            assert "engine failed" in events[0].detail
    finally:
        model.close()


def test_feed_waits_while_the_queue_is_full(
    models: dict[str, engine.SherpaModel], speech: np.ndarray
) -> None:
    slow = SlowRecognizer(models[LSTM].recognizer, delay=0.01)
    model = engine.SherpaModel(slow, engine.SherpaOptions(), slug="slow")
    pcm = utterances(speech, [1.0, 0.7])
    peak = 0

    async def main() -> list[Any]:
        nonlocal peak
        stream = await model.open_stream(StartOptions(model="s"), max_buffered_bytes=8000)
        assert isinstance(stream, ThreadedStream)
        events: list[Any] = []
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                async for event in stream.events():
                    events.append(event)

            tg.start_soon(consume)
            for frame in frames(pcm, [3000]):
                await stream.feed(frame)
                peak = max(peak, stream.buffered_bytes)
            await stream.flush()
        await stream.aclose()
        return events

    try:
        events = anyio.run(main)
    finally:
        model.close()
    assert peak <= 8000
    assert transcript(events) == gen.decode_directly(models[LSTM].recognizer, pcm)


def test_streams_decode_without_a_reader(
    models: dict[str, engine.SherpaModel], speech: np.ndarray
) -> None:
    """Rounds are started by feed/flush and by the end of the previous round, not by whoever
    reads the events: a stream whose events nobody reads yet is decoded all the same."""
    model = models[LSTM]
    pcm = utterances(speech, [1.0, 0.6])

    async def main() -> list[Any]:
        stream = await model.open_stream(StartOptions(model="x"), max_buffered_bytes=len(pcm))
        try:
            await stream.feed(pcm)
            await stream.flush()
            assert isinstance(stream, ThreadedStream)
            with anyio.fail_after(10):
                while stream.buffered_bytes or not stream.ended:
                    await anyio.sleep(0.01)
            return [event async for event in stream.events()]
        finally:
            await stream.aclose()

    assert transcript(anyio.run(main)) == gen.decode_directly(model.recognizer, pcm)


# -- parity over the wire ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(models: dict[str, engine.SherpaModel]) -> Iterator[Any]:
    provider = LoadedModelProvider(dict(models))
    with run_server(provider=provider) as running:
        yield running


def over_the_wire(url: str, slug: str, pcm: bytes, sizes: Sequence[int]) -> tuple[list[str], str]:
    ws = ws_connect(url, max_queue=None)
    try:
        start = {"type": "start", "model": slug, "encoding": "pcm_s16le"}
        ws.send(json.dumps({**start, "sample_rate": 16000, "channels": 1}))
        assert json.loads(ws.recv(timeout=5))["type"] == "ready"
        for frame in frames(pcm, sizes):
            ws.send(frame)
        ws.send(json.dumps({"type": "end"}))
        events: list[dict[str, Any]] = []
        while True:
            event = json.loads(ws.recv(timeout=20))
            events.append(event)
            if event["type"] in ("stats", "error"):
                break
    finally:
        ws.close()
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["final", "stats"], events[-3:]
    endpoints = [e["text"] for e in events if e["type"] == "endpoint" and e["text"]]
    return endpoints, events[-2]["text"]


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    case=st.fixed_dictionaries(
        {
            "slug": st.sampled_from([LSTM, CTC]),
            "gains": st.lists(st.floats(0.3, 1.5), min_size=1, max_size=2),
            "lead": st.floats(0.0, 0.3),
            # Even frames up to the test server's 4096-byte limit, cycled through the audio.
            "sizes": st.lists(st.integers(32, 2048).map(lambda n: 2 * n), min_size=1, max_size=8),
        }
    )
)
def test_wire_transcript_equals_sherpa_in_process(
    server: Any, models: dict[str, engine.SherpaModel], speech: np.ndarray, case: dict[str, Any]
) -> None:
    slug, gains, lead, sizes = case["slug"], case["gains"], case["lead"], case["sizes"]
    body = np.frombuffer(utterances(speech, gains, gap=1.6), dtype="<i2")
    pcm = np.concatenate([silence(lead), body]).astype("<i2").tobytes()
    assert len(pcm) / 32000 < 9.5  # the test server's stream_max_duration is 10 s
    expected = gen.decode_directly(models[slug].recognizer, pcm)
    if slug == LSTM:
        assert expected[0], "the LSTM model endpoints in 1.6 s gaps"
    assert over_the_wire(server.url, slug, pcm, sizes) == expected


def test_clients_that_cancel_or_vanish_free_their_streams(
    server: Any, models: dict[str, engine.SherpaModel], speech: np.ndarray
) -> None:
    import socket

    model = models[LSTM]
    pcm = utterances(speech, [1.0, 0.8])
    clients = []
    for i in range(4):
        ws = ws_connect(server.url, max_queue=None)
        start = {"type": "start", "model": LSTM, "encoding": "pcm_s16le"}
        ws.send(json.dumps({**start, "sample_rate": 16000, "channels": 1}))
        assert json.loads(ws.recv(timeout=5))["type"] == "ready"
        for frame in frames(pcm[: 48000 * (i + 1)], [4096]):
            ws.send(frame)
        clients.append(ws)
    clients[0].send(json.dumps({"type": "cancel"}))
    events: list[dict[str, Any]] = []
    while not events or events[-1]["type"] != "stats":
        events.append(json.loads(clients[0].recv(timeout=10)))
    assert events[-1]["canceled"] is True
    clients[0].close()
    for ws in clients[1:]:  # gone without a close frame, mid-stream
        ws.socket.shutdown(socket.SHUT_RDWR)
        ws.socket.close()
    deadline = time.monotonic() + 10
    while model.counters.live_streams and time.monotonic() < deadline:
        time.sleep(0.01)
    assert model.counters.live_streams == 0, "every engine stream was freed"
    assert model.rounds.open_streams == 0
    expected = gen.decode_directly(model.recognizer, pcm)
    assert len(expected[0]) == 2
    assert over_the_wire(server.url, LSTM, pcm, [4096]) == expected
