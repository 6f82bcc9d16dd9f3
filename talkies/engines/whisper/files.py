"""Whole files (POST /v1/audio/transcriptions) through whisper.cpp's own 30 s windows and
segments, not the rolling window: the decode's parameters, the file's windows, and its
segments as a transcript.

A file is decoded a window of :data:`FILE_WINDOW_SECONDS` at a time, never whole: a 4 h
upload as one ``whisper_full`` call held 4 h of float32 samples (920 MB) and their
log-mel spectrogram (460 MB) at once. Each window is cut at the quietest tenth of a second
of the last :data:`CUT_SEARCH_SECONDS` before its mark, so a cut falls in a pause rather than
through a word; audio shorter than a window is one call, exactly as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ...protocol.events import SAMPLE_RATE, Word
from ..base import TranscriptionRequest, TranscriptSegment
from .markers import speech_mask, strip_markers

__all__ = [
    "CUT_SEARCH_SECONDS",
    "FILE_WINDOW_SECONDS",
    "file_params",
    "file_segments",
    "file_windows",
    "shift_segment",
]

FILE_WINDOW_SECONDS = 300.0  # a file's audio decoded per whisper_full call (at most)
CUT_SEARCH_SECONDS = 20.0  # a window ends at the quietest point of its last this-many seconds
_FRAME = SAMPLE_RATE // 10  # the cut search's unit: 0.1 s


def _quietest_cut(window: npt.NDArray[np.int16], search: int) -> int:
    """Where to end ``window``: the middle of the quietest 0.1 s frame of its last ``search``
    samples (the latest, among equally quiet ones, so windows stay long)."""
    frames = min(search, window.size) // _FRAME
    if frames == 0:
        return window.size
    start = window.size - frames * _FRAME
    tail = window[start:].astype(np.float32)
    energy = np.square(tail).reshape(frames, _FRAME).sum(axis=1)
    latest = frames - 1 - int(np.argmin(energy[::-1]))
    return start + latest * _FRAME + _FRAME // 2


def file_windows(
    chunks: Iterable[bytes],
    *,
    window_seconds: float = FILE_WINDOW_SECONDS,
    search_seconds: float = CUT_SEARCH_SECONDS,
) -> Iterator[tuple[int, npt.NDArray[np.int16]]]:
    """The file's audio (PCM16LE chunks) as ``(first sample, samples)`` windows of at most
    ``window_seconds``, each but the last cut at the quietest point of its last
    ``search_seconds``; at most one window and one chunk are held at a time. Empty audio is
    one empty window."""
    limit = max(_FRAME, round(window_seconds * SAMPLE_RATE)) * 2
    search = max(_FRAME, round(min(search_seconds, window_seconds) * SAMPLE_RATE))
    pending = bytearray()
    first = 0
    for chunk in chunks:
        pending += chunk
        while len(pending) >= limit:
            window = np.frombuffer(pending, dtype="<i2", count=limit // 2)
            cut = _quietest_cut(window, search)
            yield first, window[:cut].copy()
            del window
            first += cut
            del pending[: cut * 2]
    del pending[len(pending) - len(pending) % 2 :]
    if pending or first == 0:
        yield first, np.frombuffer(bytes(pending), dtype="<i2").copy()


def shift_segment(segment: TranscriptSegment, *, seconds: float, id: int) -> TranscriptSegment:
    """``segment`` of a window that starts ``seconds`` into the file, as the file's ``id``th."""
    if not seconds:
        return replace(segment, id=id)
    words = tuple(replace(w, start=w.start + seconds, end=w.end + seconds) for w in segment.words)
    return replace(
        segment, id=id, start=segment.start + seconds, end=segment.end + seconds, words=words
    )


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
