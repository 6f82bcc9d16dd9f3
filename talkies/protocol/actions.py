"""What a :class:`~talkies.protocol.session.StreamSession` asks its driver to do.

The driver pulls them with ``StreamSession.pull_actions()`` after each input and executes
them in order. Engine actions come in one shape per stream: one ``Open``, any number of
``Feed``, at most one ``Flush``, and exactly one ``Release`` for every ``Open``, on every path
(see docs/architecture.md for why release is its own action rather than implied by ``Flush``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .errors import CloseCode
from .events import Event
from .messages import StartOptions

__all__ = ["Action", "Close", "Cut", "Feed", "Flush", "Open", "Release", "Send"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Send:
    """Write ``event`` as one text message."""

    event: Event


@dataclass(frozen=True, kw_only=True, slots=True)
class Close:
    """Close the WebSocket with ``code``; ``reason`` is the error code string or empty."""

    code: CloseCode
    reason: str = ""


@dataclass(frozen=True, kw_only=True, slots=True)
class Open:
    """Resolve the model and open an engine stream; answer with EngineOpened or Refused."""

    options: StartOptions


@dataclass(frozen=True, kw_only=True, slots=True)
class Feed:
    """Hand accepted PCM16LE mono 16 kHz samples to the engine stream, in order."""

    pcm: bytes = field(repr=False)
    frames: int = 1  # client frames joined in ``pcm`` (boundaries carry no meaning)

    def __repr__(self) -> str:
        return f"Feed(<{len(self.pcm)} bytes, {self.frames} frames>)"


@dataclass(frozen=True, kw_only=True, slots=True)
class Flush:
    """Finish decoding what was fed; answer with EngineFinal (or EngineFailed)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Cut:
    """Close the engine's open utterance after what was fed, keep the stream; answer with an
    EngineEndpoint marked ``cut`` (or EngineFailed)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Release:
    """Drop the engine stream and free its slot; results that still arrive are ignored."""


Action = Send | Close | Open | Feed | Flush | Cut | Release
