"""Talkies' MCP tools: their arguments, the shape of their results, and what they run.

- ``transcribe``: a staged file (``file_path``, as the HTTP form field takes it) or base64
  audio; the same decode, model checks and slot (the model's per-model pool, spec: "The same
  per-model pool also counts HTTP ASR, MCP ASR, and TTS requests") as
  ``POST /v1/audio/transcriptions``; text, and ``verbose_json``'s fields as structured content;
- ``speak``: the speech route's synthesis, as WAV audio content;
- ``list_models``: the rows of ``GET /v1/models``.

Every check raises the :class:`HttpError` the HTTP route would (:mod:`.mcp_tool` turns it
into a tool error). Base64 audio is decoded a slice at a time into a file in
``<data_dir>/tmp`` (never whole in memory, as text or bytes, beside the JSON-RPC message that
carries it) and takes the HTTP route's bounded path from there: the same probe, slot, turn
among the server's decodes and ffmpeg streaming into the engine; the file is removed when the
transcription ends.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import anyio.lowlevel
import anyio.to_thread
from pydantic import BaseModel, Field

from .. import transcripts
from ..config import Settings
from ..engines.base import TranscriptionRequest
from ..engines.pool import ModelPool
from ..engines.supply.builtin import DEFAULT_MODEL, DEFAULT_SPEECH_MODEL
from ..engines.tts.base import SpeechRequest
from .files import FileStore
from .http import HttpError
from .mcp_tool import McpTool, StrictArguments, ToolResult
from .models import model_rows
from .speech import synthesize
from .transcribe import asr_entry, checked_language, transcribe_file

__all__ = [
    "ListModelsArguments",
    "ModelList",
    "SpeakArguments",
    "Speech",
    "SpeechTools",
    "TranscribeArguments",
    "Transcription",
]


class TranscribeArguments(StrictArguments):
    file_path: str | None = Field(
        default=None,
        description=(
            "A staged file: its path under the server's files store, as PUT /v1/files/{path} "
            "stored it. Give this or audio_base64."
        ),
    )
    audio_base64: str | None = Field(
        default=None,
        description=(
            "The audio file itself (wav, mp3, flac, ogg, webm, m4a, ...), base64-encoded; "
            "a data: URL is accepted too. Give this or file_path."
        ),
    )
    model: str = Field(default=DEFAULT_MODEL, description="The ASR model's id (see list_models).")
    language: str | None = Field(
        default=None,
        description="'auto' or a language code such as 'en'; default: the model's own.",
    )
    prompt: str | None = Field(
        default=None, description="Text that conditions the decoder (Whisper's initial prompt)."
    )
    word_timestamps: bool = Field(
        default=False, description="Also return every word with its start and end."
    )


class _Segment(BaseModel):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class _TimedWord(BaseModel):
    word: str
    start: float
    end: float


class Transcription(BaseModel):
    """OpenAI's ``verbose_json`` transcription, and the model that made it."""

    task: str
    language: str = Field(description="The language's English name in lower case, as OpenAI.")
    duration: float = Field(description="Seconds of audio.")
    text: str
    segments: list[_Segment]
    words: list[_TimedWord] | None = Field(
        default=None, description="Present when word_timestamps was asked for."
    )
    model: str


class ListModelsArguments(StrictArguments):
    pass


class SpeakArguments(StrictArguments):
    text: str = Field(description="What to say (at most 4096 characters).")
    model: str = Field(
        default=DEFAULT_SPEECH_MODEL, description="The speech model's id (see list_models)."
    )
    voice: str = Field(default="alloy", description="A voice of that model.")
    speed: float = Field(default=1.0, description="1 is the model's own pace.")
    language: str | None = Field(default=None, description="A language code such as 'en'.")


class Speech(BaseModel):
    """What ``speak`` made: the audio itself is the result's audio content (WAV)."""

    model: str
    voice: str
    format: str
    sample_rate: int
    seconds: float
    bytes: int


class _ModelRow(BaseModel):
    id: str
    object: str
    owned_by: str
    executor: str
    streaming: bool
    source: str
    downloaded: bool
    loaded: bool
    in_use: int
    max_concurrency: int
    pinned: bool


class ModelList(BaseModel):
    """The body of GET /v1/models."""

    object: str
    data: list[_ModelRow]


# -- base64 audio ------------------------------------------------------------------------------

_BASE64_SLICE = 1 << 20  # characters of base64 decoded at a time
_DATA_URL_HEAD = 1024  # a data: URL's "data:<type>;base64," is found within this many


def _invalid_base64(message: str = "audio_base64 is not valid base64") -> HttpError:
    return HttpError(400, message, code="invalid_base64", param="audio_base64")


def write_base64(text: str, out: BinaryIO, *, limit: int) -> int:
    """Decode ``text`` (base64, or a ``data:`` URL of it; MIME line breaks allowed) into
    ``out``, a slice of :data:`_BASE64_SLICE` characters at a time, so that neither the
    decoded bytes nor a copy of the text is ever whole in memory; the number of bytes
    written. 400 for text that is not base64 (as strict as decoding it whole: no character
    outside the alphabet, padding only at the end), 413 past ``limit`` decoded bytes.
    Blocking: call it from a worker thread."""
    start, end = 0, len(text)
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if text.startswith("data:", start, end):  # a data: URL, as browsers write files
        comma = text.find(",", start, min(end, start + _DATA_URL_HEAD))
        if comma < 0 or not text[start:comma].endswith(";base64"):
            raise _invalid_base64(
                "a data: URL in audio_base64 must be base64 (data:<type>;base64,<data>)"
            )
        start = comma + 1
    written = 0
    carry = ""  # characters short of a 4-character group, for the next slice
    padded = False  # a group with padding ended the data: nothing may follow it
    for offset in range(start, end, _BASE64_SLICE):
        piece = carry + "".join(text[offset : min(end, offset + _BASE64_SLICE)].split())
        usable = len(piece) - len(piece) % 4
        carry = piece[usable:]
        if not usable:
            continue
        if padded:
            raise _invalid_base64()
        try:
            data = base64.b64decode(piece[:usable], validate=True)
        except (binascii.Error, ValueError):  # ValueError: characters outside ASCII
            raise _invalid_base64() from None
        padded = piece[usable - 1] == "="
        written += len(data)
        if written > limit:
            raise _too_large(limit)
        out.write(data)
    if carry:
        raise _invalid_base64()
    if not written:
        raise HttpError(400, "audio_base64 is empty", code="invalid_audio", param="audio_base64")
    return written


def _too_large(limit: int) -> HttpError:
    return HttpError(
        413,
        f"the audio exceeds the limit of {limit} bytes (TALKIES_MAX_UPLOAD_BYTES)",
        code="request_too_large",
        param="audio_base64",
    )


# -- the tools ---------------------------------------------------------------------------------


class SpeechTools:
    """The tools of one :class:`~talkies.app.TalkiesApp`, over its models and files store."""

    def __init__(
        self,
        settings: Settings,
        *,
        pool: ModelPool | None,
        files: FileStore,
        tmp_dir: Path,
        decodes: anyio.CapacityLimiter,
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.files = files
        self.tmp_dir = tmp_dir
        self.decodes = decodes  # the server's turns for file decodes, shared with HTTP

    def tools(self) -> list[McpTool[Any]]:
        return [
            McpTool(
                name="transcribe",
                description=(
                    "Transcribe speech to text. Returns the text; structured content adds "
                    "segments with times, the duration and the language (and words with "
                    "times when word_timestamps is true)."
                ),
                arguments=TranscribeArguments,
                output=Transcription,
                run=self.transcribe,
            ),
            McpTool(
                name="list_models",
                description=(
                    "The models this server has: id, engine (executor), whether it streams, "
                    "is downloaded or loaded, and its concurrent requests (in_use of "
                    "max_concurrency)."
                ),
                arguments=ListModelsArguments,
                output=ModelList,
                run=self.list_models,
            ),
            McpTool(
                name="speak",
                description=(
                    "Synthesize speech from text. Returns the audio as WAV audio content; "
                    "structured content gives its length and format."
                ),
                arguments=SpeakArguments,
                output=Speech,
                run=self.speak,
            ),
        ]

    async def speak(self, arguments: SpeakArguments) -> ToolResult:
        pool = self.pool
        if pool is None:
            raise HttpError(404, "this server has no model registry", code="model_not_found")
        request = SpeechRequest(
            text=arguments.text,
            voice=arguments.voice,
            speed=arguments.speed,
            language=arguments.language,
        )
        data, mime, rate = await synthesize(
            pool,
            arguments.model,
            request,
            "wav",
            chunk_steps=self.settings.qwen3_stream_chunk_size,
        )
        seconds = round((len(data) - 44) / (2 * rate), 3)  # s16 mono behind a 44-byte header
        document = {
            "model": arguments.model,
            "voice": arguments.voice,
            "format": "wav",
            "sample_rate": rate,
            "seconds": seconds,
            "bytes": len(data),
        }
        text = f"{seconds:g} s of speech from {arguments.model} ({arguments.voice})"
        return ToolResult(text=text, structured=document, audio=(data, mime))

    async def list_models(self, arguments: ListModelsArguments) -> ToolResult:
        document = {"object": "list", "data": model_rows(self.pool)}
        return ToolResult(text=json.dumps(document, ensure_ascii=False), structured=document)

    async def transcribe(self, arguments: TranscribeArguments) -> ToolResult:
        pool = self.pool
        if pool is None:
            raise HttpError(404, "this server has no model registry", code="model_not_found")
        entry = asr_entry(pool, arguments.model)
        options = TranscriptionRequest(
            language=checked_language(arguments.language or None),
            prompt=arguments.prompt or None,
            word_timestamps=arguments.word_timestamps,
            cancel=threading.Event(),
        )
        staged, encoded = arguments.file_path, arguments.audio_base64
        if (staged is None) == (encoded is None):
            raise HttpError(
                400, "give exactly one of 'file_path' and 'audio_base64'", param="file_path"
            )
        max_seconds = self.settings.stream_max_duration
        if staged is not None:
            source = self.files.path_for_request(staged)
            transcript = await transcribe_file(
                pool,
                entry,
                source,
                options,
                decodes=self.decodes,
                max_seconds=max_seconds,
                param="file_path",
            )
        else:
            assert encoded is not None
            source = await self._base64_file(encoded)
            try:
                transcript = await transcribe_file(
                    pool,
                    entry,
                    source,
                    options,
                    decodes=self.decodes,
                    max_seconds=max_seconds,
                    param="audio_base64",
                )
            finally:
                source.unlink(missing_ok=True)
        document = transcripts.verbose_json(transcript, words=arguments.word_timestamps)
        document["model"] = entry.slug
        return ToolResult(text=transcript.text.strip(), structured=document)

    async def _base64_file(self, encoded: str) -> Path:
        """``encoded`` decoded into a temporary file beside the form uploads (ffmpeg reads
        files), in a worker thread; removed again if that fails or is cancelled."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="mcp-")
        path = Path(name)
        limit = self.settings.max_upload_bytes

        def write() -> None:
            with os.fdopen(handle, "wb") as out:
                write_base64(encoded, out, limit=limit)

        try:
            # Not abandoned on cancel: the file is removed only once nothing writes to it.
            await anyio.to_thread.run_sync(write)
            await anyio.lowlevel.checkpoint_if_cancelled()
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return path
