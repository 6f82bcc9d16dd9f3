"""The Wyoming server: Home Assistant's speech-to-text and text-to-speech over TCP.

It runs in ``talkies serve``'s process beside the HTTP server, on the same model pool: a
transcription is a pool stream (the same slots, pinning and engine runtime as a WebSocket
stream), a synthesis a pool slot on the speech model (as ``/v1/audio/speech``).

One connection serves any number of requests, one at a time:

- ``describe`` -> ``info``: an ``asr`` program with every streaming ASR model of the registry
  and a ``tts`` program with every speech model, from the registry alone (nothing is loaded).
- ``transcribe {name?, language?}``, then ``audio-start`` / ``audio-chunk``* / ``audio-stop``
  (any rate, width and channel count, converted to 16 kHz mono) -> ``transcript-start``, a
  ``transcript-chunk`` for each utterance the engine commits (append-only: the chunks join
  into the transcript), ``transcript``, ``transcript-stop``.
- ``synthesize {text, voice?}`` -> ``audio-start`` / ``audio-chunk``* / ``audio-stop``; and
  the streaming form ``synthesize-start`` / ``synthesize-chunk``* / ``synthesize-stop``
  (the ``synthesize`` a streaming client also sends, for older servers, is ignored), where
  each sentence is synthesized as soon as it is complete, then ``synthesize-stopped``.
- ``ping`` -> ``pong``. Other event types are ignored, as the protocol asks of servers.

What a client may not do is answered with an ``error {text, code}`` event: a refused request
keeps the connection; broken framing, a cap passed, or a client that stopped sending mid-request
gets its error and the connection is closed. Caps are checked where the bytes enter
(:mod:`.framing`); a client that stops reading is dropped after TALKIES_STREAM_IDLE_TIMEOUT.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from collections.abc import Callable
from typing import Any, cast

import anyio
import anyio.abc
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from .. import __version__
from ..config import Settings, wyoming_address
from ..engines import catalogue
from ..engines.base import EngineStream, EngineUnavailable, Refusal, RefusalKind
from ..engines.pool import ModelPool
from ..engines.supply.builtin import DEFAULT_MODEL, DEFAULT_SPEECH_MODEL
from ..engines.supply.download import is_downloaded
from ..engines.supply.entry import ModelEntry
from ..engines.supply.wheels import wheels_installed
from ..engines.tts.base import (
    API_SPEED_RANGE,
    MAX_INPUT_CHARS,
    SpeechError,
    SpeechModel,
    SpeechRequest,
    SynthesisFailed,
    check_request,
)
from ..protocol import EngineEndpoint, EngineFailed, EngineFinal
from ..protocol.messages import StartOptions, normalize_language
from ..transcripts import LANGUAGE_NAMES
from ..transport.server import ListenError
from .audio import AudioFormatError, PcmConverter, audio_format
from .framing import EventReader, FramingError, WireEvent, encode

__all__ = ["MAX_CONNECTIONS", "WyomingServer"]

log = logging.getLogger("talkies.wyoming")

MAX_CONNECTIONS = 64
# Text a streaming synthesis may hold that is not yet a whole sentence, and in all.
MAX_STREAMED_CHARS = 16 * MAX_INPUT_CHARS
# Bytes of PCM per audio-chunk event sent (wyoming-piper sends 1024 samples).
_SEND_CHUNK = 8192
_READ_SIZE = 65536
# A sentence ends at . ! ? ; : (and the CJK full stops), closing quotes or brackets, space.
_SENTENCE_END = re.compile(r"(?<=[.!?;:\u3002\uff01\uff1f])[\"')\]]*\s+")
_URL = "https://github.com/talkies-speech/talkies"

# The languages of the speech models' executors (a voice's own list needs it loaded).
_TTS_LANGUAGES = {"piper": ["en"], "kokoro": ["en", "ja", "zh", "es", "fr", "hi", "it", "pt"]}
_ATTRIBUTION = {
    "whisper": ("OpenAI Whisper", "https://github.com/openai/whisper"),
    "sherpa": ("k2-fsa sherpa-onnx", "https://github.com/k2-fsa/sherpa-onnx"),
    "vosk": ("Alpha Cephei Vosk", "https://alphacephei.com/vosk/"),
    "parakeet_cpp": ("NVIDIA Parakeet", "https://huggingface.co/nvidia"),
    "piper": ("Piper", "https://github.com/OHF-voice/piper1-gpl"),
    "kokoro": ("Kokoro-82M", "https://huggingface.co/hexgrad/Kokoro-82M"),
    "qwen3_tts": ("Qwen3-TTS", "https://github.com/QwenLM/Qwen3-TTS"),
}


_INVALID = RefusalKind.INVALID_INPUT
_UNKNOWN = RefusalKind.UNKNOWN_MODEL
_NOT_STREAMING = RefusalKind.STREAMING_NOT_SUPPORTED
_LANGUAGE = RefusalKind.INVALID_LANGUAGE


class _Close(Exception):
    """End this connection (after the error event it was given, if any)."""


def _attribution(executor: str) -> dict[str, str]:
    name, url = _ATTRIBUTION.get(executor, (executor, _URL))
    return {"name": name, "url": url}


def _asr_languages(entry: ModelEntry) -> list[str]:
    if entry.executor == "whisper":
        first = entry.options.get("language")
        rest = [code for code in LANGUAGE_NAMES if code != first]
        return [first, *rest] if isinstance(first, str) else rest
    language = entry.options.get("language")
    if isinstance(language, str):
        return [language]
    return ["en"] if "-en" in entry.slug or entry.slug.endswith("en") else []


def _text_field(data: dict[str, Any], key: str, limit: int) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Refusal(_INVALID, f"{key} must be a string")
    if len(value) > limit:
        raise Refusal(_INVALID, f"{key} is longer than {limit} characters")
    return value


class WyomingServer:
    """Serve Wyoming on ``settings.wyoming_uri`` with ``pool`` until :meth:`shutdown`."""

    def __init__(self, settings: Settings, pool: ModelPool) -> None:
        if settings.wyoming_uri is None:
            raise ValueError("TALKIES_WYOMING_URI is not set")
        self.settings = settings
        self.pool = pool
        self.host, self.port = wyoming_address(settings.wyoming_uri)
        self.connections = 0
        self.busy = 0  # connections in the middle of a request
        self._idle = anyio.Event()
        self._idle.set()
        self._accept: anyio.CancelScope | None = None
        self._tasks: anyio.abc.TaskGroup | None = None
        self._stopping = False

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[WyomingServer] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen until :meth:`shutdown` ends; ``task_status`` gets the server when bound."""
        try:
            listener = await anyio.create_tcp_listener(local_host=self.host, local_port=self.port)
        except OSError as exc:
            reason = str(exc.strerror or exc).lower()
            raise ListenError(
                f"cannot listen for Wyoming on {self.host}:{self.port}: {reason} "
                "(set TALKIES_WYOMING_URI or --wyoming)"
            ) from exc
        self.port = listener.listeners[0].extra(anyio.abc.SocketAttribute.local_port)
        # The first look at the installed distributions takes ~0.5 s: not in the first
        # describe's time (Home Assistant waits 1 s for its info).
        await anyio.to_thread.run_sync(self.info)
        log.info("wyoming listening", extra={"host": self.host, "port": self.port})
        async with listener, anyio.create_task_group() as tasks:
            self._tasks = tasks
            with anyio.CancelScope() as accept:
                self._accept = accept
                task_status.started(self)
                await listener.serve(self._connection, task_group=tasks)

    async def shutdown(self, grace: float) -> None:
        """Stop accepting; requests in progress may finish for ``grace`` seconds; then every
        connection is closed."""
        self._stopping = True
        if self._accept is not None:
            self._accept.cancel()
        with anyio.move_on_after(grace):
            await self._idle.wait()
        if self._tasks is not None:
            self._tasks.cancel_scope.cancel()

    def _set_busy(self, delta: int) -> None:
        self.busy += delta
        if self.busy == 0:
            self._idle.set()
        elif self.busy == 1 and delta > 0:
            self._idle = anyio.Event()

    async def _connection(self, stream: anyio.abc.SocketStream) -> None:
        self.connections += 1
        try:
            async with stream:
                connection = _Connection(self, stream)
                if self.connections > MAX_CONNECTIONS:
                    with contextlib.suppress(anyio.BrokenResourceError, OSError, _Close):
                        await connection.error(
                            f"the server is at its limit of {MAX_CONNECTIONS} Wyoming connections",
                            "connection_limit",
                        )
                    return
                await connection.run()
        except Exception:
            log.exception("wyoming connection failed")
        finally:
            self.connections -= 1

    def info(self) -> dict[str, Any]:
        """The ``info`` event's data: the registry as Wyoming programs (nothing loaded)."""
        asr: list[dict[str, Any]] = []
        tts: list[dict[str, Any]] = []
        data_dir = self.settings.data_dir
        for slug in self.pool.slugs():
            entry = self.pool.entry(slug)
            if entry is None:
                continue
            executor = catalogue.find(entry.executor)
            if executor is None:
                continue
            loaded = self.pool.peek(slug)
            installed = (
                loaded is not None
                or (entry.path is not None and entry.path.is_dir())
                or is_downloaded(entry, data_dir)
                or wheels_installed(entry.wheels)
            )
            common = {
                "name": slug,
                "attribution": _attribution(entry.executor),
                "installed": bool(installed),
                "description": entry.description or slug,
                "version": entry.revision or None,
            }
            if executor.kind == "asr" and executor.streams:
                asr.append({**common, "languages": _asr_languages(entry)})
            elif executor.kind == "tts" and executor.load_speech is not None:
                voice: dict[str, Any] = {
                    **common,
                    "languages": _TTS_LANGUAGES.get(entry.executor, []),
                }
                if loaded is not None:
                    names = cast(SpeechModel, loaded).voices()
                    voice["speakers"] = [{"name": name} for name in names]
                tts.append(voice)
        # The defaults first: a client that picks the first model gets the offline ones.
        asr.sort(key=lambda m: m["name"] != DEFAULT_MODEL)
        tts.sort(key=lambda v: v["name"] != DEFAULT_SPEECH_MODEL)
        talkies = {"name": "Talkies", "url": _URL}
        return {
            "asr": [
                {
                    "name": "talkies",
                    "attribution": talkies,
                    "installed": True,
                    "description": "Talkies streaming speech recognition",
                    "version": __version__,
                    "models": asr,
                    "supports_transcript_streaming": True,
                }
            ],
            "tts": [
                {
                    "name": "talkies",
                    "attribution": talkies,
                    "installed": True,
                    "description": "Talkies speech synthesis",
                    "version": __version__,
                    "voices": tts,
                    "supports_synthesize_streaming": True,
                }
            ],
            "handle": [],
            "intent": [],
            "wake": [],
            "mic": [],
            "snd": [],
        }


class _Transcription:
    """One ``audio-start`` .. ``audio-stop``: the pool stream, the converter, what was said."""

    def __init__(self, stream: EngineStream, converter: PcmConverter) -> None:
        self.stream = stream
        self.converter = converter
        self.sent: list[str] = []  # the transcript-chunks sent, in order
        self.done = anyio.Event()


class _Connection:
    def __init__(self, server: WyomingServer, stream: anyio.abc.SocketStream) -> None:
        self.server = server
        self.settings = server.settings
        self.pool = server.pool
        self.stream = stream
        self.reader = EventReader()
        self.write_lock = anyio.Lock()
        self.asr_model: str | None = None
        self.asr_language: str | None = None
        self.transcription: _Transcription | None = None
        self.dropping = False  # the transcription failed: its audio is dropped until audio-stop
        self.tasks: anyio.abc.TaskGroup | None = None
        # The streaming synthesis: its sentence queue and the task speaking it.
        self.sentences: MemoryObjectSendStream[str] | None = None
        self.streamed = ""
        self.streamed_total = 0
        self.synthesis_done: anyio.Event | None = None
        self.synthesis_failed = False
        self.speaking = False  # a synthesis is sending (the client need not send meanwhile)

    # -- sending ---------------------------------------------------------------------------

    async def send(
        self, kind: str, data: dict[str, Any] | None = None, payload: bytes = b""
    ) -> None:
        """One event; a client that does not take it within the idle timeout is dropped."""
        frame = encode(kind, data, payload or None)
        async with self.write_lock:
            with anyio.move_on_after(self.settings.stream_idle_timeout) as scope:
                try:
                    await self.stream.send(frame)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    raise _Close from None
            if scope.cancelled_caught:
                log.info(
                    "wyoming client stopped reading",
                    extra={"timeout": self.settings.stream_idle_timeout},
                )
                raise _Close

    async def error(self, text: str, code: str) -> None:
        await self.send("error", {"text": text, "code": code})

    async def refuse(self, exc: Refusal | EngineUnavailable | SynthesisFailed) -> None:
        if isinstance(exc, Refusal):
            await self.error(exc.detail, exc.kind.value)
        elif isinstance(exc, EngineUnavailable):
            await self.error(str(exc), "server_error")
        else:
            await self.error(str(exc), "server_error")

    # -- the connection's loop -----------------------------------------------------------

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                self.tasks = tasks
                try:
                    await self._read_loop()
                finally:
                    tasks.cancel_scope.cancel()
        except* _Close:
            pass
        finally:
            await self._end_transcription()

    async def _read_loop(self) -> None:
        idle = self.settings.stream_idle_timeout
        last = anyio.current_time()
        while True:
            try:
                event = self.reader.next_event()
            except FramingError as exc:
                await self.error(str(exc), "invalid_message")
                return
            if event is not None:
                last = anyio.current_time()
                await self._handle(event)
                continue
            if self.server._stopping and self.transcription is None and not self.speaking:
                return
            # Nothing to wait for while the server is speaking; otherwise the client must
            # send something within the idle timeout.
            with anyio.move_on_after(1.0):
                try:
                    data = await self.stream.receive(_READ_SIZE)
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    return
                self.reader.feed(data)
                last = anyio.current_time()
                continue
            if self.speaking:
                last = anyio.current_time()
            elif anyio.current_time() - last > idle:
                await self.error(f"nothing was received for {idle:g} s", "idle_timeout")
                return

    async def _handle(self, event: WireEvent) -> None:
        handler = _HANDLERS.get(event.type)
        if handler is None:
            log.debug("wyoming: ignored an event", extra={"type": event.type[:64]})
            return
        try:
            await handler(self, event)
        except (Refusal, EngineUnavailable) as exc:
            await self.refuse(exc)

    # -- describe, ping ------------------------------------------------------------------

    async def _describe(self, event: WireEvent) -> None:
        # A worker thread: it looks at files, and a loaded voice list is a call to its
        # engine process.
        await self.send("info", await anyio.to_thread.run_sync(self.server.info))

    async def _ping(self, event: WireEvent) -> None:
        text = event.data.get("text")
        await self.send("pong", {"text": text} if isinstance(text, str) else None)

    # -- speech to text ------------------------------------------------------------------

    def _asr_entry(self, name: str | None) -> str:
        slug = name or (DEFAULT_MODEL if self.pool.entry(DEFAULT_MODEL) else None)
        if slug is None:
            for candidate in self.pool.slugs():
                entry = self.pool.entry(candidate)
                if entry is not None and catalogue.executor_of(entry).streams:
                    slug = candidate
                    break
        entry = self.pool.entry(slug) if slug else None
        if entry is None:
            raise Refusal(_UNKNOWN, f"unknown model {str(name)[:64]!r}")
        if not catalogue.executor_of(entry).streams:
            raise Refusal(_NOT_STREAMING, f"model {slug!r} is not a streaming ASR model")
        return entry.slug

    async def _transcribe(self, event: WireEvent) -> None:
        if self.transcription is not None:
            raise Refusal(_INVALID, "a transcription is in progress: send audio-stop first")
        name = _text_field(event.data, "name", 256)
        language = _text_field(event.data, "language", 32)
        if language is not None and normalize_language(language) is None:
            raise Refusal(_LANGUAGE, f"language must be a code such as 'en', got {language!r}")
        self.asr_model = self._asr_entry(name)
        self.asr_language = normalize_language(language) if language else None

    async def _audio_start(self, event: WireEvent) -> None:
        if self.transcription is not None:
            raise Refusal(_INVALID, "audio-start during a transcription: send audio-stop first")
        self.dropping = False
        await self._open(event)

    async def _open(self, event: WireEvent) -> None:
        try:
            converter = PcmConverter(*audio_format(event.data))
        except AudioFormatError as exc:
            raise Refusal(_INVALID, str(exc)) from None
        slug = self.asr_model or self._asr_entry(None)
        options = StartOptions(model=slug, language=self.asr_language)
        self.server._set_busy(+1)
        try:
            stream = await self.pool.open_stream(options)
        except BaseException:
            self.server._set_busy(-1)
            raise
        self.transcription = _Transcription(stream, converter)
        await self.send(
            "transcript-start", {"language": self.asr_language} if self.asr_language else None
        )
        assert self.tasks is not None
        self.tasks.start_soon(self._results, self.transcription)

    async def _results(self, job: _Transcription) -> None:
        """The engine's results as transcript events, until its final (or failure)."""
        try:
            async for result in job.stream.events():
                if isinstance(result, EngineEndpoint | EngineFinal) and result.text.strip():
                    text = result.text.strip()
                    piece = text if not job.sent else " " + text
                    job.sent.append(text)
                    await self.send("transcript-chunk", {"text": piece})
                if isinstance(result, EngineFinal):
                    transcript: dict[str, Any] = {"text": " ".join(job.sent)}
                    if self.asr_language:
                        transcript["language"] = self.asr_language
                    await self.send("transcript", transcript)
                    await self.send("transcript-stop")
                    break
                if isinstance(result, EngineFailed):
                    self.dropping = True  # the rest of its audio, until audio-stop
                    await self.error(result.detail, "server_error")
                    break
        finally:
            job.done.set()
            if self.transcription is job:
                await self._end_transcription()

    async def _audio_chunk(self, event: WireEvent) -> None:
        job = self.transcription
        if self.dropping:
            return
        if job is None:  # no audio-start: the chunk's own format opens the stream
            await self._open(event)
            job = self.transcription
            assert job is not None
        if job.done.is_set():
            return  # the stream failed (its error was sent): the rest of its audio is dropped
        try:
            chunk_format = audio_format(event.data)
        except AudioFormatError as exc:
            raise Refusal(_INVALID, str(exc)) from None
        if chunk_format != job.converter.format:
            raise Refusal(_INVALID, "an audio-chunk's format differs from its audio-start")
        pcm = job.converter.convert(event.payload or b"")
        if job.converter.seconds > self.settings.stream_max_duration:
            await self.error(
                f"the audio is longer than {self.settings.stream_max_duration:g} s",
                "audio_too_long",
            )
            raise _Close
        if pcm:
            await job.stream.feed(pcm)

    async def _audio_stop(self, event: WireEvent) -> None:
        job = self.transcription
        if self.dropping:
            self.dropping = False
            return
        if job is None:
            raise Refusal(_INVALID, "audio-stop without audio-start")
        if not job.done.is_set():
            rest = job.converter.convert(b"", last=True)
            if rest:
                await job.stream.feed(rest)
            await job.stream.flush()
            await job.done.wait()
        await self._end_transcription()

    async def _end_transcription(self) -> None:
        job, self.transcription = self.transcription, None
        if job is not None:
            with anyio.CancelScope(shield=True):
                await job.stream.aclose()
            self.server._set_busy(-1)

    # -- text to speech ------------------------------------------------------------------

    def _voice(self, data: dict[str, Any]) -> tuple[str, str | None, str | None]:
        """(model, voice, language) of a synthesize event's ``voice``."""
        voice = data.get("voice")
        if voice is None:
            voice = {}
        if not isinstance(voice, dict):
            raise Refusal(_INVALID, "voice must be an object")
        name = _text_field(voice, "name", 256)
        speaker = _text_field(voice, "speaker", 256)
        language = _text_field(voice, "language", 32)
        slug = name or DEFAULT_SPEECH_MODEL
        entry = self.pool.entry(slug)
        if entry is None:
            raise Refusal(_UNKNOWN, f"unknown voice {slug[:64]!r}")
        if catalogue.executor_of(entry).kind != "tts":
            raise Refusal(_INVALID, f"{slug!r} is not a speech model")
        return entry.slug, speaker, language

    async def _synthesize(self, event: WireEvent) -> None:
        if self.sentences is not None or self.synthesis_done is not None:
            return  # a streaming client's copy of its text, for older servers
        text = _text_field(event.data, "text", MAX_INPUT_CHARS)
        if text is None:
            raise Refusal(_INVALID, "synthesize needs its text")
        # What every model checks, before a slot or a load (empty text, its length).
        check_request(SpeechRequest(text=text, voice="-"), speed_range=API_SPEED_RANGE)
        slug, speaker, language = self._voice(event.data)
        self.server._set_busy(+1)
        self.speaking = True
        try:
            await self._speak(slug, [text], speaker, language)
        finally:
            self.speaking = False
            self.server._set_busy(-1)

    async def _speak(
        self,
        slug: str,
        texts: list[str] | MemoryObjectReceiveStream[str],
        speaker: str | None,
        language: str | None,
    ) -> None:
        """Speak each text in turn on one slot: one audio-start, the chunks, one audio-stop.
        A refusal before any audio is an error event instead."""
        started = False
        model: SpeechModel | None = None
        release: Callable[[], None] | None = None
        try:
            async for text in _each(texts):
                if not text.strip():
                    continue
                request = SpeechRequest(text=text, voice=speaker or "", language=language)
                if model is None:
                    check_request(request, speed_range=API_SPEED_RANGE)
                    loaded, release = await self.pool.acquire(slug)
                    model = cast(SpeechModel, loaded)
                if not speaker:  # the model's first voice (for an engine process, a call to it)
                    voices = await anyio.to_thread.run_sync(model.voices)
                    request = SpeechRequest(text=text, voice=voices[0], language=language)
                stream = await model.synthesize(request)
                async with stream:
                    async for pcm in stream:
                        if not started:
                            started = True
                            await self.send(
                                "audio-start",
                                {"rate": model.sample_rate, "width": 2, "channels": 1},
                            )
                        for at in range(0, len(pcm), _SEND_CHUNK):
                            await self.send(
                                "audio-chunk",
                                {"rate": model.sample_rate, "width": 2, "channels": 1},
                                pcm[at : at + _SEND_CHUNK],
                            )
        except (Refusal, EngineUnavailable, SynthesisFailed) as exc:
            if isinstance(exc, SpeechError | SynthesisFailed) or not started:
                await self.refuse(exc)
            self.synthesis_failed = True
            return
        finally:
            if release is not None:
                release()
        if not started:
            rate = model.sample_rate if model is not None else 24000
            await self.send("audio-start", {"rate": rate, "width": 2, "channels": 1})
        await self.send("audio-stop")

    async def _synthesize_start(self, event: WireEvent) -> None:
        if self.sentences is not None:
            raise Refusal(_INVALID, "a streaming synthesis is in progress")
        slug, speaker, language = self._voice(event.data)
        send, receive = anyio.create_memory_object_stream[str](math.inf)
        self.sentences = send
        self.streamed = ""
        self.streamed_total = 0
        self.synthesis_failed = False
        done = self.synthesis_done = anyio.Event()
        self.server._set_busy(+1)

        async def speak() -> None:
            self.speaking = True
            try:
                async with receive:
                    await self._speak(slug, receive, speaker, language)
            finally:
                self.speaking = False
                done.set()

        assert self.tasks is not None
        self.tasks.start_soon(speak)

    async def _synthesize_chunk(self, event: WireEvent) -> None:
        if self.sentences is None:
            raise Refusal(_INVALID, "synthesize-chunk without synthesize-start")
        text = _text_field(event.data, "text", MAX_INPUT_CHARS) or ""
        self.streamed_total += len(text)
        if self.streamed_total > MAX_STREAMED_CHARS:
            await self.error(
                f"a streaming synthesis is limited to {MAX_STREAMED_CHARS} characters",
                "invalid_input",
            )
            raise _Close
        self.streamed += text
        # Each complete sentence goes to the synthesis now; the rest waits for more text.
        while match := _SENTENCE_END.search(self.streamed):
            sentence, self.streamed = self.streamed[: match.end()], self.streamed[match.end() :]
            if not self.synthesis_failed:
                self.sentences.send_nowait(sentence.strip())
        if len(self.streamed) > MAX_INPUT_CHARS and not self.synthesis_failed:
            # A "sentence" this long is spoken as it is.
            self.sentences.send_nowait(self.streamed)
            self.streamed = ""

    async def _synthesize_stop(self, event: WireEvent) -> None:
        if self.sentences is None or self.synthesis_done is None:
            raise Refusal(_INVALID, "synthesize-stop without synthesize-start")
        sentences, self.sentences = self.sentences, None
        done = self.synthesis_done
        try:
            if self.streamed.strip() and not self.synthesis_failed:
                sentences.send_nowait(self.streamed.strip())
            self.streamed = ""
            sentences.close()
            await done.wait()
            await self.send("synthesize-stopped")
        finally:
            self.synthesis_done = None
            self.server._set_busy(-1)


async def _each(texts: list[str] | MemoryObjectReceiveStream[str]) -> Any:
    if isinstance(texts, list):
        for text in texts:
            yield text
    else:
        async for text in texts:
            yield text


_Handler = Callable[[_Connection, WireEvent], Any]
_HANDLERS: dict[str, _Handler] = {
    "describe": _Connection._describe,
    "ping": _Connection._ping,
    "transcribe": _Connection._transcribe,
    "audio-start": _Connection._audio_start,
    "audio-chunk": _Connection._audio_chunk,
    "audio-stop": _Connection._audio_stop,
    "synthesize": _Connection._synthesize,
    "synthesize-start": _Connection._synthesize_start,
    "synthesize-chunk": _Connection._synthesize_chunk,
    "synthesize-stop": _Connection._synthesize_stop,
}
