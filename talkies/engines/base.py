"""The two faces of an engine: the synchronous adapter and the async stream transports use."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Protocol

from ..protocol import EngineEndpoint, EngineFailed, EngineFinal, EnginePartial, ErrorCode
from ..protocol.messages import StartOptions

if TYPE_CHECKING:
    from .runner import DecodeRounds

__all__ = [
    "EngineEvent",
    "EngineStream",
    "EngineUnavailable",
    "EngineUpdate",
    "LoadedModel",
    "NoModels",
    "Recognition",
    "RecognitionModel",
    "Refusal",
    "StreamProvider",
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


class Refusal(Exception):
    """The provider will not open this stream; ``code`` is the contract's error code."""

    def __init__(self, code: ErrorCode, detail: str) -> None:
        super().__init__(f"{code.value}: {detail}")
        self.code = code
        self.detail = detail


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

    def events(self) -> AsyncIterator[EngineEvent]:
        """Results in order; ends after EngineFinal or EngineFailed."""
        ...

    async def aclose(self) -> None:
        """Release the stream and its slot. Idempotent; waits for in-flight decoding."""
        ...


class LoadedModel(Protocol):
    """A model held in memory by the pool; opens any number of streams on it."""

    async def open_stream(self, options: StartOptions, *, max_buffered_bytes: int) -> EngineStream:
        """A new stream; runs on the event loop, so it must not block (no decoding here)."""
        ...

    def close(self) -> None:
        """Free the model. Called from a worker thread, after every stream was closed."""
        ...


class RecognitionModel:
    """A :class:`LoadedModel` for engines whose streams are plain :class:`Recognition` objects:
    each stream is run by a :class:`~talkies.engines.runner.ThreadedStream`."""

    def recognition(self, options: StartOptions) -> Recognition:
        """Create a stream's decoder state (cheap; called on the event loop)."""
        raise NotImplementedError

    _rounds: DecodeRounds | None = None

    async def open_stream(self, options: StartOptions, *, max_buffered_bytes: int) -> EngineStream:
        from .runner import DecodeRounds, ThreadedStream

        if self._rounds is None:  # one set of worker-thread rounds per model
            self._rounds = DecodeRounds()
        return ThreadedStream(
            self.recognition(options), max_buffered_bytes=max_buffered_bytes, rounds=self._rounds
        )

    def close(self) -> None:
        return None


class StreamProvider(Protocol):
    """Resolves a model slug to an open stream (the model pool, in a full server)."""

    async def open_stream(self, options: StartOptions) -> EngineStream:
        """Open a stream or raise :class:`Refusal`."""
        ...


class NoModels:
    """A provider with an empty registry: every slug is unknown."""

    async def open_stream(self, options: StartOptions) -> EngineStream:
        raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {options.model!r}")
