"""Text-to-speech engines: raw s16le PCM out, streamed (Qwen3-TTS) or buffered (Kokoro).

The engine modules import their heavy runtimes (torch, qwen-tts, onnxruntime) only when a
model is loaded; importing this package costs nothing.
"""

from .base import (
    MAX_INPUT_CHARS,
    SAMPLE_RATE,
    SpeechError,
    SpeechErrorKind,
    SpeechModel,
    SpeechRequest,
    SpeechStream,
    SynthesisFailed,
)

__all__ = [
    "MAX_INPUT_CHARS",
    "SAMPLE_RATE",
    "SpeechError",
    "SpeechErrorKind",
    "SpeechModel",
    "SpeechRequest",
    "SpeechStream",
    "SynthesisFailed",
]
