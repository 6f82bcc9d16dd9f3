"""The Realtime translator and the native session, wired as the app wires them, in memory.

:class:`RealtimePair` is what ``talkies/app/realtime.py`` does around the two pure halves,
minus the sockets and the resampler: ``session.created`` first, client reads through
:meth:`~talkies.dialects.RealtimeTranslator.client` into the session, the audio held until
the native ``ready`` delivered then, every ``Send`` of the session back through
:meth:`~talkies.dialects.RealtimeTranslator.session`. The fuzz harness
(fuzz/fuzz_realtime.py), the hypothesis tests and the executed docs table
(tests/test_dialect_realtime_*.py) all drive it, and :func:`check_event` is their one oracle
of an event's shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from talkies.dialects.realtime import ClientInput, RealtimeConfig, RealtimeTranslator, event_limit
from talkies.protocol import (
    AudioBatch,
    Close,
    ErrorCode,
    Input,
    Open,
    PeerGone,
    Refused,
    Send,
    SessionLimits,
    State,
    StreamSession,
)

__all__ = ["REALTIME_LIMITS", "RealtimePair", "check_event"]

REALTIME_LIMITS = SessionLimits(
    max_frame_bytes=4096,
    max_duration_seconds=30.0,
    idle_timeout_seconds=10.0,
    start_timeout_seconds=5.0,
)

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
_CODES = {code.value for code in ErrorCode}


@dataclass
class RealtimePair:
    """A translator and a session, driven like one ``/v1/realtime`` connection."""

    config: RealtimeConfig
    now: float = 0.0
    events: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    opened: bool = False  # the session asked for an engine stream
    fed: list[bytes] = field(default_factory=list)  # the audio frames the session was given
    refusal: Refused | None = None  # the upgrade's refusal, delivered before anything is read

    def __post_init__(self) -> None:
        self.translator = RealtimeTranslator(
            self.config,
            session_id="sess_test",
            max_event_bytes=event_limit(REALTIME_LIMITS.max_frame_bytes),
            max_frame_bytes=REALTIME_LIMITS.max_frame_bytes,
        )
        self.session = StreamSession(REALTIME_LIMITS, now=self.now)
        if self.refusal is not None:  # as StreamRoute.serve delivers a dialect's refusal
            self._handle(self.refusal)
        self.translator.connected()  # said nothing once the refusal closed the connection
        self._collect()

    @property
    def closed(self) -> bool:
        return self.session.state is State.CLOSED

    def client(self, batch: list[ClientInput]) -> None:
        """One read of client messages, as the channel gives them."""
        inputs = self.translator.client(batch)
        self._collect()
        for item in inputs:
            self._handle(item)
        self._deliver_held()

    def engine(self, item: Input) -> None:
        """An engine answer or a transport fact (EngineOpened, EnginePartial, Tick, ...)."""
        self._handle(item)
        self._deliver_held()

    def finish(self) -> None:
        self._handle(PeerGone())

    def audio(self) -> bytes:
        """The 24 kHz audio the session was given (the app resamples it on the way)."""
        return b"".join(self.fed)

    def _deliver_held(self) -> None:
        if self.translator.streaming and not self.closed:
            for item in self.translator.held():
                self._handle(item)

    def _handle(self, item: Input) -> None:
        if isinstance(item, AudioBatch):
            self.fed.extend(item.frames)
        self.session.handle(item, self.now)
        for action in self.session.pull_actions():
            if isinstance(action, Send):
                self.translator.session(action.event.to_json())
                self._collect()
            elif isinstance(action, Open):
                self.opened = True
            elif isinstance(action, Close):
                assert self.close_code is None, "closed twice"
                self.close_code = int(action.code)
                self.translator.closing()

    def _collect(self) -> None:
        for text in self.translator.pull_messages():
            event = json.loads(text)
            check_event(event)
            assert self.close_code is None, f"{event['type']} after the close"
            self.events.append(event)

    def items(self) -> dict[str, tuple[str, str | None]]:
        """Each committed item's (concatenated deltas, completed transcript or None)."""
        out: dict[str, tuple[str, str | None]] = {}
        for event in self.events:
            kind = event["type"]
            if kind == "input_audio_buffer.committed":
                out[event["item_id"]] = ("", None)
            elif kind == "conversation.item.input_audio_transcription.delta":
                joined, done = out[event["item_id"]]
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
