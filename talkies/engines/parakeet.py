"""``parakeet_cpp``: NVIDIA's cache-aware streaming transducers (Nemotron streaming ASR, the
realtime EOU model) through the parakeet.cpp runtime of the PyPI package ``parakeet-cpp-cuda``.

**The runtime.** The package's Python module ``parakeet`` loads its bundled
``libparakeet.so`` when it is imported. That library links ggml's CUDA backend, which needs
the CUDA 12 runtime (``libcudart.so.12``), cuBLAS (``libcublas.so.12``, ``libcublasLt.so.12``)
and NCCL (``libnccl.so.2``), shipped by NVIDIA's ``nvidia-*-cu12`` wheels, and the NVIDIA
driver's ``libcuda.so.1``, which no wheel ships. Nothing puts the wheels' folders on the
loader's path, so :func:`runtime` loads those libraries from the installed wheels first (the
system's copies otherwise), then the driver, then imports ``parakeet``; the first one missing
becomes the 4500 detail (:func:`require_runtime`). Where the driver finds no GPU, ggml falls
back to its CPU backend; the device is parakeet.cpp's choice, not ``TALKIES_DEVICE``'s.

**The API used.** ``parakeet.Model`` loads the GGUF. Streams go through the library's flat C
API (``parakeet_capi.h``): ``stream_begin_lang``, ``stream_feed_json``,
``stream_finalize_json``, ``stream_free``. The Python ``parakeet.Stream`` offers no word
times; the JSON entry points (ABI 5 and later) return, per call, the newly finalised text, the
end-of-utterance events with their times, and the words finalised with their times. They are
bound with ctypes on the library handle the ``parakeet`` module loaded (``parakeet._ffi.lib``,
the package's one private name used here: the functions themselves are public C API).

parakeet.cpp computes every graph on one process-global ggml backend; its C API does not say
that two threads may use it at once, so all native calls take :data:`_NATIVE_LOCK`: streams of
one server decode one call at a time.

**A stream.** Audio reaches the runtime in blocks of :data:`FEED_SAMPLES` (80 ms, one encoder
frame) whatever the client's framing, so endpoints and finals do not depend on it. After each
``accept`` the stream reports the text of the current utterance (a partial) when it changed:
the runtime has no revisable hypothesis, only text it finalised, so partials grow. An
``<EOU>`` (end of utterance) or ``<EOB>`` (end of a backchannel such as "uh-huh"; the
decoder restarts at both) ends the utterance: an endpoint with its text. Text finalised in the
same 80 ms block as the event but after it is counted before it (the runtime reports a
block's text as one string). ``finish`` flushes the runtime and returns the text after the
last endpoint.

**Word times** count from the stream's first sample. The runtime times a word only once the
next word starts (or at the end of the stream), so at an endpoint the utterance's last word
has no times yet: the endpoint's ``words`` are the words already timed, and the late word is
not reported. The final's words are complete. Language tags such as ``<en-us>``, which
Nemotron is reported to append to its transcripts, are removed from text and words.

**Languages.** A model with language prompts (Nemotron) accepts the tags in its GGUF prompt
dictionary (read from the file header by :mod:`.gguf_meta`), or their primary language
(``en-GB`` -> ``en``); no language is the model's default, ``auto`` is passed on where the
dictionary has it. Others are refused with ``invalid_language``. A model without prompts
decodes its one language whatever is asked.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import json
import logging
import math
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from ..protocol import EngineEndpoint, EngineFinal, EnginePartial, ErrorCode, Word
from ..protocol.messages import StartOptions
from .base import (
    EngineUnavailable,
    EngineUpdate,
    LoadedModel,
    RecognitionModel,
    Refusal,
    Transcript,
    TranscriptionRequest,
    transcribe_recognition,
)
from .builtin import DEFAULT_MODEL
from .gguf_meta import GGUFError, read_metadata
from .registry import ModelEntry

__all__ = [
    "FEED_BYTES",
    "FEED_SAMPLES",
    "PACKAGE",
    "ModelHeader",
    "ParakeetModel",
    "ParakeetOptions",
    "ParakeetRecognition",
    "RuntimeMissing",
    "choose_language",
    "clean_text",
    "load",
    "model_file",
    "parse_words",
    "read_header",
    "require_runtime",
    "runtime",
]

log = logging.getLogger("talkies.engines")

SAMPLE_RATE = 16000
# 80 ms: one encoder frame of a FastConformer (10 ms hop, 8x subsampling).
FEED_SAMPLES = 1280
FEED_BYTES = 2 * FEED_SAMPLES
PACKAGE = "parakeet-cpp-cuda"
# The streaming JSON documents carry "events" from ABI 5 on.
_MIN_ABI = 5
_NATIVE_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class _Library:
    soname: str
    what: str
    distribution: str  # the PyPI wheel that ships it
    folder: str  # where in that wheel


# In load order: each one's dependencies first.
_CUDA_LIBRARIES = (
    _Library(
        "libcudart.so.12",
        "the CUDA 12 runtime",
        "nvidia-cuda-runtime-cu12",
        "nvidia/cuda_runtime/lib",
    ),
    _Library("libcublasLt.so.12", "cuBLASLt", "nvidia-cublas-cu12", "nvidia/cublas/lib"),
    _Library("libcublas.so.12", "cuBLAS", "nvidia-cublas-cu12", "nvidia/cublas/lib"),
    _Library("libnccl.so.2", "NCCL", "nvidia-nccl-cu12", "nvidia/nccl/lib"),
)
_DRIVER = "libcuda.so.1"
_INSTALL = "pip install 'talkies[parakeet]'"


# -- the runtime ------------------------------------------------------------------------------


class RuntimeMissing(Exception):
    """The parakeet.cpp runtime cannot be loaded here; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class _Runtime:
    """The ``parakeet`` module and the C functions streams use."""

    module: ModuleType
    version: str
    abi: int
    begin: Any  # parakeet_capi_stream_begin_lang(ctx, lang) -> stream | NULL
    feed: Any  # parakeet_capi_stream_feed_json(stream, float*, n) -> char* | NULL
    finalize: Any  # parakeet_capi_stream_finalize_json(stream) -> char* | NULL
    free_stream: Any  # parakeet_capi_stream_free(stream)
    free_string: Any  # parakeet_capi_free_string(char*)
    last_error: Any  # parakeet_capi_last_error(ctx) -> const char*

    def take(self, pointer: int | None) -> str | None:
        """The malloc'd string at ``pointer``, freed; None for NULL."""
        if not pointer:
            return None
        value = ctypes.cast(pointer, ctypes.c_char_p).value
        self.free_string(pointer)
        return value.decode("utf-8", "replace") if value is not None else ""

    def error(self, ctx: int) -> str:
        message = self.last_error(ctx)
        return message.decode("utf-8", "replace") if message else "unknown error"


def _load_cuda_library(library: _Library) -> None:
    """Load ``library``, from its wheel if installed, else from the loader's path. Once loaded,
    it is what the loader gives ``libggml-cuda.so`` for that name (libraries are matched by
    soname), so no global symbol scope is needed."""
    try:
        wheel = importlib.metadata.distribution(library.distribution)
    except importlib.metadata.PackageNotFoundError:
        wheel = None
    if wheel is not None:
        path = Path(str(wheel.locate_file(f"{library.folder}/{library.soname}")))
        if path.is_file():
            try:
                ctypes.CDLL(str(path))
                return
            except OSError as exc:
                raise RuntimeMissing(
                    f"{library.soname} ({library.what}) failed to load: {exc}"
                ) from exc
    try:
        ctypes.CDLL(library.soname)
    except OSError:
        raise RuntimeMissing(
            f"{library.soname} ({library.what}) is missing: {PACKAGE} needs it from the PyPI "
            f"package {library.distribution} ({_INSTALL})"
        ) from None


def _bind(lib: Any, name: str, restype: Any, *argtypes: Any) -> Any:
    # lib[name] makes a new function object: the module's own bindings are left alone.
    function = lib[name]
    function.restype, function.argtypes = restype, list(argtypes)
    return function


def _load_runtime() -> _Runtime:
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeMissing(f"the PyPI package {PACKAGE} is not installed ({_INSTALL})") from None
    for library in _CUDA_LIBRARIES:
        _load_cuda_library(library)
    try:
        ctypes.CDLL(_DRIVER)
    except OSError:
        raise RuntimeMissing(
            f"{_DRIVER} (the NVIDIA driver) is missing: {PACKAGE} needs an NVIDIA GPU and its "
            "driver, even to decode on the CPU"
        ) from None
    try:
        module = importlib.import_module("parakeet")
    except OSError as exc:
        # The package's message lists each library it tried, one per line.
        detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise RuntimeMissing(f"{PACKAGE} {version} could not load its library: {detail}") from exc
    except ImportError as exc:
        raise RuntimeMissing(f"{PACKAGE} {version} is broken: {exc}") from exc
    abi = int(module.abi_version())
    lib = getattr(getattr(module, "_ffi", None), "lib", None)
    if abi < _MIN_ABI or lib is None or not hasattr(lib, "parakeet_capi_stream_feed_json"):
        raise RuntimeMissing(
            f"{PACKAGE} {version} (libparakeet ABI {abi}) lacks the streaming JSON API "
            f"(ABI {_MIN_ABI} or later; {PACKAGE}==0.2.2 has it)"
        )
    void_p, char_p, float_p = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_float)
    return _Runtime(
        module=module,
        version=version,
        abi=abi,
        begin=_bind(lib, "parakeet_capi_stream_begin_lang", void_p, void_p, char_p),
        feed=_bind(lib, "parakeet_capi_stream_feed_json", void_p, void_p, float_p, ctypes.c_int),
        finalize=_bind(lib, "parakeet_capi_stream_finalize_json", void_p, void_p),
        free_stream=_bind(lib, "parakeet_capi_stream_free", None, void_p),
        free_string=_bind(lib, "parakeet_capi_free_string", None, void_p),
        last_error=_bind(lib, "parakeet_capi_last_error", char_p, void_p),
    )


class _Once:
    """The outcome of the one attempt to load the runtime: the runtime or why not. A failure
    is kept: the libraries already loaded stay loaded, and a second attempt would only repeat
    it."""

    lock = threading.Lock()
    loaded: _Runtime | None = None
    missing: str | None = None


def runtime() -> _Runtime:
    """The loaded runtime, loading it on first use; :class:`RuntimeMissing` if it cannot be."""
    with _Once.lock:
        if _Once.loaded is None:
            if _Once.missing is not None:
                raise RuntimeMissing(_Once.missing)
            try:
                _Once.loaded = _load_runtime()
            except RuntimeMissing as exc:
                _Once.missing = str(exc)
                raise
        return _Once.loaded


def _require(entry: ModelEntry) -> _Runtime:
    try:
        return runtime()
    except RuntimeMissing as exc:
        raise EngineUnavailable(
            f"model {entry.slug!r} cannot load the parakeet.cpp runtime: {exc}. "
            f"Use {DEFAULT_MODEL!r} here, which works offline"
        ) from None


def require_runtime(entry: ModelEntry) -> str:
    """The runtime's version, or :class:`EngineUnavailable` naming what is missing (the pool
    asks before it fetches a model's files)."""
    loaded = _require(entry)
    return f"{PACKAGE} {loaded.version} (libparakeet ABI {loaded.abi})"


# -- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ParakeetOptions:
    """The engine knobs of a parakeet_cpp entry (``ModelEntry.options``).

    ``gguf_file``: the model file, relative to the model folder; needed only when the folder
    holds more than one ``.gguf``.
    """

    gguf_file: str | None = None

    @classmethod
    def parse(cls, slug: str, options: Mapping[str, Any]) -> ParakeetOptions:
        unknown = sorted(set(options) - {"gguf_file"})
        if unknown:
            raise ValueError(
                f"model {slug!r}: unknown parakeet_cpp option(s) "
                f"{', '.join(map(repr, unknown))}; known: 'gguf_file'"
            )
        gguf_file = options.get("gguf_file")
        if gguf_file is not None and (
            not isinstance(gguf_file, str)
            or not gguf_file.endswith(".gguf")
            or Path(gguf_file).is_absolute()
            or ".." in Path(gguf_file).parts
        ):
            raise ValueError(
                f"model {slug!r}: option 'gguf_file' must name a .gguf file inside the model "
                f"folder, got {gguf_file!r}"
            )
        return cls(gguf_file=gguf_file)


def model_file(slug: str, root: Path, options: ParakeetOptions) -> Path:
    """The GGUF to load, or :class:`EngineUnavailable` saying why there is none."""
    where = f"model {slug!r}"
    if not root.is_dir():
        raise EngineUnavailable(f"{where}: the model folder {str(root)!r} does not exist")
    if options.gguf_file is not None:
        path = root / options.gguf_file
        if not path.is_file():
            raise EngineUnavailable(f"{where}: {options.gguf_file!r} is not in {str(root)!r}")
        return path
    found = sorted(p.name for p in root.glob("*.gguf") if p.is_file())
    if len(found) == 1:
        return root / found[0]
    if not found:
        raise EngineUnavailable(f"{where}: no .gguf file in {str(root)!r}")
    raise EngineUnavailable(
        f"{where}: {str(root)!r} holds several .gguf files ({', '.join(found)}): name one in "
        "the entry's option 'gguf_file'"
    )


# -- loading ------------------------------------------------------------------------------------

_ARCH = "general.architecture"
_LANGUAGES = "parakeet.prompt.dictionary.keys"
_DEFAULT_LANGUAGE = "parakeet.prompt.default_lang"


@dataclass(frozen=True, slots=True)
class ModelHeader:
    """What Talkies reads from a model's GGUF header before loading it."""

    languages: tuple[str, ...]  # the language prompt dictionary's tags; () without prompts
    default_language: str | None


def read_header(slug: str, path: Path) -> ModelHeader:
    """The header of a parakeet.cpp GGUF, or :class:`EngineUnavailable` for another file."""
    where = f"model {slug!r}"
    try:
        header = read_metadata(path, (_ARCH, _LANGUAGES, _DEFAULT_LANGUAGE))
    except (GGUFError, OSError) as exc:
        raise EngineUnavailable(f"{where}: cannot read {str(path)!r}: {exc}") from None
    if header.get(_ARCH) != "parakeet":
        raise EngineUnavailable(
            f"{where}: {path.name!r} is not a parakeet.cpp model (general.architecture is "
            f"{header.get(_ARCH)!r}, not 'parakeet')"
        )
    tags = header.get(_LANGUAGES, [])
    default = header.get(_DEFAULT_LANGUAGE)
    return ModelHeader(
        languages=tuple(t for t in tags if isinstance(t, str)) if isinstance(tags, list) else (),
        default_language=default if isinstance(default, str) else None,
    )


def choose_language(slug: str, languages: Sequence[str], requested: str | None) -> str | None:
    """The prompt tag to open a stream with (None: the model's default), or :class:`Refusal`
    (``invalid_language``) for a language a model with prompts does not know.

    Tags match exactly, as parakeet.cpp matches them, else by their primary language
    (``en-GB`` -> ``en``). A model without prompts ignores the language.
    """
    if requested is None or not languages:
        return None
    if requested == "auto":
        return "auto" if "auto" in languages else None
    for candidate in (requested, requested.split("-")[0]):
        if candidate in languages:
            return candidate
    known = ", ".join(sorted(t for t in languages if t != "auto"))
    raise Refusal(
        ErrorCode.INVALID_LANGUAGE,
        f"model {slug!r} has no language {requested!r} (it knows {known})",
    )


def load(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
    """Load the model's GGUF (blocking: run it in a worker thread)."""
    options = ParakeetOptions.parse(entry.slug, entry.options)
    path = model_file(entry.slug, root, options)
    header = read_header(entry.slug, path)
    loaded = _require(entry)
    where = f"model {entry.slug!r}"
    if device not in ("auto", "cuda"):
        log.info(
            "model %r: parakeet.cpp chooses its device itself (the first GPU its driver "
            "reports, else the CPU); TALKIES_DEVICE=%s does not apply",
            entry.slug,
            device,
        )
    began = time.monotonic()
    with _NATIVE_LOCK:
        try:
            native = loaded.module.Model(str(path))
        except loaded.module.ParakeetError as exc:
            raise EngineUnavailable(
                f"{where}: parakeet.cpp could not load {path.name!r}: {exc}"
            ) from None
        # A model that cannot stream fails here, at load, not at the first client.
        stream = loaded.begin(native.handle, None)
        if not stream:
            reason = loaded.error(native.handle)
            native.close()
            raise EngineUnavailable(f"{where}: {path.name!r} cannot stream: {reason}")
        loaded.free_stream(stream)
    log.debug("model %r: loaded %s in %.2f s", entry.slug, path.name, time.monotonic() - began)
    return ParakeetModel(entry.slug, native, loaded, header)


class ParakeetModel(RecognitionModel):
    """A loaded GGUF; its streams are :class:`ParakeetRecognition` objects."""

    def __init__(self, slug: str, native: Any, loaded: _Runtime, header: ModelHeader) -> None:
        self.slug = slug
        self.header = header
        self._native: Any = native  # parakeet.Model
        self.runtime = loaded

    @property
    def handle(self) -> int:
        """The native ``parakeet_ctx*``."""
        if self._native is None:
            raise RuntimeError(f"model {self.slug!r} was closed")
        handle: int = self._native.handle
        return handle

    def language_for(self, requested: str | None) -> str | None:
        """See :func:`choose_language`."""
        return choose_language(self.slug, self.header.languages, requested)

    def recognition(self, options: StartOptions) -> ParakeetRecognition:
        return ParakeetRecognition(
            self,
            language=self.language_for(options.language),
            word_timestamps=options.word_timestamps,
            interim_results=options.interim_results,
        )

    def transcribe(self, pcm: bytes, request: TranscriptionRequest) -> Transcript:
        """A whole file through a stream of its own (a
        :class:`~talkies.engines.base.FileTranscriber`; blocking). Fed one :data:`FEED_BYTES`
        block per call, each segment ends at the block where the runtime ended the utterance.
        """
        recognition = ParakeetRecognition(
            self,
            language=self.language_for(request.language_code),
            word_timestamps=request.word_timestamps,
            interim_results=False,
        )
        return transcribe_recognition(
            recognition, pcm, step=FEED_BYTES, language=request.language_code
        )

    def close(self) -> None:
        native, self._native = self._native, None
        if native is not None:
            with _NATIVE_LOCK:
                native.close()


# -- streams ------------------------------------------------------------------------------------

# A language tag as a whole token: "<en-us>", "<de>", "<zh-cn>".
_TAG = re.compile(r"(?<!\S)<[A-Za-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*>(?!\S)")
_SPACES = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """Text without language tags, with single spaces and no spaces at the ends."""
    return _SPACES.sub(" ", _TAG.sub(" ", text)).strip()


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_words(raw: object) -> list[Word]:
    """The runtime's ``[{"w", "start", "end", "conf"}]`` as :class:`Word`, without tags and
    entries lacking a word or a finite time; ``0 <= start <= end``."""
    if not isinstance(raw, list):
        return []
    words: list[Word] = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        text, start, end = item.get("w"), _number(item.get("start")), _number(item.get("end"))
        if not isinstance(text, str) or start is None or end is None:
            continue
        text = clean_text(text)
        if not text:
            continue
        start = max(0.0, start)
        confidence = _number(item.get("conf"))
        if confidence is not None and not 0.0 <= confidence <= 1.0:
            confidence = None
        words.append(Word(word=text, start=start, end=max(start, end), confidence=confidence))
    return words


@dataclass(frozen=True, slots=True)
class _Step:
    """One JSON document of ``stream_feed_json`` / ``stream_finalize_json``."""

    text: str
    words: list[Word]
    boundaries: list[float]  # times of <EOU>/<EOB> events, seconds

    @classmethod
    def parse(cls, document: str) -> _Step:
        try:
            data: Any = json.loads(document)
        except ValueError:
            log.warning("parakeet.cpp returned a stream result that is not JSON: %.200r", document)
            return cls("", [], [])
        if not isinstance(data, dict):
            return cls("", [], [])
        text = data.get("text")
        events = data.get("events")
        boundaries = [
            t
            for e in (events if isinstance(events, list) else [])
            if isinstance(e, dict) and e.get("type") in ("eou", "eob")
            for t in [_number(e.get("t"))]
            if t is not None
        ]
        return cls(
            text if isinstance(text, str) else "", parse_words(data.get("words")), boundaries
        )


class ParakeetRecognition:
    """One stream: a :class:`~talkies.engines.base.Recognition` over a native
    ``parakeet_stream``, begun on the first ``accept``/``finish`` (in the worker thread)."""

    def __init__(
        self,
        model: ParakeetModel,
        *,
        language: str | None,
        word_timestamps: bool,
        interim_results: bool,
    ) -> None:
        self._model = model
        self._runtime = model.runtime
        self._language = language
        self._words = word_timestamps
        self._partials = interim_results
        self._stream: int | None = None
        self._closed = False
        self._pending = bytearray()  # less than FEED_BYTES not yet given to the runtime
        self._text = ""  # what the runtime finalised since the last endpoint (raw)
        self._timed: list[Word] = []  # the words of that text the runtime has timed
        self._since = 0.0  # when the current utterance began (the last boundary), seconds
        self._partial = ""  # the partial text last reported

    def _native(self) -> int:
        if self._closed:
            raise RuntimeError("the stream was closed")
        if self._stream is None:
            language = self._language.encode() if self._language is not None else None
            ctx = self._model.handle
            with _NATIVE_LOCK:
                stream = self._runtime.begin(ctx, language)
                if not stream:
                    raise RuntimeError(
                        f"parakeet.cpp could not open a stream: {self._runtime.error(ctx)}"
                    )
            self._stream = int(stream)
        return self._stream

    def _call(self, samples: np.ndarray | None) -> _Step:
        """Feed ``samples`` (None: finalise) and parse what the runtime returns."""
        stream = self._native()
        with _NATIVE_LOCK:
            if samples is None:
                result = self._runtime.finalize(stream)
            else:
                pointer = samples.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
                result = self._runtime.feed(stream, pointer, int(samples.size))
            document = self._runtime.take(result)
            if document is None:
                raise RuntimeError(f"parakeet.cpp: {self._runtime.error(self._model.handle)}")
        return _Step.parse(document)

    def _absorb(self, step: _Step, out: list[EngineUpdate] | None) -> None:
        """Add a step's text and words; at each boundary (unless ``out`` is None: the end of
        the stream), report the utterance as an endpoint and start the next one."""
        self._text += step.text
        # A word that began before the current utterance is the late last word of one already
        # reported: dropped (see the module docstring).
        self._timed += [w for w in step.words if w.start >= self._since - 1e-3]
        if out is None:
            return
        for boundary in step.boundaries:
            text = clean_text(self._text)
            if text:
                words = [w for w in self._timed if w.start < boundary] if self._words else []
                out.append(EngineEndpoint(text=text, words=tuple(words)))
            self._timed = [w for w in self._timed if w.start >= boundary]
            self._text, self._since, self._partial = "", boundary, ""

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        self._pending += pcm
        out: list[EngineUpdate] = []
        whole = len(self._pending) - len(self._pending) % FEED_BYTES
        for offset in range(0, whole, FEED_BYTES):
            block = _samples(self._pending[offset : offset + FEED_BYTES])
            self._absorb(self._call(block), out)
        del self._pending[:whole]
        if self._partials:
            text = clean_text(self._text)
            if text != self._partial:
                self._partial = text
                words = tuple(self._timed) if self._words else ()
                out.append(EnginePartial(text=text, words=words))
        return out

    def finish(self) -> EngineFinal:
        if self._pending:
            pending = self._pending[: len(self._pending) - len(self._pending) % 2]
            # A boundary in this last block is not taken: the final is that utterance.
            self._absorb(self._call(_samples(pending)), None)
            self._pending.clear()
        self._absorb(self._call(None), None)
        words = tuple(self._timed) if self._words else ()
        return EngineFinal(text=clean_text(self._text), words=words)

    def close(self) -> None:
        self._closed = True
        stream, self._stream = self._stream, None
        if stream is not None:
            with _NATIVE_LOCK:
                self._runtime.free_stream(stream)
        self._pending.clear()


def _samples(pcm: bytes | bytearray) -> np.ndarray:
    """PCM16LE as contiguous float32 in [-1, 1)."""
    samples: np.ndarray = np.frombuffer(bytes(pcm), dtype="<i2").astype(np.float32)
    samples /= np.float32(32768.0)
    return np.ascontiguousarray(samples)
