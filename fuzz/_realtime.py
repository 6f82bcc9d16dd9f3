"""The Realtime translator and the native session, wired as the app wires them, in memory.

:class:`RealtimePair` is what ``talkies/app/realtime.py`` does around the two pure halves,
minus the sockets and the resampler: ``session.created`` first, then fuzz/_dialect.py's
:class:`~fuzz._dialect.DialectPair` (client reads through
:meth:`~talkies.dialects.RealtimeTranslator.client` into the session, every ``Send`` of the
session back through :meth:`~talkies.dialects.RealtimeTranslator.session`), with the audio
held until the native ``ready`` delivered then. The fuzz harness
(fuzz/fuzz_realtime.py), the hypothesis tests and the executed docs table
(tests/test_dialect_realtime_*.py) all drive it, and :func:`check_event` is their one oracle
of an event's shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fuzz._dialect import DIALECT_LIMITS, DialectPair
from talkies.dialects.realtime import RealtimeConfig, RealtimeTranslator, event_limit
from talkies.protocol import AudioBatch, Input, Refused

__all__ = ["REALTIME_LIMITS", "RealtimePair", "check_event"]

REALTIME_LIMITS = DIALECT_LIMITS

_ITEM_EVENTS = {
    "input_audio_buffer.speech_started",
    "input_audio_buffer.speech_stopped",
    "input_audio_buffer.committed",
    "conversation.item.input_audio_transcription.delta",
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.input_audio_transcription.failed",
}
_KINDS = _ITEM_EVENTS | {
    "session.created",
    "session.updated",
    "transcription_session.updated",
    "input_audio_buffer.cleared",
    "conversation.item.added",
    "conversation.item.created",
    "conversation.item.done",
    "error",
}


@dataclass
class RealtimePair(DialectPair):
    """A translator and a session, driven like one ``/v1/realtime`` connection."""

    config: RealtimeConfig
    events: list[dict[str, Any]] = field(default_factory=list)
    fed: list[bytes] = field(default_factory=list)  # the audio frames the session was given
    refusal: Refused | None = None  # the upgrade's refusal, delivered before anything is read

    def __post_init__(self) -> None:
        self.translator = RealtimeTranslator(
            self.config,
            session_id="sess_test",
            max_event_bytes=event_limit(REALTIME_LIMITS.max_frame_bytes),
            max_frame_bytes=REALTIME_LIMITS.max_frame_bytes,
        )
        self.session = self._new_session()
        if self.refusal is not None:  # as StreamRoute.serve delivers a dialect's refusal
            self._handle(self.refusal)
        self.translator.connected()  # said nothing once the refusal closed the connection
        self._collect()

    def audio(self) -> bytes:
        """The 24 kHz audio the session was given (the app resamples it on the way)."""
        return b"".join(self.fed)

    def _settle(self) -> None:
        """The audio held until the native ``ready``, delivered then."""
        if self.translator.streaming and not self.closed:
            for item in self.translator.held():
                self._handle(item)

    def _handle(self, item: Input) -> None:
        if isinstance(item, AudioBatch):
            self.fed.extend(item.frames)
        super()._handle(item)

    def _received(self, event: dict[str, Any]) -> None:
        check_event(event)
        self.events.append(event)

    def items(self) -> dict[str, tuple[str, str | None]]:
        """Each item's (concatenated deltas, completed transcript or None)."""
        out: dict[str, tuple[str, str | None]] = {}
        for event in self.events:
            kind = event["type"]
            if kind == "input_audio_buffer.committed":
                out.setdefault(event["item_id"], ("", None))
            elif kind == "conversation.item.input_audio_transcription.delta":
                # (deltas of a stable prefix come before the item is committed)
                joined, done = out.get(event["item_id"], ("", None))
                assert done is None, "a delta after completed"
                out[event["item_id"]] = (joined + event["delta"], None)
            elif kind == "conversation.item.input_audio_transcription.completed":
                joined, done = out[event["item_id"]]
                assert done is None, "completed twice"
                out[event["item_id"]] = (joined, event["transcript"])
        return out


def check_event(event: dict[str, Any]) -> None:
    """Raise unless ``event`` has the shape OpenAI documents for its type."""
    kind = event.get("type")
    assert kind in _KINDS, kind
    assert isinstance(event["event_id"], str) and event["event_id"].startswith("event_")
    if kind in _ITEM_EVENTS:
        assert isinstance(event["item_id"], str) and event["item_id"].startswith("item_")
    if kind == "input_audio_buffer.speech_started":
        assert isinstance(event["audio_start_ms"], int) and event["audio_start_ms"] >= 0
    elif kind == "input_audio_buffer.speech_stopped":
        assert isinstance(event["audio_end_ms"], int) and event["audio_end_ms"] >= 0
    elif kind in ("conversation.item.added", "conversation.item.created", "conversation.item.done"):
        item = event["item"]
        assert item["type"] == "message" and item["role"] == "user"
        assert item["content"][0]["type"] == "input_audio"
    elif kind == "conversation.item.input_audio_transcription.delta":
        assert isinstance(event["delta"], str) and event["content_index"] == 0
    elif kind == "conversation.item.input_audio_transcription.completed":
        assert isinstance(event["transcript"], str)
        assert event["usage"]["type"] == "duration" and event["usage"]["seconds"] >= 0
    elif kind == "error":
        error = event["error"]
        assert isinstance(error["type"], str) and isinstance(error["code"], str)
        assert isinstance(error["message"], str) and error["message"]
        assert "param" in error
    elif kind in ("session.created", "session.updated"):
        assert event["session"]["type"] == "transcription"
    elif kind == "transcription_session.updated":
        assert event["session"]["input_audio_format"] == "pcm16"
