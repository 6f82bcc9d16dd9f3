"""The built-in registry: the spec's slugs, each pinned to an immutable revision.

Revisions were taken from public references to these repositories' commits (they cannot be
re-checked from a machine without access to the Hub); ``talkies models pull`` fails loudly if
one is wrong, and TALKIES_MODELS_FILE can override any entry.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from .registry import ModelEntry

__all__ = ["BUILTIN_MODELS", "builtin_models"]

_ZIPFORMER_0626 = "csukuangfj/sherpa-onnx-streaming-zipformer-en-2023-06-26"
_ZIPFORMER_0626_REV = "672fbf1b30579d6585301139bb363f42a0ad4a24"
_ZIPFORMER_0621 = "csukuangfj/sherpa-onnx-streaming-zipformer-en-2023-06-21"
_ZIPFORMER_0621_REV = "9a65b6ea94c311ca770c2bf895b30f456a22d703"
_KROKO = "csukuangfj/sherpa-onnx-streaming-zipformer-en-kroko-2025-08-06"
_KROKO_REV = "572aaf4e2e0c603c3fc2a574d096e755a178faa1"
_WHISPER_CPP = "ggerganov/whisper.cpp"
_WHISPER_CPP_REV = "5359861c739e955e79d9a303bcbc70fb988958b1"


def _zipformer(slug: str, repo: str, rev: str, *, stem: str, suffix: str, note: str) -> ModelEntry:
    files = {part: f"{part}-{stem}{suffix}.onnx" for part in ("encoder", "decoder", "joiner")}
    return ModelEntry(
        slug=slug,
        executor="sherpa",
        repo=repo,
        revision=rev,
        allow_patterns=(*files.values(), "tokens.txt"),
        recognizer_factory="from_transducer",
        sherpa_config=MappingProxyType({**files, "tokens": "tokens.txt"}),
        description=note,
    )


BUILTIN_MODELS: dict[str, ModelEntry] = {
    e.slug: e
    for e in (
        _zipformer(
            "sherpa-zipformer-en-2023-06-26",
            _ZIPFORMER_0626,
            _ZIPFORMER_0626_REV,
            stem="epoch-99-avg-1-chunk-16-left-128",
            suffix="",
            note="English streaming Zipformer (LibriSpeech+GigaSpeech), chunk 16, left 128, fp32",
        ),
        _zipformer(
            "sherpa-zipformer-en-2023-06-26-int8",
            _ZIPFORMER_0626,
            _ZIPFORMER_0626_REV,
            stem="epoch-99-avg-1-chunk-16-left-128",
            suffix=".int8",
            note="the same model, int8-quantised: ~3x smaller, faster on CPU",
        ),
        _zipformer(
            "sherpa-zipformer-en-2023-06-21-int8",
            _ZIPFORMER_0621,
            _ZIPFORMER_0621_REV,
            stem="epoch-99-avg-1",
            suffix=".int8",
            note="English streaming Zipformer (LibriSpeech+GigaSpeech), larger context, int8",
        ),
        ModelEntry(
            slug="sherpa-zipformer-en-kroko-2025-08-06",
            executor="sherpa",
            repo=_KROKO,
            revision=_KROKO_REV,
            allow_patterns=("encoder.onnx", "decoder.onnx", "joiner.onnx", "tokens.txt"),
            recognizer_factory="from_transducer",
            sherpa_config=MappingProxyType(
                {
                    "encoder": "encoder.onnx",
                    "decoder": "decoder.onnx",
                    "joiner": "joiner.onnx",
                    "tokens": "tokens.txt",
                }
            ),
            description="English streaming Zipformer2 (Kroko), small and fast, fp32",
        ),
        ModelEntry(
            slug="whisper-base-en",
            executor="whisper",
            repo=_WHISPER_CPP,
            revision=_WHISPER_CPP_REV,
            allow_patterns=("ggml-base.en.bin",),
            options=MappingProxyType({"model_file": "ggml-base.en.bin"}),
            description="OpenAI Whisper base.en in whisper.cpp format; rolling-window streaming",
        ),
        ModelEntry(
            slug="whisper-base",
            executor="whisper",
            repo=_WHISPER_CPP,
            revision=_WHISPER_CPP_REV,
            allow_patterns=("ggml-base.bin",),
            options=MappingProxyType({"model_file": "ggml-base.bin"}),
            description="OpenAI Whisper base (multilingual) in whisper.cpp format",
        ),
    )
}


def builtin_models(data_dir: Path) -> dict[str, ModelEntry]:
    """The built-in registry for a server whose data directory is ``data_dir``."""
    models = dict(BUILTIN_MODELS)
    # The spec's example slug. parakeet.cpp publishes no Hub snapshot to pin, so the model is
    # expected as a local folder; without the runtime, a stream on it is a clear 4500.
    models["nemotron-3.5-asr-0.6b"] = ModelEntry(
        slug="nemotron-3.5-asr-0.6b",
        executor="parakeet_cpp",
        path=data_dir / "models" / "nemotron-3.5-asr-0.6b",
        description="NVIDIA Nemotron streaming ASR 0.6B via parakeet.cpp (runtime not bundled)",
    )
    return models
