"""The Deepgram translator and the native session, wired as the app wires them, in memory.

:class:`ListenPair` is what ``talkies/app/dialects.py`` does around the two pure halves,
minus the sockets: the translator's start first, client reads through
:meth:`~talkies.dialects.ListenTranslator.client` into the session, every ``Send`` of the
session back through :meth:`~talkies.dialects.ListenTranslator.session`, an engine opened on
``Open``. The fuzz harness (fuzz/fuzz_listen.py), the hypothesis tests and the executed docs
table (tests/test_dialect_deepgram_*.py) all drive it, and :func:`check_message` is their one
oracle of a message's shape.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from talkies.dialects.deepgram import ClientInput, ListenOptions, ListenTranslator
from talkies.protocol import (
    Close,
    ErrorCode,
    Input,
    Open,
    PeerGone,
    Send,
    SessionLimits,
    State,
    StreamSession,
)

__all__ = ["LISTEN_LIMITS", "ListenPair", "check_message"]

LISTEN_LIMITS = SessionLimits(
    max_frame_bytes=4096,
    max_duration_seconds=30.0,
    idle_timeout_seconds=10.0,
    start_timeout_seconds=5.0,
)

_KINDS = {"Results", "Metadata", "SpeechStarted", "UtteranceEnd", "Error"}
_CODES = {code.value for code in ErrorCode}


@dataclass
class ListenPair:
    """A translator and a session, driven like one ``/v1/listen`` connection."""

    options: ListenOptions
    now: float = 0.0
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    opened: bool = False  # the session asked for an engine stream

    def __post_init__(self) -> None:
        self.translator = ListenTranslator(
            self.options, request_id="req", model_uuid="uuid", created="2026-01-01T00:00:00Z"
        )
        self.session = StreamSession(LISTEN_LIMITS, now=self.now)
        self._handle(self.translator.start())

    @property
    def closed(self) -> bool:
        return self.session.state is State.CLOSED

    def client(self, batch: list[ClientInput]) -> None:
        """One read of client messages, as the channel gives them."""
        inputs = self.translator.client(batch)
        self._collect()
        for item in inputs:
            self._handle(item)

    def engine(self, item: Input) -> None:
        """An engine answer or a transport fact (EngineOpened, EnginePartial, Tick, ...)."""
        self._handle(item)

    def finish(self) -> None:
        self._handle(PeerGone())

    def _handle(self, item: Input) -> None:
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
            message = json.loads(text)
            check_message(message)
            assert self.close_code is None, f"{message['type']} after the close"
            if self.messages and self.messages[-1]["type"] in ("Error", "Metadata"):
                raise AssertionError(f"{message['type']} after {self.messages[-1]['type']}")
            self.messages.append(message)

    def finals(self) -> list[dict[str, Any]]:
        """The words of every final Results, in order."""
        words: list[dict[str, Any]] = []
        for message in self.messages:
            if message["type"] == "Results" and message["is_final"]:
                words.extend(message["channel"]["alternatives"][0]["words"])
        return words


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_message(message: dict[str, Any]) -> None:
    """Raise unless ``message`` has the shape Deepgram documents for its type."""
    kind = message.get("type")
    assert kind in _KINDS, kind
    if kind == "Results":
        assert message["channel_index"] == [0, 1]
        assert _number(message["start"]) and message["start"] >= 0
        assert _number(message["duration"]) and message["duration"] >= 0
        for flag in ("is_final", "speech_final", "from_finalize"):
            assert isinstance(message[flag], bool)
        assert not message["speech_final"] or message["is_final"]
        (alternative,) = message["channel"]["alternatives"]
        assert isinstance(alternative["transcript"], str)
        assert _number(alternative["confidence"]) and 0 <= alternative["confidence"] <= 1
        for word in alternative["words"]:
            assert set(word) == {"word", "start", "end", "confidence", "punctuated_word"}
            assert 0 <= word["start"] <= word["end"]
            assert 0 <= word["confidence"] <= 1
        metadata = message["metadata"]
        assert set(metadata) == {"request_id", "model_info", "model_uuid"}
    elif kind == "Metadata":
        assert _number(message["duration"]) and message["channels"] == 1
        assert isinstance(message["request_id"], str) and isinstance(message["created"], str)
    elif kind == "SpeechStarted":
        assert message["channel"] == [0, 1] and _number(message["timestamp"])
    elif kind == "UtteranceEnd":
        assert message["channel"] == [0, 1] and _number(message["last_word_end"])
    else:
        assert message["variant"] in _CODES and message["code"] == message["variant"]
        assert isinstance(message["description"], str) and message["description"]
