"""``vosk``: Kaldi models through Vosk's ``KaldiRecognizer``, one recognizer per stream.

:func:`load` opens the model snapshot's root with ``vosk.Model``; Vosk decodes on the CPU
whatever ``TALKIES_DEVICE`` says. Each stream is a :class:`VoskRecognition` run by the
engine-stream runtime (:mod:`talkies.engines.runtime.rounds`), which creates it in a worker
thread: a ``KaldiRecognizer`` takes ~70 ms to build, too long for the event loop.

Audio reaches the recognizer in fixed blocks of :data:`CHUNK_BYTES` (0.1 s), whatever the
client's frames or the runner's batches were: Vosk checks for an endpoint only at the end of
each ``AcceptWaveform`` call, and the point where an utterance is cut changes how the next one
is decoded, so feeding the client's framing through would make the transcript depend on it.
A block that ends an utterance gives an endpoint (``Result()``); otherwise the stream reports
``PartialResult()`` once per batch (the protocol session drops one that did not change).
``end`` feeds the last partial block and returns ``FinalResult()``. Vosk's word times already
count from the start of the stream, across utterances. Endpoints and the final carry words
when the client asks for word timestamps; partials carry them only with the entry option
``partial_words`` (:class:`VoskOptions`).

Vosk's feature extraction dithers (unless the model's ``conf/mfcc.conf`` sets
``--dither=0``), drawing from the C library's process-wide ``rand()``: the same audio can give
slightly different words from one run to the next, and streams running at the same time draw
from the same sequence. Runs are repeatable only from the same ``srand`` seed, one at a time.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

from ...protocol import EngineEndpoint, EngineFinal, EnginePartial, Word
from ...protocol.events import SAMPLE_RATE
from ...protocol.messages import StartOptions
from ..base import (
    EngineUnavailable,
    EngineUpdate,
    LoadedModel,
    PcmSource,
    Transcript,
    TranscriptionRequest,
    transcribe_recognition,
)
from ..catalogue import Executor
from ..runtime import RecognitionModel
from ..supply.entry import ModelEntry

__all__ = [
    "CHUNK_BYTES",
    "EXECUTORS",
    "VoskModel",
    "VoskOptions",
    "VoskRecognition",
    "check_model_dir",
    "load",
    "parse_words",
]

log = logging.getLogger("talkies.engines")

# 0.1 s of PCM16: the block size every recognizer is fed in (a multiple of 2 bytes).
CHUNK_BYTES = 3200


# -- what talkies uses of vosk (it ships no type information) -------------------------------


class _Recognizer(Protocol):
    """``vosk.KaldiRecognizer``, the methods talkies calls (vosk's spelling)."""

    def SetWords(self, enable_words: bool) -> None: ...

    def AcceptWaveform(self, data: bytes) -> int: ...

    def Result(self) -> str: ...

    def PartialResult(self) -> str: ...

    def FinalResult(self) -> str: ...


class _Model(Protocol):
    """``vosk.Model``: opaque to talkies; recognizers are made from it."""


def _import_vosk(slug: str) -> ModuleType:
    try:
        import vosk  # type: ignore[import-untyped, unused-ignore]
    except ImportError as exc:
        raise EngineUnavailable(
            f"model {slug!r} needs the vosk package, which is not installed on this server "
            "(pip install 'talkies[vosk]')"
        ) from exc
    module: ModuleType = vosk
    _quiet(module)
    return module


@functools.cache
def _quiet(vosk: ModuleType) -> None:
    """Vosk logs every model load and recognizer to stderr at level 0; keep its errors only."""
    vosk.SetLogLevel(-1)


# -- configuration -------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class VoskOptions:
    """The engine knobs of a vosk entry (``ModelEntry.options``).

    ``partial_words``: give partials word times too (``SetPartialWords``) when the client asks
    for word timestamps. Off by default: Vosk then builds partials from the part of the lattice
    it has already determinized, so they lag the audio by a second or more and a short
    utterance may get none at all; without it they follow the audio every 0.1 s, with empty
    ``words``.
    """

    partial_words: bool = False

    @classmethod
    def parse(cls, slug: str, options: Mapping[str, Any]) -> VoskOptions:
        unknown = sorted(set(options) - {"partial_words"})
        if unknown:
            raise ValueError(
                f"model {slug!r}: unknown vosk option(s) {', '.join(map(repr, unknown))}; "
                "known: 'partial_words'"
            )
        partial_words = options.get("partial_words", False)
        if not isinstance(partial_words, bool):
            raise ValueError(f"model {slug!r}: option 'partial_words' must be true or false")
        return cls(partial_words=partial_words)


# -- the model directory -------------------------------------------------------------------


def check_model_dir(slug: str, root: Path) -> None:
    """Raise :class:`EngineUnavailable` unless ``root`` has the layout ``vosk.Model`` opens.

    Vosk accepts two layouts: ``am/final.mdl`` + ``conf/mfcc.conf`` + a ``graph/`` folder, or
    the older flat one (``final.mdl``, ``mfcc.conf`` and the graph side by side). Either needs
    a decoding graph: ``HCLG.fst``, or ``HCLr.fst`` with ``Gr.fst``. Checking first gives a
    message naming the model instead of Vosk's own log lines and a bare "Failed to create a
    model".
    """
    where = f"model {slug!r}"
    if not root.is_dir():
        raise EngineUnavailable(f"{where}: the model directory {str(root)!r} does not exist")
    if (root / "am" / "final.mdl").is_file():
        required = ["conf/mfcc.conf"]
        graph = root / "graph"
        graph_name = "graph/"
    elif (root / "final.mdl").is_file():
        required = ["mfcc.conf"]
        graph = root
        graph_name = ""
    else:
        hint = ""
        nested = sorted(
            p.name for p in root.iterdir() if p.is_dir() and (p / "am" / "final.mdl").is_file()
        )
        if nested:
            hint = f"; the Vosk model seems to be in the subfolder {nested[0]!r}, point at that"
        raise EngineUnavailable(
            f"{where}: {str(root)!r} is not a Vosk model directory (no am/final.mdl or "
            f"final.mdl){hint}"
        )
    missing = [name for name in required if not (root / name).is_file()]
    has_graph = (graph / "HCLG.fst").is_file() or (
        (graph / "HCLr.fst").is_file() and (graph / "Gr.fst").is_file()
    )
    if not has_graph:
        missing.append(f"{graph_name}HCLG.fst (or {graph_name}HCLr.fst and {graph_name}Gr.fst)")
    if missing:
        raise EngineUnavailable(
            f"{where}: the Vosk model in {str(root)!r} is incomplete: missing {', '.join(missing)}"
        )


def load(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
    """Open the Vosk model at ``root`` (blocking: run it in a worker thread)."""
    options = VoskOptions.parse(entry.slug, entry.options)
    vosk = _import_vosk(entry.slug)
    check_model_dir(entry.slug, root)
    if device.startswith("cuda"):
        log.debug("model %r: vosk decodes on the CPU, not %s", entry.slug, device)
    try:
        model: _Model = vosk.Model(str(root))
    except Exception as exc:
        raise EngineUnavailable(
            f"model {entry.slug!r}: vosk could not open the model in {str(root)!r} ({exc})"
        ) from exc
    return VoskModel(entry.slug, model, vosk, options)


class VoskModel(RecognitionModel):
    """A loaded Vosk model; its streams are :class:`VoskRecognition` objects."""

    def __init__(
        self, slug: str, native: _Model, vosk: ModuleType, options: VoskOptions | None = None
    ) -> None:
        self.slug = slug
        self.options = options if options is not None else VoskOptions()
        self._model: _Model | None = native
        self._vosk = vosk

    @property
    def native(self) -> _Model:
        """The ``vosk.Model`` (several :class:`VoskModel` may share one)."""
        if self._model is None:
            raise RuntimeError(f"model {self.slug!r} was closed")
        return self._model

    def recognizer(self) -> _Recognizer:
        """A new ``KaldiRecognizer`` (~70 ms for a lookahead graph: call from a worker)."""
        recognizer: _Recognizer = self._vosk.KaldiRecognizer(self.native, float(SAMPLE_RATE))
        return recognizer

    def recognition(self, options: StartOptions) -> VoskRecognition:
        return VoskRecognition(self, options)

    def transcribe(self, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
        """A whole file through a recognizer of its own (a
        :class:`~talkies.engines.base.FileTranscriber`; blocking). Vosk always has word times.

        Fed one :data:`CHUNK_BYTES` block per call, the block where Vosk finds an endpoint is
        known exactly: segments end there (spec, "Sherpa-ONNX and Vosk"). ``request.cancel``
        is checked between blocks.
        """
        options = StartOptions(
            model=self.slug, interim_results=False, word_timestamps=request.word_timestamps
        )
        return transcribe_recognition(
            VoskRecognition(self, options),
            audio,
            step=CHUNK_BYTES,
            language=request.language_code,
            cancel=request.cancel,
        )

    def close(self) -> None:
        # Recognizers still alive hold their own reference on the native model.
        self._model = None


class VoskRecognition:
    """One stream: a :class:`~talkies.engines.base.Recognition` over a ``KaldiRecognizer``.

    Building it builds the recognizer (tens of milliseconds): the runtime does that in a
    worker thread.
    """

    def __init__(self, model: VoskModel, options: StartOptions) -> None:
        self._words = options.word_timestamps
        self._partials = options.interim_results
        partial_words = self._words and self._partials and model.options.partial_words
        rec = model.recognizer()
        if self._words:
            rec.SetWords(True)
            set_partial_words = getattr(rec, "SetPartialWords", None)  # vosk >= 0.3.32
            if partial_words and callable(set_partial_words):
                set_partial_words(True)
        self._rec: _Recognizer | None = rec
        self._pending = bytearray()  # less than CHUNK_BYTES not yet given to the recognizer

    def _recognizer(self) -> _Recognizer:
        if self._rec is None:
            raise RuntimeError("the vosk stream was closed")
        return self._rec

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        rec = self._recognizer()
        self._pending += pcm
        out: list[EngineUpdate] = []
        fed = 0
        decoded = False  # a block went in since the last endpoint
        while len(self._pending) - fed >= CHUNK_BYTES:
            block = bytes(self._pending[fed : fed + CHUNK_BYTES])
            fed += CHUNK_BYTES
            if rec.AcceptWaveform(block):
                text, words = _parse(rec.Result(), "text", "result")
                out.append(EngineEndpoint(text=text, words=words))
                decoded = False
            else:
                decoded = True
        del self._pending[:fed]
        if decoded and self._partials:
            text, words = _parse(rec.PartialResult(), "partial", "partial_result")
            out.append(EnginePartial(text=text, words=words))
        return out

    def finish(self) -> EngineFinal:
        rec = self._recognizer()
        if self._pending:
            # An endpoint found in this last block is not taken: FinalResult() returns that
            # utterance, flushed to the end of the audio.
            rec.AcceptWaveform(bytes(self._pending))
            self._pending.clear()
        text, words = _parse(rec.FinalResult(), "text", "result")
        return EngineFinal(text=text, words=words)

    def close(self) -> None:
        rec, self._rec = self._rec, None
        del rec  # KaldiRecognizer.__del__ frees the native recognizer
        self._pending.clear()


# -- results ---------------------------------------------------------------------------------


def _number(value: object) -> float | None:
    """A finite JSON number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_words(raw: object) -> tuple[Word, ...]:
    """Vosk's word list (``[{"word", "start", "end", "conf"}, ...]``) as :class:`Word`.

    Entries without a word or a finite time are skipped; times are clamped so that
    ``0 <= start <= end``; a confidence that is not a finite number becomes None.
    """
    if not isinstance(raw, list):
        return ()
    words: list[Word] = []
    for item in raw:
        if not isinstance(item, dict):
            continue
        text, start, end = item.get("word"), _number(item.get("start")), _number(item.get("end"))
        if not isinstance(text, str) or not text or start is None or end is None:
            continue
        start = max(0.0, start)
        confidence = _number(item.get("conf"))
        words.append(Word(word=text, start=start, end=max(start, end), confidence=confidence))
    return tuple(words)


def _parse(result: str, text_key: str, words_key: str) -> tuple[str, tuple[Word, ...]]:
    try:
        data: Any = json.loads(result)
    except ValueError:
        log.warning("vosk returned a result that is not JSON: %.200r", result)
        return "", ()
    if not isinstance(data, dict):
        return "", ()
    text = data.get(text_key)
    return (text.strip() if isinstance(text, str) else ""), parse_words(data.get(words_key))


EXECUTORS = (
    Executor(
        name="vosk",
        kind="asr",
        streams=True,
        transcribes_files=True,
        isolated=True,
        load_recognition=load,
        requires=("vosk",),
    ),
)
