"""``whisper`` and ``whisper_ct2``: live ASR over Whisper, on whisper.cpp (the ``pywhispercpp``
binding) or CTranslate2 (faster-whisper's engine; the default ``whisper-base-en``): utterances
cut by voice activity, each rolled, then decoded whole. The two executors differ only below
the seam of :class:`~.model.BaseWhisperModel` (``decode``, ``_transcribe_window``); what
each costs is in docs/engines.md ("Whisper backends").

Modules: :mod:`.config` (entry options), :mod:`.ggml` (model files), :mod:`.native` (the
binding), :mod:`.model` (:class:`BaseWhisperModel`, whisper.cpp's :class:`WhisperModel`),
:mod:`.ctranslate` (CTranslate2's :class:`Ct2WhisperModel`, with :mod:`.features`, log-mel,
and :mod:`.tokens`, the vocabulary), :mod:`.utterances` (voice activity:
utterances and endpoints), :mod:`.rolling` (the rolling policy within an utterance),
:mod:`.agreement` (LocalAgreement-2, the alternative measured against it), :mod:`.files`
(whole files, by utterance).

Whisper is not a streaming model: it transcribes a buffer. A stream is cut into utterances by
the runtime's voice activity detector (:mod:`talkies.engines.runtime.vad`; option ``vad``,
default on): silence is not decoded, each utterance is decoded whole once at its pause and
sent as an endpoint (:mod:`.utterances`; docs/engines.md). Within an utterance, and over the
whole stream with ``vad`` off (no endpoints then: the final covers the whole stream), a bounded
window of recent PCM is re-decoded (spec: "rolling: Re-decodes a bounded PCM window and emits
changed partial revisions"); LocalAgreement-2 (:mod:`.agreement`) is the measured
alternative for an utterance. Every partial says how much of its text is committed
(``stable``: its committed words' text, which the endpoint or final begins with); the entry
option ``policy: "early"`` commits agreed words within about a second (:mod:`.agreement`,
docs/engines.md "Stable text"), forcing them as the decoder's ``prefix`` in later decodes:

Rolling policy (per stream)
---------------------------
- Audio accumulates in a window of at most ``window_seconds`` (entry option, default 5 s; the
  pool passes ``TALKIES_STREAM_MAX_BUFFER_SECONDS`` here).
- **Refresh on a grid.** Every ``refresh_seconds`` (default 0.5 s) of stream time the
  window is decoded again and the hypothesis (committed prefix + window) reported as a
  partial (the protocol session drops it when it did not change). Refreshes are due at
  multiples of the period, not a period after the last decode, so one that ran late (behind
  a commit) does not delay all that follow.
- **Skip to the newest audio.** A decode always covers everything accepted so far: the
  runtime hands a stream its whole backlog in one batch, so a decoder that falls behind
  decodes less often rather than queueing stale windows, and its next partial jumps to the
  newest audio (revisions stay monotone: the session numbers them).
- **Commit at overflow.** When the window is full, everything buffered is decoded once with
  token timestamps and the longer encoder, up to what that encoder holds (about 15 s,
  :func:`~.config.commit_samples`): usually the window and a frame, after a backlog all of
  it, in one decode that costs about what a window's does. The leading words that end at
  least ``keep_seconds`` (default 1 s) before the decoded span's end are committed: appended
  to the stream's transcript and never revised again. The audio is cut in the pause after the
  last committed word (the midpoint between its end and the next word's start), so the next
  window starts between words: each word is transcribed in one window only, which avoids
  both the duplicated words of overlapping windows and the clipped ones of a cut at a fixed
  time. Words near the end of the window, which Whisper garbles when the audio stops
  mid-word, stay uncommitted and are decoded again with more context.
- **Seam check.** Token timestamps are approximate, so a window may start with the tail of
  the last committed word and Whisper hears it again ("how much | much there"): leading words
  of a window that repeat the last committed words are dropped (:func:`drop_repeated_start`).
- Fallbacks: a window with no words at all drops everything but its last ``keep_seconds``; a
  window whose words all end late (broken timestamps) is committed whole and dropped.
- The committed text is not given to later decodes as Whisper's prompt: measured on the
  LibriVox stream of the tests, prompting made Whisper repeat the prompt (WER 49%, against 6%
  without).
- ``finish()`` decodes what is left (or reuses the commit decode when it covered exactly
  that) and returns the committed words + the remainder.

Decoding: greedy, temperature 0 with no temperature fallback (``temperature_inc=0``: fallback
turns a junk window into many decodes), no cross-call context, timestamp tokens on (without
them Whisper loops on a window that ends mid-sentence), one segment for partials. The encoder
length ``audio_ctx`` is cut from Whisper's 30 s to what the window needs: partials use just
the window (5 s: 256 positions), commits and the final ``final_audio_ctx`` (default 768,
about 15 s), because accuracy drops when the encoder sees little beyond the speech.

Flash attention is off: with it and a reduced ``audio_ctx``, the same audio decoded
differently depending on what the context had decoded before (whisper.cpp 1.8.5, CPU).

Sharing: whisper.cpp contexts are not thread-safe. A model holds ``contexts`` (default 1)
whisper.cpp contexts, each a full copy of the weights plus its work buffers (base, f16: about
240 MiB each, RSS after decoding); a decode borrows one for its duration. With one context, decodes
of all streams of the model are serialised: on two cores a second context buys little and
costs the memory. The binding releases the GIL while decoding, so the event loop keeps
running. ``threads`` (default 2) is per decode; ggml spin-waits for its threads, so more
threads than idle cores makes decodes much slower, not faster.

Languages: none in the start message means the entry's ``language`` option (default "en");
"auto" detects on the first decodes and keeps the language found once 3 s were heard (an
English-only model always uses "en"); a tag is cut to its primary subtag ("pt-BR" -> "pt"),
and one Whisper does not know is refused with ``invalid_language``.

Word times come from whisper.cpp's token timestamps when ``word_timestamps`` is requested,
in seconds from the stream's first sample; they are approximate (off by up to ~0.2 s).

Whole files (POST /v1/audio/transcriptions) do not go through the rolling window:
:meth:`BaseWhisperModel.transcribe` decodes the file's speech in chunks of at most 30 s cut
in pauses by the voice activity detector, long silences undecoded, with Whisper's own segments
(:mod:`.files`, :class:`~.files.FileChunks`), stopped through the backend's abort check when
the request is cancelled. With no language in the request it uses the entry's, as a stream does.

The model file is ``options.model_file``, else ``model.bin``, else the only ``*.bin`` in the
model folder; it is checked from end to end before whisper.cpp sees it. A faster-whisper
(CTranslate2) folder is converted once (:mod:`talkies.engines.whisper.ct2ggml`) and the conversion
kept beside it.
"""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

from ...config import Settings
from ..catalogue import Executor
from ..supply.entry import ModelEntry
from .config import RollingConfig, commit_samples, encoder_positions, resolve_config
from .ctranslate import Ct2WhisperModel, load_ct2
from .features import log_mel
from .files import file_params, file_segments
from .ggml import GgmlInfo, inspect_ggml
from .model import BaseWhisperModel, WhisperModel, load
from .rolling import (
    Decoded,
    DecodedWord,
    Decoder,
    DecodeRequest,
    WhisperRecognition,
    choose_cut,
    drop_repeated_start,
)
from .utterances import UtteranceRecognition

__all__ = [
    "EXECUTORS",
    "BaseWhisperModel",
    "Ct2WhisperModel",
    "DecodeRequest",
    "Decoded",
    "DecodedWord",
    "Decoder",
    "GgmlInfo",
    "RollingConfig",
    "UtteranceRecognition",
    "WhisperModel",
    "WhisperRecognition",
    "choose_cut",
    "commit_samples",
    "drop_repeated_start",
    "encoder_positions",
    "file_params",
    "file_segments",
    "inspect_ggml",
    "load",
    "load_ct2",
    "log_mel",
    "resolve_config",
    "with_window",
]


def with_window(entry: ModelEntry, settings: Settings) -> ModelEntry:
    """The entry as the server runs it: without a ``window_seconds`` of its own, the rolling
    window is the server's buffer (TALKIES_STREAM_MAX_BUFFER_SECONDS); without voice activity
    options of its own, the server's (TALKIES_VAD, TALKIES_VAD_THRESHOLD,
    TALKIES_VAD_MIN_SILENCE, TALKIES_VAD_SPEECH_PAD)."""
    server = {
        "window_seconds": settings.stream_max_buffer_seconds,
        "vad": settings.vad,
        "vad_threshold": settings.vad_threshold,
        "vad_min_silence_seconds": settings.vad_min_silence,
        "vad_speech_pad_seconds": settings.vad_speech_pad,
    }
    missing = {key: value for key, value in server.items() if key not in entry.options}
    if not missing:
        return entry
    return replace(entry, options=MappingProxyType({**entry.options, **missing}))


# Two executors, one per backend, rather than a backend option on one: each names the runtime
# it needs (``requires``: what a listing reports missing), and a registry entry says by its
# executor alone which runtime serves it. Everything above the decoder is shared.
EXECUTORS = (
    Executor(
        name="whisper",
        kind="asr",
        streams=True,
        transcribes_files=True,
        isolated=True,
        load_recognition=load,
        prepare=with_window,
        requires=("pywhispercpp",),
    ),
    Executor(
        name="whisper_ct2",
        kind="asr",
        streams=True,
        transcribes_files=True,
        isolated=True,
        load_recognition=load_ct2,
        prepare=with_window,
        requires=("ctranslate2",),
    ),
)
