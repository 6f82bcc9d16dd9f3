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


# The events that carry an open transcription's work (its audio) and an open streaming
# synthesis' (its text). While one is open (a model's slot held), only its own events, taken
# and not empty, are activity for the idle deadline: a client that sent nothing else (pings,
# describe, unknown events, empty chunks, refused events, a transcribe or a legacy synthesize
# that does nothing for the work open) would otherwise hold the slot as long as it kept on.
_AUDIO_EVENTS = frozenset({"audio-chunk", "audio-stop"})
_TEXT_EVENTS = frozenset({"synthesize-chunk", "synthesize-stop"})


def _carries_work(event: WireEvent) -> bool:
    """Whether a chunk event carries something (audio bytes, text to speak)."""
    if event.type == "audio-chunk":
        return bool(event.payload)
    if event.type == "synthesize-chunk":
        text = event.data.get("text")
        return isinstance(text, str) and bool(text.strip())
    return True


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
                work = self._open_work()
                began = anyio.current_time()
                taken = await self._handle(event)
                now = anyio.current_time()
                if work is None or (taken and event.type in work and _carries_work(event)):
                    last = now
                else:
                    # The time the server spent on it is not the client's idleness.
                    last += now - began
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

    def _open_work(self) -> frozenset[str] | None:
        """The events that are activity while a transcription or a streaming synthesis is
        open (None: nothing is open, every event is)."""
        asr = self.asr.transcription is not None
        tts = self.tts.streaming_open
        if not asr and not tts:
            return None
        return (_AUDIO_EVENTS if asr else frozenset()) | (_TEXT_EVENTS if tts else frozenset())

    async def _handle(self, event: WireEvent) -> bool:
        """Serve one event; whether it was taken (not refused nor ignored)."""
        handler = self._handlers.get(event.type)
        if handler is None:
            log.debug("wyoming: ignored an event", extra={"type": event.type[:64]})
            return False
        try:
            await handler(event)
        except (Refusal, EngineUnavailable) as exc:
            await self.channel.refuse(exc)
            return False
        return True

    async def _describe(self, event: WireEvent) -> None:
        # A worker thread: it looks at files, and a loaded voice list is a call to its
        # engine process.
        await self.channel.send("info", await anyio.to_thread.run_sync(self._info))

    async def _ping(self, event: WireEvent) -> None:
        text = event.data.get("text")
        await self.channel.send("pong", {"text": text} if isinstance(text, str) else None)
