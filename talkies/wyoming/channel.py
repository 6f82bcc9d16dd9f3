"""What every Wyoming handler shares of its connection: sending events (with the write
deadline), error events, the connection's task group, and the checks of a client's fields."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

from ..config import Settings
from ..engines.base import EngineUnavailable, Refusal, RefusalKind
from ..engines.pool import ModelPool
from ..engines.tts.base import SynthesisFailed
from .framing import encode

__all__ = ["Busy", "Channel", "Close", "text_field"]

log = logging.getLogger("talkies.wyoming")

# Counts a request in (+1) or out (-1) of the server's in-progress total, for shutdown.
Busy = Callable[[int], None]


class Close(Exception):
    """End this connection (after the error event it was given, if any)."""


def text_field(data: dict[str, Any], key: str, limit: int) -> str | None:
    """``data[key]``: absent (None) or a string of at most ``limit`` characters."""
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise Refusal(RefusalKind.INVALID_INPUT, f"{key} must be a string")
    if len(value) > limit:
        raise Refusal(RefusalKind.INVALID_INPUT, f"{key} is longer than {limit} characters")
    return value


class Channel:
    """One connection's sending half and what its handlers share."""

    def __init__(
        self,
        stream: anyio.abc.SocketStream,
        settings: Settings,
        pool: ModelPool,
        busy: Busy,
    ) -> None:
        self.stream = stream
        self.settings = settings
        self.pool = pool
        self.busy = busy
        self.tasks: anyio.abc.TaskGroup | None = None  # the connection's, while it runs
        self._write_lock = anyio.Lock()

    def start_soon(self, job: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run ``job`` beside the connection's read loop, ended with it."""
        assert self.tasks is not None, "the connection is not running"
        self.tasks.start_soon(job)

    async def send(
        self, kind: str, data: dict[str, Any] | None = None, payload: bytes = b""
    ) -> None:
        """One event; a client that does not take it within the idle timeout is dropped."""
        frame = encode(kind, data, payload or None)
        async with self._write_lock:
            with anyio.move_on_after(self.settings.stream_idle_timeout) as scope:
                try:
                    await self.stream.send(frame)
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    raise Close from None
            if scope.cancelled_caught:
                log.info(
                    "wyoming client stopped reading",
                    extra={"timeout": self.settings.stream_idle_timeout},
                )
                raise Close

    async def error(self, text: str, code: str) -> None:
        await self.send("error", {"text": text, "code": code})

    async def refuse(self, exc: Refusal | EngineUnavailable | SynthesisFailed) -> None:
        if isinstance(exc, Refusal):
            await self.error(exc.detail, exc.kind.value)
        else:
            await self.error(str(exc), "server_error")
