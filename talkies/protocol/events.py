"""Events the server sends to the client (spec: "Events", "Errors and close codes").

Frozen, keyword-only value objects. ``to_dict()`` gives the exact JSON object of the spec,
``to_json()`` its compact text; nothing else in the package builds event JSON by hand.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from .errors import ErrorCode
from .lag import LagSummary

__all__ = [
    "CHANNELS",
    "ENCODING",
    "SAMPLE_RATE",
    "Endpoint",
    "Error",
    "Event",
    "Final",
    "Partial",
    "Ready",
    "Stats",
    "TranscriptEvent",
    "Word",
]

# The fixed PCM format of the contract (spec: "Start and audio contract").
ENCODING: Literal["pcm_s16le"] = "pcm_s16le"
SAMPLE_RATE = 16000
CHANNELS = 1


# allow_nan=False: the constructors already refuse non-finite numbers; this is the backstop
# that keeps a bug from putting the non-JSON token NaN on the wire. One encoder for all:
# json.dumps with options builds a new JSONEncoder per call, and a partial is sent per frame.
_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode


@dataclass(frozen=True, kw_only=True, slots=True)
class Word:
    """One timed word: seconds from the start of the stream's accepted audio."""

    word: str
    start: float
    end: float
    confidence: float | None = None

    def __post_init__(self) -> None:
        # Engines hand us ints and numpy floats too; the wire always carries JSON floats.
        object.__setattr__(self, "start", float(self.start))
        object.__setattr__(self, "end", float(self.end))
        if self.confidence is not None:
            object.__setattr__(self, "confidence", float(self.confidence))
        if not (math.isfinite(self.start) and math.isfinite(self.end)):
            raise ValueError("word times must be finite")
        if not 0.0 <= self.start <= self.end:
            raise ValueError(f"word times need 0 <= start <= end, got {self.start}, {self.end}")
        if self.confidence is not None and not math.isfinite(self.confidence):
            raise ValueError("word confidence must be finite")

    def to_dict(self) -> dict[str, Any]:
        # On the wire to the millisecond, as the HTTP routes give them: no engine times a
        # word finer (Whisper 20 ms, Vosk 10 ms), and the sums and float32s engines make
        # would put 2.3720000000000003 or 0.47999998927116394 there.
        out: dict[str, Any] = {
            "word": self.word,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
        }
        if self.confidence is not None:
            out["confidence"] = self.confidence
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Ready:
    """Sent once the engine stream is open; echoes the model and the fixed PCM format."""

    type: ClassVar[str] = "ready"
    model: str
    encoding: str = ENCODING
    sample_rate: int = SAMPLE_RATE
    channels: int = CHANNELS

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "model": self.model,
            "encoding": self.encoding,
            "sample_rate": self.sample_rate,
            "channels": self.channels,
        }

    def to_json(self) -> str:
        return _dumps(self.to_dict())


@dataclass(frozen=True, kw_only=True, slots=True)
class TranscriptEvent:
    """The shared shape of ``partial``, ``endpoint`` and ``final``.

    ``lag`` is an extension beside the spec's fields, like a word's ``confidence``: seconds
    the decoder was behind the audio the server had received when it produced this result
    (docs/protocol.md); absent, never ``null``, where the engine runtime did not measure it.
    """

    type: ClassVar[str]
    is_final: ClassVar[bool] = False
    revision: int
    text: str
    words: tuple[Word, ...] = field(default=())
    audio_seconds: float
    lag: float | None = None

    def __post_init__(self) -> None:
        if self.lag is not None and not (math.isfinite(self.lag) and self.lag >= 0):
            raise ValueError(f"lag must be a finite number of seconds >= 0, got {self.lag}")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "revision": self.revision,
            "text": self.text,
            "words": [w.to_dict() for w in self.words],
            "audio_seconds": self.audio_seconds,
            "is_final": self.is_final,
        }
        if self.lag is not None:
            out["lag"] = self.lag
        return out

    def to_json(self) -> str:
        return _dumps(self.to_dict())


@dataclass(frozen=True, kw_only=True, slots=True)
class Partial(TranscriptEvent):
    """A revisable hypothesis: it replaces the previous one, it is not appended.

    ``stable`` is an extension like ``lag``: how many leading characters (Unicode code
    points) of ``text`` will not be revised, because the utterance's ``endpoint`` (or the
    ``final``) begins with exactly them (docs/protocol.md); absent where the engine does not
    say. The rest of the partial is revisable as the spec says.
    """

    type: ClassVar[str] = "partial"
    stable: int | None = None

    def __post_init__(self) -> None:
        TranscriptEvent.__post_init__(self)
        if self.stable is not None and not 0 <= self.stable <= len(self.text):
            raise ValueError(f"stable must be within the text, got {self.stable}")

    def to_dict(self) -> dict[str, Any]:
        out = TranscriptEvent.to_dict(self)
        if self.stable is not None:
            out["stable"] = self.stable
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Endpoint(TranscriptEvent):
    """A native decoder utterance boundary; the stream stays open.

    ``cut`` is an extension no native client sees: ``true`` on the endpoint that answers a
    translator's :class:`~talkies.protocol.inputs.CutRequested` (docs/dialects.md).
    """

    type: ClassVar[str] = "endpoint"
    cut: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = TranscriptEvent.to_dict(self)
        if self.cut:
            out["cut"] = True
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Final(TranscriptEvent):
    """The result of ``end``: exactly one per flushed stream."""

    type: ClassVar[str] = "final"
    is_final: ClassVar[bool] = True


@dataclass(frozen=True, kw_only=True, slots=True)
class Stats:
    """The terminal accounting event of ``end`` and ``cancel``.

    ``lag`` is an extension: percentiles of the lag the stream's results carried, absent when
    none carried one (docs/protocol.md).
    """

    type: ClassVar[str] = "stats"
    audio_seconds: float
    frames: int
    canceled: bool
    lag: LagSummary | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "audio_seconds": self.audio_seconds,
            "frames": self.frames,
            "canceled": self.canceled,
        }
        if self.lag is not None:
            out["lag"] = self.lag.to_dict()
        return out

    def to_json(self) -> str:
        return _dumps(self.to_dict())


@dataclass(frozen=True, kw_only=True, slots=True)
class Error:
    """Sent before a close on an accepted connection; its code fixes the close code."""

    type: ClassVar[str] = "error"
    code: ErrorCode
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "code": self.code.value, "detail": self.detail}

    def to_json(self) -> str:
        return _dumps(self.to_dict())


Event = Ready | Partial | Endpoint | Final | Stats | Error
