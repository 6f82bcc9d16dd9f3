"""What a driver tells a :class:`~talkies.protocol.session.StreamSession`.

Three families: client messages (text and binary, whole or in fragments as wsproto and ASGI
deliver them), the engine's answers, and transport facts. Time is not an input of its own:
every call to ``StreamSession.handle`` carries ``now``, and :class:`Tick` merely asks the
session to look at the clock it was given.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ErrorCode
from .events import Word

__all__ = [
    "AudioBatch",
    "AuthRejected",
    "BinaryReceived",
    "CutRequested",
    "EngineEndpoint",
    "EngineFailed",
    "EngineFinal",
    "EngineOpened",
    "EnginePartial",
    "Input",
    "PeerGone",
    "Refused",
    "ShuttingDown",
    "TextReceived",
    "Tick",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class TextReceived:
    """A text message or one fragment of it; ``final`` marks its last fragment.

    ``data`` is ``str`` from wsproto and ASGI ``text``, or raw ``bytes`` where the peer's
    bytes were not (or could not be) decoded, such as an ASGI ``bytes`` text frame.
    """

    data: str | bytes
    final: bool = True
    # False: a piece of a WebSocket frame whose rest is still to come (a transport that hands
    # on data as it arrives). Not activity: the idle timeout runs between frames, so a frame
    # trickled a byte at a time does not hold the stream open.
    frame_end: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class BinaryReceived:
    """A binary message (one PCM frame) or one fragment of it (``frame_end``: as above)."""

    data: bytes
    final: bool = True
    frame_end: bool = True


@dataclass(frozen=True, kw_only=True, slots=True)
class AudioBatch:
    """Whole binary messages in a row, as one transport read delivered them.

    Handling it is equivalent to handling ``BinaryReceived(data=frame)`` for each frame in
    order, except that the accepted frames reach the engine as one ``Feed``: a driver pays
    the per-input cost once per read rather than once per 20 ms frame. Send it only when no
    message is half-received (a pending fragment makes it ``invalid_message``).
    """

    # bytearray too: wsproto hands its payloads over as fresh bytearrays, and the session
    # copies the accepted frames once, into the Feed, instead of once per frame here.
    frames: tuple[bytes | bytearray, ...]


@dataclass(frozen=True, kw_only=True, slots=True)
class CutRequested:
    """Close the open utterance after the audio sent so far, and go on listening.

    Not a message of the native protocol (its clients have ``end``): a translator sends it
    for a dialect's flush that keeps the stream (OpenAI Realtime's manual
    ``input_audio_buffer.commit``, Deepgram's ``Finalize``). The engine answers with one
    ``endpoint`` marked ``cut``, in order after the endpoints of the audio before it.
    """


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineOpened:
    """The engine stream asked for by ``Open`` is ready for audio."""


@dataclass(frozen=True, kw_only=True, slots=True)
class EnginePartial:
    """A revisable hypothesis for the current utterance.

    ``lag`` (here and on the other results): seconds of the audio the server had received
    for the stream that the decoder had not yet answered for when it produced this result,
    as the engine runtime measured it (talkies/engines/runtime/lag.py; None: not measured).
    The session sends it on the transcript event and sums it up in ``stats``.

    ``stable``: how many leading characters (code points) of ``text`` will not be revised:
    the utterance's endpoint (or the final) begins with exactly them. None: the engine does
    not say (Vosk, sherpa), which promises nothing before the endpoint.
    """

    text: str
    words: tuple[Word, ...] = ()
    lag: float | None = None
    stable: int | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineEndpoint:
    """The decoder closed an utterance; ``text`` is that utterance.

    ``cut``: the answer to :class:`CutRequested` (the utterance was closed where it was
    asked to be, not where the decoder found a pause); sent even when empty.
    """

    text: str
    words: tuple[Word, ...] = ()
    lag: float | None = None  # as on EnginePartial
    cut: bool = False


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineFinal:
    """The answer to ``Flush``: what remained after the last endpoint."""

    text: str
    words: tuple[Word, ...] = ()
    lag: float | None = None  # as on EnginePartial


@dataclass(frozen=True, kw_only=True, slots=True)
class EngineFailed:
    """The engine could not open, decode or flush; ``detail`` is safe to show the client."""

    detail: str


@dataclass(frozen=True, kw_only=True, slots=True)
class Refused:
    """The driver will not serve this stream: unknown model, busy, limits, not streaming."""

    code: ErrorCode
    detail: str


@dataclass(frozen=True, kw_only=True, slots=True)
class AuthRejected:
    """The upgrade's bearer token was missing or wrong (spec: close 4401, no error object)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class PeerGone:
    """The connection is gone: TCP closed, or the client sent a close frame."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ShuttingDown:
    """The server's grace period is over: end the stream with close 1001."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Tick:
    """A timer fired; the session compares its deadline with ``now``."""


Input = (
    TextReceived
    | BinaryReceived
    | AudioBatch
    | CutRequested
    | EngineOpened
    | EnginePartial
    | EngineEndpoint
    | EngineFinal
    | EngineFailed
    | Refused
    | AuthRejected
    | PeerGone
    | ShuttingDown
    | Tick
)
