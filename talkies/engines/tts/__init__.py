"""What text-to-speech engines share: raw s16le PCM out, streamed or buffered.

:mod:`.base` is the interface (:class:`SpeechModel`, :class:`SpeechRequest`, the refusals of a
request, :func:`check_request`, the worker that streams a synthesis into a bounded queue);
:mod:`.voices` the sample and custom reference voices. The engines themselves are folders of
their own (:mod:`talkies.engines.qwen3`: streamed; :mod:`talkies.engines.kokoro`: buffered),
which import their heavy runtimes (torch, qwen-tts, onnxruntime) only when a model is loaded.
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
