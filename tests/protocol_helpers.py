"""Builders shared by the protocol tests: sessions in each state and canonical inputs."""

from __future__ import annotations

import json
from typing import Any

from talkies.protocol import (
    Action,
    BinaryReceived,
    Close,
    EngineOpened,
    Error,
    Input,
    Send,
    SessionLimits,
    State,
    StreamSession,
    TextReceived,
)

LIMITS = SessionLimits(
    max_frame_bytes=4096,
    max_duration_seconds=10.0,
    idle_timeout_seconds=30.0,
    start_timeout_seconds=5.0,
)

START: dict[str, Any] = {
    "type": "start",
    "model": "tiny-test",
    "encoding": "pcm_s16le",
    "sample_rate": 16000,
    "channels": 1,
}


def start_text(**changes: Any) -> str:
    """A start message with ``changes`` applied; a value of ``...`` removes the field."""
    body = dict(START)
    for key, value in changes.items():
        if value is ...:
            body.pop(key, None)
        else:
            body[key] = value
    return json.dumps(body)


def text(data: str | bytes, *, final: bool = True) -> TextReceived:
    return TextReceived(data=data, final=final)


def pcm(n_bytes: int, value: int = 0) -> BinaryReceived:
    return BinaryReceived(data=bytes([value & 0xFF]) * n_bytes)


def session_in(
    state: State, limits: SessionLimits = LIMITS, now: float = 0.0, **start: Any
) -> StreamSession:
    """A fresh session driven into ``state`` by the ordinary happy path; actions drained."""
    s = StreamSession(limits, now=now)
    steps: list[Input] = []
    if state is not State.AWAITING_START:
        steps.append(text(start_text(**start)))
    if state in (State.STREAMING, State.FLUSHING):
        steps.append(EngineOpened())
    if state is State.FLUSHING:
        steps.append(text('{"type":"end"}'))
    if state is State.CLOSED:
        steps.append(text('{"type":"cancel"}'))
    for step in steps:
        s.handle(step, now)
    assert s.state is state, (s.state, s.pull_actions())
    s.pull_actions()
    return s


def feed(s: StreamSession, *inputs: Input, now: float = 0.0) -> list[Action]:
    for item in inputs:
        s.handle(item, now)
    return s.pull_actions()


def error_of(actions: list[Action]) -> tuple[str, int] | None:
    """(error code, close code) of a failed step, or None."""
    errors = [a.event for a in actions if isinstance(a, Send) and isinstance(a.event, Error)]
    closes = [a for a in actions if isinstance(a, Close)]
    if not errors:
        return None
    assert len(errors) == 1 and len(closes) == 1, actions
    return errors[0].code.value, int(closes[0].code)


def events(actions: list[Action]) -> list[dict[str, Any]]:
    return [a.event.to_dict() for a in actions if isinstance(a, Send)]
