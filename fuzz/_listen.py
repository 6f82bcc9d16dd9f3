"""The Deepgram translator and the native session, wired as the app wires them, in memory.

:class:`ListenPair` is what ``talkies/app/dialects.py`` does around the two pure halves,
minus the sockets: the translator's start first, then fuzz/_dialect.py's
:class:`~fuzz._dialect.DialectPair` (client reads through
:meth:`~talkies.dialects.ListenTranslator.client` into the session, every ``Send`` of the
session back through :meth:`~talkies.dialects.ListenTranslator.session`, an engine opened on
``Open``). The fuzz harness (fuzz/fuzz_listen.py), the hypothesis tests and the executed docs
table (tests/test_dialect_deepgram_*.py) all drive it, and :func:`check_message` is their one
oracle of a message's shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fuzz._dialect import DIALECT_LIMITS, ERROR_CODES, DialectPair
from talkies.dialects.deepgram import ListenOptions, ListenTranslator

__all__ = ["LISTEN_LIMITS", "ListenPair", "check_message"]

LISTEN_LIMITS = DIALECT_LIMITS

_KINDS = {"Results", "Metadata", "SpeechStarted", "UtteranceEnd", "Error"}


@dataclass
class ListenPair(DialectPair):
    """A translator and a session, driven like one ``/v1/listen`` connection."""

    options: ListenOptions
    messages: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.translator = ListenTranslator(
            self.options, request_id="req", model_uuid="uuid", created="2026-01-01T00:00:00Z"
        )
        self.session = self._new_session()
        self._handle(self.translator.start())

    def _received(self, message: dict[str, Any]) -> None:
        check_message(message)
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
        assert message["variant"] in ERROR_CODES and message["code"] == message["variant"]
        assert isinstance(message["description"], str) and message["description"]
