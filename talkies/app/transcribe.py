"""``POST /v1/audio/transcriptions``: OpenAI-compatible file transcription on every engine.

Spec ("Sherpa-ONNX and Vosk"): the upload (or a staged file) is normalized to 16 kHz mono PCM
with ffmpeg and fed through an isolated stream of the chosen engine to completion; whisper
decodes the whole file at once. The order of work keeps slots for decoding only:

1. the form is parsed as it arrives (the file to a temporary file, within the upload cap);
2. fields are checked (400/404 before any audio work);
3. ffmpeg probes and decodes (400 for anything that is not audio);
4. a slot is taken from the model's pool, the same one streams use (429 when full, 409 when
   streams pin another model), and the engine transcribes in a worker thread;
5. the transcript is rendered in the requested format.

A client that leaves during the upload, the decode or the transcription stops the work: the
host cancels the handler, the engine's transcription is told to stop (and is waited for, so
the model never runs more transcriptions than it has slots), and the slot is freed.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import anyio.lowlevel
import anyio.to_thread

from .. import audio, transcripts
from ..engines import catalogue
from ..engines.base import (
    EngineUnavailable,
    FileTranscriber,
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
    "acquire_model",
    "asr_entry",
    "checked_language",
    "decode_audio",
    "run_transcription",
    "transcribe_pcm",
    "transcription_route",
]

log = logging.getLogger("talkies.app")

_GRANULARITIES = frozenset({"segment", "word"})


async def acquire_model(pool: ModelPool, slug: str) -> tuple[AnyModel, Callable[[], None]]:
    """A slot and the loaded model, with the pool's refusals as HTTP errors."""
    try:
        return await pool.acquire(slug)
    except (Refusal, EngineUnavailable) as exc:  # (a ModelConflict is a Refusal)
        raise http_error(exc) from None


async def run_transcription(
    model: FileTranscriber, pcm: bytes, request: TranscriptionRequest
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
            transcript = await anyio.to_thread.run_sync(model.transcribe, pcm, request)
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


async def decode_audio(source: Path, *, max_seconds: float, param: str) -> bytes:
    """16 kHz mono PCM16 of an audio file; 400 for anything that is not audio."""
    try:
        return await audio.decode(source, max_seconds=max_seconds)
    except audio.AudioError as exc:
        raise HttpError(400, str(exc), code="invalid_audio", param=param) from None


async def transcribe_pcm(
    pool: ModelPool, entry: ModelEntry, pcm: bytes, options: TranscriptionRequest
) -> Transcript:
    """The transcript, on a slot of the model's pool (429 when full, 409 when a stream pins
    another model), taken only now that the audio is decoded."""
    slug = entry.slug
    model, release = await acquire_model(pool, slug)
    try:
        if not isinstance(model, FileTranscriber):
            raise HttpError(400, f"model {slug!r} does not transcribe files", param="model")
        try:
            transcript = await run_transcription(model, pcm, options)
        except Refusal as exc:
            raise http_error(exc) from None
        except TranscriptionCancelled:
            raise HttpError(499, "the client closed the request") from None
        except Exception as exc:
            log.exception("transcription failed", extra={"model": slug})
            raise HttpError(500, f"the speech engine failed: {exc}") from None
    finally:
        release()
    if transcript.language is None:  # Vosk and sherpa cannot tell: the asked or set one
        default = entry.options.get("language")
        known = options.language or (default if isinstance(default, str) else None)
        transcript = replace(transcript, language=known)
    return transcript


async def transcription_route(
    request: Request, *, pool: ModelPool, files: FileStore, tmp_dir: Path, max_seconds: float
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
        pcm = await decode_audio(source, max_seconds=max_seconds, param="file")
        form.close()  # the decoded audio is all that is needed now
        transcript = await transcribe_pcm(pool, entry, pcm, options)
        body, content_type = transcripts.render(
            transcript, fmt, timestamp_granularities=sorted(granularities)
        )
        return Response(status=200, headers=[(b"content-type", content_type.encode())], body=body)
    finally:
        form.close()
