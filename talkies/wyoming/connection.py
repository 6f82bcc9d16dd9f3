"""One Wyoming connection: its read loop (framing errors, the idle deadline, shutdown) and
the dispatch of each event to its handler.

One connection serves any number of requests, one at a time. A refused request is an
``error {text, code}`` event and the connection goes on; broken framing, a cap passed, or a
client that stopped sending mid-request gets its error and the connection is closed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread

from ..engines.base import EngineUnavailable, Refusal
from .asr import Transcriber
from .channel import Channel, Close
from .framing import EventReader, FramingError, WireEvent
from .tts import Synthesizer

__all__ = ["Connection"]

log = logging.getLogger("talkies.wyoming")

_READ_SIZE = 65536


# The events that carry a transcription's or a synthesis' work (its audio, its text).
_WORK_EVENTS = frozenset(
    {
        "transcribe",
        "audio-start",
        "audio-chunk",
        "audio-stop",
        "synthesize",
        "synthesize-start",
        "synthesize-chunk",
        "synthesize-stop",
    }
)


class Connection:
    """Serve one client until it leaves, breaks the protocol or the server stops."""

    def __init__(
        self,
        channel: Channel,
        *,
        info: Callable[[], dict[str, Any]],
        stopping: Callable[[], bool],
    ) -> None:
        self.channel = channel
        self.reader = EventReader()
        self.asr = Transcriber(channel)
        self.tts = Synthesizer(channel)
        self._info = info
        self._stopping = stopping
        self._handlers: dict[str, Callable[[WireEvent], Awaitable[None]]] = {
            "describe": self._describe,
            "ping": self._ping,
            "transcribe": self.asr.transcribe,
            "audio-start": self.asr.audio_start,
            "audio-chunk": self.asr.audio_chunk,
            "audio-stop": self.asr.audio_stop,
            "synthesize": self.tts.synthesize,
            "synthesize-start": self.tts.synthesize_start,
            "synthesize-chunk": self.tts.synthesize_chunk,
            "synthesize-stop": self.tts.synthesize_stop,
        }

    async def run(self) -> None:
        try:
            async with anyio.create_task_group() as tasks:
                self.channel.tasks = tasks
                try:
                    await self._read_loop()
                finally:
                    tasks.cancel_scope.cancel()
        except* Close:
            pass
        finally:
            self.tts.end()
            await self.asr.end()

    async def _read_loop(self) -> None:
        idle = self.channel.settings.stream_idle_timeout
        last = anyio.current_time()
        while True:
            try:
                event = self.reader.next_event()
            except FramingError as exc:
                await self.channel.error(str(exc), "invalid_message")
                return
            if event is not None:
                if self._counts(event):
                    last = anyio.current_time()
                await self._handle(event)
                continue
            if self._stopping() and self.asr.transcription is None and not self.tts.in_progress:
                return
            # Nothing to wait for while the server owes audio; otherwise the client must
            # send a whole event within the idle timeout (a streaming synthesis waiting for
            # its text included). Bytes alone do not count: a header trickled a byte at a
            # time would otherwise hold the connection for ever.
            if self.tts.working:
                last = anyio.current_time()
            elif anyio.current_time() - last > idle:
                await self.channel.error(f"no event was received for {idle:g} s", "idle_timeout")
                return
            with anyio.move_on_after(1.0):
                try:
                    data = await self.channel.stream.receive(_READ_SIZE)
                except (anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                    return
                self.reader.feed(data)

    def _counts(self, event: WireEvent) -> bool:
        """Whether an event is activity for the idle deadline. With a transcription or a
        streaming synthesis open (a slot held), only that work's events are: a client that
        opened one and then sent only ``ping``, ``describe`` or unknown events would
        otherwise hold the model's slot for as long as it kept them up."""
        if self.asr.transcription is None and not self.tts.in_progress:
            return True
        return event.type in _WORK_EVENTS

    async def _handle(self, event: WireEvent) -> None:
        handler = self._handlers.get(event.type)
        if handler is None:
            log.debug("wyoming: ignored an event", extra={"type": event.type[:64]})
            return
        try:
            await handler(event)
        except (Refusal, EngineUnavailable) as exc:
            await self.channel.refuse(exc)

    async def _describe(self, event: WireEvent) -> None:
        # A worker thread: it looks at files, and a loaded voice list is a call to its
        # engine process.
        await self.channel.send("info", await anyio.to_thread.run_sync(self._info))

    async def _ping(self, event: WireEvent) -> None:
        text = event.data.get("text")
        await self.channel.send("pong", {"text": text} if isinstance(text, str) else None)
