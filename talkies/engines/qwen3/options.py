"""Qwen3-TTS: the entry options and the import of ``qwen_tts`` (:mod:`talkies.engines.qwen3`)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import io
import logging
import math
import re
import sys
import threading
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from ..options import int_option
from ..tts.base import (
    str_map_option,
)

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
CLONE_PROMPT_CACHE = 16
# The chat and TTS control tokens of Qwen3-TTS prompts. qwen-tts builds prompts as text and
# slices them by token position, so these must not come from request text.
CONTROL_TOKENS = re.compile(r"<\|[A-Za-z_]+\|>|<tts_[A-Za-z_]+>")
OPTION_KEYS = frozenset(
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


def plain_text(text: str) -> str:
    """``text`` with any prompt control tokens blanked out."""
    return CONTROL_TOKENS.sub(" ", text)


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
    unknown = sorted(set(options) - OPTION_KEYS)
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
