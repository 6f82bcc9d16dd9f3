"""Whole files (POST /v1/audio/transcriptions) through whisper.cpp's own windows and
segments, not the rolling window: the decode's parameters, the file's chunks, and its
segments as a transcript.

A file is decoded a chunk at a time as it arrives, never whole (a 4 h upload as one
``whisper_full`` call held 4 h of float32 samples, 920 MB, and their log-mel spectrogram,
460 MB, at once): :class:`FileChunks` cuts it by voice activity (the live streams' detector,
:mod:`talkies.engines.runtime.vad`) into chunks of speech of at most
:data:`FILE_WINDOW_SECONDS` (Whisper's own 30 s window), cut in pauses:

- a chunk starts where the detector hears speech (less ``vad_speech_pad_seconds``) and ends
  where it stops (plus as much); a pause of up to :data:`MAX_PAUSE_SECONDS` stays inside its
  chunk (Whisper reads across it with the context of both sides, as from the whole file); a
  longer silence ends the chunk and is not decoded at all: silence costs no decode and gives
  Whisper nothing to hallucinate on. Whisper times words after a long pause poorly (with 3 s
  kept, the first word after a 1.5 s pause came back 0.5 s early), and its first word from
  the start of what it is given, whatever silence leads into it, so the silence before a
  chunk's speech is not given to it either: a recording with speech from near its start to
  near its end is still one decode of (almost) all of it;
- a chunk that would grow past the window is cut in the middle of its latest pause within its
  last :data:`CUT_SEARCH_SECONDS`, else (speech with no pause the detector closes) at the
  quietest tenth of a second there;
- at most one chunk, the detector's state and one piece of the upload are held at a time.

A model with voice activity off (``vad: false``) cuts the whole file into such windows, silence
included, at the quietest point. :func:`file_windows` is the same cut without a detector.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from ...protocol.events import SAMPLE_RATE, Word
from ..base import TranscriptionCancelled, TranscriptionRequest, TranscriptSegment
from ..runtime.vad import VAD_WINDOW, SpeechStart, VoiceActivity
from .markers import speech_mask, strip_markers

__all__ = [
    "CUT_SEARCH_SECONDS",
    "FILE_WINDOW_SECONDS",
    "MAX_PAUSE_SECONDS",
    "FileChunks",
    "file_params",
    "file_segments",
    "file_windows",
    "shift_segment",
]

FILE_WINDOW_SECONDS = 30.0  # a file's audio decoded per whisper_full call (at most)
CUT_SEARCH_SECONDS = 10.0  # a chunk is cut in a pause (or the quietest point) of its last
MAX_PAUSE_SECONDS = 1.0  # a longer silence ends a chunk and is not decoded
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


@dataclass(slots=True)
class _Chunk:
    """The chunk being gathered: its first sample, the end of its last utterance, and the
    pauses between its utterances (first and last sample of each)."""

    start: int
    speech_end: int
    pauses: list[tuple[int, int]]
    speech: bool  # holds an utterance that is not a click (``short``)


class FileChunks:
    """A file's PCM16LE pieces in, ``(first sample, samples)`` chunks of its speech out, in
    order (see the module docstring). ``samples``: how many the file had, once iterated.
    ``cancel``, once set, stops it between two pieces with :class:`TranscriptionCancelled`
    (a long silence is scored without a decode to stop)."""

    def __init__(
        self,
        pieces: Iterable[bytes],
        activity: VoiceActivity | None,
        *,
        window_seconds: float = FILE_WINDOW_SECONDS,
        search_seconds: float = CUT_SEARCH_SECONDS,
        max_pause_seconds: float = MAX_PAUSE_SECONDS,
        cancel: threading.Event | None = None,
    ) -> None:
        self._pieces = pieces
        self._activity = activity
        self._window = max(_FRAME, round(window_seconds * SAMPLE_RATE))
        self._search = max(_FRAME, round(min(search_seconds, window_seconds) * SAMPLE_RATE))
        self._max_pause = round(max_pause_seconds * SAMPLE_RATE)
        self._cancel = cancel
        pad = activity.config.pad_samples if activity is not None else 0
        # The detector reports where speech began (less its padding) a window after it did:
        # keep that much when no chunk is open.
        self._keep = pad + 2 * VAD_WINDOW
        self._settle = self._max_pause + pad + 2 * VAD_WINDOW  # silence that ends a chunk
        self._pending = bytearray()  # PCM from sample _base to samples
        self._base = 0
        self.samples = 0
        self._chunk: _Chunk | None = None
        self._speaking = False
        self._out: list[tuple[int, npt.NDArray[np.int16]]] = []

    def __iter__(self) -> Iterator[tuple[int, npt.NDArray[np.int16]]]:
        carry = b""
        for piece in self._pieces:
            if self._cancel is not None and self._cancel.is_set():
                raise TranscriptionCancelled("the transcription was cancelled")
            data = carry + piece
            usable = len(data) - len(data) % 2
            carry = data[usable:]
            if usable:
                self._push(data[:usable])
                yield from self._drain()
        self._end()
        yield from self._drain()

    # -- internals ---------------------------------------------------------------------------

    def _drain(self) -> Iterator[tuple[int, npt.NDArray[np.int16]]]:
        while self._out:
            yield self._out.pop(0)

    def _push(self, data: bytes) -> None:
        self._pending += data
        before = self.samples
        self.samples += len(data) // 2
        if self._activity is None:
            if self._chunk is None:
                self._chunk = _Chunk(before, before, [], True)
            self._speaking = True
            self._overflow(self.samples)
        else:
            samples = np.frombuffer(data, dtype="<i2").astype(np.float32) / np.float32(32768.0)
            for event in self._activity.push(samples):
                if isinstance(event, SpeechStart):
                    self._speech_start(event.start)
                else:
                    self._speech_end(event.end, short=event.short)
                self._overflow(event.at)
            self._overflow(self.samples)
            chunk = self._chunk
            if (
                chunk is not None
                and not self._speaking
                and self.samples - chunk.speech_end > self._settle
            ):
                self._emit(chunk.speech_end)  # no later speech can join this chunk
        self._forget()

    def _speech_start(self, start: int) -> None:
        self._speaking = True
        chunk = self._chunk
        if chunk is not None and start - chunk.speech_end > self._max_pause:
            self._emit(chunk.speech_end)
            chunk = None
        if chunk is None:
            self._chunk = _Chunk(start, start, [], False)
        else:
            chunk.pauses.append((chunk.speech_end, start))

    def _speech_end(self, end: int, *, short: bool) -> None:
        self._speaking = False
        chunk = self._chunk
        if chunk is None:
            return
        chunk.speech_end = max(end, chunk.start)
        chunk.speech = chunk.speech or not short

    def _overflow(self, position: int) -> None:
        """Cut the open chunk while it is longer than a window by ``position``."""
        while (chunk := self._chunk) is not None and position - chunk.start > self._window:
            limit = chunk.start + self._window
            if not self._speaking and chunk.speech_end <= limit:
                self._emit(chunk.speech_end)  # it ended in time; what follows is silence
                return
            low = max(limit - self._search, chunk.start + 1)
            pauses = [(a + b) // 2 for a, b in chunk.pauses if low <= (a + b) // 2 <= limit]
            if pauses:
                cut = pauses[-1]
            else:
                start = limit - self._search - self._base
                window = np.frombuffer(self._pending, dtype="<i2", count=limit - self._base)
                cut = limit - self._search + _quietest_cut(window[start:], self._search)
                del window
            speech = chunk.speech or self._speaking
            self._emit(cut, force=True)
            self._chunk = _Chunk(
                cut,
                max(cut, chunk.speech_end),
                [p for p in chunk.pauses if (p[0] + p[1]) // 2 > cut],
                speech,
            )

    def _emit(self, end: int, *, force: bool = False) -> None:
        """Hand on the open chunk up to ``end`` (the chunk closes)."""
        chunk, self._chunk = self._chunk, None
        if chunk is None or end <= chunk.start or not (chunk.speech or force):
            return
        first, last = (chunk.start - self._base) * 2, (end - self._base) * 2
        self._out.append((chunk.start, np.frombuffer(self._pending[first:last], "<i2").copy()))

    def _forget(self) -> None:
        """Drop the audio no chunk can need any more."""
        keep_from = self._chunk.start if self._chunk is not None else self.samples - self._keep
        drop = min(max(0, keep_from - self._base), len(self._pending) // 2)
        if drop:
            del self._pending[: drop * 2]
            self._base += drop

    def _end(self) -> None:
        chunk = self._chunk
        if chunk is None:
            return
        if self._speaking:
            chunk.speech = True
            self._emit(self.samples)  # speech to the end
        else:
            self._emit(chunk.speech_end)


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
