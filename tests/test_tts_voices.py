"""Reference voices (``talkies.engines.tts.voices``) and the engine-independent plumbing of
``talkies.engines.tts.base``: request checks, PCM conversion, and the worker-thread bridge,
driven by plain Python jobs (no speech runtime needed).
"""

from __future__ import annotations

import os
import threading
import time
import wave
from collections.abc import Callable
from pathlib import Path

import anyio
import numpy as np
import pytest

from talkies.engines.tts import SpeechError, SpeechErrorKind, SpeechRequest, SynthesisFailed
from talkies.engines.tts.base import (
    MAX_INPUT_CHARS,
    Emitter,
    SpeechStream,
    check_request,
    pcm16,
    start_synthesis,
)
from talkies.engines.tts.voices import (
    SAMPLE_VOICES,
    ReferenceVoice,
    check_voice_name,
    custom_voice,
    list_custom_voices,
    read_reference_audio,
    reference_voice,
    sample_voice,
)

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def write_wav(
    path: Path, seconds: float = 1.0, rate: int = 24000, width: int = 2, channels: int = 1
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(int(seconds * rate)) / rate
    tone = (np.sin(2 * np.pi * 220 * t) * 0.3 * 32767).astype("<i2")
    data = np.repeat(tone, channels).tobytes() if width == 2 else bytes(len(tone) * channels)
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(width)
        wav.setframerate(rate)
        wav.writeframes(data)
    return path


# -- names ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["anna", "team/anna", "a_b-c.d", "Team1/sub/x", "x" * 64])
def test_good_names(name: str) -> None:
    check_voice_name(name)


@pytest.mark.parametrize(
    "name",
    [
        "",
        "..",
        ".",
        "../anna",
        "team/../anna",
        "team/./anna",
        "team//anna",
        "team/",
        "/etc/passwd",
        "C:anna",
        "team\\anna",
        "an\x00na",
        ".hidden",
        "team/.hidden",
        "-dash",
        "sp ace",
        "x" * 65,
        "a/" * 64 + "a",
        "/".join("abcdefghi"),  # nine levels
        "é",
    ],
)
def test_bad_names_are_refused(name: str, tmp_path: Path) -> None:
    with pytest.raises(SpeechError) as info:
        check_voice_name(name)
    assert (info.value.kind, info.value.param) == (SpeechErrorKind.INVALID_INPUT, "voice")
    with pytest.raises(SpeechError):
        custom_voice(tmp_path, name)
    with pytest.raises(SpeechError):
        reference_voice(tmp_path, name)


# -- custom voices -------------------------------------------------------------------------------


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A data dir with custom voices, good and bad, and a secret outside the folder."""
    data = tmp_path / "data"
    voices = data / "custom-voices"
    write_wav(voices / "team" / "anna.wav")
    (voices / "team" / "anna.txt").write_text("  Hello from Anna.\n")
    write_wav(voices / "solo.wav")
    (voices / "empty.txt").write_text("   \n")
    write_wav(voices / "empty.wav")
    write_wav(voices / ".hidden" / "ghost.wav")
    write_wav(voices / "bad name.wav")
    (voices / "notes.txt").write_text("not a voice")
    outside = write_wav(tmp_path / "secret" / "stolen.wav")
    (tmp_path / "secret" / "stolen.txt").write_text("secret")
    os.symlink(outside, voices / "leak.wav")  # a file symlink leading out
    os.symlink(tmp_path / "secret", voices / "linked")  # a folder symlink leading out
    os.symlink(voices / "solo.wav", voices / "alias.wav")  # a symlink that stays inside
    os.symlink(voices / "missing.wav", voices / "dangling.wav")
    write_wav(voices / "told.wav")
    os.symlink(tmp_path / "secret" / "stolen.txt", voices / "told.txt")  # transcript leads out
    os.mkdir(voices / "folder.wav")
    return data


def test_custom_voice_with_and_without_transcript(data_dir: Path) -> None:
    root = (data_dir / "custom-voices").resolve()
    anna = custom_voice(data_dir, "team/anna")
    assert anna == ReferenceVoice("team/anna", root / "team" / "anna.wav", "Hello from Anna.")
    solo = custom_voice(data_dir, "solo")
    assert solo is not None and solo.transcript is None  # x-vector only
    empty = custom_voice(data_dir, "empty")
    assert empty is not None and empty.transcript is None  # a blank transcript is none
    alias = custom_voice(data_dir, "alias")
    assert alias is not None and alias.audio == root / "solo.wav"
    assert custom_voice(data_dir, "nobody") is None
    assert custom_voice(data_dir / "no-such-dir", "anna") is None


@pytest.mark.parametrize("name", ["leak", "linked/stolen", "dangling", "told", "folder"])
def test_paths_leading_out_or_nowhere_are_refused(data_dir: Path, name: str) -> None:
    with pytest.raises(SpeechError) as info:
        custom_voice(data_dir, name)
    assert info.value.kind is SpeechErrorKind.UNKNOWN_VOICE
    assert "secret" not in info.value.message and str(data_dir) not in info.value.message


def test_listing(data_dir: Path) -> None:
    assert list_custom_voices(data_dir) == ["alias", "empty", "solo", "team/anna", "told"]
    assert list_custom_voices(data_dir / "nothing") == []


def test_reference_voice_prefers_custom_then_sample(data_dir: Path) -> None:
    assert reference_voice(data_dir, "team/anna").transcript == "Hello from Anna."
    assert reference_voice(data_dir, "alloy") == sample_voice("alloy")
    assert reference_voice(None, "echo") == sample_voice("echo")
    write_wav(data_dir / "custom-voices" / "fable.wav")
    shadow = reference_voice(data_dir, "fable")
    assert shadow.audio.parent == (data_dir / "custom-voices").resolve()
    with pytest.raises(SpeechError) as info:
        reference_voice(data_dir, "nobody")
    assert info.value.kind is SpeechErrorKind.UNKNOWN_VOICE
    with pytest.raises(SpeechError):
        reference_voice(None, "team/anna")


# -- clips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SAMPLE_VOICES)
def test_sample_voices_ship_with_transcripts(name: str) -> None:
    voice = sample_voice(name)
    assert voice is not None and voice.transcript and len(voice.transcript.split()) >= 8
    with wave.open(str(voice.audio)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24000, 1, 2)
        assert 2.0 <= wav.getnframes() / 24000 <= 10.0
    audio, rate = read_reference_audio(voice)
    assert rate == 24000 and audio.dtype == np.float32
    assert 0.05 < np.abs(audio).max() <= 1.0


def test_reading_clips(tmp_path: Path) -> None:
    stereo = ReferenceVoice("s", write_wav(tmp_path / "s.wav", rate=16000, channels=2), None)
    audio, rate = read_reference_audio(stereo)
    assert rate == 16000 and audio.shape == (16000,)

    def refused(path: Path) -> str:
        with pytest.raises(SpeechError) as info:
            read_reference_audio(ReferenceVoice("x", path, None))
        return info.value.message

    assert "16-bit" in refused(write_wav(tmp_path / "u8.wav", width=1))
    assert "longer than" in refused(write_wav(tmp_path / "long.wav", seconds=31, rate=8000))
    assert "shorter than" in refused(write_wav(tmp_path / "short.wav", seconds=0.2))
    (tmp_path / "junk.wav").write_bytes(b"RIFF nonsense")
    assert "not a readable WAV" in refused(tmp_path / "junk.wav")
    assert "not a readable WAV" in refused(tmp_path / "missing.wav")


# -- request checks and PCM ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "kind", "param"),
    [
        ({"text": ""}, SpeechErrorKind.INVALID_INPUT, "input"),
        ({"text": " \n\t"}, SpeechErrorKind.INVALID_INPUT, "input"),
        ({"text": "x" * (MAX_INPUT_CHARS + 1)}, SpeechErrorKind.INVALID_INPUT, "input"),
        ({"text": "a\x00b"}, SpeechErrorKind.INVALID_INPUT, "input"),
        ({"voice": "nova"}, SpeechErrorKind.UNKNOWN_VOICE, "voice"),
        ({"speed": 0.1}, SpeechErrorKind.INVALID_INPUT, "speed"),
        ({"speed": float("nan")}, SpeechErrorKind.INVALID_INPUT, "speed"),
        ({"speed": 3.0}, SpeechErrorKind.UNSUPPORTED, "speed"),
        ({"text": "a\ud800b"}, SpeechErrorKind.INVALID_INPUT, "input"),
        (
            {"instructions": "x" * (MAX_INPUT_CHARS + 1)},
            SpeechErrorKind.INVALID_INPUT,
            "instructions",
        ),
        ({"instructions": "calm\x00"}, SpeechErrorKind.INVALID_INPUT, "instructions"),
        ({"instructions": "calm\udfff"}, SpeechErrorKind.INVALID_INPUT, "instructions"),
    ],
)
def test_check_request(change: dict[str, object], kind: SpeechErrorKind, param: str) -> None:
    fields: dict[str, object] = {"text": "Hello.", "voice": "alloy", **change}
    request = SpeechRequest(**fields)  # type: ignore[arg-type]
    with pytest.raises(SpeechError) as info:
        check_request(request, speed_range=(0.5, 2.0), voices=["alloy"])
    assert (info.value.kind, info.value.param) == (kind, param)


def test_check_request_accepts() -> None:
    text = "x" * MAX_INPUT_CHARS
    check_request(SpeechRequest(text=text, voice="any"), speed_range=(1.0, 1.0))
    check_request(SpeechRequest(text="Hi", voice="a", speed=2.0), speed_range=(0.5, 2.0))
    for instructions in ("", "Speak calmly, in a low voice. \u00e9\U0001f600"):
        request = SpeechRequest(text="Hi", voice="a", instructions=instructions)
        check_request(request, speed_range=(1.0, 1.0))


def test_pcm16() -> None:
    pcm = pcm16(np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -2.0], np.float32))
    assert np.frombuffer(pcm, "<i2").tolist() == [0, 16384, -16384, 32767, -32767, 32767, -32767]


# -- the worker-thread bridge --------------------------------------------------------------------


def counting_job(
    chunks: int, *, delay: float = 0.0, fail: BaseException | None = None
) -> Callable[[Emitter], None]:
    def job(emitter: Emitter) -> None:
        for i in range(chunks):
            emitter.step()
            time.sleep(delay)
            emitter.emit(bytes([i]) * 4)
        if fail is not None:
            raise fail

    return job


async def read_all(stream: SpeechStream) -> list[bytes]:
    async with stream:
        return [chunk async for chunk in stream]


async def test_bridge_delivers_in_order_and_frees_the_lock() -> None:
    lock = threading.Lock()
    stream = start_synthesis(counting_job(5), lock=lock, max_chunks=2, name="t")
    assert await read_all(stream) == [bytes([i]) * 4 for i in range(5)]
    assert stream.finished and stream.steps == 5 and not lock.locked()


async def test_bridge_bounds_a_slow_reader() -> None:
    lock = threading.Lock()
    stream = start_synthesis(counting_job(50), lock=lock, max_chunks=3, name="t")
    async with stream:
        await anyio.sleep(0.3)
        # Three queued, the fourth made and waiting for room.
        assert stream.chunks_produced == 3 and stream.steps == 4
        assert len([c async for c in stream]) == 50


async def test_bridge_aclose_stops_the_worker_between_steps() -> None:
    lock = threading.Lock()
    stream = start_synthesis(counting_job(1000, delay=0.01), lock=lock, max_chunks=2, name="t")
    await stream.__anext__()
    await stream.aclose()
    assert stream.finished and stream.steps < 1000 and not lock.locked()
    await stream.aclose()  # idempotent
    assert [c async for c in stream] == []


async def test_bridge_waits_for_the_lock_and_gives_up_when_closed() -> None:
    lock = threading.Lock()
    lock.acquire()
    stream = start_synthesis(counting_job(3), lock=lock, max_chunks=2, name="t")
    await anyio.sleep(0.1)
    assert stream.steps == 0 and not stream.finished  # waiting for the lock
    with anyio.fail_after(2):
        await stream.aclose()
    assert stream.finished
    lock.release()


async def test_bridge_serializes_by_lock() -> None:
    lock = threading.Lock()
    first = start_synthesis(counting_job(5, delay=0.02), lock=lock, max_chunks=8, name="a")
    second = start_synthesis(counting_job(5, delay=0.02), lock=lock, max_chunks=8, name="b")
    with anyio.fail_after(5):
        while not (first.finished or second.finished):
            assert first.steps == 0 or second.steps == 0
            await anyio.sleep(0.005)
        assert len(await read_all(first)) == len(await read_all(second)) == 5


async def test_bridge_errors() -> None:
    lock = threading.Lock()
    refused = SpeechError(SpeechErrorKind.INVALID_INPUT, "nothing to speak", param="input")
    stream = start_synthesis(counting_job(2, fail=refused), lock=lock, max_chunks=4, name="t")
    got: list[bytes] = []
    with pytest.raises(SpeechError) as info:
        async for chunk in stream:
            got.append(chunk)
    assert info.value is refused and len(got) == 2
    assert [c async for c in stream] == []  # raised once, then the end

    crash = ZeroDivisionError("boom")
    stream = start_synthesis(counting_job(1, fail=crash), lock=lock, max_chunks=4, name="t")
    with pytest.raises(SynthesisFailed) as failed:
        await read_all(stream)
    assert failed.value.__cause__ is crash and "boom" not in str(failed.value)
    assert not lock.locked()


async def test_bridge_dropped_stream_stops_its_worker() -> None:
    lock = threading.Lock()
    stream = start_synthesis(counting_job(10_000), lock=lock, max_chunks=1, name="t")
    await anyio.sleep(0.05)
    del stream  # never read, never closed
    with anyio.fail_after(5):
        while lock.locked():
            await anyio.sleep(0.01)
