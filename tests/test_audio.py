"""``talkies.audio`` against the real ffmpeg and ffprobe (Debian ``ffmpeg``), on real speech
(Debian ``pocketsphinx-testdata``: goforward.raw, 2.786 s of s16le 16 kHz mono).

Every input file is made here with the ffmpeg command line from that speech; every encoded
output is decoded back with the ffmpeg command line, not with the code under test.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import time
import wave
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from talkies import audio

from . import procs

GOFORWARD = Path("/usr/share/pocketsphinx/test/data/goforward.raw")

pytestmark = [
    pytest.mark.skipif(
        shutil.which("ffmpeg") is None or shutil.which("ffprobe") is None,
        reason="needs ffmpeg and ffprobe (apt-get install ffmpeg)",
    ),
    pytest.mark.skipif(
        not GOFORWARD.is_file(), reason="needs Debian pocketsphinx-testdata (goforward.raw)"
    ),
]

SR = 16000


def ffmpeg(*args: str) -> None:
    subprocess.run(["ffmpeg", "-v", "error", "-nostdin", "-y", *args], check=True)


def to_s16le(rate: int) -> list[str]:
    return ["-f", "s16le", "-ac", "1", "-ar", str(rate), "-"]


def from_s16le(path: Path) -> list[str]:
    return ["-f", "s16le", "-ar", str(SR), "-ac", "1", "-i", str(path)]


def ffmpeg_decode(path: Path, rate: int) -> bytes:
    """``path`` as s16le mono at ``rate``, by the ffmpeg command line."""
    done = subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", "-i", str(path), *to_s16le(rate)],
        check=True,
        capture_output=True,
    )
    return done.stdout


def ffprobe(path: Path, entries: str) -> str:
    done = subprocess.run(
        ["ffprobe", "-v", "error", "-show_entries", entries, "-of", "csv=p=0", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def speech() -> bytes:
    return GOFORWARD.read_bytes()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, speech: bytes) -> dict[str, Path]:
    """goforward in the formats clients upload, made by ffmpeg from the raw PCM."""
    root = tmp_path_factory.mktemp("audio-in")
    raw = root / "goforward.raw"
    raw.write_bytes(speech)
    pcm_in = from_s16le(raw)
    made = {
        "wav": ["-c:a", "pcm_s16le"],
        "flac": ["-c:a", "flac"],
        "mp3": ["-c:a", "libmp3lame", "-b:a", "64k"],
        "ogg": ["-c:a", "libvorbis"],  # Ogg Vorbis
        "opus": ["-c:a", "libopus", "-f", "ogg"],  # Ogg Opus
        "webm": ["-c:a", "libopus"],
        "m4a": ["-c:a", "aac"],
    }
    out: dict[str, Path] = {}
    for name, codec in made.items():
        out[name] = root / f"goforward.{name}"
        ffmpeg(*pcm_in, *codec, str(out[name]))
    # Stereo 44.1 kHz 24-bit: decoding must downmix and resample.
    out["stereo44k"] = root / "stereo44k.wav"
    ffmpeg(*pcm_in, "-ac", "2", "-ar", "44100", "-c:a", "pcm_s24le", str(out["stereo44k"]))
    return out


def decode(path: Path, max_seconds: float = 60.0) -> bytes:
    return anyio.run(lambda: audio.decode(path, max_seconds=max_seconds))


def decode_unsure(path: Path, max_seconds: float) -> int:
    """``decode_to`` as for a container that does not say how long it is (so only decoding
    can find it too long); the bytes handed over."""
    unsure = audio.Probe(format_name="flac", duration=None, audio_streams=1)

    async def drop(chunk: bytes) -> None:
        pass

    return anyio.run(lambda: audio.decode_to(path, drop, max_seconds=max_seconds, info=unsure))


def seconds(pcm: bytes, rate: int = SR) -> float:
    return len(pcm) / 2 / rate


# -- decoding ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "tolerance"),
    [
        ("wav", 0.002),
        ("flac", 0.002),
        ("mp3", 0.005),  # the LAME header gives ffmpeg the encoder delay and padding
        ("ogg", 0.005),
        ("opus", 0.005),
        ("webm", 0.005),
        ("m4a", 0.05),  # AAC in MP4: up to a frame of padding
        ("stereo44k", 0.002),
    ],
)
def test_decodes_uploads_to_16k_mono(
    files: dict[str, Path], speech: bytes, name: str, tolerance: float
) -> None:
    pcm = decode(files[name])
    assert len(pcm) % 2 == 0
    assert abs(seconds(pcm) - seconds(speech)) <= tolerance, (name, seconds(pcm))
    if name in ("wav", "flac"):
        assert pcm == speech  # lossless in, the same samples out
    else:
        # Lossy, but the same speech: the waveforms correlate.
        a = np.frombuffer(speech, "<i2").astype(np.float64)
        b = np.frombuffer(pcm, "<i2").astype(np.float64)
        n = min(a.size, b.size)
        best = max(np.corrcoef(a[: n - lag], b[lag:n])[0, 1] for lag in range(80))
        assert best > 0.8, (name, best)


def test_decoding_does_not_block_the_event_loop(files: dict[str, Path]) -> None:
    ticks = 0

    async def main() -> bytes:
        nonlocal ticks
        async with anyio.create_task_group() as tg:

            async def tick() -> None:
                nonlocal ticks
                while True:
                    ticks += 1
                    await anyio.sleep(0.001)

            tg.start_soon(tick)
            pcm = await audio.decode(files["mp3"], max_seconds=60)
            tg.cancel_scope.cancel()
        return pcm

    assert anyio.run(main)
    assert ticks >= 3  # the loop kept running while ffprobe and ffmpeg worked


# -- bad input -----------------------------------------------------------------------------------


def _bad_files(root: Path, good: Path) -> dict[str, Path]:
    bad: dict[str, Path] = {}
    bad["empty"] = root / "empty.wav"
    bad["empty"].write_bytes(b"")
    bad["truncated header"] = root / "truncated.wav"
    bad["truncated header"].write_bytes(good.read_bytes()[:30])
    bad["text named .wav"] = root / "notes.wav"
    bad["text named .wav"].write_text("These are my meeting notes, not audio.\n" * 20)
    bad["random bytes"] = root / "noise.mp3"
    bad["random bytes"].write_bytes(np.random.default_rng(0).bytes(20000))
    bad["png image"] = root / "picture.wav"
    ffmpeg("-f", "lavfi", "-i", "color=red:s=64x64", "-frames:v", "1", "-f", "image2",
           "-c:v", "png", str(bad["png image"]))  # fmt: skip
    bad["video without audio"] = root / "silent-film.webm"
    ffmpeg("-f", "lavfi", "-i", "color=blue:s=64x64:d=1", "-c:v", "libvpx", "-an",
           str(bad["video without audio"]))  # fmt: skip
    # A well-formed WAV header with no samples after it.
    bad["header only"] = root / "header-only.wav"
    with wave.open(str(bad["header only"]), "wb") as header_only:
        header_only.setnchannels(1)
        header_only.setsampwidth(2)
        header_only.setframerate(SR)
    # An HLS playlist pointing at a file of the server: ffmpeg would read it if let.
    bad["playlist"] = root / "playlist.m3u8"
    bad["playlist"].write_text(f"#EXTM3U\n#EXT-X-TARGETDURATION:3\n#EXTINF:3.0,\n{good}\n"
                               "#EXT-X-ENDLIST\n")  # fmt: skip
    bad["missing"] = root / "does-not-exist.wav"
    bad["directory"] = root
    return bad


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory, files: dict[str, Path]) -> dict[str, Path]:
    return _bad_files(tmp_path_factory.mktemp("audio-bad"), files["wav"])


BAD = [
    "empty",
    "truncated header",
    "text named .wav",
    "random bytes",
    "png image",
    "video without audio",
    "header only",
    "playlist",
    "missing",
    "directory",
]


@pytest.mark.parametrize("name", BAD)
def test_bad_input_is_an_audio_error_with_a_readable_message(
    bad_files: dict[str, Path], name: str
) -> None:
    path = bad_files[name]
    with pytest.raises(audio.AudioError) as caught:
        decode(path)
    message = str(caught.value)
    assert message and message[0].islower() and len(message) < 200
    assert str(path.parent) not in message  # the server's paths stay out of client messages
    assert "Traceback" not in message and "@ 0x" not in message
    assert isinstance(caught.value, ValueError)  # a client error, not a server failure


def test_bad_input_messages_say_what_is_wrong(bad_files: dict[str, Path]) -> None:
    def message(name: str) -> str:
        with pytest.raises(audio.AudioError) as caught:
            decode(bad_files[name])
        return str(caught.value)

    assert message("empty") == "the audio file is empty"
    assert "not valid audio" in message("truncated header")
    assert "not valid audio" in message("text named .wav")
    assert "supported audio format" in message("png image")
    assert "png" in message("png image")
    assert message("video without audio") == "the file contains no audio stream"
    assert message("header only") == "the file contains no audio samples"
    assert "supported audio format" in message("playlist")


# -- limits and cancellation ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def long_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An hour of silence in FLAC (under 1 MB; ffmpeg needs a few seconds to decode it)."""
    path = tmp_path_factory.mktemp("audio-long") / "hour.flac"
    ffmpeg("-f", "lavfi", "-i", f"anullsrc=r={SR}:cl=mono", "-t", "3600", "-c:a", "flac", str(path))
    return path


def children(names: tuple[str, ...] = ("ffmpeg", "ffprobe")) -> list[int]:
    """Our child processes called ``names``, running or not yet reaped."""
    return [child.pid for child in procs.children() if child.comm in names]


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """Every child ``audio`` starts from now on: (program name, anyio process)."""
    found: list[tuple[str, Any]] = []
    open_process = anyio.open_process

    async def recording(command: Any, **kwargs: Any) -> Any:
        process = await open_process(command, **kwargs)
        found.append((Path(command[0]).name, process))
        return process

    monkeypatch.setattr(audio.anyio, "open_process", recording)
    return found


def test_longer_than_max_seconds_is_refused_without_decoding_it_all(
    files: dict[str, Path], long_file: Path, spawned: list[tuple[str, Any]]
) -> None:
    with pytest.raises(audio.AudioError, match="longer than the limit of 2 seconds"):
        decode(files["wav"], max_seconds=2)
    assert len(decode(files["wav"], max_seconds=2.8)) == GOFORWARD.stat().st_size
    spawned.clear()
    # The container says it holds an hour: refused before anything is decoded.
    with pytest.raises(audio.AudioError, match="longer than the limit of 30 seconds"):
        decode(long_file, max_seconds=30)
    assert [(name, process.returncode) for name, process in spawned] == [("ffprobe", 0)]
    spawned.clear()
    # A container that does not say: decoding stops at the limit, ffmpeg killed mid-decode
    # (an hour takes it seconds), where reading on to the end would have let it exit 0.
    handed: list[int] = []

    async def keep(chunk: bytes) -> None:
        handed.append(len(chunk))

    unsure = audio.Probe(format_name="flac", duration=None, audio_streams=1)
    with pytest.raises(audio.AudioError, match="longer than the limit of 30 seconds"):
        anyio.run(lambda: audio.decode_to(long_file, keep, max_seconds=30, info=unsure))
    assert [(name, process.returncode) for name, process in spawned] == [
        ("ffmpeg", -signal.SIGKILL),
    ]
    assert sum(handed) <= 30 * 2 * SR and set(handed) == {audio.CHUNK_BYTES}
    assert children() == []
    with pytest.raises(ValueError, match="max_seconds"):
        decode(files["wav"], max_seconds=0)


def test_a_refused_decode_leaves_reaping_ffmpeg_to_asyncio(
    long_file: Path,
    spawned: list[tuple[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``Popen.kill()`` polls the child before it signals it. Once ffmpeg is dead, that poll
    can reap it before asyncio's child watcher does; the watcher then logs "Unknown child
    process pid" and reports 255 as the exit status. That happened in about 1 refused decode
    in 30 when ffmpeg was killed twice (once at the limit, once leaving ``_child``). Here the
    watcher's wait (asyncio's watchers call ``os.waitpid`` at run time; ``Popen`` bound its
    own at import) reaps a child only 50 ms after it has died, so any such poll wins."""
    waitpid = os.waitpid

    def late(pid: int, options: int) -> tuple[int, int]:
        if options == 0:  # the watcher's blocking wait, not a poll
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # dead, not yet reaped
                time.sleep(0.05)
        return waitpid(pid, options)

    monkeypatch.setattr(os, "waitpid", late)
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        for _ in range(3):
            with pytest.raises(audio.AudioError, match="longer than the limit"):
                decode_unsure(long_file, max_seconds=5)
    codes = [process.returncode for name, process in spawned if name == "ffmpeg"]
    assert codes == [-signal.SIGKILL] * 3
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
    assert children() == []


def _cancel_when(found: Callable[[], bool], path: Path) -> bool:
    """Decode ``path``, cancelling once ``found()``; whether the decode was cancelled."""

    async def main() -> bool:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    deadline = time.monotonic() + 20
                    while not found() and time.monotonic() < deadline:
                        await anyio.sleep(0.005)
                    scope.cancel()

                tg.start_soon(watch)
                await audio.decode(path, max_seconds=4000)
        return scope.cancelled_caught

    return anyio.run(main)


def test_a_cancelled_decode_leaves_no_ffmpeg_behind(long_file: Path) -> None:
    assert _cancel_when(lambda: bool(children(("ffmpeg",))), long_file)
    assert children() == []


def test_a_cancelled_probe_leaves_no_ffprobe_behind(long_file: Path) -> None:
    assert _cancel_when(lambda: bool(children(("ffprobe",))), long_file)
    assert children() == []


def test_a_child_cancelled_while_it_is_spawned_is_reaped_before_the_block_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # asyncio forks the child, then waits for its pipes; a cancellation landing in between
    # once left it killed but not reaped (CI saw one ffmpeg outlive the loop). The watcher
    # spins without sleeping so it cancels as soon as the child shows in /proc, often before
    # open_process returns; 5 in 100 tries leaked before the spawn was shielded. A child the
    # block did not reap is reaped later by asyncio's watcher thread, which then logs that the
    # loop handling it is closed: that warning is what the test looks for.
    async def once() -> list[int]:
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def watch() -> None:
                    while not children(("sleep",)):
                        await anyio.sleep(0)
                    scope.cancel()

                tg.start_soon(watch)
                async with audio._child(["sleep", "30"]):
                    await anyio.sleep(30)
        assert scope.cancelled_caught
        return children(("sleep",))

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        left = [anyio.run(once) for _ in range(150)]
        time.sleep(0.2)  # for the watcher threads of children nobody waited for
    assert [pids for pids in left if pids] == []
    assert [r.getMessage() for r in caplog.records if "is closed" in r.getMessage()] == []


# -- encoding ------------------------------------------------------------------------------------

MAGIC = {
    "wav": (b"RIFF", 0),
    "flac": (b"fLaC", 0),
    "opus": (b"OggS", 0),
}


# format -> (Content-Type, seconds the decoded length may differ by)
ENCODED = {
    "wav": ("audio/wav", 0.0),
    "pcm": ("audio/pcm", 0.0),
    "flac": ("audio/flac", 0.0),
    "mp3": ("audio/mpeg", 0.005),  # gapless: the LAME header carries delay and padding
    "opus": ("audio/opus", 0.005),
    "aac": ("audio/aac", 0.15),  # ADTS has no place for the encoder delay: ~1-2 frames
}


@pytest.mark.parametrize("rate", [24000, 22050])
@pytest.mark.parametrize("fmt", list(ENCODED))
def test_encode_gives_audio_ffmpeg_decodes_back(
    tmp_path: Path, speech: bytes, rate: int, fmt: str
) -> None:
    content_type, tolerance = ENCODED[fmt]
    # Synthesized speech arrives at the TTS model's rate (24 kHz for Kokoro and Qwen3).
    pcm = ffmpeg_resampled(tmp_path, speech, rate)
    data, got_type = anyio.run(audio.encode, pcm, rate, fmt)
    assert got_type == content_type
    assert data
    if fmt == "pcm":
        assert data == pcm
        return
    path = tmp_path / f"speech.{fmt}"
    path.write_bytes(data)
    if fmt in MAGIC:
        magic, at = MAGIC[fmt]
        assert data[at : at + len(magic)] == magic
    if fmt == "opus":
        assert b"OpusHead" in data[:100]
        assert ffprobe(path, "format=format_name") == "ogg"
        assert ffprobe(path, "stream=codec_name") == "opus"
    if fmt == "aac":
        assert data[0] == 0xFF and data[1] & 0xF0 == 0xF0  # ADTS sync word
        assert ffprobe(path, "format=format_name") == "aac"
    if fmt == "mp3":
        assert ffprobe(path, "stream=codec_name") == "mp3"
    back = ffmpeg_decode(path, rate)
    assert abs(seconds(back, rate) - seconds(pcm, rate)) <= tolerance + 1e-9, seconds(back, rate)
    if fmt in ("wav", "flac"):
        assert back == pcm


def ffmpeg_resampled(tmp_path: Path, speech: bytes, rate: int) -> bytes:
    raw = tmp_path / "in.raw"
    raw.write_bytes(speech)
    done = subprocess.run(
        ["ffmpeg", "-v", "error", "-nostdin", *from_s16le(raw), *to_s16le(rate)],
        check=True,
        capture_output=True,
    )
    return done.stdout


def test_encode_round_trips_through_decode(speech: bytes, tmp_path: Path) -> None:
    for fmt in ("wav", "flac", "mp3", "opus"):
        data, _ = anyio.run(audio.encode, speech, SR, fmt)
        path = tmp_path / f"back.{fmt}"
        path.write_bytes(data)
        back = decode(path)
        assert abs(seconds(back) - seconds(speech)) <= 0.005, fmt


def test_encode_refuses_an_unknown_format(speech: bytes) -> None:
    with pytest.raises(audio.AudioError, match="unsupported response_format 'ogg'"):
        anyio.run(audio.encode, speech, SR, "ogg")
    assert set(audio.SPEECH_FORMATS) == {"mp3", "opus", "aac", "flac", "wav", "pcm"}
