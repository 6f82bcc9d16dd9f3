"""sherpa-onnx online recognizers, with streams batched through one decode loop per model.

:func:`load` builds ``sherpa_onnx.OnlineRecognizer.<recognizer_factory>(**kwargs)`` from a
registry entry. Relative model paths in ``sherpa_config`` resolve under the model's root and
may not leave it; every other key is passed through, checked against the factory's
signature. The provider comes from ``TALKIES_DEVICE`` (:func:`select_provider`).

Each client stream owns one sherpa ``OnlineStream``. The loaded model runs one decode thread
(``batch: true``, the default). Each round it moves queued audio into the streams that have
no decodable chunk left, then decodes one chunk of *every* ready stream with a single
``decode_streams`` call (at most ``max_batch`` streams per call), again and again while some
are still ready (for at most ~20 ms, then new audio gets its turn), so N live streams cost
about one batched encoder run per chunk instead of N. After each decoded chunk a stream is
checked for an endpoint (then reset), so the results depend on the audio only, never on how
it was split into frames or batched. Results reach each stream's event loop through
``call_soon_threadsafe`` (trio: ``run_sync_soon``), so the decode thread never waits for a
loop. ``aclose()`` frees a stream at once when the thread is not using it, else the thread
frees it right after its round. ``batch: false`` runs each stream as a plain
:class:`~talkies.engines.base.Recognition` behind a
:class:`~talkies.engines.runner.ThreadedStream` instead.

Entry ``options``: ``batch`` (bool, default true), ``max_batch`` (1-1024, default 16),
``max_wait`` (seconds the idle loop waits for more streams' audio before decoding, 0-1,
default 0.005), ``tail_padding`` (seconds of silence decoded after ``end`` so the last
frames reach the model, 0-5, default 0.66).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import re
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.from_thread
import anyio.lowlevel
import numpy as np

from ..protocol import EngineEndpoint, EngineFailed, EngineFinal, EnginePartial, Word
from ..protocol.messages import StartOptions
from .base import (
    EngineEvent,
    EngineStream,
    EngineUpdate,
    LoadedModel,
    Transcript,
    TranscriptionRequest,
    transcribe_recognition,
)
from .registry import SHERPA_FACTORIES, ModelEntry

__all__ = [
    "SherpaModel",
    "SherpaOptions",
    "SherpaRecognition",
    "load",
    "recognizer_kwargs",
    "select_provider",
    "words_from_tokens",
]

log = logging.getLogger("talkies.engines")

SAMPLE_RATE = 16000
# Keys naming one file (or directory) of the model: resolved under the model root.
PATH_KEYS = frozenset(
    {
        "tokens",
        "encoder",
        "decoder",
        "joiner",
        "model",
        "lm",
        "hotwords_file",
        "bpe_vocab",
        "ctc_graph",
        "lodr_fst",
        "hr_lexicon",
        "hr_dict_dir",
    }
)
# Keys naming comma-separated files.
PATH_LIST_KEYS = frozenset({"rule_fsts", "rule_fars", "hr_rule_fsts"})
_DIRECTORY_KEYS = frozenset({"hr_dict_dir"})
# Registry spellings -> the factory's parameter.
ALIASES = {"lm_model": "lm"}
# Chosen by talkies, not by the registry entry.
RESERVED_KEYS = {
    "provider": "the provider follows TALKIES_DEVICE",
    "device": "the device follows TALKIES_DEVICE",
}
_DEFAULTS: dict[str, object] = {
    "sample_rate": SAMPLE_RATE,
    "feature_dim": 80,
    "enable_endpoint_detection": True,
}
_CUDA_DEVICE = re.compile(r"cuda:(0|[1-9][0-9]{0,8})")
# One encoder output frame (10 ms fbank shift x 4 subsampling): the span given to a
# stream's last word, whose end the model does not mark.
_TOKEN_SPAN = 0.04
# How long one round of the decode loop may keep decoding the backlog of the streams it
# took before it looks for new audio again.
_ROUND_SECONDS = 0.02
# Bytes of PCM per accept() in a whole-file transcription: 0.1 s.
_FILE_STEP = 3200


# -- what talkies uses of sherpa-onnx (it ships no type information) -------------------------


class _Result(Protocol):
    text: str
    tokens: list[str]
    timestamps: list[float]
    start_time: float


class _NativeStream(Protocol):
    def accept_waveform(self, sample_rate: int, waveform: np.ndarray) -> None: ...

    def input_finished(self) -> None: ...


class _Recognizer(Protocol):
    def create_stream(self) -> _NativeStream: ...

    def is_ready(self, s: _NativeStream) -> bool: ...

    def decode_stream(self, s: _NativeStream) -> None: ...

    def decode_streams(self, ss: list[_NativeStream]) -> None: ...

    def is_endpoint(self, s: _NativeStream) -> bool: ...

    def reset(self, s: _NativeStream) -> bool: ...

    def get_result_all(self, s: _NativeStream) -> _Result: ...


# -- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class SherpaOptions:
    """The engine knobs of a sherpa entry (``ModelEntry.options``)."""

    batch: bool = True
    max_batch: int = 16
    max_wait: float = 0.005
    tail_padding: float = 0.66

    @classmethod
    def parse(cls, slug: str, options: Mapping[str, Any]) -> SherpaOptions:
        where = f"model {slug!r}"
        unknown = sorted(set(options) - {"batch", "max_batch", "max_wait", "tail_padding"})
        if unknown:
            raise ValueError(
                f"{where}: unknown sherpa option(s) {', '.join(map(repr, unknown))}; known: "
                "'batch', 'max_batch', 'max_wait', 'tail_padding'"
            )
        batch = options.get("batch", True)
        if not isinstance(batch, bool):
            raise ValueError(f"{where}: option 'batch' must be true or false")
        max_batch = options.get("max_batch", 16)
        if type(max_batch) is not int or not 1 <= max_batch <= 1024:
            raise ValueError(f"{where}: option 'max_batch' must be an integer from 1 to 1024")

        def seconds(key: str, default: float, top: float) -> float:
            value = options.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{where}: option {key!r} must be a number of seconds")
            if not 0.0 <= float(value) <= top:
                raise ValueError(f"{where}: option {key!r} must be from 0 to {top} seconds")
            return float(value)

        return cls(
            batch=batch,
            max_batch=max_batch,
            max_wait=seconds("max_wait", 0.005, 1.0),
            tail_padding=seconds("tail_padding", 0.66, 5.0),
        )


def _cuda_available() -> bool:
    """A CUDA-capable onnxruntime (the Python one, or the one sherpa-onnx bundles) and an
    NVIDIA device node."""
    providers: list[str] = []
    try:
        import onnxruntime  # type: ignore[import-not-found, import-untyped, unused-ignore]
    except ImportError:
        pass
    else:
        providers = list(onnxruntime.get_available_providers())
    bundled = False
    try:
        import sherpa_onnx  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        pass
    else:
        lib = Path(sherpa_onnx.__file__).parent / "lib"
        bundled = any(lib.glob("libonnxruntime_providers_cuda*"))
    if "CUDAExecutionProvider" not in providers and not bundled:
        return False
    return Path("/dev/nvidiactl").exists() or any(Path("/proc/driver/nvidia/gpus").glob("*"))


def select_provider(
    device: str, *, cuda_available: Callable[[], bool] = _cuda_available
) -> tuple[str, int]:
    """``(provider, device index)`` for sherpa-onnx from ``TALKIES_DEVICE``.

    ``cuda`` and ``cuda:N`` ask for CUDA (sherpa-onnx itself falls back to the CPU, with a
    log line, when its onnxruntime has no CUDA provider); ``auto`` picks CUDA only when
    ``cuda_available()`` says so; ``cpu`` is the CPU.
    """
    if device == "cpu":
        return "cpu", 0
    if device == "cuda":
        return "cuda", 0
    match = _CUDA_DEVICE.fullmatch(device)
    if match is not None:
        return "cuda", int(match.group(1))
    if device == "auto":
        return ("cuda", 0) if cuda_available() else ("cpu", 0)
    raise ValueError(f"TALKIES_DEVICE must be auto, cpu, cuda or cuda:N, got {device!r}")


def _resolve(slug: str, key: str, value: str, root: Path) -> str:
    base = root.resolve()
    target = (base / value).resolve()  # an absolute value replaces base; symlinks followed
    if target != base and base not in target.parents:
        raise ValueError(
            f"model {slug!r}: sherpa_config[{key!r}] = {value!r} is outside the model "
            f"directory {str(base)!r}"
        )
    exists = target.is_dir() if key in _DIRECTORY_KEYS else target.is_file()
    if not exists:
        raise ValueError(
            f"model {slug!r}: sherpa_config[{key!r}] = {value!r}: no such "
            f"{'directory' if key in _DIRECTORY_KEYS else 'file'} in {str(base)!r}"
        )
    return str(target)


def recognizer_kwargs(
    slug: str,
    factory: Callable[..., object],
    config: Mapping[str, Any],
    root: Path,
    provider: tuple[str, int],
) -> dict[str, Any]:
    """Keyword arguments for ``factory`` from an entry's ``sherpa_config``: model paths
    resolved and confined under ``root``, keys checked against the factory's signature."""
    name = getattr(factory, "__name__", "factory")
    params = inspect.signature(factory).parameters
    accepted = {
        p for p, spec in params.items() if spec.kind is not spec.VAR_KEYWORD
    } - RESERVED_KEYS.keys()
    kwargs: dict[str, Any] = {}
    for raw_key, value in config.items():
        key = ALIASES.get(raw_key, raw_key)
        if key in RESERVED_KEYS:
            raise ValueError(f"model {slug!r}: sherpa_config[{raw_key!r}] is not allowed: "
                             f"{RESERVED_KEYS[key]}")  # fmt: skip
        if key not in accepted:
            raise ValueError(
                f"model {slug!r}: sherpa_config[{raw_key!r}] is not a parameter of "
                f"OnlineRecognizer.{name} (accepted: {', '.join(sorted(accepted))})"
            )
        if key in kwargs:
            raise ValueError(f"model {slug!r}: sherpa_config sets {key!r} twice")
        if key in PATH_KEYS or key in PATH_LIST_KEYS:
            if not isinstance(value, str):
                raise ValueError(f"model {slug!r}: sherpa_config[{raw_key!r}] must be a path")
            if value and key in PATH_LIST_KEYS:
                kwargs[key] = ",".join(_resolve(slug, raw_key, v, root) for v in value.split(","))
                continue
            if value:
                kwargs[key] = _resolve(slug, raw_key, value, root)
                continue
        kwargs[key] = value
    required = [
        p
        for p, spec in params.items()
        if spec.default is spec.empty and spec.kind is not spec.VAR_KEYWORD and p not in kwargs
    ]
    if required:
        raise ValueError(
            f"model {slug!r}: sherpa_config lacks {', '.join(map(repr, required))} "
            f"for OnlineRecognizer.{name}"
        )
    for key, default in _DEFAULTS.items():
        if key in accepted:
            kwargs.setdefault(key, default)
    kwargs["provider"], kwargs["device"] = provider
    return kwargs


def load(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
    """Build the entry's online recognizer (blocking: run it in a worker thread)."""
    where = f"model {entry.slug!r}"
    factory_name = entry.recognizer_factory
    if factory_name not in SHERPA_FACTORIES:
        raise ValueError(
            f"{where}: recognizer_factory must be one of {', '.join(sorted(SHERPA_FACTORIES))},"
            f" got {factory_name!r}"
        )
    options = SherpaOptions.parse(entry.slug, entry.options)
    provider = select_provider(device)
    import sherpa_onnx  # type: ignore[import-untyped, unused-ignore]

    factory = getattr(sherpa_onnx.OnlineRecognizer, factory_name)
    kwargs = recognizer_kwargs(entry.slug, factory, entry.sherpa_config, root, provider)
    started = time.perf_counter()
    try:
        recognizer = factory(**kwargs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ValueError(f"{where}: sherpa-onnx rejected the configuration: {exc}") from exc
    log.info(
        "sherpa model loaded",
        extra={
            "model": entry.slug,
            "factory": factory_name,
            "provider": provider[0],
            "device_index": provider[1],
            "batch": options.batch,
            "seconds": round(time.perf_counter() - started, 3),
        },
    )
    return SherpaModel(recognizer, options, slug=entry.slug)


# -- decoding, shared by both modes ------------------------------------------------------------


def _is_cjk(char: str) -> bool:
    code = ord(char)
    return 0x3040 <= code <= 0x30FF or 0x3400 <= code <= 0x9FFF or 0xAC00 <= code <= 0xD7AF


def words_from_tokens(
    tokens: Sequence[str], timestamps: Sequence[float], *, offset: float, limit: float
) -> tuple[Word, ...]:
    """Merge BPE tokens into words: a token starting with ``▁`` or a space starts a word (and
    so does each CJK character). ``timestamps`` are token starts relative to ``offset``; a
    word ends where the next begins, the last one a token span after its last token; every
    time is clamped to ``limit`` (the audio accepted so far)."""
    if len(tokens) != len(timestamps):
        return ()
    groups: list[list[Any]] = []  # [text, first time, last time]
    boundary = True
    for token, stamp in zip(tokens, timestamps, strict=True):
        if token[:1] in ("▁", " "):
            boundary = True
        piece = token.lstrip("▁ ")
        if not piece:
            continue
        if boundary or not groups or _is_cjk(piece[0]) or _is_cjk(groups[-1][0][-1]):
            groups.append([piece, float(stamp), float(stamp)])
            boundary = False
        else:
            groups[-1][0] += piece
            groups[-1][2] = float(stamp)
    words: list[Word] = []
    for i, (text, first, last) in enumerate(groups):
        start = min(max(offset + first, 0.0), limit)
        end = offset + groups[i + 1][1] if i + 1 < len(groups) else offset + last + _TOKEN_SPAN
        words.append(Word(word=text, start=start, end=max(start, min(end, limit))))
    return tuple(words)


class _Decoder:
    """One client stream's sherpa state. Only one thread calls it at a time."""

    def __init__(self, recognizer: _Recognizer, options: StartOptions, tail_padding: float):
        self.rec = recognizer
        self.stream: _NativeStream | None = recognizer.create_stream()
        self._want_words = options.word_timestamps
        self._tail = np.zeros(round(tail_padding * SAMPLE_RATE), dtype=np.float32)
        self._carry = b""  # an odd trailing byte, kept for the next call
        self.samples = 0  # samples accepted (without the tail padding)
        self._shown = ""  # the text of the last partial or endpoint
        self.finishing = False

    @property
    def native(self) -> _NativeStream:
        assert self.stream is not None, "the stream was freed"
        return self.stream

    def accept(self, pcm: bytes) -> None:
        if self._carry:
            pcm, self._carry = self._carry + pcm, b""
        if len(pcm) % 2:
            pcm, self._carry = pcm[:-1], pcm[-1:]
        if not pcm:
            return
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
        samples *= np.float32(1.0 / 32768.0)
        self.native.accept_waveform(SAMPLE_RATE, samples)
        self.samples += len(samples)

    def ready(self) -> bool:
        return bool(self.rec.is_ready(self.native))

    def _words(self, result: _Result) -> tuple[Word, ...]:
        if not self._want_words or not result.tokens:
            return ()
        return words_from_tokens(
            list(result.tokens),
            list(result.timestamps),
            offset=float(result.start_time),
            limit=self.samples / SAMPLE_RATE,
        )

    def after_chunk(self, out: list[EngineUpdate]) -> None:
        """One chunk was decoded: an endpoint closes the utterance (not while finishing)."""
        if self.finishing or not self.rec.is_endpoint(self.native):
            return
        result = self.rec.get_result_all(self.native)
        text = result.text.strip()
        if text or self._shown:
            out.append(EngineEndpoint(text=text, words=self._words(result)))
        self.rec.reset(self.native)
        self._shown = ""

    def partial(self, out: list[EngineUpdate]) -> None:
        result = self.rec.get_result_all(self.native)
        text = result.text.strip()
        if text != self._shown:
            out.append(EnginePartial(text=text, words=self._words(result)))
            self._shown = text

    def start_finish(self) -> None:
        """End of input: decode the tail padding too, and no more endpoints."""
        if self.finishing:
            return
        self.finishing = True
        self._carry = b""
        if len(self._tail):
            self.native.accept_waveform(SAMPLE_RATE, self._tail)
        self.native.input_finished()

    def final(self) -> EngineFinal:
        result = self.rec.get_result_all(self.native)
        return EngineFinal(text=result.text.strip(), words=self._words(result))

    def free(self) -> None:
        self.stream = None  # drops the native OnlineStream


class SherpaRecognition:
    """A stream decoded on its own (``batch: false``): the :class:`Recognition` protocol."""

    def __init__(self, recognizer: _Recognizer, options: StartOptions, tail_padding: float):
        self._d = _Decoder(recognizer, options, tail_padding)

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        out: list[EngineUpdate] = []
        self._d.accept(pcm)
        decoded = False
        while self._d.ready():
            self._d.rec.decode_stream(self._d.native)
            self._d.after_chunk(out)
            decoded = True
        if decoded:
            self._d.partial(out)
        return out

    def finish(self) -> EngineFinal:
        self._d.start_finish()
        while self._d.ready():
            self._d.rec.decode_stream(self._d.native)
        return self._d.final()

    def close(self) -> None:
        self._d.free()


# -- the batched mode ----------------------------------------------------------------------------


def _waker(token: anyio.lowlevel.EventLoopToken) -> Callable[[Callable[[], None]], None]:
    """Schedule a callback on the event loop of ``token`` from any thread, without waiting
    for it where the backend allows (asyncio, trio)."""
    native = token.native_token
    if isinstance(native, asyncio.AbstractEventLoop):
        loop = native

        def on_asyncio(callback: Callable[[], None]) -> None:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(callback)

        return on_asyncio
    run_sync_soon = getattr(native, "run_sync_soon", None)
    if callable(run_sync_soon):

        def on_trio(callback: Callable[[], None]) -> None:
            with contextlib.suppress(Exception):  # trio.RunFinishedError: the run is over
                run_sync_soon(callback)

        return on_trio

    def blocking(callback: Callable[[], None]) -> None:
        with contextlib.suppress(Exception):  # the loop is gone
            anyio.from_thread.run_sync(callback, token=token)

    return blocking


class _Slot:
    """The decode loop's view of one client stream. Fields marked (M) are guarded by the
    batcher's mutex; ``decoder`` is used only by whoever holds the slot: the decode thread
    while ``in_flight``, else nobody (it is then free to be released)."""

    __slots__ = (
        "audio",
        "audio_bytes",
        "closing",
        "decoder",
        "done",
        "flush",
        "freed",
        "in_flight",
        "maybe_ready",
        "notify",
        "results",
        "wants_results",
        "wants_room",
    )

    def __init__(self, decoder: _Decoder, notify: Callable[[], None]) -> None:
        self.decoder = decoder
        self.notify = notify  # schedules the stream's wake-up on its event loop
        self.audio: deque[bytes] = deque()  # (M) queued PCM
        self.audio_bytes = 0  # (M)
        self.flush = False  # (M) end of input requested
        self.closing = False  # (M) the stream is closed: free the decoder
        self.freed = False  # (M)
        self.in_flight = False  # (M) the decode thread is using the decoder
        self.maybe_ready = False  # (M) the native stream may hold a decodable chunk
        self.done = False  # (M) a final or failure was produced: no more decoding
        self.results: deque[EngineEvent] = deque()  # (M)
        self.wants_results = False  # (M) events() waits for results
        self.wants_room = False  # (M) feed() waits for room in the queue

    def has_work(self) -> bool:
        if self.done or self.closing:
            return False
        return bool(self.audio) or self.maybe_ready or (self.flush and not self.decoder.finishing)


class _Batcher:
    """One decode thread per model: batches every ready stream into ``decode_streams``."""

    def __init__(self, recognizer: _Recognizer, options: SherpaOptions, slug: str) -> None:
        self._rec = recognizer
        self._max_batch = options.max_batch
        self._max_wait = options.max_wait
        self._slug = slug
        self.mutex = threading.Lock()
        self._work = threading.Condition(self.mutex)
        self._slots: list[_Slot] = []  # (M)
        self._thread: threading.Thread | None = None
        self._stopping = False  # (M)
        # Counters for tests and benches.
        self.decode_calls = 0
        self.decoded_chunks = 0

    # -- loop side (any thread) ----------------------------------------------------------------

    def add(self, slot: _Slot) -> None:
        with self.mutex:
            if self._stopping:
                raise RuntimeError(f"model {self._slug!r} is closed")
            self._slots.append(slot)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"sherpa-decode-{self._slug}", daemon=True
                )
                self._thread.start()

    def kick(self) -> None:
        """Call with the mutex held: there is new work."""
        self._work.notify()

    def release(self, slot: _Slot) -> bool:
        """Close ``slot``: free it now if the decode thread is not using it (True), else the
        thread frees it after its round and notifies the stream (False)."""
        with self.mutex:
            slot.closing = True
            if slot.in_flight:
                return False
            self._free(slot)
            return True

    def _free(self, slot: _Slot) -> None:
        # Mutex held and the slot not in flight: nobody else touches the decoder.
        if slot.freed:
            return
        slot.freed = True
        slot.decoder.free()
        slot.audio.clear()
        slot.audio_bytes = 0
        if slot in self._slots:
            self._slots.remove(slot)

    def stop(self) -> None:
        """End the decode thread (after its round) and free every stream still open."""
        with self.mutex:
            self._stopping = True
            self._work.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self.mutex:
            left = list(self._slots)
            for slot in left:
                self._free(slot)
        for slot in left:
            slot.notify()

    # -- the decode thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:
            # Not expected: the rounds catch the engine's errors. Leave nothing hanging:
            # every stream fails, aclose() can free them, and new streams are refused.
            log.exception("sherpa decode loop crashed", extra={"model": self._slug})
            with self.mutex:
                self._stopping = True
                left = list(self._slots)
                for slot in left:
                    slot.in_flight = False
                    if not slot.done:
                        slot.done = True
                        slot.results.append(EngineFailed(detail="the speech engine failed"))
            for slot in left:
                slot.notify()

    def _loop(self) -> None:
        while True:
            with self.mutex:
                if not self._wait_for_work():
                    return
                work = self._take()
            try:
                outputs = self._round(work)
            except Exception:  # a bug in the round itself: its streams get a failure
                log.exception("sherpa decode loop failed", extra={"model": self._slug})
                failure = EngineFailed(detail="the speech engine failed")
                outputs = {id(s): [failure] for s, _, _ in work}
            wake: list[_Slot] = []
            with self.mutex:
                for slot, pcm, _ in work:
                    slot.in_flight = False
                    events = outputs.get(id(slot), [])
                    if any(isinstance(e, EngineFinal | EngineFailed) for e in events):
                        slot.done = True
                    slot.results.extend(events)
                    if slot.closing:
                        self._free(slot)
                    # Wake the stream's waiters only when there is something for them.
                    changed = bool(events) or pcm is not None
                    if slot.closing or (changed and (slot.wants_results or slot.wants_room)):
                        slot.wants_results = slot.wants_room = False
                        wake.append(slot)
            for slot in wake:
                slot.notify()

    def _wait_for_work(self) -> bool:
        """Mutex held: wait until some stream has work; False when stopping."""
        waited = False
        while not self._stopping and not any(s.has_work() for s in self._slots):
            self._work.wait()
            waited = True
        if self._stopping:
            return False
        if waited and self._max_wait > 0:
            # Coming out of idle: give the other streams' audio a moment to arrive, so one
            # decode serves them all.
            deadline = time.monotonic() + self._max_wait
            while not self._stopping:
                live = [s for s in self._slots if not s.done and not s.closing]
                if all(s.has_work() for s in live) or len(live) <= 1:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._work.wait(left)
        return not self._stopping

    def _take(self) -> list[tuple[_Slot, bytes | None, bool]]:
        """Mutex held: the slots this round works on, each with the audio taken from its
        queue and whether its input ends now."""
        work: list[tuple[_Slot, bytes | None, bool]] = []
        for slot in self._slots:
            if not slot.has_work():
                continue
            slot.in_flight = True
            pcm: bytes | None = None
            # Audio moves into the native stream only once its decodable chunks are done,
            # so the bounded queue (not sherpa's buffer) absorbs a client that is too fast.
            if slot.audio and not slot.maybe_ready:
                pcm = b"".join(slot.audio)
                slot.audio.clear()
                slot.audio_bytes = 0
            # The input ends once every chunk of the audio before it was decoded (with
            # endpoint checks), as a stream decoded on its own does; feed() ignores audio
            # once flush is set, so nothing can follow the tail padding.
            finish = (
                slot.flush
                and pcm is None
                and not slot.audio
                and not slot.maybe_ready
                and not slot.decoder.finishing
            )
            work.append((slot, pcm, finish))
        return work

    def _round(self, work: list[tuple[_Slot, bytes | None, bool]]) -> dict[int, list[EngineEvent]]:
        """No lock held; the slots in ``work`` are in flight (owned by this thread)."""
        outputs: dict[int, list[EngineEvent]] = {id(s): [] for s, _, _ in work}
        live: list[_Slot] = []
        for slot, pcm, finish in work:
            try:
                if pcm is not None:
                    slot.decoder.accept(pcm)
                if finish:
                    slot.decoder.start_finish()
            except Exception:
                log.exception("sherpa stream failed to accept audio", extra={"model": self._slug})
                outputs[id(slot)].append(EngineFailed(detail="the speech engine failed"))
                continue
            live.append(slot)
        decoded: set[int] = set()
        failed: set[int] = set()
        started = time.monotonic()
        ready = [s for s in live if s.decoder.ready()]
        while ready:
            for start in range(0, len(ready), self._max_batch):
                batch = ready[start : start + self._max_batch]
                try:
                    self._rec.decode_streams([s.decoder.native for s in batch])
                except Exception:
                    log.exception(
                        "sherpa decode failed", extra={"model": self._slug, "streams": len(batch)}
                    )
                    for slot in batch:
                        failed.add(id(slot))
                        outputs[id(slot)].append(
                            EngineFailed(detail="the speech engine failed while decoding")
                        )
                    continue
                self.decode_calls += 1
                self.decoded_chunks += len(batch)
                for slot in batch:
                    decoded.add(id(slot))
                    updates: list[EngineUpdate] = []
                    slot.decoder.after_chunk(updates)
                    outputs[id(slot)].extend(updates)
            # Streams with more decodable audio go again (batched the same way) until they
            # are drained or the round's time is up: new audio of the others waits for the
            # next round, so a backlog costs few rounds without starving anyone for long.
            if time.monotonic() - started >= _ROUND_SECONDS:
                break
            ready = [s for s in ready if id(s) not in failed and s.decoder.ready()]
        for slot in live:
            if id(slot) in failed:
                continue
            events = outputs[id(slot)]
            try:
                if slot.decoder.ready():
                    slot.maybe_ready = True  # more chunks: the next round (partial then)
                    continue
                slot.maybe_ready = False
                if slot.decoder.finishing:
                    events.append(slot.decoder.final())
                elif id(slot) in decoded:
                    updates = []
                    slot.decoder.partial(updates)
                    events.extend(updates)
            except Exception:
                log.exception("sherpa stream failed", extra={"model": self._slug})
                events.append(EngineFailed(detail="the speech engine failed"))
        return outputs


class BatchedStream:
    """An :class:`~talkies.engines.base.EngineStream` decoded by the model's batch loop."""

    def __init__(self, batcher: _Batcher, decoder: _Decoder, *, max_buffered_bytes: int) -> None:
        if max_buffered_bytes < 2:
            raise ValueError("max_buffered_bytes must be at least 2")
        self._batcher = batcher
        self._max = max_buffered_bytes
        self._closed = False
        # Each waiter re-arms its own event before looking at the shared state, and the
        # decode thread wakes them all through _on_update, run on this stream's event loop.
        self._results_ready = anyio.Event()
        self._room = anyio.Event()
        self._freed = anyio.Event()
        wake = _waker(anyio.lowlevel.current_token())
        self._slot = _Slot(decoder, lambda: wake(self._on_update))
        batcher.add(self._slot)

    def _on_update(self) -> None:
        self._results_ready.set()
        self._room.set()
        self._freed.set()

    @property
    def buffered_bytes(self) -> int:
        return self._slot.audio_bytes

    async def feed(self, pcm: bytes) -> None:
        slot = self._slot
        while True:
            self._room = anyio.Event()
            with self._batcher.mutex:
                if self._closed or slot.closing or slot.flush or slot.done:
                    return
                # A frame always fits into an empty queue, so this cannot deadlock.
                if not slot.audio or slot.audio_bytes + len(pcm) <= self._max:
                    slot.audio.append(pcm)
                    slot.audio_bytes += len(pcm)
                    self._batcher.kick()
                    return
                slot.wants_room = True
            await self._room.wait()

    async def flush(self) -> None:
        with self._batcher.mutex:
            self._slot.flush = True
            self._batcher.kick()

    async def events(self) -> AsyncIterator[EngineEvent]:
        slot = self._slot
        while not self._closed:
            self._results_ready = anyio.Event()
            with self._batcher.mutex:
                items = list(slot.results)
                slot.results.clear()
                freed = slot.freed
                if not items:
                    slot.wants_results = True
            for item in items:
                yield item
                if isinstance(item, EngineFinal | EngineFailed):
                    return
            if freed:
                return
            if not items:
                await self._results_ready.wait()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._results_ready.set()
        self._room.set()
        # Shielded: the native stream must be released even if our caller is cancelled, and
        # never while the decode thread is using it.
        with anyio.CancelScope(shield=True):
            while True:
                self._freed = anyio.Event()
                if self._batcher.release(self._slot):
                    return
                await self._freed.wait()


class SherpaModel:
    """A loaded sherpa-onnx online recognizer (a :class:`LoadedModel`)."""

    def __init__(self, recognizer: Any, options: SherpaOptions, *, slug: str) -> None:
        self.recognizer: _Recognizer = recognizer
        self.options = options
        self.slug = slug
        self._batcher = _Batcher(self.recognizer, options, slug) if options.batch else None

    @property
    def batcher(self) -> _Batcher | None:
        return self._batcher

    def recognition(self, options: StartOptions) -> SherpaRecognition:
        """A stream decoded on its own, whatever the mode (tests, offline transcription)."""
        return SherpaRecognition(self.recognizer, options, self.options.tail_padding)

    def transcribe(self, pcm: bytes, request: TranscriptionRequest) -> Transcript:
        """A whole file through an ``OnlineStream`` of its own, decoded on the calling thread,
        never through the batched decode thread (a
        :class:`~talkies.engines.base.FileTranscriber`; blocking). Fed 0.1 s per call, so
        a segment ends within 0.1 s after the chunk where sherpa found its endpoint.
        """
        options = StartOptions(
            model=self.slug, interim_results=False, word_timestamps=request.word_timestamps
        )
        return transcribe_recognition(
            self.recognition(options), pcm, step=_FILE_STEP, language=request.language_code
        )

    async def open_stream(self, options: StartOptions, *, max_buffered_bytes: int) -> EngineStream:
        if self._batcher is None:
            from .runner import ThreadedStream

            return ThreadedStream(self.recognition(options), max_buffered_bytes=max_buffered_bytes)
        decoder = _Decoder(self.recognizer, options, self.options.tail_padding)
        return BatchedStream(self._batcher, decoder, max_buffered_bytes=max_buffered_bytes)

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.stop()
        log.info("sherpa model closed", extra={"model": self.slug})
