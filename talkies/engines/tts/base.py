"""Speech synthesis: the request, its errors, the model protocol, and the thread-to-loop bridge.

A synthesis runs in a worker thread of its own that pushes raw PCM (s16le mono at the model's
``sample_rate``) into a queue bounded in chunks; :class:`SpeechStream` is the event loop's end
of that queue. A full queue blocks the worker, so a slow reader slows generation instead of
growing memory. Closing the stream (``aclose``, a cancelled reader, or dropping it) sets a stop
flag that the worker checks at every generation step; the worker then unwinds, releases the
model's lock and ends, and ``aclose`` returns only after that.

Each model serializes its own synthesis work with a lock taken by the worker thread: a second
request *waits* for it (in its own thread, never on the event loop). Admission (how many may
wait) belongs to the HTTP layer's slot pool, not to this layer.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import threading
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import anyio
import numpy as np
import numpy.typing as npt

from ..base import Refusal, RefusalKind

__all__ = [
    "API_SPEED_RANGE",
    "MAX_INPUT_CHARS",
    "NOTHING_TO_SPEAK",
    "SAMPLE_RATE",
    "Emitter",
    "SpeechError",
    "SpeechErrorKind",
    "SpeechModel",
    "SpeechRequest",
    "SpeechStream",
    "SynthesisFailed",
    "SynthesisStopped",
    "auto_device",
    "check_request",
    "pcm16",
    "start_synthesis",
    "str_map_option",
]

log = logging.getLogger("talkies.engines")

SAMPLE_RATE = 24000
# OpenAI's limit on /v1/audio/speech ``input``.
MAX_INPUT_CHARS = 4096
# OpenAI's range for ``speed``; a model may accept less (SpeechErrorKind.UNSUPPORTED).
API_SPEED_RANGE = (0.25, 4.0)
# How often a worker waiting for a model's lock looks at its stop flag.
_LOCK_POLL_SECONDS = 0.05


@dataclass(frozen=True, kw_only=True, slots=True)
class SpeechRequest:
    """One utterance to synthesize (the engine-level shape of OpenAI's speech request)."""

    text: str
    voice: str
    speed: float = 1.0
    instructions: str | None = None
    language: str | None = None  # None: the model's default ("auto" for Qwen3)


# The kinds a speech request is refused with (invalid_input, unknown_voice, unsupported): the
# engines' one vocabulary (every one is the client's fault, HTTP 400).
SpeechErrorKind = RefusalKind


# The detail of the refusal of a text in which an engine found nothing to speak (only
# punctuation, say): a streaming synthesis skips such a piece (talkies/wyoming/tts.py).
NOTHING_TO_SPEAK = "the input has nothing to speak"


class SpeechError(Refusal):
    """A refused speech request: a :class:`~talkies.engines.base.Refusal` whose ``message``
    (its detail) is written for the client and whose ``param`` (its field) names the field."""

    def __init__(self, kind: RefusalKind, message: str, *, param: str | None = None) -> None:
        super().__init__(kind, message, field=param)

    def __str__(self) -> str:
        return self.detail

    @property
    def message(self) -> str:
        return self.detail

    @property
    def param(self) -> str | None:
        return self.field


class SynthesisFailed(RuntimeError):
    """The engine failed while synthesizing (a server error); the message is client-safe and
    the cause is chained and logged."""


class SynthesisStopped(Exception):
    """Raised inside a worker when its stream was closed; unwinds the synthesis."""


def auto_device(device: str, runtime: str, has_gpu: Callable[[Any], bool]) -> str:
    """TALKIES_DEVICE for a speech engine's runtime: ``auto`` is the GPU when ``runtime`` (a
    module, imported only now) can use one, else the CPU (a missing runtime: the engine's own
    load names it)."""
    if device != "auto":
        return device
    try:
        module = importlib.import_module(runtime)
    except ImportError:
        return "cpu"
    return "cuda" if has_gpu(module) else "cpu"


def check_request(
    request: SpeechRequest,
    *,
    speed_range: tuple[float, float],
    voices: Collection[str] | None = None,
) -> None:
    """The checks every model makes: the text (and instructions) length and characters, the
    speed range, and the voice name when the model knows all its voices up front
    (``voices``)."""
    if not request.text.strip():
        raise SpeechError(SpeechErrorKind.INVALID_INPUT, "input is empty", param="input")
    _check_text(request.text, "input")
    if request.instructions is not None:  # only some models use them; none may choke on them
        _check_text(request.instructions, "instructions")
    if voices is not None and request.voice not in voices:
        raise SpeechError(
            SpeechErrorKind.UNKNOWN_VOICE, f"unknown voice {request.voice[:128]!r}", param="voice"
        )
    if not API_SPEED_RANGE[0] <= request.speed <= API_SPEED_RANGE[1]:  # also refuses NaN
        raise SpeechError(
            SpeechErrorKind.INVALID_INPUT,
            f"speed must be between {API_SPEED_RANGE[0]:g} and {API_SPEED_RANGE[1]:g}",
            param="speed",
        )
    low, high = speed_range
    if not low <= request.speed <= high:
        if low == high:
            message = f"this model speaks at one speed only: speed must be {low:g}"
        else:
            message = f"this model's speed must be between {low:g} and {high:g}"
        raise SpeechError(SpeechErrorKind.UNSUPPORTED, message, param="speed")


def _check_text(text: str, param: str) -> None:
    """Text a model is given: at most :data:`MAX_INPUT_CHARS`, no NUL, valid Unicode."""
    if len(text) > MAX_INPUT_CHARS:
        raise SpeechError(
            SpeechErrorKind.INVALID_INPUT,
            f"{param} is {len(text)} characters; the limit is {MAX_INPUT_CHARS}",
            param=param,
        )
    if "\x00" in text:
        raise SpeechError(SpeechErrorKind.INVALID_INPUT, f"{param} contains NUL", param=param)
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # JSON can carry a lone surrogate ("\\ud800"); no model can
            raise SpeechError(
                SpeechErrorKind.INVALID_INPUT,
                f"{param} is not valid Unicode (a lone surrogate)",
                param=param,
            ) from None


def str_map_option(options: Mapping[str, Any], key: str) -> dict[str, str] | None:
    """A model option that maps names to names, or None when absent."""
    value = options.get(key)
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and k and v for k, v in value.items()
    ):
        raise ValueError(f"option {key!r} must map names to names, got {value!r}")
    return dict(value)


def pcm16(samples: npt.NDArray[np.floating]) -> bytes:
    """Float samples in [-1, 1] as s16le bytes (clipped, rounded to nearest)."""
    clipped = np.clip(np.asarray(samples, dtype=np.float32), -1.0, 1.0)
    return bytes(np.rint(clipped * 32767.0).astype("<i2").tobytes())


class SpeechModel(Protocol):
    """A loaded text-to-speech model."""

    @property
    def sample_rate(self) -> int:
        """Hz of the PCM the streams yield (24000 for every model here)."""
        ...

    @property
    def streaming(self) -> bool:
        """True when chunks come out while the utterance is still being generated."""
        ...

    def voices(self) -> list[str]:
        """The voice names ``SpeechRequest.voice`` may take, in a stable order."""
        ...

    def validate(self, request: SpeechRequest) -> None:
        """Raise :class:`SpeechError` for a request this model refuses (cheap; no audio)."""
        ...

    async def synthesize(self, request: SpeechRequest, *, chunk_steps: int = 8) -> SpeechStream:
        """Validate, then start a synthesis; its PCM comes from the returned stream."""
        ...

    def close(self) -> None:
        """Free the model (blocking; call from a worker thread once no stream is open)."""
        ...


# -- the worker's side --------------------------------------------------------------------------


def _loop_caller() -> Callable[[Callable[[], None]], None]:
    """A thread-safe, non-blocking "run this on the current event loop soon".

    Non-blocking on purpose: a worker must never wait for the loop (which may be gone), or a
    dead loop would leave it holding the model's lock forever.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # not asyncio: anyio's other backend
        trio: Any = importlib.import_module("trio")  # optional, untyped here
        token = trio.lowlevel.current_trio_token()

        def call_trio(fn: Callable[[], None]) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(fn)

        return call_trio

    def call(fn: Callable[[], None]) -> None:
        # A closed loop raises RuntimeError: then nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(fn)

    return call


class _Channel:
    """The bounded chunk queue between one worker thread and the event loop."""

    def __init__(self, max_chunks: int, call_loop: Callable[[Callable[[], None]], None]) -> None:
        self._cond = threading.Condition()
        self._chunks: deque[bytes] = deque()
        self._max = max_chunks
        self._call_loop = call_loop
        self._waiter: anyio.Event | None = None  # set when something changes (loop side)
        self.stop_requested = False
        self.done = False
        self.error: BaseException | None = None
        self.steps = 0  # generation steps taken (codec steps for Qwen3)
        self.chunks = 0  # chunks handed to the queue

    # worker side

    def _wake(self) -> None:
        # Called with the condition held.
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._call_loop(waiter.set)

    def put(self, chunk: bytes) -> None:
        with self._cond:
            while len(self._chunks) >= self._max and not self.stop_requested:
                self._cond.wait()
            if self.stop_requested:
                raise SynthesisStopped
            self._chunks.append(chunk)
            self.chunks += 1
            self._wake()

    def finish(self, error: BaseException | None) -> None:
        with self._cond:
            self.done = True
            self.error = error
            self._wake()

    # loop side

    def take(self) -> bytes | anyio.Event | None:
        """A chunk; None at the end; else an event to wait on before asking again."""
        with self._cond:
            if self._chunks:
                chunk = self._chunks.popleft()
                self._cond.notify_all()
                return chunk
            if self.done or self.stop_requested:
                return None
            if self._waiter is None:
                self._waiter = anyio.Event()
            return self._waiter

    def wait_done(self) -> anyio.Event | None:
        with self._cond:
            if self.done:
                return None
            if self._waiter is None:
                self._waiter = anyio.Event()
            return self._waiter

    def stop(self) -> None:
        """Ask the worker to stop; drop what it queued. Thread-safe and idempotent."""
        with self._cond:
            self.stop_requested = True
            self._chunks.clear()
            self._cond.notify_all()


class Emitter:
    """What a synthesis job running in the worker thread sees of its stream."""

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel

    @property
    def stopped(self) -> bool:
        return self._channel.stop_requested

    def check(self) -> None:
        """Raise :class:`SynthesisStopped` if the stream was closed."""
        if self._channel.stop_requested:
            raise SynthesisStopped

    def step(self) -> None:
        """Count one generation step; raise :class:`SynthesisStopped` if the stream was closed."""
        self.check()
        self._channel.steps += 1

    def emit(self, pcm: bytes) -> None:
        """Queue one chunk; blocks while the queue is full; raises if the stream was closed."""
        if pcm:
            self._channel.put(pcm)


# -- the event loop's side ----------------------------------------------------------------------


class SpeechStream:
    """The PCM chunks of one synthesis, as an async iterator of ``bytes``.

    Use ``async with`` (or call :meth:`aclose`) so the worker is stopped and the model freed
    as soon as the reader is done; a reader cancelled while waiting stops the worker too.
    """

    def __init__(self, channel: _Channel, thread: threading.Thread) -> None:
        self._channel = channel
        self._thread = thread
        self._raised = False

    @property
    def steps(self) -> int:
        """Generation steps the worker has taken so far (codec steps for Qwen3)."""
        return self._channel.steps

    @property
    def chunks_produced(self) -> int:
        """Chunks the worker has queued so far (read or not)."""
        return self._channel.chunks

    @property
    def finished(self) -> bool:
        """The worker has ended (and released the model)."""
        return self._channel.done

    def __aiter__(self) -> SpeechStream:
        return self

    async def __anext__(self) -> bytes:
        while True:
            item = self._channel.take()
            if isinstance(item, bytes):
                return item
            if item is None:
                error = self._channel.error
                if error is not None and not self._raised and not self._channel.stop_requested:
                    self._raised = True
                    raise error
                raise StopAsyncIteration
            try:
                await item.wait()
            except BaseException:
                # The reader was cancelled: nobody will read the rest.
                self._channel.stop()
                raise

    async def aclose(self) -> None:
        """Stop the synthesis and wait until its worker has ended. Idempotent."""
        self._channel.stop()
        # Shielded: the model's lock must be seen released before a caller moves on, even one
        # that is being cancelled; the wait is at most one generation step.
        with anyio.CancelScope(shield=True):
            while (waiter := self._channel.wait_done()) is not None:
                await waiter.wait()

    async def __aenter__(self) -> SpeechStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __del__(self) -> None:
        # A stream dropped unread must not keep generating into a queue nobody reads.
        self._channel.stop()


def start_synthesis(
    job: Callable[[Emitter], None],
    *,
    lock: threading.Lock,
    max_chunks: int,
    name: str,
) -> SpeechStream:
    """Run ``job`` in a new worker thread that holds ``lock`` while it runs.

    Call from the event loop. ``job`` yields PCM with ``Emitter.emit`` and calls
    ``Emitter.step`` at every generation step. A :class:`SpeechError` it raises reaches the
    reader as is; any other exception is logged and reaches it as :class:`SynthesisFailed`.
    """
    if max_chunks < 1:
        raise ValueError("max_chunks must be at least 1")
    channel = _Channel(max_chunks, _loop_caller())
    emitter = Emitter(channel)

    def run() -> None:
        error: BaseException | None = None
        acquired = False
        try:
            while not lock.acquire(timeout=_LOCK_POLL_SECONDS):
                emitter.check()
            acquired = True
            emitter.check()
            job(emitter)
        except SynthesisStopped:
            pass
        except SpeechError as exc:
            error = exc
        except Exception as exc:
            log.exception("speech synthesis failed", extra={"model": name})
            error = SynthesisFailed("the speech engine failed while synthesizing")
            error.__cause__ = exc
        finally:
            if acquired:
                lock.release()
            channel.finish(error)

    thread = threading.Thread(target=run, name=f"talkies-tts-{name}", daemon=True)
    stream = SpeechStream(channel, thread)
    thread.start()
    return stream
