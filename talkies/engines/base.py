"""The two faces of an engine: the synchronous adapter and the async stream transports use."""

from __future__ import annotations

import enum
import math
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from ..protocol import EngineEndpoint, EngineFailed, EngineFinal, EnginePartial, ErrorCode, Word
from ..protocol.events import SAMPLE_RATE
from ..protocol.messages import StartOptions

__all__ = [
    "BatchRecognition",
    "EngineEvent",
    "EngineLost",
    "EngineStream",
    "EngineUnavailable",
    "EngineUpdate",
    "FileTranscriber",
    "ListeningStream",
    "LoadedModel",
    "NoModels",
    "PcmSource",
    "Recognition",
    "Refusal",
    "RefusalKind",
    "ResultListener",
    "StreamProvider",
    "Transcript",
    "TranscriptSegment",
    "TranscriptionCancelled",
    "TranscriptionRequest",
    "Work",
    "pcm_chunks",
    "transcribe_recognition",
]

EngineUpdate = EnginePartial | EngineEndpoint
EngineEvent = EnginePartial | EngineEndpoint | EngineFinal | EngineFailed


class Recognition(Protocol):
    """One decoding stream on a loaded model, driven from one worker thread at a time.

    Word times are seconds from the first sample given to ``accept``.
    """

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        """Decode PCM16LE mono 16 kHz samples; return what changed (partials, endpoints)."""
        ...

    def finish(self) -> EngineFinal:
        """Flush the decoder: the transcript of the audio after the last endpoint."""
        ...

    def close(self) -> None:
        """Free the stream's native resources. Called once, after any accept/finish."""
        ...


@dataclass(slots=True, eq=False)
class Work:
    """One stream's share of a decode round (:mod:`talkies.engines.runtime.rounds`).

    In: the audio queued since the last round and whether the input ends after it. Out: the
    events, in order (an EngineFinal or EngineFailed ends the stream), and ``more``: the
    decoder still holds decodable input, so the runtime calls again, with no new audio and no
    finish, before it gives the stream more (its bounded queue, not the decoder, absorbs a
    client that is faster than decoding).
    """

    recognition: Recognition
    pcm: bytes
    finish: bool
    events: list[EngineEvent] = field(default_factory=list)
    more: bool = False
    # A cut (EngineStream.cut): after ``finish``, the round thread closes ``recognition`` and
    # puts the new one ``renew()`` makes in its place; the stream goes on with that one.
    renew: Callable[[], Recognition] | None = None


class BatchRecognition(Recognition, Protocol):
    """A :class:`Recognition` that can also decode many streams of its model in one call.

    The runtime calls ``decode_many`` instead of ``accept``/``finish`` when a recognition
    has it: once per round, on one of the round's recognitions, with every stream of the same
    recognition type in the round. It decodes each item's ``pcm``, ends its input when
    ``finish`` is set (an EngineFinal once everything before the end was decoded), fills in
    ``events`` and ``more``, and reports a failure of one stream as an EngineFailed in its
    events. An exception fails every stream of the call.
    """

    def decode_many(self, work: Sequence[Work]) -> None: ...


class RefusalKind(enum.Enum):
    """Why an engine or the pool refuses. The first five are the live-ASR contract's own error
    codes (a stream closes with the spec's close code for each); every kind also has one HTTP
    status. Both mappings are written once, in :mod:`talkies.app.refusals`."""

    UNKNOWN_MODEL = "unknown_model"
    STREAMING_NOT_SUPPORTED = "streaming_not_supported"
    MODEL_BUSY = "model_busy"  # another model is pinned by streams
    CONNECTION_LIMIT = "connection_limit"  # the model's slots are full
    INVALID_LANGUAGE = "invalid_language"
    MODEL_IN_USE = "model_in_use"  # unloading a model that streams or requests use
    INVALID_INPUT = "invalid_input"  # empty or over-long text, a bad speed or language
    UNKNOWN_VOICE = "unknown_voice"
    UNSUPPORTED = "unsupported"  # valid for the API, but not something this model can do


class Refusal(Exception):
    """An engine or the pool will not do what was asked: the one refusal of ``engines/``.

    ``kind`` says why; ``detail`` is written for the client; ``field`` names the request field
    at fault (None: the request as a whole). ``kind`` may be given as the contract's
    :class:`~talkies.protocol.ErrorCode` of the same name.
    """

    def __init__(
        self, kind: RefusalKind | ErrorCode, detail: str, *, field: str | None = None
    ) -> None:
        kind = kind if isinstance(kind, RefusalKind) else RefusalKind(kind.value)
        super().__init__(f"{kind.value}: {detail}")
        self.kind = kind
        self.detail = detail
        self.field = field

    @property
    def code(self) -> ErrorCode | None:
        """The contract's error code of the same name, for the kinds a stream can be refused
        with (None for the others: they are refusals of requests only)."""
        try:
            return ErrorCode(self.kind.value)
        except ValueError:
            return None


class EngineLost(RuntimeError):
    """The engine behind a recognition is gone (its process ended, its model was unloaded).

    ``str(exc)`` is written for the client: a stream whose decode call raises this fails with
    it as its detail, the same detail it gets when the runtime learns of the end while the
    stream is paused between calls (the engine process's watcher, isolation/proxy.py)."""


class EngineUnavailable(Exception):
    """The model cannot be served (missing runtime, failed download or load check).

    Its message is written for the client: it becomes the detail of a 4500 ``server_error``.
    """


class EngineStream(Protocol):
    """An open engine stream as the event loop sees it."""

    async def feed(self, pcm: bytes) -> None:
        """Queue audio; waits while the queue is full (backpressure to the client)."""
        ...

    async def flush(self) -> None:
        """Ask for the final result; ``events()`` ends with an EngineFinal."""
        ...

    async def cut(self) -> None:
        """Close the utterance after the audio fed so far and go on: ``events()`` gives an
        EngineEndpoint marked ``cut`` for it (the decoder's ``finish()``), word times in the
        stream's time, and the stream keeps its slot and its model."""
        ...

    def events(self) -> AsyncIterator[EngineEvent]:
        """Results in order; ends after EngineFinal or EngineFailed."""
        ...

    async def aclose(self) -> None:
        """Release the stream and its slot. Idempotent; waits for in-flight decoding."""
        ...


ResultListener = Callable[[deque[EngineEvent]], bool]


@runtime_checkable
class ListeningStream(EngineStream, Protocol):
    """An engine stream that can also offer its results to a listener the moment they exist.

    The one fast result path, declared: the runtime's streams
    (:class:`~talkies.engines.runtime.ThreadedStream`) and the pool's wrapper of them have it.
    After :meth:`listen`, each batch of results is first offered to ``listener`` on the event
    loop, in the callback that ends the decode round: it takes what it can from the front of
    the queue it is given and returns whether it took everything. ``events()`` is woken only
    for what it leaves, in order; a stream without ``listen`` delivers everything there.
    """

    def listen(self, listener: ResultListener) -> None: ...


class LoadedModel(Protocol):
    """A model held in memory by the pool; opens any number of streams on it."""

    async def open_stream(self, options: StartOptions, *, max_buffered_bytes: int) -> EngineStream:
        """A new stream; runs on the event loop, so it must not block (no decoding here)."""
        ...

    def close(self) -> None:
        """Free the model. Called from a worker thread, after every stream was closed."""
        ...


class StreamProvider(Protocol):
    """Resolves a model slug to an open stream (the model pool, in a full server)."""

    async def open_stream(self, options: StartOptions) -> EngineStream:
        """Open a stream or raise :class:`Refusal`."""
        ...


class NoModels:
    """A provider with an empty registry: every slug is unknown."""

    async def open_stream(self, options: StartOptions) -> EngineStream:
        raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {options.model!r}")


# -- whole-file transcription (POST /v1/audio/transcriptions) --------------------------------


class TranscriptionCancelled(Exception):
    """A file transcription stopped because its ``cancel`` event was set (the client left)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class TranscriptionRequest:
    """The decoding options of one file transcription (OpenAI's form fields, checked)."""

    # None: the model's default language (Whisper's entry option; others report none);
    # "auto": detect, where the engine can; else a language code.
    language: str | None = None
    prompt: str | None = None  # text that conditions the decoder (Whisper's initial prompt)
    temperature: float = 0.0  # 0: greedy
    word_timestamps: bool = False  # timestamp_granularities includes "word"
    # Set from another thread to stop the transcription (TranscriptionCancelled).
    cancel: threading.Event | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and 0.0 <= self.temperature <= 1.0):
            raise ValueError(f"temperature must be from 0 to 1, got {self.temperature!r}")

    @property
    def language_code(self) -> str | None:
        """The requested language, or None when the engine should detect it."""
        return None if self.language in (None, "", "auto") else self.language


@dataclass(frozen=True, kw_only=True, slots=True)
class TranscriptSegment:
    """One utterance of a transcript: an engine endpoint, or one of Whisper's segments.

    Times are seconds from the start of the file. The optional fields are what Whisper
    reports; engines without them leave the defaults.
    """

    id: int
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()
    tokens: tuple[int, ...] = ()  # the engine's token ids (Whisper)
    avg_logprob: float | None = None  # mean log probability of the tokens
    no_speech_prob: float | None = None
    temperature: float = 0.0  # the temperature the segment was decoded at


@dataclass(frozen=True, kw_only=True, slots=True)
class Transcript:
    """The result of a whole-file transcription."""

    text: str
    language: str | None  # a language code ("en"): detected or requested; None if unknown
    duration: float  # seconds of audio transcribed
    segments: tuple[TranscriptSegment, ...] = ()

    @property
    def words(self) -> tuple[Word, ...]:
        """Every timed word, in order (empty unless word timestamps were asked for)."""
        return tuple(w for segment in self.segments for w in segment.words)


# A file's audio, PCM16LE mono 16 kHz: one bytes object, or chunks pulled one at a time. The
# server's come from ffmpeg through a bounded channel (talkies.app.transcribe), so a file is
# never whole in memory; pulling a chunk may block, and raises TranscriptionCancelled when the
# audio stopped coming (the client left, or the file turned out not to decode).
PcmSource = bytes | Iterable[bytes]


def pcm_chunks(audio: PcmSource, size: int) -> Iterator[bytes]:
    """``audio`` in pieces of at most ``size`` bytes, pulled as they are asked for."""
    if size < 1:
        raise ValueError("size must be positive")
    if isinstance(audio, bytes | bytearray | memoryview):
        view = memoryview(audio)
        for offset in range(0, len(view), size):
            yield bytes(view[offset : offset + size])
        return
    for chunk in audio:
        if len(chunk) <= size:
            if chunk:
                yield chunk
            continue
        view = memoryview(chunk)
        for offset in range(0, len(view), size):
            yield bytes(view[offset : offset + size])


@runtime_checkable
class FileTranscriber(Protocol):
    """A loaded model that can transcribe a whole file (spec, "Sherpa-ONNX and Vosk": "feeds
    it through an isolated native stream to completion"), taking its audio a chunk at a time.

    ``isinstance(model, FileTranscriber)`` tells whether a loaded model has the method.
    """

    def transcribe(self, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
        """Transcribe PCM16LE mono 16 kHz audio, pulled from ``audio`` as it is decoded.
        Blocking: call it from a worker thread.

        Holds only a bounded part of the audio at a time (the streaming engines a step,
        Whisper a window). Raises :class:`TranscriptionCancelled` soon after
        ``request.cancel`` is set, and whatever pulling from ``audio`` raised."""
        ...


def transcribe_recognition(
    recognition: Recognition,
    audio: PcmSource,
    *,
    step: int,
    language: str | None,
    cancel: threading.Event | None = None,
) -> Transcript:
    """Feed ``audio`` through ``recognition`` to completion, ``step`` bytes at a time, as its
    chunks arrive (so the pieces fed are those of the whole audio cut every ``step`` bytes,
    however it was chunked).

    Each endpoint with text becomes a segment, and the final result the last one. Segments
    are contiguous: each ends at the audio accepted when its endpoint came (so within
    ``step`` of the decoder's own boundary) and the next starts there; the last ends with the
    audio. ``cancel`` is checked before every step: once set, this raises
    :class:`TranscriptionCancelled`. Closes ``recognition``.
    """
    if step < 2 or step % 2:
        raise ValueError("step must be a positive even number of bytes")
    segments: list[TranscriptSegment] = []
    start = 0.0
    accepted = 0  # bytes fed so far

    def add(text: str, words: Sequence[Word], end: float) -> None:
        nonlocal start
        end = min(max(end, start), accepted / (2 * SAMPLE_RATE))
        if text:
            segments.append(
                TranscriptSegment(
                    id=len(segments), start=start, end=end, text=text, words=tuple(words)
                )
            )
        start = end

    def check() -> None:
        if cancel is not None and cancel.is_set():
            raise TranscriptionCancelled("the transcription was cancelled")

    def feed(piece: bytes) -> None:
        nonlocal accepted
        check()
        accepted += len(piece)
        for update in recognition.accept(piece):
            if isinstance(update, EngineEndpoint):
                add(update.text.strip(), update.words, accepted / (2 * SAMPLE_RATE))

    pending = bytearray()  # less than a step, carried to the next chunk
    try:
        for chunk in pcm_chunks(audio, 1 << 20):
            check()
            if not pending and len(chunk) % step == 0:  # the usual case: no copy to carry
                view = memoryview(chunk)
                for offset in range(0, len(view), step):
                    feed(bytes(view[offset : offset + step]))
                continue
            pending += chunk
            whole = len(pending) - len(pending) % step
            for offset in range(0, whole, step):
                feed(bytes(pending[offset : offset + step]))
            del pending[:whole]
        del pending[len(pending) - len(pending) % 2 :]  # an odd last byte is no sample
        if pending:
            feed(bytes(pending))
        check()
        final = recognition.finish()
        add(final.text.strip(), final.words, accepted / (2 * SAMPLE_RATE))
    finally:
        recognition.close()
    return Transcript(
        text=" ".join(s.text for s in segments),
        language=language,
        duration=accepted / (2 * SAMPLE_RATE),
        segments=tuple(segments),
    )
