"""``POST /v1/audio/speech`` (OpenAI's shape) and ``GET /v1/audio/voices?model=``.

Spec ("Qwen3 PCM over HTTP"): with a Qwen3 model and ``response_format: "pcm"`` the body is
raw s16le mono PCM at 24 kHz, ``application/octet-stream`` with ``X-Sample-Rate: 24000``, sent
chunk by chunk (HTTP/1.1 chunked transfer) as the codec decodes it: each chunk is
``TALKIES_QWEN3_STREAM_CHUNK_SIZE`` codec steps, written the moment it exists. Every other
format, and every Kokoro request, is synthesized whole and then encoded (ffmpeg for flac, mp3,
opus and aac).

Checks come before any audio: the body, the model (404 unknown, 400 not a speech model), the
format, what every model checks (input length, OpenAI's speed range), then a slot from the
model's pool (429 full, 409 another model pinned; the model loaded if it is not), then the
model's own checks (voice, its own speed range). The first chunk is awaited before the 200 is
committed, so a failure at the start of synthesis is still a clean 4xx/5xx.

A streamed response owns its slot until its body is closed: the host closes it when the client
has everything, or when the client leaves, which stops the synthesis within one codec step.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any, cast

import anyio

from .. import audio, metrics
from ..engines import catalogue
from ..engines.base import EngineLost
from ..engines.pool import ModelPool
from ..engines.tts.base import (
    API_SPEED_RANGE,
    SpeechError,
    SpeechModel,
    SpeechRequest,
    SpeechStream,
    SynthesisFailed,
    check_request,
)
from .http import HttpError, Request, Response, json_response
from .refusals import http_error
from .transcribe import acquire_model

__all__ = ["speech_route", "synthesize", "voices_route"]

log = logging.getLogger("talkies.app")

_MAX_BODY = 65536  # 4096 characters of input, as UTF-8 and JSON-escaped, fit easily
_SURFACE = "http"  # the metrics' surface label: this route and MCP's speak


def _ended(outcome: str, code: str = "", *, pcm_bytes: int = 0, rate: int = 0) -> None:
    """Count a synthesis that took a slot: ``end``, ``peer_gone`` or its error code."""
    metrics.SYNTHESES.labels(_SURFACE, outcome, code).inc()
    if pcm_bytes and rate:
        metrics.SPEECH_AUDIO_SECONDS.labels(_SURFACE).inc(pcm_bytes / 2 / rate)


_FIELDS = {
    "model",
    "input",
    "voice",
    "response_format",
    "speed",
    "instructions",
    "language",
    "stream_format",
}


def _text(doc: dict[str, Any], name: str, *, required: bool) -> str | None:
    value = doc.get(name)
    if value is None:
        if required:
            raise HttpError(400, f"the {name!r} field is required", param=name)
        return None
    if not isinstance(value, str):
        raise HttpError(400, f"the {name!r} field must be a string", param=name)
    return value


def _speech_model(pool: ModelPool, slug: str) -> None:
    entry = pool.entry(slug)
    if entry is None:
        raise HttpError(404, f"unknown model {slug!r}", code="model_not_found", param="model")
    if catalogue.executor_of(entry).kind != "tts":
        raise HttpError(
            400,
            f"model {slug!r} ({entry.executor}) is not a speech model",
            code="unsupported_model",
            param="model",
        )


async def _parse(request: Request) -> tuple[str, str, SpeechRequest]:
    raw = await request.body.read(limit=_MAX_BODY)
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise HttpError(400, "the body must be a JSON object") from None
    except RecursionError:  # arrays or objects nested past the interpreter's stack
        raise HttpError(400, "the body is nested too deeply") from None
    if not isinstance(doc, dict):
        raise HttpError(400, "the body must be a JSON object")
    unknown = sorted(set(doc) - _FIELDS)
    if unknown:
        raise HttpError(400, f"unknown field {unknown[0]!r}", param=unknown[0])
    slug = _text(doc, "model", required=True)
    text = _text(doc, "input", required=True)
    voice = _text(doc, "voice", required=True)
    # OpenAI's stream_format: "audio" (its default) is what this route does, the audio
    # streamed as it is made; "sse" (base64 audio in server-sent events) is not offered.
    stream_format = _text(doc, "stream_format", required=False)
    if stream_format not in (None, "audio"):
        raise HttpError(
            400,
            "stream_format must be 'audio': the audio is streamed as it is made; "
            "server-sent events are not offered",
            param="stream_format",
        )
    fmt = _text(doc, "response_format", required=False) or "mp3"
    if fmt not in audio.SPEECH_FORMATS:
        choices = ", ".join(audio.SPEECH_FORMATS)
        raise HttpError(400, f"response_format must be one of {choices}", param="response_format")
    speed = doc.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float):
        raise HttpError(400, "speed must be a number", param="speed")
    try:
        speed = float(speed)
    except OverflowError:  # an integer of 400 digits: a number, past every float
        speed = math.inf if speed > 0 else -math.inf
    # Out of range (infinities and NaN too) is check_request's to refuse, in _start.
    assert slug is not None and text is not None and voice is not None
    speech = SpeechRequest(
        text=text,
        voice=voice,
        speed=speed,
        instructions=_text(doc, "instructions", required=False),
        language=_text(doc, "language", required=False),
    )
    return slug, fmt, speech


class _StreamedSpeech:
    """A response body over a synthesis: its chunks as they come, the slot released exactly
    once when the host closes it (done, failed or the client gone), even if never read."""

    def __init__(
        self, first: bytes, stream: SpeechStream, release: Callable[[], None], rate: int
    ) -> None:
        self._first: bytes | None = first
        self._stream = stream
        self._release = release
        self._closed = False
        self._rate = rate
        self._sent = len(first)
        self._outcome = ("peer_gone", "")  # until the synthesis ends or fails

    def __aiter__(self) -> _StreamedSpeech:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not None:
            first, self._first = self._first, None
            return first
        if self._closed:
            raise StopAsyncIteration
        try:
            chunk = await self._stream.__anext__()
        except StopAsyncIteration:
            self._outcome = ("end", "")
            raise
        except SynthesisFailed:
            self._outcome = ("server_error", "server_error")
            raise
        self._sent += len(chunk)
        return chunk

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._stream.aclose()
        finally:
            self._release()
            _ended(*self._outcome, pcm_bytes=self._sent, rate=self._rate)


async def _start(
    pool: ModelPool, slug: str, speech: SpeechRequest, *, chunk_steps: int
) -> tuple[SpeechModel, SpeechStream, bytes, Callable[[], None]]:
    """A slot, the model's own checks, and the synthesis up to its first chunk (so an error
    at the start is still a clean refusal). The caller owns the stream and the slot."""
    _speech_model(pool, slug)
    try:
        # What every model checks (input, OpenAI's speed range), before a slot or a load: a
        # bad request is a 400 whether or not its model can be loaded.
        check_request(speech, speed_range=API_SPEED_RANGE)
    except SpeechError as exc:
        raise http_error(exc) from None
    started = time.monotonic()
    try:
        loaded, release = await acquire_model(pool, slug)
    except HttpError as exc:
        _ended(exc.code or "error", exc.code or "error")
        raise
    model = cast(SpeechModel, loaded)  # a TTS entry's executor loads a speech model
    try:
        stream = await model.synthesize(speech, chunk_steps=chunk_steps)  # validates first
    except SpeechError as exc:
        release()
        error = http_error(exc)
        _ended(error.code or "error", error.code or "error")
        raise error from None
    except (EngineLost, SynthesisFailed) as exc:
        # The engine process died or hung before the synthesis began (its validation is a
        # call to it): a 500 in OpenAI's shape, not a dropped connection; the next request
        # loads a fresh engine.
        release()
        _ended("server_error", "server_error")
        raise HttpError(500, str(exc), code="server_error") from None
    except BaseException:
        release()
        _ended("peer_gone")
        raise
    try:
        first = await anext(stream, b"")
    except BaseException as exc:
        await stream.aclose()
        release()
        if isinstance(exc, SpeechError):
            error = http_error(exc)
            _ended(error.code or "error", error.code or "error")
            raise error from None
        if isinstance(exc, SynthesisFailed):
            _ended("server_error", "server_error")
            raise HttpError(500, str(exc), code="server_error") from None
        _ended("peer_gone")
        raise
    metrics.FIRST_AUDIO_SECONDS.labels(_SURFACE).observe(time.monotonic() - started)
    return model, stream, first, release


async def _rest(
    stream: SpeechStream, first: bytes, release: Callable[[], None], rate: int
) -> bytes:
    """Every chunk after ``first``; then the stream is closed and the slot released."""
    chunks = [first]
    outcome = ("peer_gone", "")
    try:
        async for chunk in stream:
            chunks.append(chunk)
        outcome = ("end", "")
    except SynthesisFailed as exc:
        outcome = ("server_error", "server_error")
        raise HttpError(500, str(exc), code="server_error") from None
    finally:
        await stream.aclose()
        release()
        _ended(*outcome, pcm_bytes=sum(map(len, chunks)), rate=rate)
    return b"".join(chunks)


async def _encode(pcm: bytes, model: SpeechModel, fmt: str) -> tuple[bytes, str]:
    data, content_type = await audio.encode(pcm, model.sample_rate, fmt)
    if fmt == "pcm":
        content_type = "application/octet-stream"  # as the streamed PCM: raw, no header
    return data, content_type


async def synthesize(
    pool: ModelPool, slug: str, speech: SpeechRequest, fmt: str, *, chunk_steps: int
) -> tuple[bytes, str, int]:
    """A whole utterance, encoded: (data, content type, sample rate). For MCP's ``speak``."""
    model, stream, first, release = await _start(pool, slug, speech, chunk_steps=chunk_steps)
    pcm = await _rest(stream, first, release, model.sample_rate)
    data, content_type = await _encode(pcm, model, fmt)
    return data, content_type, model.sample_rate


async def speech_route(request: Request, *, pool: ModelPool, chunk_steps: int) -> Response:
    slug, fmt, speech = await _parse(request)
    model, stream, first, release = await _start(pool, slug, speech, chunk_steps=chunk_steps)
    headers = [(b"x-sample-rate", str(model.sample_rate).encode())]
    if model.streaming and fmt == "pcm":
        # The body owns the stream, and the slot, from here on.
        headers.insert(0, (b"content-type", b"application/octet-stream"))
        body = _StreamedSpeech(first, stream, release, model.sample_rate)
        return Response(status=200, headers=headers, body=body)
    pcm = await _rest(stream, first, release, model.sample_rate)
    data, content_type = await _encode(pcm, model, fmt)
    headers.insert(0, (b"content-type", content_type.encode()))
    return Response(status=200, headers=headers, body=data)


async def voices_route(request: Request, *, pool: ModelPool) -> Response:
    slug = (request.query_params().get("model") or [""])[-1]
    if not slug:
        speech_models = [
            entry.slug
            for entry in map(pool.entry, pool.slugs())
            if entry is not None and catalogue.executor_of(entry).kind == "tts"
        ]
        raise HttpError(
            400,
            f"give ?model= one of: {', '.join(speech_models) or 'none configured'}",
            param="model",
        )
    _speech_model(pool, slug)
    loaded = pool.peek(slug)
    if loaded is None:  # load it (that needs a slot for the moment)
        loaded, release = await acquire_model(pool, slug)
        release()
    try:
        # A worker thread: for a model in an engine process this is a call to it.
        voices = await anyio.to_thread.run_sync(cast(SpeechModel, loaded).voices)
    except EngineLost:
        # Its engine process died while idle (found by calling it): once more, on the
        # engine the pool loads in its place, as a speech request would load it.
        loaded, release = await acquire_model(pool, slug)
        release()
        try:
            voices = await anyio.to_thread.run_sync(cast(SpeechModel, loaded).voices)
        except EngineLost as exc:
            raise HttpError(500, str(exc), code="server_error") from None
    return json_response(200, {"object": "list", "model": slug, "voices": voices})
