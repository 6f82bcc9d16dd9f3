"""Qwen3-TTS on the ``qwen-tts`` package (0.1.1), streamed one codec step at a time.

qwen-tts returns whole waveforms only. Streaming here rides on its internals, which is why
the package is pinned:

- The package's own ``Qwen3TTSForConditionalGeneration.generate`` runs in the synthesis
  worker thread. The talker's ``forward`` is wrapped once at load (``functools.wraps``, because
  HF ``generate`` checks keyword arguments against its signature); each call returns the
  previous step's full 16-codebook frame in ``hidden_states[1]``: one codec step, 1920
  samples. So the streamed codes *are* the buffered ones (equal under greedy decoding).
- Every ``chunk_steps`` frames go through the codec decoder with ``left_context`` (25) earlier
  frames in front, as the package's own ``chunked_decode`` does (a clone's reference codes
  are that context for the first chunk), so the concatenated stream matches a one-shot decode
  to ~2e-5 (measured on the tiny model).
- The worker checks the stream's stop flag at every step (from the wrapped ``forward``), and
  queuing a chunk blocks while the stream's queue is full, which pauses generation.

Model kinds: ``custom_voice`` (named speakers; OpenAI's ``alloy``/``echo``/``fable`` are
aliases for some of them) and ``base`` (voice cloning: the sample voices and custom voices of
:mod:`talkies.engines.tts.voices`). One synthesis runs at a time per model; others wait.
``speed`` must be 1: Qwen3-TTS has no rate control.

Options (a registry entry's ``options``): ``threads`` (torch intra-op threads, default 1;
``torch.set_num_threads`` is process-wide, so it is set at the start of every synthesis),
``left_context`` (frames, default 25), ``queue_chunks`` (chunks a reader may fall behind,
default 2), ``dtype`` (``float32`` on CPU, ``bfloat16`` elsewhere), ``generation`` (qwen-tts
sampling arguments over the model's ``generation_config.json``; ``{"do_sample": false,
"subtalker_dosample": false}`` is greedy), ``voice_aliases`` (voice name -> speaker).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.machinery
import io
import logging
import math
import re
import sys
import threading
import types
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from ..base import EngineUnavailable
from ..options import int_option
from ..tts.base import (
    SAMPLE_RATE,
    Emitter,
    SpeechError,
    SpeechErrorKind,
    SpeechRequest,
    SpeechStream,
    check_request,
    pcm16,
    start_synthesis,
    str_map_option,
)
from ..tts.voices import SAMPLE_VOICES, ReferenceVoice, list_custom_voices, read_reference_audio
from ..tts.voices import reference_voice as find_reference_voice
from ..tts.voices import sample_voice as find_sample_voice

__all__ = [
    "DEFAULT_VOICE_ALIASES",
    "GENERATION_KEYS",
    "LANGUAGE_CODES",
    "Qwen3Settings",
    "Qwen3SpeechModel",
    "import_qwen_tts",
    "load",
    "resolve_settings",
]

log = logging.getLogger("talkies.engines")

# OpenAI voice names -> speakers of Qwen's CustomVoice checkpoints (used when present).
DEFAULT_VOICE_ALIASES = {"alloy": "serena", "echo": "ryan", "fable": "aiden"}
# ISO 639-1 codes -> the language names Qwen3-TTS takes.
LANGUAGE_CODES = {
    "zh": "chinese",
    "en": "english",
    "ja": "japanese",
    "ko": "korean",
    "de": "german",
    "fr": "french",
    "ru": "russian",
    "pt": "portuguese",
    "es": "spanish",
    "it": "italian",
}
# qwen-tts sampling arguments an entry may set under ``generation``, with their types.
GENERATION_KEYS: dict[str, type] = {
    "do_sample": bool,
    "top_k": int,
    "top_p": float,
    "temperature": float,
    "repetition_penalty": float,
    "subtalker_dosample": bool,
    "subtalker_top_k": int,
    "subtalker_top_p": float,
    "subtalker_temperature": float,
    "max_new_tokens": int,
}
_CLONE_PROMPT_CACHE = 16
# The chat and TTS control tokens of Qwen3-TTS prompts. qwen-tts builds prompts as text and
# slices them by token position, so these must not come from request text.
_CONTROL_TOKENS = re.compile(r"<\|[A-Za-z_]+\|>|<tts_[A-Za-z_]+>")
_OPTION_KEYS = frozenset(
    {"threads", "left_context", "queue_chunks", "dtype", "generation", "voice_aliases"}
)


# -- importing qwen_tts -------------------------------------------------------------------------

# qwen_tts imports ``torchaudio.compliance.kaldi`` at import time, for its 25 Hz tokenizer only.
# PyPI's torchaudio is a CUDA build that fails to import on CPU-only machines, so when it
# cannot be imported a stand-in is put in sys.modules for the duration of the import of
# qwen_tts, then removed: nothing else sees it, and the 12 Hz models Talkies runs never call it.
_TORCHAUDIO_MODULES = ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi")
_import_lock = threading.Lock()


def _kaldi_unavailable(*args: object, **kwargs: object) -> NoReturn:
    raise RuntimeError(
        "the 25 Hz Qwen3-TTS tokenizer needs torchaudio, which cannot be imported here"
    )


def _torchaudio_importable() -> bool:
    try:
        importlib.import_module("torchaudio.compliance.kaldi")
    except Exception as exc:  # ImportError, or OSError from a CUDA build without CUDA
        log.info("torchaudio cannot be imported (%s); using a stand-in to import qwen_tts", exc)
        for name in [n for n in sys.modules if n == "torchaudio" or n.startswith("torchaudio.")]:
            del sys.modules[name]  # half-imported leftovers of the failed import
        return False
    return True


def _torchaudio_stand_in() -> dict[str, types.ModuleType]:
    modules: dict[str, types.ModuleType] = {}
    for name in _TORCHAUDIO_MODULES:
        module = types.ModuleType(name, "stand-in for torchaudio while qwen_tts is imported")
        module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
        modules[name] = module
    modules["torchaudio"].compliance = modules["torchaudio.compliance"]  # type: ignore[attr-defined]
    kaldi = modules["torchaudio.compliance.kaldi"]
    modules["torchaudio.compliance"].kaldi = kaldi  # type: ignore[attr-defined]
    kaldi.fbank = _kaldi_unavailable  # type: ignore[attr-defined]
    return modules


def import_qwen_tts() -> Any:
    """The ``qwen_tts`` module, imported with the torchaudio guard (ImportError if absent)."""
    with _import_lock:
        module = sys.modules.get("qwen_tts")
        if module is not None:
            return module
        # Imported first, so they record whether torchaudio really is available.
        importlib.import_module("torch")
        importlib.import_module("transformers")
        stand_in = {} if _torchaudio_importable() else _torchaudio_stand_in()
        sys.modules.update(stand_in)
        banner = io.StringIO()
        try:
            # qwen_tts prints a flash-attn banner to stdout at import; keep stdout clean.
            with contextlib.redirect_stdout(banner):
                module = importlib.import_module("qwen_tts")
        finally:
            for name, stub in stand_in.items():
                if sys.modules.get(name) is stub:
                    del sys.modules[name]
        if banner.getvalue().strip():
            log.debug("qwen_tts import printed: %s", " ".join(banner.getvalue().split()))
        return module


# -- options ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Qwen3Settings:
    """A Qwen3 entry's ``options``, checked."""

    threads: int = 1
    left_context: int = 25
    queue_chunks: int = 2
    dtype: str = "float32"
    generation: Mapping[str, Any] = field(default_factory=dict)
    voice_aliases: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_VOICE_ALIASES))


def _plain(text: str) -> str:
    """``text`` with any prompt control tokens blanked out."""
    return _CONTROL_TOKENS.sub(" ", text)


def _generation(value: object) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"option 'generation' must be an object, got {value!r}")
    out: dict[str, Any] = {}
    for key, item in value.items():
        kind = GENERATION_KEYS.get(key)
        if kind is None:
            raise ValueError(
                f"option 'generation' has unknown key {key!r}; known: {', '.join(GENERATION_KEYS)}"
            )
        if kind is bool:
            ok = isinstance(item, bool)
        elif kind is int:
            ok = isinstance(item, int) and not isinstance(item, bool) and item > 0
        else:
            ok = isinstance(item, int | float) and not isinstance(item, bool)
            ok = ok and math.isfinite(item) and item >= 0
        if not ok:
            raise ValueError(f"option 'generation.{key}' must be a {kind.__name__}, got {item!r}")
        out[key] = float(item) if kind is float else item
    return out


def resolve_settings(options: Mapping[str, Any], device: str) -> Qwen3Settings:
    """Check an entry's options; ValueError naming the first bad one."""
    unknown = sorted(set(options) - _OPTION_KEYS)
    if unknown:
        log.warning("qwen3: ignoring unknown options %s", ", ".join(map(repr, unknown)))
    dtype = options.get("dtype", "float32" if device == "cpu" else "bfloat16")
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"option 'dtype' must be float32, bfloat16 or float16, got {dtype!r}")
    aliases = str_map_option(options, "voice_aliases")
    return Qwen3Settings(
        threads=int_option(options, "threads", 1, 1, 256),
        left_context=int_option(options, "left_context", 25, 0, 300),
        queue_chunks=int_option(options, "queue_chunks", 2, 1, 64),
        dtype=dtype,
        generation=_generation(options.get("generation")),
        voice_aliases=DEFAULT_VOICE_ALIASES if aliases is None else aliases,
    )


# -- the model ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
    """A validated request, resolved to what generation needs."""

    text: str
    language: str  # a Qwen3 language name, or "auto"
    speaker: str | None = None  # custom_voice
    reference: ReferenceVoice | None = None  # base
    instructions: str | None = None


class _ChunkDecoder:
    """Turns codec frames into PCM chunks of ``chunk_steps`` frames, with left context."""

    def __init__(
        self,
        decoder: Any,
        *,
        samples_per_step: int,
        left_context: int,
        chunk_steps: int,
        context: Any,
        emit: Callable[[bytes], None],
    ) -> None:
        import torch

        self._torch = torch
        self._decoder = decoder
        self._step = samples_per_step
        self._left = left_context
        self._chunk = chunk_steps
        self._context = context[-left_context:] if context is not None and left_context else None
        self._emit = emit
        self._pending: list[Any] = []
        self.frames: list[Any] = []

    def add(self, frame: Any) -> None:
        self._pending.append(frame)
        self.frames.append(frame)
        if len(self._pending) >= self._chunk:
            self._flush()

    def finish(self) -> None:
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        torch = self._torch
        new = torch.stack(self._pending)
        self._pending = []
        codes = new if self._context is None else torch.cat([self._context.to(new.device), new])
        wav = self._decoder(codes.clamp(min=0).transpose(0, 1).unsqueeze(0))  # (1, 1, samples)
        start = (codes.shape[0] - new.shape[0]) * self._step
        audio = wav[0, 0, start : start + new.shape[0] * self._step]
        self._context = codes[-self._left :] if self._left else None
        self._emit(pcm16(audio.float().cpu().numpy()))


class Qwen3SpeechModel:
    """A loaded Qwen3-TTS model (``custom_voice`` or ``base``)."""

    sample_rate = SAMPLE_RATE
    streaming = True

    def __init__(
        self,
        tts: Any,
        *,
        settings: Qwen3Settings,
        data_dir: Path | None = None,
        name: str = "qwen3-tts",
    ) -> None:
        model = tts.model
        self.kind = str(model.tts_model_type)
        if self.kind not in ("custom_voice", "base"):
            raise ValueError(f"model type {self.kind!r} is not supported (custom_voice, base)")
        if model.tokenizer_type != "qwen3_tts_tokenizer_12hz":
            raise ValueError(f"speech tokenizer {model.tokenizer_type!r} is not supported (12 Hz)")
        self.name = name
        self._tts = tts
        self._settings = settings
        self._data_dir = data_dir
        self._codec = model.speech_tokenizer.model
        self.samples_per_step = int(self._codec.get_decode_upsample_rate())
        if int(self._codec.get_output_sample_rate()) != SAMPLE_RATE:
            raise ValueError(f"the speech tokenizer does not output {SAMPLE_RATE} Hz audio")
        self._languages = sorted(str(x).lower() for x in model.get_supported_languages() or ())
        self._speakers = sorted(str(x).lower() for x in model.get_supported_speakers() or ())
        self._aliases = {
            alias: speaker.lower()
            for alias, speaker in settings.voice_aliases.items()
            if speaker.lower() in self._speakers
        }
        # qwen-tts drops instructions for its 0.6B CustomVoice model; Base has none.
        self._instructions = self.kind == "custom_voice" and model.tts_model_size != "0b6"
        self._generate_kwargs = tts._merge_generate_kwargs(**settings.generation)
        self._lock = threading.Lock()  # one synthesis at a time; held by the worker thread
        self._sink: Callable[[Any], None] | None = None
        self._prompts: OrderedDict[tuple[object, ...], Any] = OrderedDict()
        self._closed = False
        self.last_codes: npt.NDArray[np.int64] | None = None  # of the last finished synthesis
        self._install_step_hook()

    def _install_step_hook(self) -> None:
        talker = self._tts.model.talker
        forward = talker.forward

        @functools.wraps(forward)
        def stepping_forward(*args: Any, **kwargs: Any) -> Any:
            out = forward(*args, **kwargs)
            sink = self._sink
            if sink is not None:
                sink(out.hidden_states[1])  # None on the prompt's (prefill) pass
            return out

        talker.forward = stepping_forward

    # -- voices and validation --------------------------------------------------------------

    def voices(self) -> list[str]:
        if self.kind == "custom_voice":
            return [*self._aliases, *(s for s in self._speakers if s not in self._aliases)]
        names = [n for n in SAMPLE_VOICES if find_sample_voice(n) is not None]
        if self._data_dir is not None:
            names += [n for n in list_custom_voices(self._data_dir) if n not in names]
        return names

    def languages(self) -> list[str]:
        """Language names this model takes ("auto" among them)."""
        return list(self._languages)

    def _language(self, requested: str | None) -> str:
        if requested is None:
            return "auto"
        name = requested.strip().lower()
        name = LANGUAGE_CODES.get(name.split("-")[0].split("_")[0], name)
        if name not in self._languages:
            raise SpeechError(
                SpeechErrorKind.INVALID_INPUT,
                f"unsupported language {requested[:32]!r}; use one of {', '.join(self._languages)}",
                param="language",
            )
        return name

    def _plan(self, request: SpeechRequest) -> _Plan:
        check_request(request, speed_range=(1.0, 1.0))
        language = self._language(request.language)
        instructions = request.instructions if self._instructions else None
        if request.instructions and not instructions:
            log.debug("qwen3: %s model ignores instructions", self.kind)
        if self.kind == "custom_voice":
            voice = request.voice.lower()
            speaker = self._aliases.get(voice, voice)
            if speaker not in self._speakers:
                raise SpeechError(
                    SpeechErrorKind.UNKNOWN_VOICE,
                    f"unknown voice {request.voice[:128]!r}",
                    param="voice",
                )
            return _Plan(request.text, language, speaker=speaker, instructions=instructions)
        reference = find_reference_voice(self._data_dir, request.voice)
        return _Plan(request.text, language, reference=reference)

    def validate(self, request: SpeechRequest) -> None:
        self._plan(request)

    # -- synthesis --------------------------------------------------------------------------

    async def synthesize(self, request: SpeechRequest, *, chunk_steps: int = 8) -> SpeechStream:
        """Stream ``request``: chunks of ``chunk_steps`` codec steps (the last may be shorter)."""
        if chunk_steps < 1:
            raise ValueError("chunk_steps must be at least 1")
        if self._closed:
            raise RuntimeError(f"model {self.name!r} was closed")
        plan = self._plan(request)
        return start_synthesis(
            functools.partial(self._stream, plan, chunk_steps),
            lock=self._lock,
            max_chunks=self._settings.queue_chunks,
            name=self.name,
        )

    def generate_codes(self, request: SpeechRequest) -> npt.NDArray[np.int64]:
        """The whole utterance's codec frames (steps, 16) in one call, without streaming.

        Blocking (waits for the model's lock): for tests and tools.
        """
        plan = self._plan(request)
        with self._lock, self._inference():
            inputs, _ = self._prepare(plan)
            codes, _ = self._tts.model.generate(**inputs, **self._generate_kwargs)
        return np.asarray(codes[0].cpu().numpy(), dtype=np.int64)

    @contextlib.contextmanager
    def _inference(self) -> Iterator[None]:
        import torch

        if self._closed:
            raise RuntimeError(f"model {self.name!r} was closed")
        if torch.get_num_threads() != self._settings.threads:
            torch.set_num_threads(self._settings.threads)
        with torch.no_grad():
            yield

    def _prepare(self, plan: _Plan) -> tuple[dict[str, Any], Any]:
        """``generate`` arguments for ``plan``, as qwen-tts's own generate_* methods build them,
        and the reference codes that precede the output (None unless cloning in context)."""
        tts = self._tts
        input_ids = tts._tokenize_texts([tts._build_assistant_text(_plain(plan.text))])
        if plan.reference is None:
            instruct = None
            if plan.instructions:
                prompt = tts._build_instruct_text(_plain(plan.instructions))
                instruct = tts._tokenize_texts([prompt])[0]
            inputs = {
                "input_ids": input_ids,
                "instruct_ids": [instruct],
                "languages": [plan.language],
                "speakers": [plan.speaker],
                "non_streaming_mode": True,  # generate_custom_voice's default
            }
            return inputs, None
        item = self._clone_prompt(plan.reference)
        ref_ids = None
        if item.ref_text:
            ref_ids = tts._tokenize_texts([tts._build_ref_text(_plain(item.ref_text))])[0]
        inputs = {
            "input_ids": input_ids,
            "ref_ids": [ref_ids],
            "voice_clone_prompt": tts._prompt_items_to_voice_clone_prompt([item]),
            "languages": [plan.language],
            "non_streaming_mode": False,  # generate_voice_clone's default
        }
        return inputs, item.ref_code

    def _clone_prompt(self, voice: ReferenceVoice) -> Any:
        """The voice's clone prompt (reference codes + speaker embedding), cached by file."""
        stat = voice.audio.stat()
        key = (str(voice.audio), stat.st_mtime_ns, stat.st_size, voice.transcript)
        item = self._prompts.get(key)
        if item is not None:
            self._prompts.move_to_end(key)
            return item
        audio, rate = read_reference_audio(voice)
        (item,) = self._tts.create_voice_clone_prompt(
            ref_audio=(audio, rate),
            ref_text=voice.transcript,
            x_vector_only_mode=voice.transcript is None,
        )
        self._prompts[key] = item
        while len(self._prompts) > _CLONE_PROMPT_CACHE:
            self._prompts.popitem(last=False)
        return item

    def _stream(self, plan: _Plan, chunk_steps: int, emitter: Emitter) -> None:
        """The worker thread's job (the model's lock is held)."""
        eos = int(self._tts.model.config.talker_config.codec_eos_token_id)
        with self._inference():
            inputs, ref_code = self._prepare(plan)
            decoder = _ChunkDecoder(
                self._codec.decoder,
                samples_per_step=self.samples_per_step,
                left_context=self._settings.left_context,
                chunk_steps=chunk_steps,
                context=ref_code,
                emit=emitter.emit,
            )

            def on_step(codes: Any) -> None:
                if codes is None:
                    emitter.check()
                    return
                emitter.step()
                frame = codes[0]
                if int(frame[0]) != eos:  # never for one utterance; as qwen-tts cuts there
                    decoder.add(frame)

            self._sink = on_step
            try:
                self._tts.model.generate(**inputs, **self._generate_kwargs)
            finally:
                self._sink = None
            decoder.finish()
        if decoder.frames:
            frames = np.stack([f.cpu().numpy() for f in decoder.frames])
            self.last_codes = frames.astype(np.int64)
        else:
            self.last_codes = np.zeros((0, 16), np.int64)

    def close(self) -> None:
        with self._lock:  # after any running synthesis
            self._closed = True
            self._prompts.clear()
            self._sink = None
        log.debug("qwen3: model %r closed", self.name)


def load(
    root: Path,
    options: Mapping[str, Any],
    device: str,
    data_dir: Path | None = None,
    *,
    name: str = "qwen3-tts",
) -> Qwen3SpeechModel:
    """Load the Qwen3-TTS model folder ``root`` (blocking: call from a worker thread).

    ``data_dir`` holds ``custom-voices/`` for a Base model. Raises
    :class:`~talkies.engines.base.EngineUnavailable` with a client-safe message.
    """
    try:
        settings = resolve_settings(options, device)
    except ValueError as exc:
        raise EngineUnavailable(f"model {name!r}: {exc}") from None
    try:
        qwen_tts = import_qwen_tts()
        torch = importlib.import_module("torch")
    except ImportError as exc:
        raise EngineUnavailable(
            f"model {name!r} needs the qwen-tts and torch packages (talkies[qwen3]): {exc}"
        ) from None
    kwargs: dict[str, Any] = {"dtype": getattr(torch, settings.dtype)}
    if device != "cpu":
        kwargs["device_map"] = device
    try:
        tts = qwen_tts.Qwen3TTSModel.from_pretrained(str(root), **kwargs)
    except Exception as exc:
        log.exception("qwen3: loading %s failed", root)
        raise EngineUnavailable(f"model {name!r}: could not load the Qwen3-TTS model") from exc
    try:
        return Qwen3SpeechModel(tts, settings=settings, data_dir=data_dir, name=name)
    except ValueError as exc:
        raise EngineUnavailable(f"model {name!r}: {exc}") from None
