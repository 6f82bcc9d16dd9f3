"""A loaded Whisper model: what every backend shares (:class:`BaseWhisperModel`: languages,
live streams, a file's windows) and the whisper.cpp backend (:class:`WhisperModel`: a small
pool of contexts). The CTranslate2 backend is :mod:`.ctranslate`.

The seam between the two is :meth:`BaseWhisperModel.decode` (a buffer of audio to words, for
the live paths, :mod:`.rolling` and :mod:`.utterances`) and
:meth:`BaseWhisperModel._transcribe_window` (one window of a file to segments, for
:meth:`~BaseWhisperModel.transcribe`); a backend implements those two, its language table and
``close``; the streams and the file route above them are the same code on either.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ...protocol import ErrorCode
from ...protocol.events import SAMPLE_RATE
from ...protocol.messages import StartOptions
from ..base import (
    EngineUnavailable,
    PcmSource,
    Refusal,
    Transcript,
    TranscriptionCancelled,
    TranscriptionRequest,
    TranscriptSegment,
    pcm_chunks,
)
from ..runtime import RecognitionModel
from ..runtime.vad import SileroVad
from ..supply.entry import ModelEntry
from .config import MIN_DECODE_SAMPLES, RollingConfig, encoder_positions, resolve_config
from .files import (
    CUT_SEARCH_SECONDS,
    FILE_WINDOW_SECONDS,
    FileChunks,
    file_params,
    file_segments,
    shift_segment,
)
from .ggml import ggml_for, inspect_ggml, model_path
from .markers import speech_mask
from .native import Native
from .rolling import Decoded, DecodedWord, DecodeRequest, WhisperRecognition
from .utterances import UtteranceRecognition

__all__ = ["BaseWhisperModel", "WhisperModel", "load"]

log = logging.getLogger("talkies.engines")


class BaseWhisperModel(RecognitionModel):
    """What every Whisper backend shares: the language policy, live streams (VAD-cut
    utterances or the rolling window, both over :meth:`decode`) and a file's windows (over
    :meth:`_transcribe_window`)."""

    slug: str
    config: RollingConfig
    multilingual: bool
    n_audio_ctx: int  # the encoder's positions (1500: 30 s); bounds a commit's span

    def __init__(self, config: RollingConfig, *, slug: str) -> None:
        self.config = config
        self.slug = slug
        self._closed = False
        self.decodes = 0  # decodes run, for tests and benchmarks
        # Seconds of a file per decode, and of its end searched for a pause (tests shorten them).
        self.file_window = FILE_WINDOW_SECONDS
        self.file_cut_search = CUT_SEARCH_SECONDS

    def _ready(self) -> None:
        """The checks every backend makes once its weights are loaded (closing on failure)."""
        try:
            if self.config.vad:
                SileroVad.shared()  # load the detector with the model, not with a stream
        except (RuntimeError, ImportError, OSError) as exc:
            self.close()
            raise EngineUnavailable(
                f"model {self.slug!r}: voice activity detection: {exc}"
            ) from None
        try:
            self.language_for(None)  # the entry's default language must be one Whisper knows
        except Refusal as exc:
            self.close()
            raise EngineUnavailable(
                f"model {self.slug!r}: option 'language': {exc.detail}"
            ) from None

    # -- language --------------------------------------------------------------------------

    def _language_code(self, code: str) -> str | None:
        """The backend's code for a primary language subtag, None when it has no such one."""
        raise NotImplementedError

    def language_for(self, requested: str | None) -> str:
        """A whisper language code or "auto" for a start message's ``language``."""
        if requested is None:
            requested = self.config.language
        if requested == "auto":
            return "auto" if self.multilingual else "en"
        code = requested.split("-")[0].lower()
        known = self._language_code(code) if code.isalpha() else None
        if known is None:
            raise Refusal(ErrorCode.INVALID_LANGUAGE, f"whisper has no language {requested!r}")
        if not self.multilingual and known != "en":
            raise Refusal(
                ErrorCode.INVALID_LANGUAGE,
                f"model {self.slug!r} is English-only; it cannot transcribe {requested!r}",
            )
        return known

    # -- streams ---------------------------------------------------------------------------

    def recognition(self, options: StartOptions) -> WhisperRecognition | UtteranceRecognition:
        """A stream: VAD-cut utterances (:mod:`.utterances`), or with ``vad`` off the rolling
        window over the whole stream (:mod:`.rolling`)."""
        if self._closed:
            raise EngineUnavailable(f"model {self.slug!r} was unloaded")
        vad = self.config.vad_config
        if vad is not None:
            return UtteranceRecognition(
                self,
                self.config,
                SileroVad.shared().stream(vad),
                language=self.language_for(options.language),
                word_timestamps=options.word_timestamps,
                interim_results=options.interim_results,
                n_audio_ctx=self.n_audio_ctx,
            )
        return WhisperRecognition(
            self,
            self.config,
            language=self.language_for(options.language),
            word_timestamps=options.word_timestamps,
            interim_results=options.interim_results,
            n_audio_ctx=self.n_audio_ctx,
        )

    def transcribe(self, audio: PcmSource, request: TranscriptionRequest) -> Transcript:
        """A whole-file decode (a :class:`~talkies.engines.base.FileTranscriber`; blocking),
        not the rolling window: see :func:`~.files.file_params` and
        :func:`~.files.file_segments`. The audio is decoded a window at a time as it arrives
        (:class:`~.files.FileChunks`: its speech, found by the voice activity detector, in
        chunks of at most :data:`~.files.FILE_WINDOW_SECONDS` cut in pauses; long silences
        are not decoded); a short recording is one decode, as a whole file.

        No language in the request means the entry's (``options.language``), as for a
        stream; "auto" detects on a multilingual model, from the first window, and the
        later windows keep that language. The prompt conditions the first window. Raises
        :class:`Refusal` (``invalid_language``) for a language Whisper or this model does not
        know, and :class:`TranscriptionCancelled` once ``request.cancel`` is set (the backend
        stops at its next check: whisper.cpp within one encoder or decoder pass, CTranslate2
        between the calls of a 30 s window).
        """
        language = self.language_for(request.language or None)
        cancel = request.cancel
        segments: list[TranscriptSegment] = []
        vad = self.config.vad_config
        windows = FileChunks(
            pcm_chunks(audio, 1 << 20),
            SileroVad.shared().stream(vad) if vad is not None else None,
            window_seconds=self.file_window,
            search_seconds=self.file_cut_search,
            cancel=cancel,
        )
        for index, (first, samples) in enumerate(windows):
            offset = first / SAMPLE_RATE
            window = replace(request, prompt=request.prompt if index == 0 else None)
            language, found = self._transcribe_window(samples, window, language, cancel)
            first_id = len(segments)
            segments += [
                shift_segment(s, seconds=offset, id=first_id + i) for i, s in enumerate(found)
            ]
        return Transcript(
            text=" ".join(s.text for s in segments),
            language=language,
            duration=windows.samples / SAMPLE_RATE,
            segments=tuple(segments),
        )

    # -- the seam ----------------------------------------------------------------------------

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
        """Transcribe ``audio`` (float32 mono 16 kHz): the live paths' one call."""
        raise NotImplementedError

    def _transcribe_window(
        self,
        samples: npt.NDArray[np.int16],
        request: TranscriptionRequest,
        language: str,
        cancel: threading.Event | None,
    ) -> tuple[str, tuple[TranscriptSegment, ...]]:
        """One window of a file: its segments (times from the window's start), and the
        language (the detected one, when asked to detect)."""
        raise NotImplementedError


class WhisperModel(BaseWhisperModel):
    """A whisper.cpp model with a small pool of contexts."""

    def __init__(
        self,
        path: Path,
        config: RollingConfig,
        *,
        device: str = "cpu",
        slug: str = "whisper",
    ) -> None:
        super().__init__(config, slug=slug)
        self.path = path
        self.info = inspect_ggml(path)
        self.n_audio_ctx = self.info.hparams.n_audio_ctx
        self._native = Native()
        pw = self._native.pw
        use_gpu = device != "cpu"
        gpu_device = int(device.partition(":")[2] or 0) if device.startswith("cuda") else 0
        self._contexts: list[Any] = []
        self._free: queue.SimpleQueue[Any] = queue.SimpleQueue()
        try:
            for _ in range(config.contexts):
                ctx = self._native.init(path, use_gpu=use_gpu, gpu_device=gpu_device)
                self._contexts.append(ctx)
                self._free.put(ctx)
        except BaseException:
            for ctx in self._contexts:
                self._native.free(ctx)
            raise
        self.multilingual = bool(pw.whisper_is_multilingual(self._contexts[0]))
        self._eot = int(pw.whisper_token_eot(self._contexts[0]))
        self._ready()

    def _language_code(self, code: str) -> str | None:
        pw = self._native.pw
        lang_id = int(pw.whisper_lang_id(code))
        return str(pw.whisper_lang_str(lang_id)) if lang_id >= 0 else None

    # -- decoding --------------------------------------------------------------------------

    @contextmanager
    def _borrow(self) -> Iterator[Any]:
        ctx = self._free.get()
        try:
            if self._closed:
                raise RuntimeError("the whisper model was closed")
            yield ctx
        finally:
            self._free.put(ctx)

    def _params(self, request: DecodeRequest, samples: int) -> Any:
        pw = self._native.pw
        params = pw.whisper_full_default_params(
            pw.whisper_sampling_strategy.WHISPER_SAMPLING_GREEDY
        )
        params.n_threads = self.config.threads
        params.greedy = {"best_of": 1}
        params.temperature = 0.0
        params.temperature_inc = 0.0  # no fallback: a junk window must cost one decode
        params.no_context = True
        params.single_segment = not request.final
        params.token_timestamps = request.timestamps
        # Always decode with timestamp tokens, Whisper's native mode: without them a window
        # that ends mid-sentence often loops ("... might be. And Mr. John ... might be. ...").
        params.no_timestamps = False
        params.print_progress = False
        params.print_realtime = False
        params.print_timestamps = False
        params.print_special = False
        params.suppress_blank = True
        params.audio_ctx = encoder_positions(
            self.config,
            final=request.final,
            n_audio_ctx=self.n_audio_ctx,
            samples=samples,
        )
        # A bound on runaway repetition: ~12 tokens a second of audio is far above speech.
        params.max_tokens = 32 + math.ceil(samples / SAMPLE_RATE * 12)
        # "" asks whisper.cpp to detect, as "auto" does, without logging an "unknown
        # language 'auto'" error on every call.
        params.language = "" if request.language == "auto" else request.language
        params.detect_language = False
        if request.prompt:  # committed text before the audio (whisper/agreement.py)
            params.initial_prompt = request.prompt
        return params

    def decode(self, audio: npt.NDArray[np.float32], request: DecodeRequest) -> Decoded:
        """Transcribe ``audio`` (float32 mono 16 kHz) on a borrowed context."""
        pw = self._native.pw
        if audio.size < MIN_DECODE_SAMPLES:
            audio = np.concatenate([audio, np.zeros(MIN_DECODE_SAMPLES - audio.size, np.float32)])
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        params = self._params(request, audio.size)
        with self._borrow() as ctx:
            status = int(pw.whisper_full(ctx, params, audio, audio.size))
            if status != 0:
                raise RuntimeError(f"whisper_full failed with status {status}")
            self.decodes += 1
            words = self._words(ctx, request.timestamps)
            language = request.language
            if language == "auto":
                language = str(pw.whisper_lang_str(int(pw.whisper_full_lang_id(ctx))))
        return Decoded(words=tuple(words), language=language)

    def _words(self, ctx: Any, timestamps: bool) -> list[DecodedWord]:
        """Group the decode's text tokens into words: a token with a leading space starts one."""
        pw = self._native.pw
        words: list[DecodedWord] = []
        pieces: list[bytes] = []
        probs: list[float] = []
        start = end = 0.0

        def close_word() -> None:
            text = b"".join(pieces).decode("utf-8", "replace").strip()
            if text:
                p = float(np.mean(probs)) if probs else 1.0
                words.append(DecodedWord(text, start, max(start, end), p))

        for segment in range(int(pw.whisper_full_n_segments(ctx))):
            for index in range(int(pw.whisper_full_n_tokens(ctx, segment))):
                data = pw.whisper_full_get_token_data(ctx, segment, index)
                token = int(data.id)
                if token >= self._eot:
                    continue  # specials and timestamp tokens
                piece = bytes(pw.whisper_token_to_bytes(ctx, token))
                t0 = max(0.0, int(data.t0) / 100) if timestamps else 0.0
                t1 = max(0.0, int(data.t1) / 100) if timestamps else 0.0
                if piece.startswith(b" ") or not pieces:
                    if pieces:
                        close_word()
                    pieces, probs, start = [], [], t0
                pieces.append(piece)
                probs.append(float(data.p))
                end = max(end, t1, start)
        if pieces:
            close_word()
        keep = speech_mask([word.text for word in words])
        return [word for word, speech in zip(words, keep, strict=True) if speech]

    def _transcribe_window(
        self,
        samples: npt.NDArray[np.int16],
        request: TranscriptionRequest,
        language: str,
        cancel: threading.Event | None,
    ) -> tuple[str, tuple[TranscriptSegment, ...]]:
        """One window of a file: whisper.cpp's segments (times from the window's start), and
        the language (the detected one, when asked to detect)."""
        audio = samples.astype(np.float32) / np.float32(32768.0)
        duration = audio.size / SAMPLE_RATE
        if audio.size < MIN_DECODE_SAMPLES:
            audio = np.concatenate([audio, np.zeros(MIN_DECODE_SAMPLES - audio.size, np.float32)])
        audio = np.ascontiguousarray(audio, dtype=np.float32)
        pw = self._native.pw
        params = file_params(
            pw, request, language=language, threads=self.config.threads, abort=cancel
        )
        with self._borrow() as ctx:
            if cancel is not None and cancel.is_set():  # cancelled while waiting for ctx
                raise TranscriptionCancelled("the transcription was cancelled")
            status = int(pw.whisper_full(ctx, params, audio, audio.size))
            if cancel is not None and cancel.is_set():
                raise TranscriptionCancelled("the transcription was cancelled")
            if status != 0:
                raise RuntimeError(f"whisper_full failed with status {status}")
            self.decodes += 1
            if language == "auto":
                language = str(pw.whisper_lang_str(int(pw.whisper_full_lang_id(ctx))))
            return language, file_segments(pw, ctx, request, duration=duration)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for _ in self._contexts:
            self._native.free(self._free.get())
        self._contexts.clear()


def load(entry: ModelEntry, root: Path, device: str) -> WhisperModel:
    """Load the entry's whisper.cpp model file (blocking: call from a worker thread)."""
    try:
        config = resolve_config(entry.options)
    except ValueError as exc:
        raise EngineUnavailable(f"model {entry.slug!r}: {exc}") from None
    path = ggml_for(entry, model_path(entry, root, config))
    try:
        return WhisperModel(path, config, device=device, slug=entry.slug)
    except ValueError as exc:
        raise EngineUnavailable(f"model {entry.slug!r}: {exc}") from None
