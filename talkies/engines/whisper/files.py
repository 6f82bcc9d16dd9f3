"""Whole files (POST /v1/audio/transcriptions) through whisper.cpp's own 30 s windows and
segments, not the rolling window: the decode's parameters and its segments as a transcript."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...protocol.events import Word
from ..base import TranscriptionRequest, TranscriptSegment
from .markers import speech_mask, strip_markers

__all__ = ["file_params", "file_segments"]


def file_params(
    pw: Any,
    request: TranscriptionRequest,
    *,
    language: str,
    threads: int,
    abort: threading.Event | None = None,
) -> Any:
    """whisper.cpp parameters for a whole-file decode (POST /v1/audio/transcriptions).

    Whisper's own 30 s windows and segments, its full encoder (``audio_ctx`` 0); greedy at the
    requested temperature, with no temperature fallback (``temperature_inc`` 0), so a file
    costs one decode per window and temperature 0 is deterministic. ``prompt`` is the initial
    prompt of the first window. No text is carried from one window to the next
    (``no_context``): without fallback a window that loops would pass the loop on.

    ``abort``, once set, stops the decode at whisper.cpp's next check (it asks before each
    graph it computes: the encoder of a 30 s window, each decoder step). The callback takes
    the GIL, so it is set only on whole files, which can be cancelled, never on the rolling
    window's short decodes.
    """
    params = pw.whisper_full_default_params(pw.whisper_sampling_strategy.WHISPER_SAMPLING_GREEDY)
    params.n_threads = threads
    params.greedy = {"best_of": 1}
    params.temperature = float(request.temperature)
    params.temperature_inc = 0.0
    params.no_context = True
    params.single_segment = False
    params.no_timestamps = False
    params.token_timestamps = request.word_timestamps
    params.print_progress = False
    params.print_realtime = False
    params.print_timestamps = False
    params.print_special = False
    params.suppress_blank = True
    params.audio_ctx = 0
    # "" makes whisper.cpp detect the language (see WhisperModel._params).
    params.language = "" if language == "auto" else language
    params.detect_language = False
    if request.prompt:
        params.initial_prompt = request.prompt
    if abort is not None:
        is_set = abort.is_set
        params.set_abort_callback(lambda *_: is_set())
    return params


def file_segments(
    pw: Any, ctx: Any, request: TranscriptionRequest, *, duration: float
) -> tuple[TranscriptSegment, ...]:
    """whisper.cpp's segments after a decode: times from their t0/t1 (10 ms units), clamped to
    the audio and kept in order; words from token times when ``request.word_timestamps``."""
    eot = int(pw.whisper_token_eot(ctx))
    beg = int(pw.whisper_token_beg(ctx))  # timestamp tokens: beg and above
    segments: list[TranscriptSegment] = []
    floor = 0.0  # segments never start before the previous one

    def clamp(centiseconds: int, low: float) -> float:
        return min(max(int(centiseconds) / 100, low), duration)

    for index in range(int(pw.whisper_full_n_segments(ctx))):
        raw = pw.whisper_full_get_segment_text(ctx, index)
        text = strip_markers(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw))
        start = clamp(pw.whisper_full_get_segment_t0(ctx, index), floor)
        end = clamp(pw.whisper_full_get_segment_t1(ctx, index), start)
        floor = start
        tokens: list[int] = []
        logprobs: list[float] = []
        pieces: list[tuple[bytes, float, float, float]] = []  # text tokens: bytes, t0, t1, p
        for k in range(int(pw.whisper_full_n_tokens(ctx, index))):
            data = pw.whisper_full_get_token_data(ctx, index, k)
            token = int(data.id)
            if eot <= token < beg:
                continue  # end-of-text, start-of-transcript, language and task tokens
            tokens.append(token)
            logprobs.append(float(data.plog))
            if token < eot:
                piece = bytes(pw.whisper_token_to_bytes(ctx, token))
                pieces.append((piece, int(data.t0) / 100, int(data.t1) / 100, float(data.p)))
        if not text:
            continue
        words = _file_words(pieces, duration) if request.word_timestamps else ()
        segments.append(
            TranscriptSegment(
                id=len(segments),
                start=start,
                end=end,
                text=text,
                words=words,
                tokens=tuple(tokens),
                avg_logprob=float(np.mean(logprobs)) if logprobs else None,
                temperature=float(request.temperature),
            )
        )
    return tuple(segments)


def _file_words(
    pieces: Sequence[tuple[bytes, float, float, float]], duration: float
) -> tuple[Word, ...]:
    """Text tokens grouped into words (a token with a leading space starts one); a word spans
    its tokens' times, clamped to the audio, and its confidence is their mean probability."""
    groups: list[list[tuple[bytes, float, float, float]]] = []
    for piece in pieces:
        if not groups or piece[0].startswith(b" "):
            groups.append([])
        groups[-1].append(piece)
    words: list[Word] = []
    floor = 0.0
    for group in groups:
        text = b"".join(p[0] for p in group).decode("utf-8", "replace").strip()
        if not text:
            continue
        start = min(max(group[0][1], floor), duration)
        end = min(max(start, *(p[2] for p in group)), duration)
        floor = start
        confidence = float(np.mean([p[3] for p in group]))
        words.append(Word(word=text, start=start, end=end, confidence=confidence))
    keep = speech_mask([word.word for word in words])
    return tuple(word for word, speech in zip(words, keep, strict=True) if speech)
