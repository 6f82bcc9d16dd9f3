"""``/mcp``: a Model Context Protocol server over the Streamable HTTP transport.

The protocol is the official ``mcp`` SDK's: its low-level :class:`~mcp.server.lowlevel.Server`
answers ``initialize``, ``server/discover``, ``tools/list`` and ``tools/call``, and its
:class:`~mcp.server.streamable_http_manager.StreamableHTTPSessionManager` speaks the HTTP side.
This module only bridges that ASGI callable to the app layer (a :class:`Request` in, a
:class:`Response` out, so both hosts serve it alike) and writes the tools:

- ``transcribe``: a staged file (``file_path``, as the HTTP form field takes it) or base64
  audio; the same decode, model checks and slot (the model's per-model pool, spec: "The same
  per-model pool also counts HTTP ASR, MCP ASR, and TTS requests") as
  ``POST /v1/audio/transcriptions``; text, and ``verbose_json``'s fields as structured content;
- ``list_models``: the rows of ``GET /v1/models``.

Choices, and why:

- **Stateless, JSON responses.** Every POST is answered by one JSON body, so the bridge can
  collect the SDK's whole response and hand it over as bytes. Stateless means no session
  outlives its request: a client that leaves mid-call cancels the tool (the transcription stops
  and its slot is freed at once, as on the HTTP route), and there is nothing to expire. The
  cost is what needs a stream back to the client (progress notifications, server-to-client
  requests), which these tools do not use; ``GET /mcp`` answers 405, as the transport spec
  allows for a server without a standalone stream.
- **The low-level Server, not MCPServer.** MCPServer's constructor calls
  ``logging.basicConfig`` (a handler on the root logger of whoever embeds the ASGI app); the
  low-level server does not, and pydantic models give the same schemas and validation.
- **Refusals are tool errors shaped like HTTP.** Every check raises the same
  :class:`HttpError` the HTTP routes raise; a tool turns it into ``isError`` with the OpenAI
  error object plus ``status`` as structured content (a full model: 429 ``model_full``). An
  unknown tool is a JSON-RPC error (-32602), as the MCP spec asks.

Adding a tool is one :class:`McpTool` (arguments model, output model, coroutine) passed to
:meth:`McpEndpoint.add_tool`.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import unquote

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import __version__, transcripts
from ..config import Settings
from ..engines.base import (
    TranscriptionRequest,
)
from ..engines.pool import ModelPool
from ..engines.supply.builtin import DEFAULT_MODEL
from ..engines.tts.base import SpeechRequest
from .files import FileStore
from .http import Headers, HttpError, Request, Response
from .models import model_rows
from .speech import synthesize
from .transcribe import asr_entry, checked_language, decode_audio, transcribe_pcm

__all__ = ["MCP_PATH", "McpEndpoint", "McpTool", "ToolResult", "request_limit", "tool_error"]

log = logging.getLogger("talkies.app")

MCP_PATH = "/mcp"

Context = ServerRequestContext[dict[str, Any]]  # the default lifespan's state: an empty dict
ArgsT = TypeVar("ArgsT", bound=BaseModel)

# JSON-RPC's envelope around a base64 payload: method, id, tool name, the other arguments.
_ENVELOPE_BYTES = 64 * 1024


def request_limit(settings: Settings) -> int:
    """The /mcp route's body cap: base64 audio at the upload cap (4 bytes for every 3) and
    its JSON-RPC envelope."""
    return 4 * -(-settings.max_upload_bytes // 3) + _ENVELOPE_BYTES


# -- tools -----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolResult:
    """What a tool answers: text for the model to read, and the same as structured content."""

    text: str
    structured: dict[str, Any]
    audio: tuple[bytes, str] | None = None  # (data, MIME type): returned as audio content


def tool_error(exc: HttpError) -> types.CallToolResult:
    """A refusal as a tool error: the OpenAI error object the HTTP route would answer (one
    mapping from status to ``type``: :func:`~talkies.app.http.error_response`), with the HTTP
    status beside it."""
    body = exc.response().body
    assert isinstance(body, bytes)  # error responses are never streamed
    error: dict[str, Any] = json.loads(body)["error"]
    error["status"] = exc.status
    label = error["code"] or error["type"]
    return types.CallToolResult(
        content=[types.TextContent(text=f"Error {exc.status} ({label}): {exc.message}")],
        structured_content={"error": error},
        is_error=True,
    )


def _invalid_arguments(exc: ValidationError) -> HttpError:
    errors = exc.errors(include_url=False, include_input=False)
    problems = [
        f"{'.'.join(str(part) for part in error['loc']) or 'arguments'}: {error['msg']}"
        for error in errors
    ]
    first = errors[0]["loc"] if errors else ()
    return HttpError(
        400,
        "invalid arguments: " + "; ".join(problems),
        code="invalid_arguments",
        param=str(first[0]) if first else None,
    )


@dataclass(frozen=True, kw_only=True)
class McpTool(Generic[ArgsT]):
    """One tool: its arguments (a pydantic model: the input schema and its validation), the
    shape of its structured output, and the coroutine that runs it. ``run`` refuses with
    :class:`HttpError`, as a route would."""

    name: str
    description: str
    arguments: type[ArgsT]
    output: type[BaseModel]
    run: Callable[[ArgsT], Awaitable[ToolResult]]
    read_only: bool = True

    def definition(self) -> types.Tool:
        return types.Tool(
            name=self.name,
            description=self.description,
            input_schema=self.input_schema(),
            output_schema=self.output.model_json_schema(),
            annotations=types.ToolAnnotations(read_only_hint=self.read_only, open_world_hint=False),
        )

    def input_schema(self) -> dict[str, Any]:
        return self.arguments.model_json_schema()

    async def call(self, raw: Mapping[str, Any]) -> types.CallToolResult:
        try:
            arguments = self.arguments.model_validate(raw)
        except ValidationError as exc:
            return tool_error(_invalid_arguments(exc))
        try:
            result = await self.run(arguments)
        except HttpError as exc:
            return tool_error(exc)
        except Exception:
            # A bug, not a refusal: the details go to the log, never to the client.
            log.exception("MCP tool failed", extra={"tool": self.name})
            return tool_error(HttpError(500, "the tool failed; the server's log has the details"))
        content: list[types.ContentBlock] = [types.TextContent(text=result.text)]
        if result.audio is not None:
            data, mime = result.audio
            content.append(types.AudioContent(data=base64.b64encode(data).decode(), mime_type=mime))
        return types.CallToolResult(content=content, structured_content=result.structured)


class _Arguments(BaseModel):
    # Unknown arguments are refused, not ignored: a misspelt option must not silently
    # fall back to its default.
    model_config = ConfigDict(extra="forbid")


class TranscribeArguments(_Arguments):
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


class ListModelsArguments(_Arguments):
    pass


class SpeakArguments(_Arguments):
    text: str = Field(description="What to say (at most 4096 characters).")
    model: str = Field(default="kokoro-82m", description="The speech model's id (see list_models).")
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


def _base64_audio(text: str, *, limit: int) -> bytes:
    param = "audio_base64"
    payload = text.strip()
    if payload.startswith("data:"):  # a data: URL, as browsers and many clients write files
        header, comma, payload = payload.partition(",")
        if not comma or not header.endswith(";base64"):
            raise HttpError(
                400,
                "a data: URL in audio_base64 must be base64 (data:<type>;base64,<data>)",
                code="invalid_base64",
                param=param,
            )
    payload = "".join(payload.split())  # MIME-style line breaks are common in base64
    if len(payload) > 4 * -(-limit // 3):  # refused before decoding anything
        raise _too_large(limit)
    try:
        data = base64.b64decode(payload, validate=True)
    except ValueError:  # binascii.Error, or characters outside ASCII
        raise HttpError(
            400, "audio_base64 is not valid base64", code="invalid_base64", param=param
        ) from None
    if not data:
        raise HttpError(400, "audio_base64 is empty", code="invalid_audio", param=param)
    if len(data) > limit:
        raise _too_large(limit)
    return data


def _too_large(limit: int) -> HttpError:
    return HttpError(
        413,
        f"the audio exceeds the limit of {limit} bytes (TALKIES_MAX_UPLOAD_BYTES)",
        code="request_too_large",
        param="audio_base64",
    )


def _write_file(handle: int, data: bytes) -> None:
    with os.fdopen(handle, "wb") as out:
        out.write(data)


# -- the endpoint ------------------------------------------------------------------------------


class McpEndpoint:
    """The MCP server of one :class:`~talkies.app.TalkiesApp`: its tools, and the SDK's
    Streamable HTTP manager, which runs only inside :meth:`lifespan`."""

    def __init__(
        self, settings: Settings, *, pool: ModelPool | None, files: FileStore, tmp_dir: Path
    ) -> None:
        self.settings = settings
        self.pool = pool
        self.files = files
        self.tmp_dir = tmp_dir
        self._tools: dict[str, McpTool[Any]] = {}
        self.server: Server[dict[str, Any]] = Server(
            "talkies",
            version=__version__,
            instructions=(
                "Talkies, a speech server. transcribe turns audio into text: a file staged "
                "on the server (file_path) or base64 audio; speak turns text into speech; "
                "list_models lists the models."
            ),
            get_tool_input_schema=self._input_schema,
            on_list_tools=self._list_tools,
            on_call_tool=self._call_tool,
        )
        self._manager: StreamableHTTPSessionManager | None = None
        self.add_tool(
            McpTool(
                name="transcribe",
                description=(
                    "Transcribe speech to text. Returns the text; structured content adds "
                    "segments with times, the duration and the language (and words with "
                    "times when word_timestamps is true)."
                ),
                arguments=TranscribeArguments,
                output=Transcription,
                run=self._transcribe,
            )
        )
        self.add_tool(
            McpTool(
                name="list_models",
                description=(
                    "The models this server has: id, engine (executor), whether it streams, "
                    "is downloaded or loaded, and its concurrent requests (in_use of "
                    "max_concurrency)."
                ),
                arguments=ListModelsArguments,
                output=ModelList,
                run=self._list_models,
            )
        )

        self.add_tool(
            McpTool(
                name="speak",
                description=(
                    "Synthesize speech from text. Returns the audio as WAV audio content; "
                    "structured content gives its length and format."
                ),
                arguments=SpeakArguments,
                output=Speech,
                run=self._speak,
            )
        )

    def add_tool(self, tool: McpTool[Any]) -> None:
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} exists already")
        self._tools[tool.name] = tool

    # -- lifetime and requests -------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """The SDK's manager, for as long as the server runs. A manager runs only once, so
        each lifespan gets a new one; cancelling it ends every tool call in flight."""
        manager = StreamableHTTPSessionManager(
            self.server,
            json_response=True,
            stateless=True,
            max_request_body_size=request_limit(self.settings),
        )
        async with manager.run():
            self._manager = manager
            try:
                yield
            finally:
                self._manager = None

    async def handle(self, request: Request) -> Response:
        """``POST /mcp``: one JSON-RPC message in, the SDK's answer out."""
        manager = self._manager
        if manager is None:  # an ASGI host running without lifespan events
            raise HttpError(
                503,
                "the MCP endpoint runs only while the server's lifespan does",
                code="unavailable",
            )
        # Read here, under the app's cap and with its 413, rather than inside the SDK. A
        # JSON-RPC message is parsed whole anyway.
        body = await request.body.read()
        return await _call_asgi(manager.handle_request, request, body)

    # -- protocol handlers -----------------------------------------------------------------

    def _input_schema(self, name: str) -> dict[str, Any] | None:
        tool = self._tools.get(name)
        return tool.input_schema() if tool is not None else None

    async def _list_tools(
        self, ctx: Context, params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[tool.definition() for tool in self._tools.values()])

    async def _call_tool(
        self, ctx: Context, params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        tool = self._tools.get(params.name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}")
        return await tool.call(params.arguments or {})

    # -- the tools -------------------------------------------------------------------------

    async def _speak(self, arguments: SpeakArguments) -> ToolResult:
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

    async def _list_models(self, arguments: ListModelsArguments) -> ToolResult:
        document = {"object": "list", "data": model_rows(self.pool)}
        return ToolResult(text=json.dumps(document, ensure_ascii=False), structured=document)

    async def _transcribe(self, arguments: TranscribeArguments) -> ToolResult:
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
            pcm = await decode_audio(source, max_seconds=max_seconds, param="file_path")
        else:
            assert encoded is not None
            data = _base64_audio(encoded, limit=self.settings.max_upload_bytes)
            pcm = await self._decode_bytes(data, max_seconds=max_seconds)
        transcript = await transcribe_pcm(pool, entry, pcm, options)
        document = transcripts.verbose_json(transcript, words=arguments.word_timestamps)
        document["model"] = entry.slug
        return ToolResult(text=transcript.text.strip(), structured=document)

    async def _decode_bytes(self, data: bytes, *, max_seconds: float) -> bytes:
        # ffmpeg reads files: the audio goes to a temporary file beside the form uploads,
        # removed as soon as it is decoded (before the model's slot is even asked for).
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        handle, name = tempfile.mkstemp(dir=self.tmp_dir, prefix="mcp-")
        path = Path(name)
        try:
            await anyio.to_thread.run_sync(_write_file, handle, data)
            return await decode_audio(path, max_seconds=max_seconds, param="audio_base64")
        finally:
            path.unlink(missing_ok=True)


# -- the bridge: an ASGI application called with a Request -------------------------------------

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[MutableMapping[str, Any], Receive, Send], Awaitable[None]]

# Framing is the host's business: it sets its own length or chunking.
_HOP_BY_HOP = frozenset({b"content-length", b"transfer-encoding", b"connection", b"keep-alive"})


async def _call_asgi(app: Asgi, request: Request, body: bytes) -> Response:
    """Run ``app`` on ``request`` (its body already read) and collect its whole response.

    Whole responses only: the SDK is configured for JSON responses, which it sends complete
    before returning. A client that leaves cancels this call (the host cancels the handler),
    which is how the SDK learns of it.
    """
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": request.method,
        "scheme": "http",
        "path": unquote(request.path),
        "raw_path": request.path.encode("latin-1"),
        "query_string": request.query.encode("latin-1"),
        "root_path": "",
        "headers": list(request.headers),
        "client": None,
        "server": None,
    }
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        # Only the client leaving could come next, and then the host cancels this handler.
        await anyio.sleep_forever()
        return {"type": "http.disconnect"}

    status: int | None = None
    headers: Headers = []
    parts: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = int(message["status"])
            headers = [
                (bytes(name).lower(), bytes(value))
                for name, value in message.get("headers", ())
                if bytes(name).lower() not in _HOP_BY_HOP
            ]
        elif message["type"] == "http.response.body":
            parts.append(bytes(message.get("body", b"")))

    await app(scope, receive, send)
    if status is None:
        log.error("the MCP server sent no response", extra={"method": request.method})
        raise HttpError(500, "the MCP server sent no response")
    return Response(status=status, headers=headers, body=b"".join(parts))
