"""Speech to text over Wyoming: ``transcribe {name?, language?}``, then ``audio-start`` /
``audio-chunk``* / ``audio-stop`` (any rate, width and channel count, converted to 16 kHz
mono) -> ``transcript-start``, ``transcript-chunk`` events, ``transcript``,
``transcript-stop``.

The chunks are append-only: joined, they are the transcript, exactly. A chunk is sent as soon
as text is certain: the part of a partial's stable prefix (``stable``: the leading characters
the engine promises its endpoint begins with; Whisper's committed words) not sent yet, and at
each endpoint (and the final) the rest of that utterance (:class:`Chunks`). An engine that
promises nothing (Vosk, sherpa) gives one chunk per utterance, at its endpoint.

A transcription is a pool stream: the same slots, pinning and engine runtime as a WebSocket
stream; its audio is decoded while it arrives."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio

from .. import metrics
from ..engines import catalogue
from ..engines.base import EngineStream, Refusal, RefusalKind
from ..engines.supply.builtin import DEFAULT_MODEL
from ..protocol import EngineEndpoint, EngineFailed, EngineFinal, EnginePartial
from ..protocol.messages import StartOptions, normalize_language
from .audio import AudioFormatError, PcmConverter, audio_format
from .channel import Channel, Close, text_field
from .framing import WireEvent

__all__ = ["Chunks", "Transcriber"]

log = logging.getLogger("talkies.wyoming")

_INVALID = RefusalKind.INVALID_INPUT
_SURFACE = "wyoming"  # the metrics' surface label
_EVENT_LATENCY = metrics.EVENT_LATENCY_SECONDS.labels(surface=_SURFACE)


class Chunks:
    """A transcription's ``transcript-chunk`` texts, from the engine's results.

    Each utterance's text is stripped and joined to the one before by a space, as the
    transcript always was; within an utterance, what a partial's stable prefix adds (stripped
    of trailing space, which the endpoint might not have) is sent at once, the rest at its
    endpoint. ``text`` is every chunk joined: the transcript.
    """

    def __init__(self) -> None:
        self.text = ""  # every chunk so far, joined
        self._open = ""  # of the open utterance, what was sent (stripped, no separator)

    def partial(self, result: EnginePartial) -> str:
        """The chunk a partial makes certain ("" when nothing new)."""
        if not result.stable or result.stable <= 0:
            return ""
        certain = result.text[: result.stable].strip()
        if len(certain) <= len(self._open) or not certain.startswith(self._open):
            return ""  # nothing new (a stable prefix never shrinks nor changes)
        return self._send(certain)

    def end(self, result: EngineEndpoint | EngineFinal) -> str:
        """The rest of an utterance at its endpoint (or the final)."""
        text = result.text.strip()
        if not text.startswith(self._open):
            # A broken promise: what was sent stands (chunks are never withdrawn); the
            # endpoint's text follows it.
            log.warning("an endpoint does not begin with the stable text sent before it")
            self.text += " " + text if text else ""
            self._open = ""
            return " " + text if text else ""
        piece = self._send(text) if len(text) > len(self._open) else ""
        self._open = ""
        return piece

    def _send(self, certain: str) -> str:
        piece = certain[len(self._open) :]
        if not self._open and self.text:
            piece = " " + piece  # a new utterance: the separator comes with its first chunk
        self._open = certain
        self.text += piece
        return piece


class _Transcription:
    """One ``audio-start`` .. ``audio-stop``: the pool stream, the converter, what was said."""

    def __init__(self, stream: EngineStream, converter: PcmConverter) -> None:
        self.stream = stream
        self.converter = converter
        self.chunks = Chunks()  # the transcript-chunks sent
        self.done = anyio.Event()
        # For the metrics: how it ended (as a WebSocket stream's outcome, and its error
        # code), the audio-chunks taken, when audio last went to the engine.
        self.outcome = ("peer_gone", "")
        self.frames = 0
        self.fed_at = 0.0


class Transcriber:
    """One connection's speech-to-text: at most one transcription at a time."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.pool = channel.pool
        self.model: str | None = None
        self.language: str | None = None
        self.transcription: _Transcription | None = None
        self.dropping = False  # the transcription failed: its audio is dropped until audio-stop

    def _entry(self, name: str | None) -> str:
        slug = name or (DEFAULT_MODEL if self.pool.entry(DEFAULT_MODEL) else None)
        if slug is None:
            for candidate in self.pool.slugs():
                entry = self.pool.entry(candidate)
                if entry is not None and catalogue.executor_of(entry).streams:
                    slug = candidate
                    break
        entry = self.pool.entry(slug) if slug else None
        if entry is None:
            raise Refusal(RefusalKind.UNKNOWN_MODEL, f"unknown model {str(name)[:64]!r}")
        if not catalogue.executor_of(entry).streams:
            raise Refusal(
                RefusalKind.STREAMING_NOT_SUPPORTED, f"model {slug!r} is not a streaming ASR model"
            )
        return entry.slug

    async def transcribe(self, event: WireEvent) -> None:
        if self.transcription is not None:
            raise Refusal(_INVALID, "a transcription is in progress: send audio-stop first")
        name = text_field(event.data, "name", 256)
        language = text_field(event.data, "language", 32)
        if language is not None and normalize_language(language) is None:
            raise Refusal(
                RefusalKind.INVALID_LANGUAGE,
                f"language must be a code such as 'en', got {language!r}",
            )
        self.model = self._entry(name)
        self.language = normalize_language(language) if language else None
        self.dropping = False  # a new request: what an earlier refusal dropped is over

    async def audio_start(self, event: WireEvent) -> None:
        if self.transcription is not None:
            raise Refusal(_INVALID, "audio-start during a transcription: send audio-stop first")
        await self._open(event)

    async def _open(self, event: WireEvent) -> None:
        # Refused (a bad format, a full model): the rest of this audio, up to its
        # audio-stop, is dropped, not taken as a new transcription chunk by chunk (each
        # refused again, or one opening once a slot is free, its transcript the audio's tail).
        self.dropping = True
        try:
            converter = PcmConverter(*audio_format(event.data))
        except AudioFormatError as exc:
            raise Refusal(_INVALID, str(exc)) from None
        slug = self.model or self._entry(None)
        options = StartOptions(model=slug, language=self.language)
        self.channel.busy(+1)
        try:
            stream = await self.pool.open_stream(options)
        except BaseException:
            self.channel.busy(-1)
            raise
        self.dropping = False
        job = self.transcription = _Transcription(stream, converter)
        await self.channel.send(
            "transcript-start", {"language": self.language} if self.language else None
        )
        self.channel.start_soon(lambda: self._results(job))

    async def _results(self, job: _Transcription) -> None:
        """The engine's results as transcript events, until its final (or failure)."""
        send = self.channel.send
        try:
            async for result in job.stream.events():
                piece = ""
                if isinstance(result, EnginePartial):
                    piece = job.chunks.partial(result)
                elif isinstance(result, EngineEndpoint | EngineFinal):
                    piece = job.chunks.end(result)
                if piece:
                    if job.fed_at:
                        _EVENT_LATENCY.observe(time.monotonic() - job.fed_at)
                    await send("transcript-chunk", {"text": piece})
                if isinstance(result, EngineFinal):
                    job.outcome = ("end", "")
                    transcript: dict[str, Any] = {"text": job.chunks.text}
                    if self.language:
                        transcript["language"] = self.language
                    await send("transcript", transcript)
                    await send("transcript-stop")
                    break
                if isinstance(result, EngineFailed):
                    self.dropping = True  # the rest of its audio, until audio-stop
                    job.outcome = ("server_error", "server_error")
                    await self.channel.error(result.detail, "server_error")
                    break
        finally:
            job.done.set()
            if self.transcription is job:
                await self.end()

    async def audio_chunk(self, event: WireEvent) -> None:
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
        job.frames += 1
        limit = self.channel.settings.stream_max_duration
        if job.converter.seconds > limit:
            job.outcome = ("audio_too_long", "audio_too_long")
            await self.channel.error(f"the audio is longer than {limit:g} s", "audio_too_long")
            raise Close
        if pcm:
            await self._feed(job, pcm)

    async def _feed(self, job: _Transcription, pcm: bytes) -> None:
        """Feed converted audio in pieces no larger than a WebSocket frame may be: a chunk
        may be up to the payload cap, and conversion makes 8-bit or 4 kHz audio up to eight
        times larger, but the engine stream's buffer (and its backpressure) counts frames
        of at most that size."""
        step = max(2, self.channel.settings.stream_max_frame_bytes & ~1)
        for at in range(0, len(pcm), step):
            await job.stream.feed(pcm[at : at + step])
        job.fed_at = time.monotonic()

    async def audio_stop(self, event: WireEvent) -> None:
        job = self.transcription
        if self.dropping:
            self.dropping = False
            return
        if job is None:
            raise Refusal(_INVALID, "audio-stop without audio-start")
        if not job.done.is_set():
            rest = job.converter.convert(b"", last=True)
            if rest:
                await self._feed(job, rest)
            await job.stream.flush()
            await job.done.wait()
        # Its audio-stop is here: a failure while it was waiting drops nothing after it.
        self.dropping = False
        await self.end()

    async def end(self) -> None:
        """Close the transcription in progress, if any (its slot is free when this returns)."""
        job, self.transcription = self.transcription, None
        if job is not None:
            with anyio.CancelScope(shield=True):
                await job.stream.aclose()
            self.channel.busy(-1)
            metrics.STREAMS.labels(_SURFACE, *job.outcome).inc()
            metrics.FRAMES.labels(_SURFACE).inc(job.frames)
            metrics.AUDIO_SECONDS.labels(_SURFACE).inc(job.converter.seconds)
