"""``whisper``: rolling-window live ASR over whisper.cpp (the ``pywhispercpp`` binding).

Whisper is not a streaming model: it transcribes a buffer. A stream therefore keeps a bounded
window of recent PCM and re-decodes it (spec: "rolling: Re-decodes a bounded PCM window and
emits changed partial revisions"). There is no native endpoint, so no EngineEndpoint is ever
produced; the final transcript covers the whole stream.

Rolling policy (per stream)
---------------------------
- Audio accumulates in a window of at most ``window_seconds`` (entry option, default 5 s; the
  pool passes ``TALKIES_STREAM_MAX_BUFFER_SECONDS`` here).
- After every ``refresh_seconds`` (default 0.5 s) of new audio the window is decoded again;
  a partial is sent only when the text (committed prefix + window hypothesis) changed. A
  decode covers everything accepted so far, so a decoder that falls behind decodes less often
  rather than queueing stale work (the runner hands over the backlog in one batch).
- **Commit at overflow.** When the window is full, it is decoded once with token timestamps.
  The leading words that end at least ``keep_seconds`` (default 1 s) before the window's end
  are committed: appended to the stream's transcript and never revised again. The audio is
  cut in the pause after the last committed word (the midpoint between its end and the next
  word's start), so the next window starts between words: each word is transcribed in one
  window only, which avoids both the duplicated words of overlapping windows and the clipped
  ones of a cut at a fixed time. Words near the end of the window, which Whisper garbles when
  the audio stops mid-word, stay uncommitted and are decoded again with more context.
- **Seam check.** Token timestamps are approximate, so a window may start with the tail of
  the last committed word and Whisper hears it again ("how much | much there"): leading words
  of a window that repeat the last committed words are dropped (:func:`drop_repeated_start`).
- Fallbacks: a window with no words at all drops everything but its last ``keep_seconds``; a
  window whose words all end late (broken timestamps) is committed whole and dropped.
- The committed text is not given to later decodes as Whisper's prompt: measured on the
  LibriVox stream of the tests, prompting made Whisper repeat the prompt (WER 49%, against 6%
  without).
- ``finish()`` decodes what is left (or reuses the commit decode when it covered exactly
  that) and returns the committed words + the remainder.

Decoding: greedy, temperature 0 with no temperature fallback (``temperature_inc=0``: fallback
turns a junk window into many decodes), no cross-call context, timestamp tokens on (without
them Whisper loops on a window that ends mid-sentence), one segment for partials. The encoder
length ``audio_ctx`` is cut from Whisper's 30 s to what the window needs: partials use just
the window (5 s: 256 positions), commits and the final ``final_audio_ctx`` (default 768,
about 15 s), because accuracy drops when the encoder sees little beyond the speech.

Flash attention is off: with it and a reduced ``audio_ctx``, the same audio decoded
differently depending on what the context had decoded before (whisper.cpp 1.8.5, CPU).

Sharing: whisper.cpp contexts are not thread-safe. A model holds ``contexts`` (default 1)
whisper.cpp contexts, each a full copy of the weights plus its work buffers (base, f16: about
240 MiB each, RSS after decoding); a decode borrows one for its duration. With one context, decodes
of all streams of the model are serialised: on two cores a second context buys little and
costs the memory. The binding releases the GIL while decoding, so the event loop keeps
running. ``threads`` (default 2) is per decode; ggml spin-waits for its threads, so more
threads than idle cores makes decodes much slower, not faster.

Languages: none in the start message means the entry's ``language`` option (default "en");
"auto" detects on the first decodes and keeps the language found once 3 s were heard (an
English-only model always uses "en"); a tag is cut to its primary subtag ("pt-BR" -> "pt"),
and one Whisper does not know is refused with ``invalid_language``.

Word times come from whisper.cpp's token timestamps when ``word_timestamps`` is requested,
in seconds from the stream's first sample; they are approximate (off by up to ~0.2 s).

Whole files (POST /v1/audio/transcriptions) do not go through the rolling window:
:meth:`WhisperModel.transcribe` decodes the file at once with whisper.cpp's own 30 s windows
and segments (:func:`file_params`, :func:`file_segments`).

The model file is ``options.model_file``, else ``model.bin``, else the only ``*.bin`` in the
model folder; it is checked from end to end before whisper.cpp sees it. A faster-whisper
(CTranslate2) folder is converted once (:mod:`talkies.engines.ct2ggml`) and the conversion
kept beside it.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import math
import queue
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from ..protocol import EngineFinal, EnginePartial, ErrorCode
from ..protocol.events import Word
from ..protocol.messages import StartOptions
from .base import (
    EngineUnavailable,
    EngineUpdate,
    RecognitionModel,
    Refusal,
    Transcript,
    TranscriptionRequest,
    TranscriptSegment,
)
from .ct2ggml import GGML_MAGIC, Ct2FormatError, Hparams, convert, ggml_tensor_shapes
from .registry import ModelEntry

__all__ = [
    "DecodeRequest",
    "Decoded",
    "DecodedWord",
    "Decoder",
    "GgmlInfo",
    "RollingConfig",
    "WhisperModel",
    "WhisperRecognition",
    "choose_cut",
    "drop_repeated_start",
    "encoder_positions",
    "inspect_ggml",
    "load",
    "resolve_config",
]

log = logging.getLogger("talkies.engines.whisper")

SAMPLE_RATE = 16000
_MIN_DECODE_SAMPLES = SAMPLE_RATE // 10  # whisper.cpp refuses input shorter than 100 ms


# -- configuration --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RollingConfig:
    """A model entry's ``options``, checked. Times in seconds."""

    window_seconds: float = 5.0
    refresh_seconds: float = 0.5
    keep_seconds: float = 1.0
    threads: int = 2
    contexts: int = 1
    # Encoder lengths in positions of 20 ms (Whisper's own is 1500: 30 s). Partials use
    # audio_ctx (0: just enough for the window, rounded up to 64); commits and the final use
    # final_audio_ctx, longer because accuracy drops when the encoder sees little beyond the
    # speech (measured on base: 256 misreads words that 640 and up get right).
    audio_ctx: int = 0
    final_audio_ctx: int = 768
    language: str = "en"  # when the client gives none
    model_file: str | None = None

    @property
    def window_samples(self) -> int:
        return round(self.window_seconds * SAMPLE_RATE)

    @property
    def refresh_samples(self) -> int:
        return max(1, round(self.refresh_seconds * SAMPLE_RATE))


def _number(options: Mapping[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"option {key!r} must be a number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"option {key!r} must be from {low:g} to {high:g}, got {value!r}")
    return float(value)


def _integer(options: Mapping[str, Any], key: str, default: int, low: int, high: int) -> int:
    value = options.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"option {key!r} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"option {key!r} must be from {low} to {high}, got {value!r}")
    return value


_OPTION_KEYS = frozenset(RollingConfig.__dataclass_fields__)


def resolve_config(options: Mapping[str, Any]) -> RollingConfig:
    """Check an entry's options; raise ValueError naming the first bad one."""
    unknown = sorted(set(options) - _OPTION_KEYS)
    if unknown:
        log.warning("whisper: ignoring unknown options %s", ", ".join(map(repr, unknown)))
    # The pool fills window_seconds from TALKIES_STREAM_MAX_BUFFER_SECONDS, a server-wide
    # setting with a wider range: clamp it to what Whisper can hold rather than refuse.
    window = _number(options, "window_seconds", 5.0, 0.0, math.inf)
    if not 1.0 <= window <= 30.0:
        clamped = min(max(window, 1.0), 30.0)
        log.warning("whisper: window_seconds %g is outside 1-30 s; using %g", window, clamped)
        window = clamped
    refresh = _number(options, "refresh_seconds", 0.5, 0.05, window)
    keep = _number(options, "keep_seconds", min(1.0, window / 4), 0.0, window / 2)
    language = options.get("language", "en")
    if not isinstance(language, str) or not language:
        raise ValueError(f"option 'language' must be a language code, got {language!r}")
    model_file = options.get("model_file")
    if model_file is not None and (not isinstance(model_file, str) or not model_file):
        raise ValueError(f"option 'model_file' must be a file name, got {model_file!r}")
    return RollingConfig(
        window_seconds=window,
        refresh_seconds=refresh,
        keep_seconds=keep,
        threads=_integer(options, "threads", 2, 1, 256),
        contexts=_integer(options, "contexts", 1, 1, 64),
        audio_ctx=_integer(options, "audio_ctx", 0, 0, 1500),
        final_audio_ctx=_integer(options, "final_audio_ctx", 768, 64, 1500),
        language=language,
        model_file=model_file,
    )


# -- the model file ---------------------------------------------------------------------------

# ggml type id -> (block size, bytes per block), for the types whisper.cpp files use.
_GGML_TYPES: dict[int, tuple[int, int]] = {
    0: (1, 4),  # f32
    1: (1, 2),  # f16
    2: (32, 18),  # q4_0
    3: (32, 20),  # q4_1
    6: (32, 22),  # q5_0
    7: (32, 24),  # q5_1
    8: (32, 34),  # q8_0
    10: (256, 84),  # q2_K
    11: (256, 110),  # q3_K
    12: (256, 144),  # q4_K
    13: (256, 176),  # q5_K
    14: (256, 210),  # q6_K
}
_MAX_TOKEN_BYTES = 1 << 16


@dataclass(frozen=True, slots=True)
class GgmlInfo:
    """What :func:`inspect_ggml` found in a whisper.cpp model file."""

    hparams: Hparams
    n_mel_filters: int
    n_fft: int
    n_tokens: int  # vocabulary entries stored (the specials are whisper.cpp's own)
    tensors: dict[str, tuple[tuple[int, ...], int]]  # name -> (shape outermost first, type)

    @property
    def multilingual(self) -> bool:
        return self.hparams.n_vocab >= 51865


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("rb")
        self.size = path.stat().st_size

    def ints(self, count: int) -> tuple[int, ...]:
        raw = self.file.read(4 * count)
        if len(raw) != 4 * count:
            raise ValueError(f"{self.path}: truncated at byte {self.file.tell()}")
        return struct.unpack(f"<{count}i", raw)

    def skip(self, count: int) -> None:
        if count < 0 or self.file.tell() + count > self.size:
            raise ValueError(f"{self.path}: truncated at byte {self.file.tell()}")
        self.file.seek(count, 1)


def inspect_ggml(path: Path) -> GgmlInfo:
    """Check a whisper.cpp ggml file from end to end without loading its weights.

    whisper.cpp reports a malformed file only through its log and hands back an unusable
    context, so every field it will read is checked here first: header, filters, vocabulary,
    and each tensor's name, shape and byte count against what whisper.cpp allocates.
    """
    reader = _Reader(path)
    try:
        (magic,) = struct.unpack("<I", struct.pack("<i", reader.ints(1)[0]))
        if magic != GGML_MAGIC:
            raise ValueError(f"{path}: not a whisper.cpp ggml model (magic {magic:#x})")
        hp = Hparams(*reader.ints(11))
        sizes = [hp.n_vocab, hp.n_audio_ctx, hp.n_audio_state, hp.n_audio_head, hp.n_text_ctx]
        sizes += [hp.n_text_state, hp.n_text_head, hp.n_mels]
        if min(sizes) <= 0 or min(hp.n_audio_layer, hp.n_text_layer) < 0:
            raise ValueError(f"{path}: impossible hparams {hp}")
        if hp.n_vocab < 51864:
            raise ValueError(
                f"{path}: n_vocab {hp.n_vocab} < 51864; whisper.cpp hard-codes its special "
                "token ids and needs at least that many"
            )
        if hp.n_audio_state != hp.n_text_state:
            raise ValueError(f"{path}: encoder and decoder widths differ")
        n_mel, n_fft = reader.ints(2)
        if not (0 < n_mel <= 512 and 0 < n_fft <= 4096):
            raise ValueError(f"{path}: bad mel filter bank {n_mel}x{n_fft}")
        reader.skip(4 * n_mel * n_fft)
        (n_tokens,) = reader.ints(1)
        if not 0 <= n_tokens <= hp.n_vocab:
            raise ValueError(f"{path}: {n_tokens} vocabulary entries for n_vocab {hp.n_vocab}")
        for _ in range(n_tokens):
            (length,) = reader.ints(1)
            if not 0 <= length <= _MAX_TOKEN_BYTES:
                raise ValueError(f"{path}: bad token length {length}")
            reader.skip(length)
        expected = ggml_tensor_shapes(hp)
        tensors: dict[str, tuple[tuple[int, ...], int]] = {}
        while reader.file.tell() < reader.size:
            n_dims, name_len, ttype = reader.ints(3)
            if not (1 <= n_dims <= 4 and 0 < name_len <= 256):
                raise ValueError(f"{path}: bad tensor header at byte {reader.file.tell() - 12}")
            dims = reader.ints(n_dims)
            name = reader.file.read(name_len).decode("utf-8", "replace")
            shape = tuple(reversed(dims))
            if name not in expected or name in tensors:
                raise ValueError(f"{path}: unexpected or repeated tensor {name!r}")
            if shape != expected[name]:
                raise ValueError(
                    f"{path}: tensor {name!r} has shape {shape}, want {expected[name]}"
                )
            if ttype not in _GGML_TYPES:
                raise ValueError(f"{path}: tensor {name!r} has unsupported ggml type {ttype}")
            block, size = _GGML_TYPES[ttype]
            count = math.prod(shape)
            if count % block:
                raise ValueError(f"{path}: tensor {name!r} does not fill its blocks")
            reader.skip(count // block * size)
            tensors[name] = (shape, ttype)
        missing = set(expected) - set(tensors)
        if missing:
            raise ValueError(f"{path}: {len(missing)} tensors missing, e.g. {sorted(missing)[0]!r}")
        return GgmlInfo(hp, n_mel, n_fft, n_tokens, tensors)
    except struct.error as exc:
        raise ValueError(f"{path}: truncated") from exc
    finally:
        reader.file.close()


_CONVERTED_SUFFIX = ".ggml.bin"


def _model_path(entry: ModelEntry, root: Path, config: RollingConfig) -> Path:
    """The model file: ``options.model_file``, else ``model.bin``, else the one ``*.bin``."""
    if config.model_file is not None:
        path = (root / config.model_file).resolve()
        if not path.is_relative_to(root.resolve()):
            raise EngineUnavailable(f"model {entry.slug!r}: model_file must stay inside the model")
        if not path.is_file():
            raise EngineUnavailable(f"model {entry.slug!r}: {config.model_file} not found")
        return path
    if (root / "model.bin").is_file():
        return root / "model.bin"
    candidates = sorted(
        p for p in root.glob("*.bin") if p.is_file() and not p.name.endswith(_CONVERTED_SUFFIX)
    )
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise EngineUnavailable(f"model {entry.slug!r}: no whisper.cpp .bin file in the model")
    raise EngineUnavailable(
        f"model {entry.slug!r}: several .bin files; name one in options.model_file"
    )


def _is_ggml(path: Path) -> bool:
    with path.open("rb") as file:
        head = file.read(4)
    return len(head) == 4 and struct.unpack("<I", head)[0] == GGML_MAGIC


def _ggml_for(entry: ModelEntry, path: Path) -> Path:
    """``path``, or for a faster-whisper (CTranslate2) folder its ggml conversion.

    The conversion (about 1.5 s for base) is written once beside the checkpoint as
    ``<name>.ggml.bin`` and reused while it is newer than the checkpoint.
    """
    if _is_ggml(path) or not (path.parent / "config.json").is_file():
        return path
    converted = path.with_name(path.stem + _CONVERTED_SUFFIX)
    if converted.is_file() and converted.stat().st_mtime >= path.stat().st_mtime:
        return converted
    try:
        convert(path.parent, converted)
    except (Ct2FormatError, OSError) as exc:
        raise EngineUnavailable(
            f"model {entry.slug!r}: {path.name} is neither a whisper.cpp model nor a "
            f"convertible CTranslate2 Whisper checkpoint: {exc}"
        ) from None
    log.info("model %r: converted the CTranslate2 checkpoint to %s", entry.slug, converted)
    return converted


# -- the native binding -----------------------------------------------------------------------


class _Native:
    """The few ``_pywhispercpp`` calls used here (the binding ships no type stubs)."""

    _log_lock = threading.Lock()
    _capture: list[tuple[int, str]] | None = None
    _hooked = False

    def __init__(self) -> None:
        try:
            self.pw: Any = importlib.import_module("_pywhispercpp")
        except ImportError as exc:
            raise EngineUnavailable(
                "the whisper executor needs pywhispercpp (pip install 'talkies[whisper]')"
            ) from exc
        self._hook_logs()

    def _hook_logs(self) -> None:
        # whisper.cpp writes its log (a few dozen lines per load, a line per language
        # detection) to stderr; route it into logging. The hook is removed at exit: a Python
        # callback invoked while the interpreter finalizes aborts the process.
        with _Native._log_lock:
            if _Native._hooked:
                return
            self.pw.whisper_log_set(_Native._on_log)
            atexit.register(self.pw.whisper_log_set, None)
            _Native._hooked = True

    @staticmethod
    def _on_log(level: int, text: str) -> None:
        capture = _Native._capture
        if capture is not None:
            capture.append((level, text))
        if level >= 4:
            log.warning("whisper.cpp: %s", text.rstrip())
        else:
            log.debug("whisper.cpp: %s", text.rstrip())

    def init(self, path: Path, *, use_gpu: bool, gpu_device: int) -> Any:
        params = self.pw.whisper_context_default_params()
        params.use_gpu = use_gpu
        params.gpu_device = gpu_device
        # With flash attention and a reduced audio_ctx, the same audio decoded differently
        # depending on what the context had decoded before (stale cross-attention state, it
        # seems; whisper.cpp 1.8.5, CPU). Without it a decode depends on its own audio only,
        # at the same speed.
        params.flash_attn = False
        with _Native._log_lock:
            captured: list[tuple[int, str]] = []
            _Native._capture = captured
            try:
                ctx = self.pw.whisper_init_from_file_with_params(str(path), params)
            finally:
                _Native._capture = None
        errors = [text.strip() for level, text in captured if level >= 4]
        if errors:
            # The binding returns a wrapper around NULL on failure; never use it.
            raise EngineUnavailable(f"whisper.cpp could not load {path.name}: {errors[-1]}")
        return ctx

    def free(self, ctx: Any) -> None:
        self.pw.whisper_free(ctx)


# -- decoding -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecodedWord:
    """A word of one decode; times in seconds from the start of the audio decoded."""

    text: str
    start: float
    end: float
    probability: float = 1.0

    def shifted(self, seconds: float) -> DecodedWord:
        return replace(self, start=self.start + seconds, end=self.end + seconds)


@dataclass(frozen=True, slots=True)
class Decoded:
    words: tuple[DecodedWord, ...]
    language: str | None = None  # what whisper.cpp used (detected when asked for "auto")

    @property
    def text(self) -> str:
        return " ".join(w.text for w in self.words)


@dataclass(frozen=True, slots=True)
class DecodeRequest:
    language: str  # a whisper language code, or "auto"
    timestamps: bool  # token-level timestamps (word times)
    final: bool  # words that will be committed or final: one decode, the longer encoder


class Decoder(Protocol):
    """What a rolling stream needs from a model (a fake one in tests)."""

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded: ...


def encoder_positions(config: RollingConfig, *, final: bool, n_audio_ctx: int = 1500) -> int:
    """The ``audio_ctx`` of a decode: never shorter than the window it must hold."""
    window = -(-math.ceil(config.window_seconds * 50) // 64) * 64  # 20 ms per position
    wanted = config.final_audio_ctx if final else (config.audio_ctx or window)
    return min(max(wanted, window), n_audio_ctx)


class WhisperModel(RecognitionModel):
    """A whisper.cpp model with a small pool of contexts; opens rolling streams."""

    def __init__(
        self,
        path: Path,
        config: RollingConfig,
        *,
        device: str = "cpu",
        slug: str = "whisper",
    ) -> None:
        self.path = path
        self.config = config
        self.slug = slug
        self.info = inspect_ggml(path)
        self._native = _Native()
        pw = self._native.pw
        use_gpu = device != "cpu"
        gpu_device = int(device.partition(":")[2] or 0) if device.startswith("cuda") else 0
        self._contexts: list[Any] = []
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        try:
            for _ in range(config.contexts):
                ctx = self._native.init(path, use_gpu=use_gpu, gpu_device=gpu_device)
                self._contexts.append(ctx)
                self._free.put(ctx)
        except BaseException:
            for ctx in self._contexts:
                self._native.free(ctx)
            raise
        self.multilingual = bool(pw.whisper_is_multilingual(self._contexts[0]))
        self._eot = int(pw.whisper_token_eot(self._contexts[0]))
        self._closed = False
        self.decodes = 0  # decodes run, for tests and benchmarks
        try:
            self.language_for(None)  # the entry's default language must be one Whisper knows
        except Refusal as exc:
            self.close()
            raise EngineUnavailable(f"model {slug!r}: option 'language': {exc.detail}") from None

    # -- language --------------------------------------------------------------------------

    def language_for(self, requested: str | None) -> str:
        """A whisper language code or "auto" for a start message's ``language``."""
        if requested is None:
            requested = self.config.language
        if requested == "auto":
            return "auto" if self.multilingual else "en"
        code = requested.split("-")[0].lower()
        pw = self._native.pw
        lang_id = int(pw.whisper_lang_id(code)) if code.isalpha() else -1
        if lang_id < 0:
            raise Refusal(ErrorCode.INVALID_LANGUAGE, f"whisper has no language {requested!r}")
        if not self.multilingual and code != "en":
            raise Refusal(
                ErrorCode.INVALID_LANGUAGE,
                f"model {self.slug!r} is English-only; it cannot transcribe {requested!r}",
            )
        return str(pw.whisper_lang_str(lang_id))

    # -- decoding --------------------------------------------------------------------------

    @contextmanager
    def _borrow(self) -> Iterator[Any]:
        ctx = self._free.get()
        try:
            if self._closed:
                raise RuntimeError("the whisper model was closed")
            yield ctx
        finally:
            self._free.put(ctx)

    def _params(self, request: DecodeRequest, samples: int) -> Any:
        pw = self._native.pw
        params = pw.whisper_full_default_params(
            pw.whisper_sampling_strategy.WHISPER_SAMPLING_GREEDY
        )
        params.n_threads = self.config.threads
        params.greedy = {"best_of": 1}
        params.temperature = 0.0
        params.temperature_inc = 0.0  # no fallback: a junk window must cost one decode
        params.no_context = True
        params.single_segment = not request.final
        params.token_timestamps = request.timestamps
        # Always decode with timestamp tokens, Whisper's native mode: without them a window
        # that ends mid-sentence often loops ("... might be. And Mr. John ... might be. ...").
        params.no_timestamps = False
        params.print_progress = False
        params.print_realtime = False
        params.print_timestamps = False
        params.print_special = False
        params.suppress_blank = True
        params.audio_ctx = encoder_positions(
            self.config, final=request.final, n_audio_ctx=self.info.hparams.n_audio_ctx
        )
        # A bound on runaway repetition: ~12 tokens a second of audio is far above speech.
        params.max_tokens = 32 + math.ceil(samples / SAMPLE_RATE * 12)
        # "" asks whisper.cpp to detect, as "auto" does, without logging an "unknown
        # language 'auto'" error on every call.
        params.language = "" if request.language == "auto" else request.language
        params.detect_language = False
        return params

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
        """Transcribe ``audio`` (float32 mono 16 kHz) on a borrowed context."""
        pw = self._native.pw
        if audio.size < _MIN_DECODE_SAMPLES:
            audio = np.concatenate([audio, np.zeros(_MIN_DECODE_SAMPLES - audio.size, np.float32)])
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        params = self._params(request, audio.size)
        with self._borrow() as ctx:
            status = int(pw.whisper_full(ctx, params, audio, audio.size))
            if status != 0:
                raise RuntimeError(f"whisper_full failed with status {status}")
            self.decodes += 1
            words = self._words(ctx, request.timestamps)
            language = request.language
            if language == "auto":
                language = str(pw.whisper_lang_str(int(pw.whisper_full_lang_id(ctx))))
        return Decoded(words=tuple(words), language=language)

    def _words(self, ctx: Any, timestamps: bool) -> list[DecodedWord]:
        """Group the decode's text tokens into words: a token with a leading space starts one."""
        pw = self._native.pw
        words: list[DecodedWord] = []
        pieces: list[bytes] = []
        probs: list[float] = []
        start = end = 0.0

        def close_word() -> None:
            text = b"".join(pieces).decode("utf-8", "replace").strip()
            if text:
                p = float(np.mean(probs)) if probs else 1.0
                words.append(DecodedWord(text, start, max(start, end), p))

        for segment in range(int(pw.whisper_full_n_segments(ctx))):
            for index in range(int(pw.whisper_full_n_tokens(ctx, segment))):
                data = pw.whisper_full_get_token_data(ctx, segment, index)
                token = int(data.id)
                if token >= self._eot:
                    continue  # specials and timestamp tokens
                piece = bytes(pw.whisper_token_to_bytes(ctx, token))
                t0 = max(0.0, int(data.t0) / 100) if timestamps else 0.0
                t1 = max(0.0, int(data.t1) / 100) if timestamps else 0.0
                if piece.startswith(b" ") or not pieces:
                    if pieces:
                        close_word()
                    pieces, probs, start = [], [], t0
                pieces.append(piece)
                probs.append(float(data.p))
                end = max(end, t1, start)
        if pieces:
            close_word()
        return words

    # -- streams ---------------------------------------------------------------------------

    def recognition(self, options: StartOptions) -> WhisperRecognition:
        if self._closed:
            raise EngineUnavailable(f"model {self.slug!r} was unloaded")
        return WhisperRecognition(
            self,
            self.config,
            language=self.language_for(options.language),
            word_timestamps=options.word_timestamps,
            interim_results=options.interim_results,
        )

    def transcribe(self, pcm: bytes, request: TranscriptionRequest) -> Transcript:
        """A whole-file decode (a :class:`~talkies.engines.base.FileTranscriber`; blocking),
        not the rolling window: see :func:`file_params` and :func:`file_segments`.

        Raises :class:`Refusal` (``invalid_language``) for a language Whisper or this model
        does not know. No language, or "auto", is detected on a multilingual model.
        """
        language = self.language_for(request.language_code or "auto")
        pcm = pcm[: len(pcm) - len(pcm) % 2]
        audio = np.frombuffer(pcm, dtype="<i2").astype(np.float32) / np.float32(32768.0)
        duration = audio.size / SAMPLE_RATE
        if audio.size < _MIN_DECODE_SAMPLES:
            audio = np.concatenate([audio, np.zeros(_MIN_DECODE_SAMPLES - audio.size, np.float32)])
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        pw = self._native.pw
        params = file_params(pw, request, language=language, threads=self.config.threads)
        with self._borrow() as ctx:
            status = int(pw.whisper_full(ctx, params, audio, audio.size))
            if status != 0:
                raise RuntimeError(f"whisper_full failed with status {status}")
            self.decodes += 1
            if language == "auto":
                language = str(pw.whisper_lang_str(int(pw.whisper_full_lang_id(ctx))))
            segments = file_segments(pw, ctx, request, duration=duration)
        return Transcript(
            text=" ".join(s.text for s in segments),
            language=language,
            duration=duration,
            segments=segments,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._contexts:
            self._native.free(self._free.get())
        self._contexts.clear()


def load(entry: ModelEntry, root: Path, device: str) -> WhisperModel:
    """Load the entry's whisper.cpp model file (blocking: call from a worker thread)."""
    try:
        config = resolve_config(entry.options)
    except ValueError as exc:
        raise EngineUnavailable(f"model {entry.slug!r}: {exc}") from None
    path = _ggml_for(entry, _model_path(entry, root, config))
    try:
        return WhisperModel(path, config, device=device, slug=entry.slug)
    except ValueError as exc:
        raise EngineUnavailable(f"model {entry.slug!r}: {exc}") from None


# -- the rolling stream -----------------------------------------------------------------------


def choose_cut(words: Sequence[DecodedWord], window: float, keep: float) -> tuple[float, int]:
    """Where to cut a full window: (seconds from its start, number of words committed).

    Commits the longest run of leading words that end by ``window - keep``; cuts halfway into
    the pause after the last of them (never past the next word's start or ``window - keep``).
    See the module docstring for the fallbacks.
    """
    limit = window - keep
    count = 0
    for word in words:
        if word.end > limit:
            break
        count += 1
    if count == 0:
        return (window - keep, 0) if not words else (window, len(words))
    cut = words[count - 1].end
    if count < len(words):
        following = min(words[count].start, limit)
        if following > cut:
            cut = (cut + following) / 2
    else:
        cut = max(cut, limit)  # nothing after them: drop the silence up to the kept tail
    return cut, count


def _norm(word: DecodedWord) -> str:
    return "".join(c for c in word.text.casefold() if c.isalnum() or c == "'")


def drop_repeated_start(
    committed: Sequence[DecodedWord], words: tuple[DecodedWord, ...], most: int = 4
) -> tuple[DecodedWord, ...]:
    """``words`` without leading words that repeat the end of ``committed``.

    The cut falls in the pause Whisper's timestamps place after the last committed word;
    those timestamps are approximate, so the next window may begin with the tail of that
    word (a fricative is enough) and Whisper hears the word again. Up to ``most`` words that
    equal, ignoring case and punctuation, the last committed ones are dropped. The price: a
    genuine repetition exactly at a cut ("very very") loses one copy.
    """
    if not committed or not words:
        return words
    tail = [_norm(w) for w in committed[-most:]]
    head = [_norm(w) for w in words[:most]]
    for k in range(min(len(tail), len(head)), 0, -1):
        if tail[-k:] == head[:k] and all(head[:k]):
            return words[k:]
    return words


@dataclass(slots=True)
class _Hypothesis:
    """The latest decode of the current window, in stream time."""

    words: tuple[DecodedWord, ...] = ()
    covers: int = 0  # samples of the window it decoded
    final: bool = False  # a final-quality decode (longer encoder, word times)


@dataclass(slots=True)
class WhisperRecognition:
    """One rolling stream; see the module docstring for the policy."""

    decoder: Decoder
    config: RollingConfig
    language: str
    word_timestamps: bool = False
    interim_results: bool = True
    _audio: npt.NDArray[np.float32] = field(default_factory=lambda: np.zeros(0, np.float32))
    _carry: bytes = b""
    _offset: int = 0  # samples committed and dropped before the window
    _undecoded: int = 0  # samples accepted since the last decode
    _committed: list[DecodedWord] = field(default_factory=list)
    _tail: _Hypothesis = field(default_factory=_Hypothesis)
    _last_text: str = ""
    _locked_language: str | None = None

    # -- Recognition -----------------------------------------------------------------------

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        samples = self._samples(pcm)
        if samples.size == 0:
            return []
        self._audio = np.concatenate([self._audio, samples])
        self._undecoded += samples.size
        changed = False
        while self._audio.size > self.config.window_samples:
            self._commit()
            changed = True
        if self.interim_results and self._undecoded >= self.config.refresh_samples:
            self._refresh()
            changed = True
        if not changed or not self.interim_results:
            return []
        text = self._text(self._tail.words)
        if text == self._last_text:
            return []
        self._last_text = text
        return [EnginePartial(text=text, words=self._words(self._tail.words))]

    def finish(self) -> EngineFinal:
        tail = self._tail.words
        if self._audio.size >= _MIN_DECODE_SAMPLES and not (
            self._tail.final and self._tail.covers == self._audio.size
        ):
            tail = self._decode(self._audio, timestamps=self.word_timestamps, final=True)
        elif self._audio.size < _MIN_DECODE_SAMPLES:
            tail = ()
        return EngineFinal(text=self._text(tail), words=self._words(tail))

    def close(self) -> None:
        self._audio = np.zeros(0, np.float32)

    # -- introspection (tests, benchmarks) --------------------------------------------------

    @property
    def buffered_seconds(self) -> float:
        return self._audio.size / SAMPLE_RATE

    @property
    def committed_text(self) -> str:
        return " ".join(w.text for w in self._committed)

    # -- internals --------------------------------------------------------------------------

    def _samples(self, pcm: bytes) -> npt.NDArray[np.float32]:
        data = self._carry + pcm
        usable = len(data) - len(data) % 2
        self._carry = data[usable:]
        return np.frombuffer(data[:usable], dtype="<i2").astype(np.float32) / 32768.0

    def _language(self) -> str:
        return self._locked_language or self.language

    def _decode(
        self, audio: npt.NDArray[np.float32], *, timestamps: bool, final: bool
    ) -> tuple[DecodedWord, ...]:
        request = DecodeRequest(
            language=self._language(),
            timestamps=timestamps,
            final=final,
        )
        decoded = self.decoder.decode(audio, request)
        if (
            self.language == "auto"
            and self._locked_language is None
            and decoded.language not in (None, "auto")
            and (audio.size >= 3 * SAMPLE_RATE or self._offset > 0)
        ):
            # Detection on a few seconds is reliable enough; per-window detection is not.
            self._locked_language = decoded.language
        seconds = self._offset / SAMPLE_RATE
        words = tuple(w.shifted(seconds) for w in decoded.words)
        return drop_repeated_start(self._committed, words)

    def _commit(self) -> None:
        window = self._audio[: self.config.window_samples]
        start = self._offset / SAMPLE_RATE
        words = self._decode(window, timestamps=True, final=True)
        relative = [w.shifted(-start) for w in words]
        cut_seconds, count = choose_cut(
            relative, window.size / SAMPLE_RATE, self.config.keep_seconds
        )
        cut = min(window.size, max(1, round(cut_seconds * SAMPLE_RATE)))
        self._committed.extend(words[:count])
        self._audio = self._audio[cut:]
        self._offset += cut
        remaining = window.size - cut  # of the decoded window, still buffered
        self._tail = _Hypothesis(words=words[count:], covers=remaining, final=True)
        self._undecoded = self._audio.size - remaining

    def _refresh(self) -> None:
        words = self._decode(self._audio, timestamps=self.word_timestamps, final=False)
        self._tail = _Hypothesis(words=words, covers=self._audio.size)
        self._undecoded = 0

    def _text(self, tail: Sequence[DecodedWord]) -> str:
        return " ".join(w.text for w in (*self._committed, *tail))

    def _words(self, tail: Sequence[DecodedWord]) -> tuple[Word, ...]:
        if not self.word_timestamps:
            return ()
        return tuple(
            Word(word=w.text, start=w.start, end=w.end, confidence=w.probability)
            for w in (*self._committed, *tail)
        )


# -- whole-file transcription --------------------------------------------------------------


def file_params(pw: Any, request: TranscriptionRequest, *, language: str, threads: int) -> Any:
    """whisper.cpp parameters for a whole-file decode (POST /v1/audio/transcriptions).

    Whisper's own 30 s windows and segments, its full encoder (``audio_ctx`` 0); greedy at the
    requested temperature, with no temperature fallback (``temperature_inc`` 0), so a file
    costs one decode per window and temperature 0 is deterministic. ``prompt`` is the initial
    prompt of the first window. No text is carried from one window to the next
    (``no_context``): without fallback a window that loops would pass the loop on.
    """
    params = pw.whisper_full_default_params(pw.whisper_sampling_strategy.WHISPER_SAMPLING_GREEDY)
    params.n_threads = threads
    params.greedy = {"best_of": 1}
    params.temperature = float(request.temperature)
    params.temperature_inc = 0.0
    params.no_context = True
    params.single_segment = False
    params.no_timestamps = False
    params.token_timestamps = request.word_timestamps
    params.print_progress = False
    params.print_realtime = False
    params.print_timestamps = False
    params.print_special = False
    params.suppress_blank = True
    params.audio_ctx = 0
    # "" makes whisper.cpp detect the language (see WhisperModel._params).
    params.language = "" if language == "auto" else language
    params.detect_language = False
    if request.prompt:
        params.initial_prompt = request.prompt
    return params


def file_segments(
    pw: Any, ctx: Any, request: TranscriptionRequest, *, duration: float
) -> tuple[TranscriptSegment, ...]:
    """whisper.cpp's segments after a decode: times from their t0/t1 (10 ms units), clamped to
    the audio and kept in order; words from token times when ``request.word_timestamps``."""
    eot = int(pw.whisper_token_eot(ctx))
    beg = int(pw.whisper_token_beg(ctx))  # timestamp tokens: beg and above
    segments: list[TranscriptSegment] = []
    floor = 0.0  # segments never start before the previous one

    def clamp(centiseconds: int, low: float) -> float:
        return min(max(int(centiseconds) / 100, low), duration)

    for index in range(int(pw.whisper_full_n_segments(ctx))):
        raw = pw.whisper_full_get_segment_text(ctx, index)
        text = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)).strip()
        start = clamp(pw.whisper_full_get_segment_t0(ctx, index), floor)
        end = clamp(pw.whisper_full_get_segment_t1(ctx, index), start)
        floor = start
        tokens: list[int] = []
        logprobs: list[float] = []
        pieces: list[tuple[bytes, float, float, float]] = []  # text tokens: bytes, t0, t1, p
        for k in range(int(pw.whisper_full_n_tokens(ctx, index))):
            data = pw.whisper_full_get_token_data(ctx, index, k)
            token = int(data.id)
            if eot <= token < beg:
                continue  # end-of-text, start-of-transcript, language and task tokens
            tokens.append(token)
            logprobs.append(float(data.plog))
            if token < eot:
                piece = bytes(pw.whisper_token_to_bytes(ctx, token))
                pieces.append((piece, int(data.t0) / 100, int(data.t1) / 100, float(data.p)))
        if not text:
            continue
        words = _file_words(pieces, duration) if request.word_timestamps else ()
        segments.append(
            TranscriptSegment(
                id=len(segments),
                start=start,
                end=end,
                text=text,
                words=words,
                tokens=tuple(tokens),
                avg_logprob=float(np.mean(logprobs)) if logprobs else None,
                temperature=float(request.temperature),
            )
        )
    return tuple(segments)


def _file_words(
    pieces: Sequence[tuple[bytes, float, float, float]], duration: float
) -> tuple[Word, ...]:
    """Text tokens grouped into words (a token with a leading space starts one); a word spans
    its tokens' times, clamped to the audio, and its confidence is their mean probability."""
    groups: list[list[tuple[bytes, float, float, float]]] = []
    for piece in pieces:
        if not groups or piece[0].startswith(b" "):
            groups.append([])
        groups[-1].append(piece)
    words: list[Word] = []
    floor = 0.0
    for group in groups:
        text = b"".join(p[0] for p in group).decode("utf-8", "replace").strip()
        if not text:
            continue
        start = min(max(group[0][1], floor), duration)
        end = min(max(start, *(p[2] for p in group)), duration)
        floor = start
        confidence = float(np.mean([p[3] for p in group]))
        words.append(Word(word=text, start=start, end=end, confidence=confidence))
    return tuple(words)
