"""Text to speech over Wyoming: ``synthesize {text, voice?}`` -> ``audio-start`` /
``audio-chunk``* / ``audio-stop``; and the streaming form ``synthesize-start`` /
``synthesize-chunk``* / ``synthesize-stop`` -> the same audio events, each sentence
synthesized as soon as it is complete while later text still arrives, then
``synthesize-stopped`` (the ``synthesize`` a streaming client also sends, for older servers,
is ignored).

A synthesis is a pool slot on the speech model, as ``/v1/audio/speech`` takes."""

from __future__ import annotations

import math
import re
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import anyio
import anyio.to_thread
from anyio.streams.memory import MemoryObjectSendStream

from .. import metrics
from ..engines import catalogue
from ..engines.base import EngineUnavailable, Refusal, RefusalKind
from ..engines.supply.builtin import DEFAULT_SPEECH_MODEL
from ..engines.tts.base import (
    API_SPEED_RANGE,
    MAX_INPUT_CHARS,
    NOTHING_TO_SPEAK,
    SpeechError,
    SpeechModel,
    SpeechRequest,
    SynthesisFailed,
    check_request,
)
from .channel import Channel, Close, text_field
from .framing import WireEvent

__all__ = ["MAX_STREAMED_CHARS", "Synthesizer"]

# Text a streaming synthesis may hold that is not yet a whole sentence, and in all.
MAX_STREAMED_CHARS = 16 * MAX_INPUT_CHARS
# Bytes of PCM per audio-chunk event sent (wyoming-piper sends 1024 samples).
_SEND_CHUNK = 8192
# A sentence ends at . ! ? ; : (and the CJK full stops), closing quotes or brackets, space.
_SENTENCE_END = re.compile(r"(?<=[.!?;:\u3002\uff01\uff1f])[\"')\]]*\s+")
_INVALID = RefusalKind.INVALID_INPUT
_SURFACE = "wyoming"  # the metrics' surface label


async def _each(texts: list[str] | AsyncIterator[str]) -> AsyncIterator[str]:
    if isinstance(texts, list):
        for text in texts:
            yield text
    else:
        async for text in texts:
            yield text


def _cut(text: str) -> int:
    """Where a text longer than :data:`MAX_INPUT_CHARS` (what one synthesis takes) is cut:
    after the last white space in its first that many characters, else at the limit."""
    cut = max(text.rfind(c, 0, MAX_INPUT_CHARS) for c in " \n\t\r") + 1
    return cut if cut > 0 else MAX_INPUT_CHARS


def _pieces(text: str) -> list[str]:
    """``text`` in pieces one synthesis takes (:func:`_cut`), stripped, blank ones dropped."""
    out = []
    while len(text) > MAX_INPUT_CHARS:
        cut = _cut(text)
        out.append(text[:cut])
        text = text[cut:]
    out.append(text)
    return [piece.strip() for piece in out if piece.strip()]


class Synthesizer:
    """One connection's text-to-speech: one synthesis (of either form) at a time."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.pool = channel.pool
        # The streaming synthesis: its sentence queue and the task speaking it.
        self.sentences: MemoryObjectSendStream[str] | None = None
        self.streamed = ""
        self.streamed_total = 0
        self.done: anyio.Event | None = None
        self.failed = False
        self.speaking = False  # a one-shot synthesis is running
        self.owed = 0  # texts of the streaming synthesis queued and not yet spoken

    @property
    def working(self) -> bool:
        """The server owes the client audio, so the client need not send meanwhile: a one-shot
        synthesis, or a streaming one with text not yet spoken. A streaming synthesis that
        waits for its client's text is not working: the idle timeout applies."""
        return self.speaking or self.owed > 0

    @property
    def streaming_open(self) -> bool:
        """A streaming synthesis is open (``synthesize-start`` taken, no ``synthesize-stop``
        yet)."""
        return self.done is not None

    @property
    def in_progress(self) -> bool:
        """A synthesis of either form is open (a graceful shutdown lets it finish)."""
        return self.speaking or self.streaming_open

    def end(self) -> None:
        """The connection is over: a streaming synthesis left open (no ``synthesize-stop``:
        the client left, stopped reading or passed a limit) gives back its count. Its task,
        and the slot it held, ended with the connection's task group."""
        if self.done is not None:
            if self.sentences is not None:
                self.sentences.close()
            self.sentences = None
            self.done = None
            self.owed = 0
            self.channel.busy(-1)

    def _queue(self, text: str) -> None:
        """Give text to the streaming synthesis, in pieces one synthesis takes."""
        if self.failed or self.sentences is None:
            return
        for piece in _pieces(text):
            self.owed += 1
            self.sentences.send_nowait(piece)

    def _voice(self, data: dict[str, Any]) -> tuple[str, str | None, str | None]:
        """(model, voice, language) of a synthesize event's ``voice``."""
        voice = data.get("voice")
        if voice is None:
            voice = {}
        if not isinstance(voice, dict):
            raise Refusal(_INVALID, "voice must be an object")
        name = text_field(voice, "name", 256)
        speaker = text_field(voice, "speaker", 256)
        language = text_field(voice, "language", 32)
        slug = name or DEFAULT_SPEECH_MODEL
        entry = self.pool.entry(slug)
        if entry is None:
            raise Refusal(RefusalKind.UNKNOWN_MODEL, f"unknown voice {slug[:64]!r}")
        if catalogue.executor_of(entry).kind != "tts":
            raise Refusal(_INVALID, f"{slug!r} is not a speech model")
        return entry.slug, speaker, language

    async def synthesize(self, event: WireEvent) -> None:
        if self.sentences is not None or self.done is not None:
            return  # a streaming client's copy of its text, for older servers
        text = text_field(event.data, "text", MAX_INPUT_CHARS)
        if text is None:
            raise Refusal(_INVALID, "synthesize needs its text")
        # What every model checks, before a slot or a load (empty text, its length).
        check_request(SpeechRequest(text=text, voice="-"), speed_range=API_SPEED_RANGE)
        slug, speaker, language = self._voice(event.data)
        self.channel.busy(+1)
        self.speaking = True
        try:
            await self._speak(slug, [text], speaker, language)
        finally:
            self.speaking = False
            self.channel.busy(-1)

    async def _speak(
        self,
        slug: str,
        texts: list[str] | AsyncIterator[str],
        speaker: str | None,
        language: str | None,
    ) -> None:
        """Speak each text in turn on one slot: one audio-start, the chunks, one audio-stop.
        A refusal or failure is an error event; after audio began, the audio-stop follows
        it, so a client reading up to the audio-stop is not left waiting."""
        send = self.channel.send
        started = False
        model: SpeechModel | None = None
        release: Callable[[], None] | None = None
        # For the metrics: when the first text came, PCM bytes sent, how it ended.
        began = 0.0
        sent = 0
        spoken = False
        outcome = ("peer_gone", "")
        try:
            async for text in _each(texts):
                if not text.strip():
                    continue
                began = began or time.monotonic()
                request = SpeechRequest(text=text, voice=speaker or "", language=language)
                check_request(request, speed_range=API_SPEED_RANGE)  # every text, not the first
                if model is None:
                    loaded, release = await self.pool.acquire(slug)
                    model = cast(SpeechModel, loaded)
                if not speaker:  # the model's first voice (for an engine process, a call to it)
                    voices = await anyio.to_thread.run_sync(model.voices)
                    request = SpeechRequest(text=text, voice=voices[0], language=language)
                audio = {"rate": model.sample_rate, "width": 2, "channels": 1}
                before = sent
                try:
                    stream = await model.synthesize(request)
                    async with stream:
                        async for pcm in stream:
                            if not started:
                                started = True
                                await send("audio-start", audio)
                            for at in range(0, len(pcm), _SEND_CHUNK):
                                piece = pcm[at : at + _SEND_CHUNK]
                                await send("audio-chunk", audio, piece)
                                if not sent:
                                    metrics.FIRST_AUDIO_SECONDS.labels(_SURFACE).observe(
                                        time.monotonic() - began
                                    )
                                sent += len(piece)
                except SpeechError as exc:
                    # A piece of a streamed text with nothing to speak ("... " cut off as a
                    # sentence of its own) is skipped: the rest of the reply is still spoken.
                    # One text that is all of a request is refused as it was.
                    if isinstance(texts, list) or exc.detail != NOTHING_TO_SPEAK or sent > before:
                        raise
            spoken = True
        except (Refusal, EngineUnavailable, SynthesisFailed) as exc:
            code = exc.kind.value if isinstance(exc, Refusal) else "server_error"
            outcome = (code, code)
            self.failed = True
            await self.channel.refuse(exc)
            if started:
                await send("audio-stop")
            return
        finally:
            if release is not None:
                release()
            if began and not spoken:  # refused, failed, or the client is gone
                self._count(outcome, sent, model)
        if not started:
            rate = model.sample_rate if model is not None else 24000
            await send("audio-start", {"rate": rate, "width": 2, "channels": 1})
        try:
            await send("audio-stop")
            outcome = ("end", "")
        finally:
            if began:
                self._count(outcome, sent, model)

    @staticmethod
    def _count(outcome: tuple[str, str], sent: int, model: SpeechModel | None) -> None:
        """Count a synthesis that ended (``end``, ``peer_gone`` or its error code)."""
        metrics.SYNTHESES.labels(_SURFACE, *outcome).inc()
        if sent and model is not None:
            metrics.SPEECH_AUDIO_SECONDS.labels(_SURFACE).inc(sent / 2 / model.sample_rate)

    async def synthesize_start(self, event: WireEvent) -> None:
        if self.sentences is not None:
            raise Refusal(_INVALID, "a streaming synthesis is in progress")
        slug, speaker, language = self._voice(event.data)
        send, receive = anyio.create_memory_object_stream[str](math.inf)
        self.sentences = send
        self.streamed = ""
        self.streamed_total = 0
        self.failed = False
        self.owed = 0
        done = self.done = anyio.Event()
        self.channel.busy(+1)

        async def texts() -> AsyncIterator[str]:
            async for text in receive:
                yield text
                self.owed -= 1  # asked for the next: this one is spoken

        async def speak() -> None:
            try:
                async with receive:
                    await self._speak(slug, texts(), speaker, language)
            finally:
                self.owed = 0  # spoken, or failed: nothing more will be
                done.set()

        self.channel.start_soon(speak)

    async def synthesize_chunk(self, event: WireEvent) -> None:
        if self.sentences is None:
            raise Refusal(_INVALID, "synthesize-chunk without synthesize-start")
        text = text_field(event.data, "text", MAX_INPUT_CHARS) or ""
        self.streamed_total += len(text)
        if self.streamed_total > MAX_STREAMED_CHARS:
            await self.channel.error(
                f"a streaming synthesis is limited to {MAX_STREAMED_CHARS} characters",
                "invalid_input",
            )
            raise Close
        self.streamed += text
        # Each complete sentence goes to the synthesis now; the rest waits for more text.
        while match := _SENTENCE_END.search(self.streamed):
            sentence, self.streamed = self.streamed[: match.end()], self.streamed[match.end() :]
            self._queue(sentence)
        while len(self.streamed) > MAX_INPUT_CHARS:
            # A "sentence" this long is spoken in pieces one synthesis takes, cut at spaces;
            # the rest waits for more text.
            cut = _cut(self.streamed)
            piece, self.streamed = self.streamed[:cut], self.streamed[cut:]
            self._queue(piece)

    async def synthesize_stop(self, event: WireEvent) -> None:
        if self.sentences is None or self.done is None:
            raise Refusal(_INVALID, "synthesize-stop without synthesize-start")
        sentences, done = self.sentences, self.done
        try:
            self._queue(self.streamed)
            self.streamed = ""
            sentences.close()
            await done.wait()
            await self.channel.send("synthesize-stopped")
        finally:
            self.sentences = None
            self.done = None
            self.channel.busy(-1)
