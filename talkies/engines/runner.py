"""Bridge a synchronous :class:`Recognition` to the event loop through a bounded queue.

Audio waits in a queue bounded in bytes (``TALKIES_STREAM_MAX_BUFFER_SECONDS`` of PCM); a full
queue makes ``feed`` wait, so the transport stops reading the socket and a slow decoder slows
the client's TCP window instead of growing the server's memory. The pump hands the decoder
everything queued since its last call in one batch, so a stream costs one thread hop per batch
rather than per frame.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator

import anyio
import anyio.to_thread

from ..protocol import EngineFailed, EngineFinal
from .base import EngineEvent, Recognition

__all__ = ["ThreadedStream"]

log = logging.getLogger("talkies.engines")


class ThreadedStream:
    """An :class:`~talkies.engines.base.EngineStream` over a :class:`Recognition`."""

    def __init__(
        self,
        recognition: Recognition,
        *,
        max_buffered_bytes: int,
        limiter: anyio.CapacityLimiter | None = None,
    ) -> None:
        if max_buffered_bytes < 2:
            raise ValueError("max_buffered_bytes must be at least 2")
        self._rec = recognition
        self._max = max_buffered_bytes
        self._limiter = limiter
        self._pending: deque[bytes] = deque()
        self._pending_bytes = 0
        self._flush = False
        self._closed = False
        self._data = anyio.Event()  # set when there is work for the pump
        self._room = anyio.Event()  # set when the queue drained
        self._busy = anyio.Lock()  # held around every call into the decoder

    @property
    def buffered_bytes(self) -> int:
        return self._pending_bytes

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
        self._data.set()

    async def flush(self) -> None:
        self._flush = True
        self._data.set()

    async def events(self) -> AsyncIterator[EngineEvent]:
        while not self._closed:
            if not self._pending and not self._flush:
                if self._data.is_set():
                    self._data = anyio.Event()
                await self._data.wait()
                continue
            if self._pending:
                batch = b"".join(self._pending)
                self._pending.clear()
                self._pending_bytes = 0
                self._room.set()
                try:
                    async with self._busy:
                        if self._closed:
                            return
                        updates = await anyio.to_thread.run_sync(
                            self._rec.accept, batch, limiter=self._limiter
                        )
                except Exception:
                    log.exception("engine failed while decoding")
                    yield EngineFailed(detail="the speech engine failed while decoding")
                    return
                for update in updates:
                    yield update
                continue
            # Flush requested and the queue is empty: the final result ends the stream.
            try:
                async with self._busy:
                    if self._closed:
                        return
                    final: EngineFinal = await anyio.to_thread.run_sync(
                        self._rec.finish, limiter=self._limiter
                    )
            except Exception:
                log.exception("engine failed while flushing")
                yield EngineFailed(detail="the speech engine failed while finishing")
                return
            yield final
            return

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._data.set()
        self._room.set()
        # Shielded: closing native resources must complete even if our caller is cancelled,
        # and must wait for a decode in flight (the lock), never run beside it.
        with anyio.CancelScope(shield=True):
            async with self._busy:
                try:
                    await anyio.to_thread.run_sync(self._rec.close, limiter=self._limiter)
                except Exception:
                    log.exception("engine failed to close a stream")
