"""One sherpa-onnx stream: its decoder state, decoded alone (``accept``/``finish``) or with
the model's other streams in one ``decode_streams`` call per chunk (``decode_many``).

After each decoded chunk a stream is checked for an endpoint (then reset), so the results
depend on the audio only, never on how it was split into frames or batched. The reference
is sherpa-onnx called directly on the whole audio (``tests/modelgen/sherpa.py``,
``decode_directly``): accept everything, decode chunk by chunk with an endpoint check after
each, then the tail padding, ``input_finished`` and the last chunks.

Every endpoint and, after each decoded batch of chunks, the current hypothesis are reported
as they are, empty or unchanged: the protocol session drops what tells the client nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from ...protocol import EngineEndpoint, EngineFailed, EngineFinal, EnginePartial, Word
from ...protocol.events import SAMPLE_RATE
from ...protocol.messages import StartOptions
from ..base import EngineUpdate, Work

__all__ = [
    "BatchedSherpaRecognition",
    "DecodeCounters",
    "SherpaRecognition",
    "StreamDecoder",
    "words_from_tokens",
]

log = logging.getLogger("talkies.engines")

# One encoder output frame (10 ms fbank shift x 4 subsampling): the span given to a
# stream's last word, whose end the model does not mark.
_TOKEN_SPAN = 0.04
# How long one decode_many call may keep decoding the backlog of its streams before it
# returns, so that new audio (of these and other streams) gets its turn.
_ROUND_SECONDS = 0.02


# -- what talkies uses of sherpa-onnx (it ships no type information) -------------------------


class _Result(Protocol):
    text: str
    tokens: list[str]
    timestamps: list[float]
    start_time: float


class NativeStream(Protocol):
    def accept_waveform(self, sample_rate: int, waveform: np.ndarray) -> None: ...

    def input_finished(self) -> None: ...


class NativeRecognizer(Protocol):
    def create_stream(self) -> NativeStream: ...

    def is_ready(self, s: NativeStream) -> bool: ...

    def decode_stream(self, s: NativeStream) -> None: ...

    def decode_streams(self, ss: list[NativeStream]) -> None: ...

    def is_endpoint(self, s: NativeStream) -> bool: ...

    def reset(self, s: NativeStream) -> bool: ...

    def get_result_all(self, s: NativeStream) -> _Result: ...


# -- words -------------------------------------------------------------------------------------


def _is_cjk(char: str) -> bool:
    code = ord(char)
    return 0x3040 <= code <= 0x30FF or 0x3400 <= code <= 0x9FFF or 0xAC00 <= code <= 0xD7AF


def words_from_tokens(
    tokens: Sequence[str], timestamps: Sequence[float], *, offset: float, limit: float
) -> tuple[Word, ...]:
    """Merge BPE tokens into words: a token starting with ``▁`` or a space starts a word (and
    so does each CJK character). ``timestamps`` are token starts relative to ``offset``; a
    word ends where the next begins, the last one a token span after its last token; every
    time is clamped to ``limit`` (the audio accepted so far)."""
    if len(tokens) != len(timestamps):
        return ()
    groups: list[list[Any]] = []  # [text, first time, last time]
    boundary = True
    for token, stamp in zip(tokens, timestamps, strict=True):
        if token[:1] in ("▁", " "):
            boundary = True
        piece = token.lstrip("▁ ")
        if not piece:
            continue
        if boundary or not groups or _is_cjk(piece[0]) or _is_cjk(groups[-1][0][-1]):
            groups.append([piece, float(stamp), float(stamp)])
            boundary = False
        else:
            groups[-1][0] += piece
            groups[-1][2] = float(stamp)
    words: list[Word] = []
    for i, (text, first, last) in enumerate(groups):
        start = min(max(offset + first, 0.0), limit)
        end = offset + groups[i + 1][1] if i + 1 < len(groups) else offset + last + _TOKEN_SPAN
        words.append(Word(word=text, start=start, end=max(start, min(end, limit))))
    return tuple(words)


# -- one stream's state --------------------------------------------------------------------------


class DecodeCounters:
    """Live native streams and batched decode calls of one model (tests, benchmarks)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.live_streams = 0  # native streams created and not yet freed
        self.decode_calls = 0  # decode_streams calls
        self.decoded_chunks = 0  # chunks those calls decoded

    def add(self, streams: int = 0, calls: int = 0, chunks: int = 0) -> None:
        with self._lock:  # rounds of one model may run in parallel threads
            self.live_streams += streams
            self.decode_calls += calls
            self.decoded_chunks += chunks


class StreamDecoder:
    """One client stream's sherpa state. Only one thread calls it at a time."""

    def __init__(
        self,
        recognizer: NativeRecognizer,
        options: StartOptions,
        tail_padding: float,
        counters: DecodeCounters | None = None,
    ) -> None:
        self.rec = recognizer
        self.stream: NativeStream | None = recognizer.create_stream()
        self._counters = counters
        if counters is not None:
            counters.add(streams=1)
        self._want_words = options.word_timestamps
        self._tail = np.zeros(round(tail_padding * SAMPLE_RATE), dtype=np.float32)
        self._carry = b""  # an odd trailing byte, kept for the next call
        self.samples = 0  # samples accepted (without the tail padding)
        self.finish_requested = False  # the input ends once the audio so far is decoded
        self.finishing = False  # tail padding and input_finished given: no more endpoints

    @property
    def native(self) -> NativeStream:
        assert self.stream is not None, "the stream was freed"
        return self.stream

    def accept(self, pcm: bytes) -> None:
        if self._carry:
            pcm, self._carry = self._carry + pcm, b""
        if len(pcm) % 2:
            pcm, self._carry = pcm[:-1], pcm[-1:]
        if not pcm:
            return
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.float32)
        samples *= np.float32(1.0 / 32768.0)
        self.native.accept_waveform(SAMPLE_RATE, samples)
        self.samples += len(samples)

    def ready(self) -> bool:
        return bool(self.rec.is_ready(self.native))

    def _words(self, result: _Result) -> tuple[Word, ...]:
        if not self._want_words or not result.tokens:
            return ()
        return words_from_tokens(
            list(result.tokens),
            list(result.timestamps),
            offset=float(result.start_time),
            limit=self.samples / SAMPLE_RATE,
        )

    def after_chunk(self, out: list[EngineUpdate]) -> None:
        """One chunk was decoded: an endpoint closes the utterance (not while finishing)."""
        if self.finishing or not self.rec.is_endpoint(self.native):
            return
        result = self.rec.get_result_all(self.native)
        out.append(EngineEndpoint(text=result.text.strip(), words=self._words(result)))
        self.rec.reset(self.native)

    def partial(self) -> EnginePartial:
        result = self.rec.get_result_all(self.native)
        return EnginePartial(text=result.text.strip(), words=self._words(result))

    def start_finish(self) -> None:
        """End of input: decode the tail padding too, and no more endpoints. The input ends
        only after every chunk before it was decoded with its endpoint check, as a stream
        decoded on its own does."""
        if self.finishing:
            return
        self.finishing = True
        self._carry = b""
        if len(self._tail):
            self.native.accept_waveform(SAMPLE_RATE, self._tail)
        self.native.input_finished()

    def final(self) -> EngineFinal:
        result = self.rec.get_result_all(self.native)
        return EngineFinal(text=result.text.strip(), words=self._words(result))

    def free(self) -> None:
        if self.stream is not None and self._counters is not None:
            self._counters.add(streams=-1)
        self.stream = None  # drops the native OnlineStream


# -- the two ways of decoding it ---------------------------------------------------------------


class SherpaRecognition:
    """A stream decoded on its own, one ``decode_stream`` per chunk: the
    :class:`~talkies.engines.base.Recognition` protocol (``batch: false``, whole files)."""

    def __init__(
        self,
        recognizer: NativeRecognizer,
        options: StartOptions,
        tail_padding: float,
        counters: DecodeCounters | None = None,
    ) -> None:
        self.decoder = StreamDecoder(recognizer, options, tail_padding, counters)

    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        d = self.decoder
        out: list[EngineUpdate] = []
        d.accept(pcm)
        decoded = False
        while d.ready():
            d.rec.decode_stream(d.native)
            d.after_chunk(out)
            decoded = True
        if decoded:
            out.append(d.partial())
        return out

    def finish(self) -> EngineFinal:
        d = self.decoder
        d.start_finish()
        while d.ready():
            d.rec.decode_stream(d.native)
        return d.final()

    def close(self) -> None:
        self.decoder.free()


class BatchedSherpaRecognition(SherpaRecognition):
    """A stream the runtime decodes with the model's other streams: one ``decode_streams``
    call per chunk for every ready stream (at most ``max_batch`` per call), so N live streams
    cost about one batched encoder run per chunk instead of N (a
    :class:`~talkies.engines.base.BatchRecognition`)."""

    def __init__(
        self,
        recognizer: NativeRecognizer,
        options: StartOptions,
        tail_padding: float,
        counters: DecodeCounters,
        *,
        max_batch: int,
    ) -> None:
        super().__init__(recognizer, options, tail_padding, counters)
        self._counters = counters
        self._max_batch = max_batch

    def decode_many(self, work: Sequence[Work]) -> None:
        """Decode one chunk of every ready stream per call, again and again while some are
        still ready, for at most ~20 ms; a stream with chunks left reports ``more``."""
        live: list[tuple[Work, StreamDecoder]] = []
        for item in work:
            assert isinstance(item.recognition, SherpaRecognition)
            d = item.recognition.decoder
            try:
                if item.pcm:
                    d.accept(item.pcm)
                if item.finish:
                    d.finish_requested = True
            except Exception:
                log.exception("sherpa stream failed to accept audio")
                item.events.append(EngineFailed(detail="the speech engine failed"))
                continue
            live.append((item, d))
        failed: set[int] = set()
        decoded: set[int] = set()
        started = time.monotonic()
        while True:
            ready: list[tuple[Work, StreamDecoder]] = []
            for item, d in live:
                if id(item) in failed:
                    continue
                if d.finish_requested and not d.finishing and not d.ready():
                    d.start_finish()  # every chunk before the end was decoded
                if d.ready():
                    ready.append((item, d))
            if not ready:
                break
            for start in range(0, len(ready), self._max_batch):
                batch = ready[start : start + self._max_batch]
                try:
                    self.decoder.rec.decode_streams([d.native for _, d in batch])
                except Exception:
                    log.exception("sherpa decode failed", extra={"streams": len(batch)})
                    for item, _ in batch:
                        failed.add(id(item))
                        item.events.append(
                            EngineFailed(detail="the speech engine failed while decoding")
                        )
                    continue
                self._counters.add(calls=1, chunks=len(batch))
                for item, d in batch:
                    decoded.add(id(item))
                    updates: list[EngineUpdate] = []
                    d.after_chunk(updates)
                    item.events.extend(updates)
            # Streams with more decodable audio go again (batched the same way) until they
            # are drained or the time is up: a backlog costs few rounds, and new audio of
            # the others waits at most this long.
            if time.monotonic() - started >= _ROUND_SECONDS:
                break
        for item, d in live:
            if id(item) in failed:
                continue
            try:
                if d.ready() or (d.finish_requested and not d.finishing):
                    item.more = True  # more chunks: the next round (the partial then)
                elif d.finishing:
                    item.events.append(d.final())
                elif id(item) in decoded:
                    item.events.append(d.partial())
            except Exception:
                log.exception("sherpa stream failed")
                item.events.append(EngineFailed(detail="the speech engine failed"))
