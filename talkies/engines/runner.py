"""Bridge synchronous :class:`Recognition` streams to the event loop, in combined rounds.

Each stream queues audio in a queue bounded in bytes (``TALKIES_STREAM_MAX_BUFFER_SECONDS`` of
PCM); a full queue makes ``feed`` wait, so the transport stops reading the socket and a slow
decoder slows the client's TCP window instead of growing the server's memory.

Decoding happens in *rounds* on worker threads (:class:`DecodeRounds`, one per model). A stream
with work joins the model's ready list; if fewer than ``parallel`` rounds are running, it leads
one: it takes every ready stream's queued audio, hands the whole batch to one worker thread,
which runs each stream's decoder in turn, and gives every stream its results. Streams that
arrive while a round runs wait for the next one. So a thread hop is paid per round, not per
stream or frame: under load, one hop serves many streams (flat combining), and an idle server
answers a single stream with a single hop.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import AsyncIterator, Sequence

import anyio
import anyio.to_thread

from ..protocol import EngineFailed, EngineFinal
from .base import EngineEvent, Recognition

__all__ = ["DecodeRounds", "ThreadedStream"]

log = logging.getLogger("talkies.engines")


class DecodeRounds:
    """The worker-thread rounds of one model: at most ``parallel`` at a time."""

    def __init__(self, parallel: int | None = None, limiter: anyio.CapacityLimiter | None = None):
        self.parallel = max(1, parallel if parallel is not None else (os.cpu_count() or 1))
        self._limiter = limiter
        self._ready: deque[ThreadedStream] = deque()
        self._running = 0

    def _enqueue(self, stream: ThreadedStream) -> None:
        self._ready.append(stream)

    def _can_lead(self) -> bool:
        return bool(self._ready) and self._running < self.parallel

    async def _lead(self) -> None:
        """Run one round over every ready stream (called by a stream's events loop)."""
        batch: list[tuple[ThreadedStream, bytes, bool]] = []
        while self._ready:
            stream = self._ready.popleft()
            stream._queued = False
            if stream._closed:
                continue
            audio, finish = stream._take_work()
            stream._busy = True
            batch.append((stream, audio, finish))
        if not batch:
            return
        self._running += 1
        try:
            # Shielded: the decoders run to the end of the round whatever happens to the
            # leader, so no stream is freed mid-decode and no stream loses its results.
            with anyio.CancelScope(shield=True):
                outcomes = await anyio.to_thread.run_sync(
                    _decode_round, batch, limiter=self._limiter
                )
        finally:
            self._running -= 1
        for (stream, _audio, _finish), events in zip(batch, outcomes, strict=True):
            stream._busy = False
            stream._deliver(events)
        for waiting in self._ready:
            waiting._wake()  # streams that joined meanwhile: one of them leads the next round


def _decode_round(batch: Sequence[tuple[ThreadedStream, bytes, bool]]) -> list[list[EngineEvent]]:
    """Worker thread: each stream's decoder in turn; a failure is that stream's alone."""
    out: list[list[EngineEvent]] = []
    for stream, audio, finish in batch:
        events: list[EngineEvent] = []
        try:
            if audio:
                events.extend(stream._rec.accept(audio))
            if finish:
                events.append(stream._rec.finish())
        except Exception:
            log.exception("engine failed while decoding")
            events.append(EngineFailed(detail="the speech engine failed while decoding"))
        out.append(events)
    return out


class ThreadedStream:
    """An :class:`~talkies.engines.base.EngineStream` over a :class:`Recognition`."""

    def __init__(
        self,
        recognition: Recognition,
        *,
        max_buffered_bytes: int,
        rounds: DecodeRounds | None = None,
    ) -> None:
        if max_buffered_bytes < 2:
            raise ValueError("max_buffered_bytes must be at least 2")
        self._rec = recognition
        self._max = max_buffered_bytes
        self._rounds = rounds if rounds is not None else DecodeRounds(parallel=1)
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._flush = False  # end requested
        self._finish_taken = False  # finish() handed to a round
        self._closed = False
        self._queued = False  # in the model's ready list
        self._busy = False  # inside a round
        self._done = False  # EngineFinal or EngineFailed delivered
        self._outbox: deque[EngineEvent] = deque()
        self._signal = anyio.Event()  # results, new work, the lead, or close
        self._room = anyio.Event()  # the queue drained
        self._idle = anyio.Event()  # not inside a round (for aclose)
        self._idle.set()

    @property
    def buffered_bytes(self) -> int:
        return self._pending_bytes

    # -- the event loop's side ----------------------------------------------------------------

    def _wake(self) -> None:
        self._signal.set()

    def _has_work(self) -> bool:
        return bool(self._pending) or (self._flush and not self._finish_taken)

    def _take_work(self) -> tuple[bytes, bool]:
        audio = b"".join(self._pending)
        self._pending.clear()
        self._pending_bytes = 0
        self._room.set()
        finish = self._flush and not self._finish_taken
        self._finish_taken = self._finish_taken or finish
        if self._idle.is_set():
            self._idle = anyio.Event()
        return audio, finish

    def _deliver(self, events: list[EngineEvent]) -> None:
        self._idle.set()
        self._outbox.extend(events)
        self._wake()

    async def feed(self, pcm: bytes) -> None:
        # A frame always fits into an empty queue (config checks frame <= buffer), so waiting
        # only while something is queued cannot deadlock.
        while self._pending and self._pending_bytes + len(pcm) > self._max and not self._closed:
            if self._room.is_set():
                self._room = anyio.Event()
            await self._room.wait()
        if self._closed or self._flush:
            return
        self._pending.append(pcm)
        self._pending_bytes += len(pcm)
        self._wake()

    async def flush(self) -> None:
        self._flush = True
        self._wake()

    async def events(self) -> AsyncIterator[EngineEvent]:
        while True:
            while self._outbox:
                event = self._outbox.popleft()
                if isinstance(event, EngineFinal | EngineFailed):
                    self._done = True
                yield event
                if self._done:
                    return
            if self._closed:
                return
            if self._has_work() and not self._queued and not self._busy:
                self._queued = True
                self._rounds._enqueue(self)
            if self._queued and self._rounds._can_lead():
                await self._rounds._lead()
                continue
            if self._signal.is_set():
                self._signal = anyio.Event()
                continue
            await self._signal.wait()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._room.set()
        self._wake()
        # Shielded: closing native resources must complete even if our caller is cancelled,
        # and must wait for a round that is using this decoder, never run beside it.
        with anyio.CancelScope(shield=True):
            await self._idle.wait()
            try:
                await anyio.to_thread.run_sync(self._rec.close)
            except Exception:
                log.exception("engine failed to close a stream")
