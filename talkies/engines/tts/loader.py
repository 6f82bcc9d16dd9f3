"""Load a text-to-speech model from its registry entry (blocking: the pool's load thread)."""

from __future__ import annotations

import importlib
from pathlib import Path

from ..base import EngineUnavailable
from ..supply.registry import ModelEntry
from .base import SpeechModel

__all__ = ["load_speech_model"]


def _device(executor: str, device: str) -> str:
    """TALKIES_DEVICE for a TTS runtime: ``auto`` is the GPU when that runtime can use one."""
    if device != "auto":
        return device
    try:
        if executor == "qwen3_tts":
            torch = importlib.import_module("torch")
            return "cuda" if torch.cuda.is_available() else "cpu"
        ort = importlib.import_module("onnxruntime")
        return "cuda" if "CUDAExecutionProvider" in ort.get_available_providers() else "cpu"
    except ImportError:
        return "cpu"  # the engine's own load names the missing package


def load_speech_model(entry: ModelEntry, root: Path, device: str, data_dir: Path) -> SpeechModel:
    device = _device(entry.executor, device)
    if entry.executor == "qwen3_tts":
        from .. import qwen3

        return qwen3.load(root, entry.options, device, data_dir, name=entry.slug)
    if entry.executor == "kokoro":
        from .. import kokoro

        return kokoro.load(root, entry.options, device, name=entry.slug)
    raise EngineUnavailable(f"model {entry.slug!r}: executor {entry.executor!r} is not TTS")
