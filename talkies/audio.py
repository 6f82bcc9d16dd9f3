"""Uploaded audio to 16 kHz mono PCM16, and synthesized PCM to the speech formats, with ffmpeg.

Decoding (spec, "Sherpa-ONNX and Vosk": Talkies "normalizes the uploaded or staged audio to
16 kHz mono PCM" before a file transcription) takes a file on disk, where the HTTP layer
streamed the upload under its size cap, and runs two child processes, never through a shell:

1. ``ffprobe`` reads the container. An empty file, a truncated header, text, an image or any
   other file that is not audio becomes :class:`AudioError`, whose message is written for the
   client (the HTTP layer answers 400 with it); ffmpeg's own words, which name the server's
   temporary path, go to the log only.
2. ``ffmpeg`` decodes the first audio stream to s16le on a pipe. :func:`decode_to` hands the
   PCM on in chunks of :data:`CHUNK_BYTES` as it comes, and reads no further while the
   receiver is busy (ffmpeg's pipe fills and ffmpeg waits), so a file transcription holds a
   few chunks however long the file; :func:`decode` keeps it whole, for short clips.
   Decoding stops with :class:`AudioError` as soon as it passes ``max_seconds`` (and a
   container that says it is clearly longer is refused before decoding starts).

Only local files are read (``-protocol_whitelist file``) and only the demuxers of
:data:`INPUT_FORMATS` may open them (``-format_whitelist``): an uploaded HLS playlist, ffconcat
list or image sequence pattern would otherwise make ffmpeg read other files of the server.

Both functions are async: the work happens in the child processes, the event loop only moves
bytes. A cancelled caller kills the child and waits for it, shielded, so no ffmpeg outlives
the request.

:func:`encode` turns synthesized PCM16 into OpenAI's speech ``response_format`` values,
each with the Content-Type OpenAI's speech endpoint answers with (:data:`SPEECH_FORMATS`).
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import re
import shutil
import signal
import tempfile
import wave
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from subprocess import DEVNULL, PIPE
from typing import Any

import anyio
from anyio.abc import ByteReceiveStream, Process

__all__ = [
    "CHUNK_BYTES",
    "INPUT_FORMATS",
    "SAMPLE_RATE",
    "SPEECH_FORMATS",
    "AudioError",
    "Probe",
    "check_duration",
    "decode",
    "decode_to",
    "encode",
    "probe",
    "wav_bytes",
]

log = logging.getLogger("talkies.audio")

SAMPLE_RATE = 16000  # the engines' PCM: s16le, mono (spec, "Start and audio contract")
_BYTES_PER_SECOND = SAMPLE_RATE * 2
CHUNK_BYTES = 2 * _BYTES_PER_SECOND  # PCM handed on at a time by decode_to (2 s)

# ffmpeg demuxer names allowed to open an upload: the formats OpenAI's transcription endpoint
# takes (flac, mp3, mp4, mpeg, mpga, m4a, ogg, wav, webm) and a few other plain audio
# containers. Playlist and list demuxers (hls, concat, image2) are left out on purpose.
INPUT_FORMATS = (
    "wav",
    "w64",
    "flac",
    "mp3",
    "ogg",
    "matroska",
    "webm",
    "mov",
    "mp4",
    "m4a",
    "aac",
    "aiff",
    "caf",
    "au",
    "amr",
    "ac3",
    "eac3",
    "asf",
    "avi",
    "mpeg",
    "mpegts",
    "flv",
    "wv",
    "ape",
    "tta",
    "voc",
)

# response_format -> (Content-Type, ffmpeg output arguments). The Content-Types are the ones
# OpenAI's /v1/audio/speech answers with; "opus" is Opus in an Ogg container and "aac" is raw
# ADTS, as OpenAI sends them. wav is written by the standard library and pcm returned as is.
SPEECH_FORMATS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mp3": ("audio/mpeg", ("-c:a", "libmp3lame", "-b:a", "64k", "-f", "mp3")),
    "opus": ("audio/opus", ("-c:a", "libopus", "-b:a", "32k", "-f", "ogg")),
    "aac": ("audio/aac", ("-c:a", "aac", "-b:a", "64k", "-f", "adts")),
    "flac": ("audio/flac", ("-c:a", "flac", "-f", "flac")),
    "wav": ("audio/wav", ()),
    "pcm": ("audio/pcm", ()),
}

_PROBE_TIMEOUT = 30.0  # seconds; a container that takes longer to open is not worth waiting on
_STDERR_KEEP = 4096  # bytes of a child's stderr kept for the log
_READ_SIZE = 1 << 16
# How ffmpeg reports a demuxer that -format_whitelist refused: "[png_pipe @ 0x..] Format not
# on whitelist 'wav,...'".
_NOT_ALLOWED = re.compile(r"\[(\w+) @ 0x[0-9a-f]+\] Format not on whitelist")


class AudioError(ValueError):
    """The audio cannot be used. ``str(error)`` is meant for the client (an HTTP 400 detail)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """What ffprobe found in a file."""

    format_name: str  # ffmpeg's demuxer name(s), e.g. "wav" or "mov,mp4,m4a,3gp,3g2,mj2"
    duration: float | None  # seconds, as the container says (may be absent or approximate)
    audio_streams: int


# -- child processes ---------------------------------------------------------------------------


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        # A server set-up problem, not the client's: not an AudioError.
        raise RuntimeError(f"{name} is not installed (Debian: apt-get install ffmpeg)")
    return path


@asynccontextmanager
async def _child(args: Sequence[str], *, stdin: int = DEVNULL) -> AsyncIterator[Process]:
    """A child process that is killed and reaped however the block ends (cancellation too)."""
    # Shielded: asyncio forks the child before it connects the pipes, and a cancellation
    # landing in between would leave the child killed but not waited for: only asyncio's
    # watcher thread reaps it, later, and not at all once the event loop has ended. Spawning
    # takes milliseconds; the caller's cancellation is seen at the next checkpoint, inside the
    # ``try`` below, which reaps it.
    with anyio.CancelScope(shield=True):
        process = await anyio.open_process(list(args), stdin=stdin, stdout=PIPE, stderr=PIPE)
    try:
        yield process
    finally:
        _kill(process)
        # Shielded: the child must be reaped even when our caller was cancelled.
        with anyio.CancelScope(shield=True):
            await process.aclose()


def _kill(process: Process) -> None:
    """SIGKILL ``process`` unless asyncio has seen it end; killing it again is harmless.

    Not ``process.kill()``: ``Popen.send_signal`` polls the child first, and once the child is
    dead that ``waitpid`` can reap it before asyncio's child watcher does. The watcher then
    logs "Unknown child process pid ..." and reports 255 as the exit status. Until the watcher
    has reaped it, the pid is still this child's (a zombie ignores the signal). asyncio notes
    the reaping on the event loop's next pass, milliseconds at most: far too soon for Linux,
    which hands out pids in turn up to ``pid_max``, to give the pid to a new process.
    """
    if process.returncode is None:
        with suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)


async def _read_tail(stream: ByteReceiveStream | None, keep: bytearray) -> None:
    """Drain ``stream`` (so the child never blocks on a full pipe), keeping its last bytes."""
    if stream is None:
        return
    with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
        while True:
            keep += await stream.receive(_READ_SIZE)
            del keep[:-_STDERR_KEEP]


def _reason(stderr: bytes | bytearray, path: str) -> str:
    """ffmpeg's last error line without the server's path or the ``[demuxer @ 0x..]`` tag."""
    lines = [line.strip() for line in bytes(stderr).decode("utf-8", "replace").splitlines()]
    lines = [line for line in lines if line]
    if not lines:
        return ""
    text = re.sub(r"^\[[^\]]*@ 0x[0-9a-f]+\]\s*", "", lines[-1])
    for name in (f"file:{path}", path):
        text = text.replace(name, "the file")
    return text[:200]


# -- decoding uploads --------------------------------------------------------------------------


def _file_path(path: str | os.PathLike[str]) -> str:
    """An absolute path, checked: a missing or empty file is refused before ffprobe runs."""
    resolved = Path(path).resolve()
    try:
        size = resolved.stat().st_size
    except OSError as exc:
        raise AudioError("the audio file could not be read") from exc
    if not resolved.is_file():
        raise AudioError("the audio file could not be read")
    if size == 0:
        raise AudioError("the audio file is empty")
    return str(resolved)


def _input_args(path: str) -> list[str]:
    # "file:" keeps a name like "concat:a|b" or "http://x" from being read as a protocol.
    return [
        "-protocol_whitelist",
        "file",
        "-format_whitelist",
        ",".join(INPUT_FORMATS),
        "-i",
        f"file:{path}",
    ]


async def probe(path: str | os.PathLike[str]) -> Probe:
    """Open ``path`` with ffprobe; :class:`AudioError` unless it is a container with audio."""
    name = _file_path(path)
    args = [_tool("ffprobe"), "-v", "error", "-hide_banner"]
    args += ["-show_entries", "stream=codec_type:format=format_name,duration", "-of", "json"]
    args += _input_args(name)
    out = bytearray()
    err = bytearray()
    with anyio.move_on_after(_PROBE_TIMEOUT) as timeout:
        async with _child(args) as process, anyio.create_task_group() as tg:
            tg.start_soon(_read_tail, process.stderr, err)
            assert process.stdout is not None
            with suppress(anyio.EndOfStream):
                while True:
                    chunk = await process.stdout.receive(_READ_SIZE)
                    if len(out) < 1 << 20:  # the JSON asked for is a few hundred bytes
                        out += chunk
            status = await process.wait()
    if timeout.cancelled_caught:
        log.info("ffprobe timed out", extra={"seconds": _PROBE_TIMEOUT})
        raise AudioError("the audio file could not be read in time; is it a valid audio file?")
    reason = _reason(err, name)
    if status != 0:
        log.info("ffprobe refused an upload", extra={"status": status, "reason": reason})
        refused = _NOT_ALLOWED.search(bytes(err).decode("utf-8", "replace"))
        if refused is not None:
            kind = refused[1].removesuffix("_pipe")
            raise AudioError(f"the file is not in a supported audio format (it looks like {kind})")
        raise AudioError(
            "the file is not valid audio: it is empty, truncated, corrupt or not an audio format"
        )
    try:
        data: Any = json.loads(out)
        streams = data.get("streams", [])
        fmt = data.get("format", {})
        audio = sum(1 for s in streams if s.get("codec_type") == "audio")
        duration: float | None = None
        with suppress(TypeError, ValueError):
            duration = float(fmt.get("duration"))
        if duration is not None and not math.isfinite(duration):
            duration = None
        result = Probe(str(fmt.get("format_name", "")), duration, audio)
    except (ValueError, AttributeError) as exc:
        log.warning("ffprobe gave output that is not the JSON asked for", exc_info=True)
        raise AudioError("the audio file could not be read") from exc
    if result.audio_streams == 0:
        raise AudioError("the file contains no audio stream")
    return result


def check_duration(info: Probe, max_seconds: float) -> None:
    """:class:`AudioError` when the container says the audio is clearly longer than
    ``max_seconds``, before anything is decoded. Only clearly: a duration some containers
    estimate (a VBR MP3 without a header) may be off by a few percent, so this allows 5% and
    a second; decoding itself stops at the exact limit."""
    if info.duration is not None and info.duration > max_seconds * 1.05 + 1.0:
        raise AudioError(f"the audio is longer than the limit of {max_seconds:g} seconds")


async def decode_to(
    path: str | os.PathLike[str],
    sink: Callable[[bytes], Awaitable[None]],
    *,
    max_seconds: float,
    chunk_bytes: int = CHUNK_BYTES,
    info: Probe | None = None,
) -> int:
    """Decode the first audio stream of ``path`` to 16 kHz mono s16le PCM, handing it to
    ``sink`` in chunks of ``chunk_bytes`` (the last may be shorter; all hold whole samples) as
    ffmpeg makes it; the number of bytes handed over.

    Nothing but the chunk being filled is held here: while ``sink`` waits, ffmpeg's output
    is not read, its pipe fills and ffmpeg waits too. ``info`` is the file's :func:`probe`,
    when the caller made it already. Raises :class:`AudioError` (a message for the client)
    when the file is not audio, cannot be decoded, holds no samples, or is longer than
    ``max_seconds``; decoding stops as soon as the limit is passed (what was handed over
    before stays handed over).
    """
    if not max_seconds > 0 or not math.isfinite(max_seconds):
        raise ValueError(f"max_seconds must be a positive number, got {max_seconds!r}")
    if chunk_bytes < 2 or chunk_bytes % 2:
        raise ValueError("chunk_bytes must be a positive even number")
    if info is None:
        info = await probe(path)
    check_duration(info, max_seconds)
    name = _file_path(path)
    limit = int(max_seconds * SAMPLE_RATE) * 2
    args = [_tool("ffmpeg"), "-nostdin", "-hide_banner", "-loglevel", "error"]
    args += _input_args(name)
    args += ["-map", "0:a:0", "-vn", "-ac", "1", "-ar", str(SAMPLE_RATE)]
    args += ["-c:a", "pcm_s16le", "-f", "s16le", "pipe:1"]
    pending = bytearray()
    err = bytearray()
    total = 0
    too_long = False
    async with _child(args) as process:
        async with anyio.create_task_group() as tg:
            tg.start_soon(_read_tail, process.stderr, err)
            assert process.stdout is not None
            with suppress(anyio.EndOfStream):
                while True:
                    pending += await process.stdout.receive(min(_READ_SIZE, chunk_bytes))
                    if total + len(pending) > limit:
                        too_long = True
                        _kill(process)  # stop decoding now; _child reaps it
                        break
                    if len(pending) >= chunk_bytes:
                        chunk = bytes(pending[:chunk_bytes])
                        del pending[:chunk_bytes]
                        total += len(chunk)
                        await sink(chunk)
        status = None if too_long else await process.wait()
    if too_long:
        raise AudioError(f"the audio is longer than the limit of {max_seconds:g} seconds")
    if status != 0:
        reason = _reason(err, name)
        log.info(
            "ffmpeg failed to decode an upload",
            extra={"status": status, "reason": reason, "format": info.format_name},
        )
        raise AudioError("the audio could not be decoded; the file may be corrupt or truncated")
    del pending[len(pending) - len(pending) % 2 :]
    if pending:
        total += len(pending)
        await sink(bytes(pending))
    if not total:
        raise AudioError("the file contains no audio samples")
    return total


async def decode(path: str | os.PathLike[str], *, max_seconds: float) -> bytes:
    """The first audio stream of ``path`` as 16 kHz mono s16le PCM, whole (for short clips;
    a file transcription streams it instead: :func:`decode_to`).

    Raises :class:`AudioError` as :func:`decode_to` does; at most ``max_seconds`` of PCM is
    ever held.
    """
    pcm = bytearray()

    async def keep(chunk: bytes) -> None:
        pcm.extend(chunk)

    await decode_to(path, keep, max_seconds=max_seconds, chunk_bytes=_READ_SIZE)
    return bytes(pcm)


# -- encoding synthesized speech ---------------------------------------------------------------


def wav_bytes(pcm: bytes, sample_rate: int) -> bytes:
    """Mono s16le ``pcm`` at ``sample_rate`` as the bytes of a WAV file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm)
    return buffer.getvalue()


async def encode(pcm: bytes, sample_rate: int, fmt: str) -> tuple[bytes, str]:
    """Mono s16le ``pcm`` at ``sample_rate`` as ``fmt`` (OpenAI's speech ``response_format``:
    mp3, opus, aac, flac, wav or pcm), with its Content-Type.

    An unknown ``fmt`` raises :class:`AudioError` (a client error). ffmpeg writes to a
    temporary file rather than a pipe so that it can seek back and finish its headers (FLAC's
    sample count, the MP3 Xing/LAME frame with the encoder delay for gapless decoding).
    """
    if fmt not in SPEECH_FORMATS:
        raise AudioError(
            f"unsupported response_format {fmt!r}; use one of {', '.join(SPEECH_FORMATS)}"
        )
    if not 1000 <= sample_rate <= 384000:
        raise ValueError(f"sample_rate out of range: {sample_rate}")
    pcm = pcm[: len(pcm) - len(pcm) % 2]
    content_type, codec = SPEECH_FORMATS[fmt]
    if fmt == "pcm":
        return pcm, content_type
    if fmt == "wav":
        return wav_bytes(pcm, sample_rate), content_type
    with tempfile.TemporaryDirectory(prefix="talkies-encode-") as folder:
        target = Path(folder) / f"speech.{fmt}"
        args = [_tool("ffmpeg"), "-nostdin", "-hide_banner", "-loglevel", "error"]
        args += ["-f", "s16le", "-ar", str(sample_rate), "-ac", "1", "-i", "pipe:0"]
        args += [*codec, "-y", f"file:{target}"]
        err = bytearray()
        async with _child(args, stdin=PIPE) as process:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_read_tail, process.stderr, err)
                tg.start_soon(_read_tail, process.stdout, bytearray())
                assert process.stdin is not None
                with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                    for start in range(0, len(pcm), _READ_SIZE):
                        await process.stdin.send(pcm[start : start + _READ_SIZE])
                await process.stdin.aclose()
            status = await process.wait()
        if status != 0:
            reason = _reason(err, str(target))
            log.error("ffmpeg failed to encode speech", extra={"format": fmt, "reason": reason})
            raise RuntimeError(f"ffmpeg could not encode {fmt}: {reason}")
        data = await anyio.Path(target).read_bytes()
    return data, content_type
