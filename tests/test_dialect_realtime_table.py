"""docs/dialects.md's Realtime table, executed: each row's script through the translator and
the real native session (fuzz/_realtime.py) gives exactly the row's ``Realtime out``."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

import pytest

from fuzz._realtime import RealtimePair
from talkies.dialects.realtime import QueryError, RealtimeConfig, parse_realtime_query
from talkies.protocol import (
    BinaryReceived,
    EngineEndpoint,
    EngineFailed,
    EngineOpened,
    EnginePartial,
    ErrorCode,
    Refused,
    TextReceived,
    Tick,
)

from .dialect_table import script_words, table_rows

DEFAULT_QUERY = "intent=transcription&model=tiny-test"
KNOWN_MODELS = {"tiny-test"}
_APPEND = 4800  # bytes of 24 kHz PCM16 per append: 0.1 s


ROWS = table_rows("realtime")


def _update(args: list[str], *, beta: bool) -> str:
    """A session update; ``model=M``, ``turn_detection=null``, ``format=F`` change one field."""
    inputs: dict[str, Any] = {}
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "model":
            inputs["transcription"] = {"model": value}
        elif key == "turn_detection":
            inputs["turn_detection"] = None if value == "null" else {"type": value}
        elif key == "format":
            inputs["format"] = {"type": value, "rate": 24000}
        else:
            raise AssertionError(f"unknown update argument {arg!r}")
    if beta:
        session: dict[str, Any] = {"input_audio_format": "pcm16"}
        if "transcription" in inputs:
            session["input_audio_transcription"] = inputs["transcription"]
        if "turn_detection" in inputs:
            session["turn_detection"] = inputs["turn_detection"]
        return json.dumps({"type": "transcription_session.update", "session": session})
    session = {"type": "transcription", "audio": {"input": inputs}}
    return json.dumps({"type": "session.update", "session": session})


def run_script(script: str) -> tuple[list[dict[str, Any]], int | None]:
    steps = [s.strip() for s in script.split(";") if s.strip()]
    query = DEFAULT_QUERY
    if steps and steps[0].startswith("query "):
        query = steps.pop(0).removeprefix("query ")
    refusal: Refused | None = None
    try:
        model = parse_realtime_query(query, default_model="tiny-test").model
    except QueryError as exc:
        model = "tiny-test"
        refusal = Refused(code=exc.code, detail=exc.detail)
    pair = RealtimePair(RealtimeConfig(model=model), refusal=refusal)
    for step in steps:
        verb, _, arg = step.partition(" ")
        tokens = arg.split()
        if verb in ("update", "beta-update"):
            pair.client([TextReceived(data=_update(tokens, beta=verb == "beta-update"))])
            if pair.opened and model not in KNOWN_MODELS and not pair.closed:
                pair.engine(Refused(code=ErrorCode.UNKNOWN_MODEL, detail="unknown model"))
        elif verb == "ready":
            pair.engine(EngineOpened())
        elif verb == "append":
            pcm = b"\x00\x01" * int(float(arg) * 24000)
            pair.client(
                [
                    TextReceived(
                        data=json.dumps(
                            {
                                "type": "input_audio_buffer.append",
                                "audio": base64.b64encode(pcm[i : i + _APPEND]).decode(),
                            }
                        )
                    )
                    for i in range(0, len(pcm), _APPEND)
                ]
            )
        elif verb == "append-raw":
            event = {"type": "input_audio_buffer.append", "audio": arg}
            pair.client([TextReceived(data=json.dumps(event))])
        elif verb == "send":
            pair.client([TextReceived(data=json.dumps({"type": arg}))])
        elif verb == "raw":
            pair.client([TextReceived(data=arg)])
        elif verb == "binary":
            pair.client([BinaryReceived(data=b"\x00\x01")])
        elif verb == "huge":
            pair.client([TextReceived(data="x" * 200_000)])
        elif verb == "tick":
            pair.now += float(arg)
            pair.engine(Tick())
        elif verb == "partial":  # ``stable=N``: the first N words will not change
            stable = [int(t.removeprefix("stable=")) for t in tokens if t.startswith("stable=")]
            text, words = script_words([t for t in tokens if not t.startswith("stable=")])
            count = len(" ".join(text.split()[: stable[0]])) if stable else None
            pair.engine(EnginePartial(text=text, words=words, stable=count))
        elif verb in ("endpoint", "cut"):  # cut: the engine's answer to a cut
            text, words = script_words(tokens)
            pair.engine(EngineEndpoint(text=text, words=words, cut=verb == "cut"))
        elif verb == "fail":
            pair.engine(EngineFailed(detail="the speech engine failed"))
        elif verb == "refuse":
            pair.engine(Refused(code=ErrorCode(arg), detail="refused"))
        else:
            raise AssertionError(f"unknown script step {step!r}")
    return pair.events, pair.close_code


def _short(kind: str) -> str:
    for prefix in ("input_audio_buffer.", "conversation.item.input_audio_transcription."):
        if kind.startswith(prefix):
            return kind.removeprefix(prefix)
    return kind.replace("conversation.item.", "item.")


def describe(events: list[dict[str, Any]], close: int | None) -> str:
    # session.created opens every connection that is not refused before anything is read.
    if events and events[0]["type"] == "session.created":
        events = events[1:]
    else:
        assert close is not None and len(events) <= 1
    parts = []
    for event in events:
        kind = event["type"]
        if kind == "error":
            parts.append(f"error {event['error']['code']}")
        elif kind.endswith(".delta"):
            parts.append(f"delta {json.dumps(event['delta'])}")
        elif kind.endswith(".completed"):
            parts.append(f"completed {json.dumps(event['transcript'])}")
        else:
            parts.append(_short(kind))
    if close is not None:
        parts.append(f"close {close}")
    return "; ".join(parts) or "—"


def test_the_table_has_a_row_for_every_event_both_ways() -> None:
    firsts = " ".join(row[0] for row in ROWS)
    for name in (
        "session.update",
        "transcription_session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "partial",
        "endpoint",
    ):
        assert name in firsts, name
    outs = " ".join(row[2] for row in ROWS)
    for name in (
        "session.updated",
        "transcription_session.updated",
        "speech_started",
        "speech_stopped",
        "committed",
        "cleared",
        "item.added",
        "item.created",
        "item.done",
        "delta",
        "completed",
        "failed",
        "error",
    ):
        assert name in outs, name


@pytest.mark.parametrize(("name", "script", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_row(name: str, script: str, expected: str) -> None:
    events, close = run_script(script)
    assert describe(events, close) == re.sub(r"\s+", " ", expected)
