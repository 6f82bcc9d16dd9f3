"""A whisper entry's ``options``, checked (:class:`RollingConfig`), and the encoder lengths
they give a decode."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...protocol.events import SAMPLE_RATE
from ..options import int_option, number_option
from ..runtime.vad import VadConfig

__all__ = [
    "COMPUTE_TYPES",
    "MIN_DECODE_SAMPLES",
    "POLICIES",
    "RollingConfig",
    "commit_samples",
    "encoder_positions",
    "resolve_config",
]

log = logging.getLogger("talkies.engines")

# How an open utterance commits words (:mod:`.utterances`): "timestamp", the timestamp cut
# at window overflow (:mod:`.rolling`); "agreement", LocalAgreement-2 trimming long speech
# (:mod:`.agreement`); "early", LocalAgreement-2 committing agreed words at every hypothesis,
# so that partials announce a stable prefix within about a second of a word (docs/engines.md).
POLICIES = ("agreement", "early", "timestamp")
MIN_DECODE_SAMPLES = SAMPLE_RATE // 10  # whisper.cpp refuses input shorter than 100 ms
# What CTranslate2 4.x takes as compute_type ("default": as the weights are stored; "auto":
# the fastest the device supports).
COMPUTE_TYPES = frozenset(
    {
        "default",
        "auto",
        "int8",
        "int8_float32",
        "int8_float16",
        "int8_bfloat16",
        "int16",
        "float16",
        "bfloat16",
        "float32",
    }
)


@dataclass(frozen=True, slots=True)
class RollingConfig:
    """A model entry's ``options``, checked. Times in seconds."""

    window_seconds: float = 5.0
    refresh_seconds: float = 0.5
    # policy "early": the hypothesis period of an utterance until its first committed word
    # (in its first 2 s), so that the first words are stable sooner; a hypothesis of under
    # 1 s of audio is then agreed with only from 0.375 s later (docs/engines.md). 0:
    # refresh_seconds throughout, and the plain agreement rules.
    first_refresh_seconds: float = 0.25
    keep_seconds: float = 1.0
    threads: int = 2
    contexts: int = 1
    # Encoder lengths in positions of 20 ms (Whisper's own is 1500: 30 s). Partials use
    # audio_ctx (0: just enough for the window, rounded up to 64); commits and the final use
    # final_audio_ctx, longer because accuracy drops when the encoder sees little beyond the
    # speech (measured on base: 256 misreads words that 640 and up get right).
    audio_ctx: int = 0
    final_audio_ctx: int = 768
    language: str = "en"  # when the client gives none
    model_file: str | None = None
    # CTranslate2's computation type (the whisper_ct2 executor; whisper.cpp ignores it):
    # int8 weights and matrix products on CPU by default (:mod:`.ctranslate`).
    compute_type: str = "int8"
    # CTranslate2's beam size for the decodes whose words are kept (the whisper_ct2 executor;
    # whisper.cpp ignores it): ``DecodeRequest.final`` ones (an utterance's final, a commit)
    # and a file's 30 s decodes at temperature 0. Partials stay greedy. 1: greedy everywhere.
    # 5 (faster-whisper's): measured better WER for ~5 % more live CPU (docs/engines.md,
    # "Whisper backends").
    final_beam_size: int = 5
    # Voice activity detection (:mod:`talkies.engines.runtime.vad`): utterances cut at pauses,
    # each decoded whole once and sent as an endpoint; silence is not decoded. Off: the
    # rolling window alone, over the whole stream, with no endpoints.
    vad: bool = True
    vad_threshold: float = 0.5
    vad_min_silence_seconds: float = 0.6
    vad_speech_pad_seconds: float = 0.3
    vad_min_speech_seconds: float = 0.2
    policy: str = "timestamp"  # how an open utterance commits (POLICIES)

    @property
    def vad_config(self) -> VadConfig | None:
        if not self.vad:
            return None
        return VadConfig(
            threshold=self.vad_threshold,
            min_silence_seconds=self.vad_min_silence_seconds,
            speech_pad_seconds=self.vad_speech_pad_seconds,
            min_speech_seconds=self.vad_min_speech_seconds,
        )

    @property
    def window_samples(self) -> int:
        return round(self.window_seconds * SAMPLE_RATE)

    @property
    def refresh_samples(self) -> int:
        return max(1, round(self.refresh_seconds * SAMPLE_RATE))

    @property
    def first_refresh_samples(self) -> int:
        return max(1, round((self.first_refresh_seconds or self.refresh_seconds) * SAMPLE_RATE))


_OPTION_KEYS = frozenset(RollingConfig.__dataclass_fields__)


def resolve_config(options: Mapping[str, Any]) -> RollingConfig:
    """Check an entry's options; raise ValueError naming the first bad one."""
    unknown = sorted(set(options) - _OPTION_KEYS)
    if unknown:
        log.warning("whisper: ignoring unknown options %s", ", ".join(map(repr, unknown)))
    # The pool fills window_seconds from TALKIES_STREAM_MAX_BUFFER_SECONDS, a server-wide
    # setting with a wider range: clamp it to what Whisper can hold rather than refuse.
    window = number_option(options, "window_seconds", 5.0, 0.0, math.inf)
    if not 1.0 <= window <= 30.0:
        clamped = min(max(window, 1.0), 30.0)
        log.warning("whisper: window_seconds %g is outside 1-30 s; using %g", window, clamped)
        window = clamped
    refresh = number_option(options, "refresh_seconds", 0.5, 0.05, window)
    first_refresh = number_option(
        options, "first_refresh_seconds", min(0.25, refresh), 0.0, refresh
    )
    if 0.0 < first_refresh < 0.05:
        raise ValueError("option 'first_refresh_seconds' must be 0 or 0.05 s or more")
    keep = number_option(options, "keep_seconds", min(1.0, window / 4), 0.0, window / 2)
    language = options.get("language", "en")
    if not isinstance(language, str) or not language:
        raise ValueError(f"option 'language' must be a language code, got {language!r}")
    model_file = options.get("model_file")
    if model_file is not None and (not isinstance(model_file, str) or not model_file):
        raise ValueError(f"option 'model_file' must be a file name, got {model_file!r}")
    compute_type = options.get("compute_type", "int8")
    if compute_type not in COMPUTE_TYPES:
        raise ValueError(
            f"option 'compute_type' must be one of {', '.join(sorted(COMPUTE_TYPES))}, "
            f"got {compute_type!r}"
        )
    policy = options.get("policy", "timestamp")
    if policy not in POLICIES:
        raise ValueError(f"option 'policy' must be one of {', '.join(POLICIES)}, got {policy!r}")
    vad = options.get("vad", True)
    if not isinstance(vad, bool):
        raise ValueError(f"option 'vad' must be true or false, got {vad!r}")
    return RollingConfig(
        vad=vad,
        policy=policy,
        vad_threshold=number_option(options, "vad_threshold", 0.5, 0.05, 0.95),
        vad_min_silence_seconds=number_option(options, "vad_min_silence_seconds", 0.6, 0.1, 10.0),
        vad_speech_pad_seconds=number_option(options, "vad_speech_pad_seconds", 0.3, 0.0, 2.0),
        vad_min_speech_seconds=number_option(options, "vad_min_speech_seconds", 0.2, 0.0, 5.0),
        window_seconds=window,
        refresh_seconds=refresh,
        first_refresh_seconds=first_refresh,
        keep_seconds=keep,
        threads=int_option(options, "threads", 2, 1, 256),
        contexts=int_option(options, "contexts", 1, 1, 64),
        audio_ctx=int_option(options, "audio_ctx", 0, 0, 1500),
        final_audio_ctx=int_option(options, "final_audio_ctx", 768, 64, 1500),
        language=language,
        model_file=model_file,
        compute_type=compute_type,
        final_beam_size=int_option(options, "final_beam_size", 5, 1, 16),
    )


def encoder_positions(
    config: RollingConfig, *, final: bool, n_audio_ctx: int = 1500, samples: int = 0
) -> int:
    """The ``audio_ctx`` of a decode: never shorter than the window, nor than the ``samples``
    it decodes (an utterance may be longer than the window: :mod:`.utterances`)."""
    window = -(-math.ceil(config.window_seconds * 50) // 64) * 64  # 20 ms per position
    needed = -(-math.ceil(samples * 50 / SAMPLE_RATE) // 64) * 64
    wanted = config.final_audio_ctx if final else (config.audio_ctx or window)
    return min(max(wanted, window, needed), n_audio_ctx)


def commit_samples(config: RollingConfig, *, n_audio_ctx: int = 1500) -> int:
    """The most audio one commit decodes: all that is buffered, up to what the commit's
    encoder holds (less 0.5 s of margin), never less than the window.

    A commit's encoder length is fixed (``final_audio_ctx``: about 15 s by default), so its
    cost hardly depends on how much of that span holds audio. A stream that fell behind
    therefore catches up in one commit of all its backlog, instead of one per window, each
    of them stale by the time its partial would be sent.
    """
    positions = encoder_positions(config, final=True, n_audio_ctx=n_audio_ctx)
    return max(config.window_samples, positions * SAMPLE_RATE // 50 - SAMPLE_RATE // 2)
