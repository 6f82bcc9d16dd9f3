"""docs/dialects.md's Deepgram table, executed: each row's script through the translator and
the real native session (fuzz/_listen.py) gives exactly the row's ``Deepgram out``."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from fuzz._listen import ListenPair
from talkies.dialects import ListenError, parse_listen_query
from talkies.protocol import (
    BinaryReceived,
    EngineEndpoint,
    EngineFinal,
    EngineOpened,
    EnginePartial,
    ErrorCode,
    Refused,
    TextReceived,
    Tick,
)

from .dialect_table import script_words, table_rows

DEFAULT_QUERY = "model=tiny-test&encoding=linear16&interim_results=true"
KNOWN_MODELS = {"tiny-test"}
FLAGS = ("is_final", "speech_final", "from_finalize")


ROWS = table_rows("deepgram")


def run_script(script: str) -> tuple[list[dict[str, Any]], int | None]:
    steps = [s.strip() for s in script.split(";") if s.strip()]
    query = DEFAULT_QUERY
    if steps and steps[0].startswith("query "):
        query = steps.pop(0).removeprefix("query ")
    refusal: Refused | None = None
    try:
        options = parse_listen_query(query, default_model="tiny-test")
    except ListenError as exc:
        options = parse_listen_query(DEFAULT_QUERY, default_model="tiny-test")
        refusal = Refused(code=exc.code, detail=exc.detail)
    pair = ListenPair(options)
    if refusal is not None:  # as StreamRoute.serve delivers a dialect's refusal: first
        pair.engine(refusal)
    elif options.model not in KNOWN_MODELS:  # as the engine provider refuses it
        pair.engine(Refused(code=ErrorCode.UNKNOWN_MODEL, detail="unknown model"))
    for step in steps:
        verb, _, arg = step.partition(" ")
        tokens = arg.split()
        if verb == "ready":
            pair.engine(EngineOpened())
        elif verb == "audio":
            pcm = b"\x00\x01" * int(float(arg) * 16000)
            pair.client([BinaryReceived(data=pcm[i : i + 3200]) for i in range(0, len(pcm), 3200)])
        elif verb == "raw-audio":
            pair.client([BinaryReceived(data=b"\x01" * int(arg))])
        elif verb == "send":
            pair.client([TextReceived(data=json.dumps({"type": arg}))])
        elif verb == "raw":
            pair.client([TextReceived(data=arg)])
        elif verb == "tick":
            pair.now += float(arg)
            pair.engine(Tick())
        elif verb == "cut":  # the engine's answer to a cut (a Finalize)
            text, words = script_words(tokens)
            pair.engine(EngineEndpoint(text=text, words=words, cut=True))
        elif verb in ("partial", "endpoint", "final"):
            text, words = script_words(tokens)
            kind = {"partial": EnginePartial, "endpoint": EngineEndpoint, "final": EngineFinal}
            pair.engine(kind[verb](text=text, words=words))
        else:
            raise AssertionError(f"unknown script step {step!r}")
    return pair.messages, pair.close_code


def describe(messages: list[dict[str, Any]], close: int | None) -> str:
    parts = []
    for m in messages:
        if m["type"] == "Results":
            flags = [f for f in FLAGS if m[f]]
            transcript = m["channel"]["alternatives"][0]["transcript"]
            parts.append(" ".join(["Results", *flags, json.dumps(transcript)]))
        elif m["type"] == "Error":
            parts.append(f"Error {m['variant']}")
        else:
            parts.append(m["type"])
    if close is not None:
        parts.append(f"close {close}")
    return "; ".join(parts) or "—"


def test_the_table_has_a_row_for_every_message_both_ways() -> None:
    firsts = " ".join(row[0] for row in ROWS)
    for name in ("KeepAlive", "Finalize", "CloseStream", "binary audio", "partial", "endpoint"):
        assert name in firsts
    outs = " ".join(row[2] for row in ROWS)
    for name in ("Results", "Metadata", "SpeechStarted", "UtteranceEnd", "Error", "from_finalize"):
        assert name in outs


@pytest.mark.parametrize(("name", "script", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_row(name: str, script: str, expected: str) -> None:
    messages, close = run_script(script)
    assert describe(messages, close) == re.sub(r"\s+", " ", expected)
