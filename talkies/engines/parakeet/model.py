"""parakeet.cpp models: options, GGUF headers, loading, and the streams (see the package
docstring)."""

from __future__ import annotations

import ctypes
import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...protocol import EngineEndpoint, EngineFinal, EnginePartial, ErrorCode, Word
from ...protocol.messages import StartOptions
from ..base import (
    EngineUnavailable,
    EngineUpdate,
    LoadedModel,
    PcmSource,
    Refusal,
    Transcript,
    TranscriptionRequest,
    transcribe_recognition,
)
from ..runtime import RecognitionModel
from ..supply.entry import ModelEntry
from .gguf_meta import GGUFError, read_metadata
from .native import (
    FEED_BYTES,
    NATIVE_LOCK,
    LoadedRuntime,
    require_loaded,
)

log = logging.getLogger("talkies.engines")

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
    loaded = require_loaded(entry)
    where = f"model {entry.slug!r}"
    if device not in ("auto", "cuda"):
        log.info(
            "model %r: parakeet.cpp chooses its device itself (the first GPU its driver "
            "reports, else the CPU); TALKIES_DEVICE=%s does not apply",
            entry.slug,
            device,
        )
    began = time.monotonic()
    with NATIVE_LOCK:
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

    def __init__(self, slug: str, native: Any, loaded: LoadedRuntime, header: ModelHeader) -> None:
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

    def transcribe(self, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
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
            recognition,
            audio,
            step=FEED_BYTES,
            language=request.language_code,
            cancel=request.cancel,
        )

    def close(self) -> None:
        native, self._native = self._native, None
        if native is not None:
            with NATIVE_LOCK:
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

    def _native(self) -> int:
        if self._closed:
            raise RuntimeError("the stream was closed")
        if self._stream is None:
            language = self._language.encode() if self._language is not None else None
            ctx = self._model.handle
            with NATIVE_LOCK:
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
        with NATIVE_LOCK:
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
            self._text, self._since = "", boundary

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        self._pending += pcm
        out: list[EngineUpdate] = []
        whole = len(self._pending) - len(self._pending) % FEED_BYTES
        for offset in range(0, whole, FEED_BYTES):
            block = _samples(self._pending[offset : offset + FEED_BYTES])
            self._absorb(self._call(block), out)
        del self._pending[:whole]
        if self._partials and whole:
            # After every decoded block, as it stands: dropping a partial that did not change
            # (or an empty one) is the protocol session's job alone (docs/architecture.md).
            words = tuple(self._timed) if self._words else ()
            out.append(EnginePartial(text=clean_text(self._text), words=words))
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
            with NATIVE_LOCK:
                self._runtime.free_stream(stream)
        self._pending.clear()


def _samples(pcm: bytes | bytearray) -> np.ndarray:
    """PCM16LE as contiguous float32 in [-1, 1)."""
    samples: np.ndarray = np.frombuffer(bytes(pcm), dtype="<i2").astype(np.float32)
    samples /= np.float32(32768.0)
    return np.ascontiguousarray(samples)
