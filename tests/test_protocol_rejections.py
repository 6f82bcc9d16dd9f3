"""One case per row of the rejection table in docs/protocol.md, executed as written there."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from talkies.protocol import (
    AudioBatch,
    AuthRejected,
    BinaryReceived,
    Close,
    EngineFailed,
    EngineFinal,
    EngineOpened,
    ErrorCode,
    Input,
    Refused,
    Release,
    Send,
    ShuttingDown,
    State,
    TextReceived,
    Tick,
)

from .protocol_helpers import LIMITS, error_of, session_in, start_text

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
OPEN_STATES = [State.AWAITING_START, State.OPENING, State.STREAMING, State.FLUSHING]


def rejection_rows() -> list[tuple[str, str, str, str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Rejections") :]
    section = section[: section.index("\n## ", 4)]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 5 or cells[0] in ("state", "---"):
            continue
        state, source, code, close = cells[0], cells[1].strip("`"), cells[2].strip("`"), cells[3]
        rows.append((state, source, code, close))
    return rows


# The notation of the table's input column.
def _inputs(source: str, now: float) -> list[tuple[Input, float]]:
    idle = LIMITS.idle_timeout_seconds
    namespace: dict[str, Any] = {
        "MAX_FRAME": LIMITS.max_frame_bytes,
        "MAX_SAMPLES": LIMITS.max_samples,
        "IDLE": idle,
        "START": LIMITS.start_timeout_seconds,
        "text": lambda s: [TextReceived(data=s)],
        "raw": lambda b: [TextReceived(data=b)],
        "frags": lambda *parts: (
            [TextReceived(data=p, final=False) for p in parts[:-1]] + [TextReceived(data=parts[-1])]
        ),
        "frags_open": lambda *parts: [TextReceived(data=p, final=False) for p in parts],
        "start": lambda **changes: [TextReceived(data=start_text(**changes))],
        "big_text": lambda n: [
            TextReceived(data=json.dumps({"type": "end", "pad": "x" * (n - 26)}))
        ],
        "binary": lambda n: [BinaryReceived(data=b"\x01" * n)],
        "bfrags": lambda *ns: (
            [BinaryReceived(data=b"\x01" * n, final=False) for n in ns[:-1]]
            + [BinaryReceived(data=b"\x01" * ns[-1])]
        ),
        "batch": lambda *ns: [AudioBatch(frames=tuple(b"\x01" * n for n in ns))],
        "bfrags_open": lambda *ns: [BinaryReceived(data=b"\x01" * n, final=False) for n in ns],
        "fill": lambda samples: [
            BinaryReceived(data=b"\0" * min(LIMITS.max_frame_bytes, 2 * samples - off))
            for off in range(0, 2 * samples, LIMITS.max_frame_bytes)
        ],
        "tick": lambda after: [("tick", after)],
        "refused": lambda code: [Refused(code=ErrorCode(code), detail="refused by the driver")],
        "auth_rejected": lambda: [AuthRejected()],
        "engine_opened": lambda: [EngineOpened()],
        "engine_failed": lambda detail: [EngineFailed(detail=detail)],
        "engine_final": lambda: [EngineFinal(text="")],
        "shutting_down": lambda: [ShuttingDown()],
    }
    value = eval(source, namespace)  # the docs are ours; this is the table's notation
    items: list[Any] = []
    for part in value if isinstance(value, list) else [value]:
        items.extend(part if isinstance(part, list) else [part])
    out: list[tuple[Input, float]] = []
    for item in items:
        if isinstance(item, tuple):
            out.append((Tick(), now + item[1]))
        else:
            out.append((item, now))
    return out


ROWS = rejection_rows()
CASES = [
    pytest.param(state, source, code, close, id=f"{state}:{source}")
    for st, source, code, close in ROWS
    for state in (OPEN_STATES if st == "any" else [State(st)])
]


def test_table_is_substantial_and_covers_every_client_code() -> None:
    assert len(ROWS) >= 80
    documented = {code for _, _, code, _ in ROWS}
    assert {c.value for c in ErrorCode} <= documented


@pytest.mark.parametrize(("state", "source", "code", "close"), CASES)
def test_rejection_row(state: State, source: str, code: str, close: str) -> None:
    s = session_in(state, now=100.0)
    held = s.stream_held
    actions = []
    for item, at in _inputs(source, now=100.0):
        s.handle(item, at)
        actions.extend(s.pull_actions())
    assert s.state is State.CLOSED
    closes = [a for a in actions if isinstance(a, Close)]
    assert [int(c.code) for c in closes] == [int(close)]
    assert actions[-1] == closes[0], "the close is the last action"
    if code == "—":
        assert not [a for a in actions if isinstance(a, Send)]
        assert closes[0].reason == ""
    else:
        assert error_of(actions) == (code, int(close))
        assert closes[0].reason == code
    # The engine stream is released exactly when one was held.
    assert sum(isinstance(a, Release) for a in actions) == int(held)
    # Late inputs are ignored once closed.
    s.handle(BinaryReceived(data=b"\0\0"), 200.0)
    s.handle(TextReceived(data='{"type":"end"}'), 200.0)
    assert s.pull_actions() == []
