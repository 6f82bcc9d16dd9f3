"""``POST /v1/audio/transcriptions``: OpenAI-compatible file transcription on every engine.

Spec ("Sherpa-ONNX and Vosk"): the upload (or a staged file) is normalized to 16 kHz mono PCM
with ffmpeg and fed through an isolated stream of the chosen engine to completion; whisper
decodes the whole file, a window at a time. The order of work keeps memory bounded and slots
for decoding only:

1. the form is parsed as it arrives (the file to a temporary file, within the upload cap);
2. fields are checked (400/404 before any audio work);
3. ffprobe opens the file (400 for anything that is not audio, or clearly too long);
4. a slot is taken from the model's pool, the same one streams use (429 when full, 409 when
   streams pin another model);
5. a turn among the server's file decodes (``TALKIES_FILE_MAX_CONCURRENCY``): a request
   past the bound waits here, holding its slot, until one ends;
6. ffmpeg decodes the file into a :class:`PcmChannel` that the engine's worker thread reads
   (``FileTranscriber.transcribe``), :data:`CHANNEL_DEPTH` chunks of 2 s at most waiting:
   ffmpeg runs only as fast as the engine takes the audio, and the file is never whole in
   memory, whatever its length;
7. the transcript is rendered in the requested format.

A client that leaves during the upload, the decode or the transcription stops the work: the
host cancels the handler, ffmpeg is killed, the engine's transcription is told to stop (and
is waited for, so the model never runs more transcriptions than it has slots), and the slot
is freed. A file that turns out not to decode, or to be too long, partway stops the engine
the same way and answers 400.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from .. import audio, transcripts
from ..engines import catalogue
from ..engines.base import (
    EngineUnavailable,
    FileTranscriber,
    PcmSource,
    Refusal,
    Transcript,
    TranscriptionCancelled,
    TranscriptionRequest,
)
from ..engines.pool import AnyModel, ModelPool
from ..engines.supply.entry import ModelEntry
from ..protocol.messages import normalize_language
from .forms import Form, read_form
from .http import HttpError, Request, Response
from .refusals import http_error

if TYPE_CHECKING:
    from .files import FileStore

__all__ = [
    "CHANNEL_DEPTH",
    "PcmChannel",
    "Producer",
    "acquire_model",
    "asr_entry",
    "checked_language",
    "probe_audio",
    "run_transcription",
    "transcribe_audio",
    "transcribe_file",
    "transcription_route",
]

log = logging.getLogger("talkies.app")

_GRANULARITIES = frozenset({"segment", "word"})

# Chunks of audio.CHUNK_BYTES (2 s) that may wait between ffmpeg and the engine. With the
# part of a chunk ffmpeg's reader is filling, the one it is handing over, the one the engine
# holds and (for an engine process) its pickled copy on the way, a transcription holds fewer
# than CHANNEL_DEPTH + 4 chunks of PCM in the server (384 KB), whatever the file's length.
CHANNEL_DEPTH = 2

# Runs the decoder, handing each chunk of PCM to the callable it is given; raises HttpError
# (400) when the audio turns out to be unusable.
Producer = Callable[[Callable[[bytes], Awaitable[None]]], Awaitable[object]]


class PcmChannel:
    """A file's PCM on its way from the decoder (on the event loop) to the engine (in its
    worker thread), at most ``depth`` chunks waiting: a decoder ahead of the engine waits in
    :meth:`put`. The engine iterates the channel (a :data:`~talkies.engines.base.PcmSource`);
    iteration ends with the audio, or raises :class:`TranscriptionCancelled` when the decoder
    stopped short of its end (the client left, the file failed to decode)."""

    def __init__(self, depth: int = CHANNEL_DEPTH) -> None:
        self._send, self._receive = anyio.create_memory_object_stream[bytes](depth)
        self._complete = False
        self.held = 0  # bytes put and not yet taken by the engine
        self.most_held = 0  # the most there ever were (tests check the bound)

    async def put(self, chunk: bytes) -> None:
        self.held += len(chunk)
        self.most_held = max(self.most_held, self.held)
        await self._send.send(chunk)

    def close(self, *, complete: bool) -> None:
        """No more chunks; ``complete``: they were the whole audio."""
        self._complete = complete
        self._send.close()

    async def _take(self) -> bytes | None:
        try:
            chunk = await self._receive.receive()
        except anyio.EndOfStream:
            return None
        self.held -= len(chunk)
        return chunk

    def __iter__(self) -> Iterator[bytes]:
        """The engine's side: blocking, from a worker thread started by anyio."""
        while True:
            try:
                chunk = anyio.from_thread.run(self._take)
            except (Exception, KeyboardInterrupt, SystemExit):
                raise
            except BaseException:
                # anyio runs _take in the caller's cancel scope: a client that left cancels
                # it, and the cancellation (asyncio's CancelledError, a BaseException) would
                # pass by an engine's ``except Exception`` and leave it mid-call.
                raise TranscriptionCancelled("the transcription was canceled") from None
            if chunk is None:
                if self._complete:
                    return
                raise TranscriptionCancelled("the audio stopped before its end")
            yield chunk

    def discard(self) -> None:
        """Drop what still waits (the transcription is over)."""
        self._receive.close()


async def acquire_model(pool: ModelPool, slug: str) -> tuple[AnyModel, Callable[[], None]]:
    """A slot and the loaded model, with the pool's refusals as HTTP errors."""
    try:
        return await pool.acquire(slug)
    except (Refusal, EngineUnavailable) as exc:  # (a ModelConflict is a Refusal)
        raise http_error(exc) from None


async def run_transcription(
    model: FileTranscriber, audio: PcmSource, request: TranscriptionRequest
) -> Transcript:
    """``model.transcribe`` in a worker thread. If the caller is cancelled (the client left),
    the transcription is told to stop, and this returns only once it has stopped, or at once
    if it never started (a caller cancelled before the thread was handed the work)."""
    cancel = request.cancel
    assert cancel is not None

    async def stop_when_cancelled() -> None:
        try:
            await anyio.sleep_forever()
        finally:
            cancel.set()  # cancelled with the caller, or at the end (the work is over then)

    failure: Exception | None = None
    async with anyio.create_task_group() as group:
        group.start_soon(stop_when_cancelled)
        try:
            # Not abandoned on cancel: a cancelled caller waits here for the thread to stop,
            # so its slot is released only once the engine is done with it.
            transcript = await anyio.to_thread.run_sync(model.transcribe, audio, request)
        except Exception as exc:  # raised below as itself, not in an exception group
            failure = exc
        finally:
            group.cancel_scope.cancel()
    if failure is not None:
        # A caller that was cancelled gets its cancellation, not the engine's answer to it.
        await anyio.lowlevel.checkpoint_if_cancelled()
        raise failure
    return transcript


def _field(form: Form, name: str) -> str | None:
    value = form.value(name)
    return value if value not in (None, "") else None


def _options(form: Form, cancel: threading.Event) -> tuple[str, TranscriptionRequest, set[str]]:
    fmt = _field(form, "response_format") or "json"
    if fmt not in transcripts.RESPONSE_FORMATS:
        choices = ", ".join(transcripts.RESPONSE_FORMATS)
        raise HttpError(400, f"response_format must be one of {choices}", param="response_format")
    granularities = set(form.values("timestamp_granularities[]", "timestamp_granularities"))
    unknown = granularities - _GRANULARITIES
    if unknown:
        raise HttpError(
            400,
            f"timestamp_granularities must be 'segment' or 'word', got {sorted(unknown)}",
            param="timestamp_granularities",
        )
    temperature = 0.0
    raw = _field(form, "temperature")
    if raw is not None:
        try:
            temperature = float(raw)
        except ValueError:
            temperature = math.nan
        if not (math.isfinite(temperature) and 0.0 <= temperature <= 1.0):
            raise HttpError(400, "temperature must be a number from 0 to 1", param="temperature")
    request = TranscriptionRequest(
        language=checked_language(_field(form, "language")),
        prompt=_field(form, "prompt"),
        temperature=temperature,
        word_timestamps="word" in granularities,
        cancel=cancel,
    )
    return fmt, request, granularities


def checked_language(language: str | None) -> str | None:
    """A request's language, normalized ("auto" or a code such as "en"); None when not given.
    Anything else is a 400 ``invalid_language``."""
    if language is None:
        return None
    normalized = normalize_language(language)
    if normalized is None:
        raise HttpError(
            400,
            f"language must be 'auto' or a language code such as 'en', got {language!r}",
            code="invalid_language",
            param="language",
        )
    return normalized


def asr_entry(pool: ModelPool, slug: str) -> ModelEntry:
    """The registry entry of a model that transcribes files: 404 or 400 if not."""
    entry = pool.entry(slug)
    if entry is None:
        raise HttpError(404, f"unknown model {slug!r}", code="model_not_found", param="model")
    if not catalogue.executor_of(entry).transcribes_files:  # 400, not 500
        raise HttpError(
            400,
            f"model {slug!r} ({entry.executor}) does not transcribe files",
            code="unsupported_model",
            param="model",
        )
    return entry


async def probe_audio(source: Path, *, max_seconds: float, param: str) -> audio.Probe:
    """What ffprobe finds in an audio file; 400 for anything that is not audio, or that says
    it is longer than ``max_seconds``."""
    try:
        info = await audio.probe(source)
        audio.check_duration(info, max_seconds)
    except audio.AudioError as exc:
        raise HttpError(400, str(exc), code="invalid_audio", param=param) from None
    return info


async def transcribe_file(
    pool: ModelPool,
    entry: ModelEntry,
    source: Path,
    options: TranscriptionRequest,
    *,
    decodes: anyio.CapacityLimiter,
    max_seconds: float,
    param: str,
) -> Transcript:
    """The transcript of an audio file, ffmpeg decoding it straight into the engine
    (:func:`transcribe_audio`); 400 before any slot for a file that is not audio."""
    info = await probe_audio(source, max_seconds=max_seconds, param=param)

    async def produce(put: Callable[[bytes], Awaitable[None]]) -> None:
        try:
            await audio.decode_to(source, put, max_seconds=max_seconds, info=info)
        except audio.AudioError as exc:
            raise HttpError(400, str(exc), code="invalid_audio", param=param) from None

    return await transcribe_audio(pool, entry, produce, options, decodes=decodes)


async def transcribe_audio(
    pool: ModelPool,
    entry: ModelEntry,
    produce: Producer,
    options: TranscriptionRequest,
    *,
    decodes: anyio.CapacityLimiter,
) -> Transcript:
    """The transcript of the audio ``produce`` decodes, on a slot of the model's pool (429
    when full, 409 when a stream pins another model) and a turn among ``decodes`` (waited
    for), both taken before decoding starts."""
    slug = entry.slug
    model, release = await acquire_model(pool, slug)
    try:
        if not isinstance(model, FileTranscriber):
            raise HttpError(400, f"model {slug!r} does not transcribe files", param="model")
        async with decodes:
            transcript = await _streamed(model, produce, options, slug=slug)
    finally:
        release()
    if transcript.language is None:  # Vosk and sherpa cannot tell: the asked or set one
        default = entry.options.get("language")
        known = options.language or (default if isinstance(default, str) else None)
        transcript = replace(transcript, language=known)
    return transcript


async def _streamed(
    model: FileTranscriber, produce: Producer, options: TranscriptionRequest, *, slug: str
) -> Transcript:
    """``produce`` into a :class:`PcmChannel`, the engine reading it; the decoder's refusal
    (400) when the audio stopped short, else the engine's answer as an HTTP error."""
    channel = PcmChannel()
    stopped: Exception | None = None  # why the decoder stopped short
    failure: Exception | None = None
    transcript: Transcript | None = None

    async def decode() -> None:
        nonlocal stopped
        complete = False
        try:
            await produce(channel.put)
            complete = True
        except Exception as exc:  # raised below, once the engine has stopped
            stopped = exc
        finally:
            channel.close(complete=complete)

    async with anyio.create_task_group() as group:
        group.start_soon(decode)
        try:
            transcript = await run_transcription(model, channel, options)
        except Exception as exc:  # raised below as itself, not in an exception group
            failure = exc
        finally:
            group.cancel_scope.cancel()  # the engine is done: so is the decoder
            channel.discard()
    if stopped is not None:
        if isinstance(stopped, HttpError):
            raise stopped
        log.error("decoding an upload failed", exc_info=stopped, extra={"model": slug})
        raise HttpError(500, "the audio could not be decoded on this server") from None
    if isinstance(failure, Refusal):
        raise http_error(failure) from None
    if isinstance(failure, TranscriptionCancelled):
        raise HttpError(499, "the client closed the request") from None
    if failure is not None:
        log.error("transcription failed", exc_info=failure, extra={"model": slug})
        raise HttpError(500, f"the speech engine failed: {failure}") from None
    assert transcript is not None
    return transcript


async def transcription_route(
    request: Request,
    *,
    pool: ModelPool,
    files: FileStore,
    tmp_dir: Path,
    max_seconds: float,
    decodes: anyio.CapacityLimiter,
) -> Response:
    form = await read_form(request, tmp_dir=tmp_dir)
    try:
        slug = _field(form, "model")
        if slug is None:
            raise HttpError(400, "the 'model' field is required", param="model")
        entry = asr_entry(pool, slug)
        cancel = threading.Event()
        fmt, options, granularities = _options(form, cancel)
        upload = form.files.get("file")
        staged = _field(form, "file_path")
        if (upload is None) == (staged is None):
            raise HttpError(400, "give exactly one of 'file' and 'file_path'", param="file")
        source = upload.path if upload is not None else files.path_for_request(str(staged))
        transcript = await transcribe_file(
            pool, entry, source, options, decodes=decodes, max_seconds=max_seconds, param="file"
        )
        body, content_type = transcripts.render(
            transcript, fmt, timestamp_granularities=sorted(granularities)
        )
        return Response(status=200, headers=[(b"content-type", content_type.encode())], body=body)
    finally:
        form.close()
