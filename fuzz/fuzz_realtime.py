"""Atheris harness: the Realtime translator (``talkies.dialects.realtime``) over the session.

The fuzz bytes are a ``/v1/realtime`` query (up to the first newline) and a program of client
events (appends of any size, session updates of either dialect with fuzzed settings, clear,
commit, raw text whole or in fragments, binary messages), engine results with timed or
untimed words, refusals, failures and ticks, run through :class:`fuzz._realtime.RealtimePair`
(the translator and the real native session, wired as the app wires them). Oracle: the query
parses or raises ``QueryError``; nothing else raises; every event has OpenAI's shape
(``check_event``), none follows the close; every committed item is completed once, and its
deltas add up to its completed transcript.

    FUZZ_HARNESSES=realtime bash fuzz/run.sh 60
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_realtime.py -runs=0 fuzz/corpus/realtime  # replay
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_realtime.py --write-seeds         # the seeds
"""

from __future__ import annotations

import base64
import contextlib
import json
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: make ``fuzz`` and ``talkies`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz import _harness

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:  # the harness stays importable (and replayable) without atheris
    atheris = None

_instrument = (
    atheris.instrument_imports(include=["talkies.dialects"])
    if atheris is not None and __name__ == "__main__" and "--write-seeds" not in sys.argv
    else contextlib.nullcontext()
)
with _instrument:
    from fuzz._realtime import RealtimePair
    from talkies.dialects.realtime import QueryError, RealtimeConfig, parse_realtime_query
    from talkies.protocol import (
        BinaryReceived,
        EngineEndpoint,
        EngineFailed,
        EngineFinal,
        EngineOpened,
        EnginePartial,
        ErrorCode,
        Refused,
        TextReceived,
        Tick,
        Word,
    )

__all__ = ["SEEDS", "check_one", "replay"]

CORPUS = Path(__file__).resolve().parent / "corpus" / "realtime"
_WORD = 0.2  # seconds per fuzzed word
# Steps per input: every state and a few items, well under a millisecond an input.
_MAX_OPS = 40
# Session settings the updates are built from (a byte picks each).
_SETTINGS: list[object] = [
    None,
    {"type": "server_vad", "silence_duration_ms": 300},
    {"type": "semantic_vad"},
    {"type": "audio/pcm", "rate": 24000},
    {"type": "audio/pcm", "rate": 16000},
    {"model": "tiny-test", "language": "en"},
    {"model": "other-model"},
    {"prompt": "x"},
    ["item.input_audio_transcription.logprobs"],
    "pcm16",
    "g711_ulaw",
    7,
]
_KEYS = ["format", "transcription", "turn_detection", "noise_reduction", "x"]
_BETA_KEYS = ["input_audio_format", "input_audio_transcription", "turn_detection", "include"]


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def byte(self) -> int | None:
        if self.at >= len(self.data):
            return None
        self.at += 1
        return self.data[self.at - 1]

    def take(self, n: int) -> bytes:
        out = self.data[self.at : self.at + n]
        self.at += len(out)
        return out


def _words(start: float, count: int, timed: bool) -> tuple[str, tuple[Word, ...]]:
    words = tuple(
        Word(word=f"w{i}", start=round(start + i * _WORD, 3), end=round(start + (i + 1) * _WORD, 3))
        for i in range(count)
    )
    return " ".join(w.word for w in words), words if timed else ()


def _update(reader: _Reader, beta: bool) -> bytes:
    settings: dict[str, object] = {}
    for _ in range((reader.byte() or 0) % 4):
        keys = _BETA_KEYS if beta else _KEYS
        key = keys[(reader.byte() or 0) % len(keys)]
        settings[key] = _SETTINGS[(reader.byte() or 0) % len(_SETTINGS)]
    if beta:
        return json.dumps({"type": "transcription_session.update", "session": settings}).encode()
    session = {"type": "transcription", "audio": {"input": settings}}
    return json.dumps({"type": "session.update", "session": session}).encode()


def check_one(data: bytes) -> None:
    """Run the oracle on one input; raises on a finding."""
    query, _, program = data.partition(b"\n")
    refusal = None
    try:
        model = parse_realtime_query(query, default_model="tiny-test").model
    except QueryError as exc:
        assert exc.code in ErrorCode and exc.detail
        model = "tiny-test"
        refusal = Refused(code=exc.code, detail=exc.detail)
    pair = RealtimePair(RealtimeConfig(model=model), refusal=refusal)
    reader = _Reader(program)
    utterance = 0.0
    longest = 0
    for _ in range(_MAX_OPS):
        op = reader.byte()
        if op is None:
            break
        op %= 14
        if op == 0:
            pair.engine(EngineOpened())
        elif op == 1:
            size = (reader.byte() or 0) * 8 + ((reader.byte() or 0) & 1)
            audio = base64.b64encode(b"\x01" * size).decode()
            pair.client(
                [
                    TextReceived(
                        data=json.dumps({"type": "input_audio_buffer.append", "audio": audio})
                    )
                ]
            )
        elif op in (2, 3):
            length = reader.byte() or 0
            pair.client([TextReceived(data=reader.take(length), final=op == 2)])
        elif op in (4, 5, 6):
            count = (reader.byte() or 0) % 8
            timed = count % 2 == 0 or op == 4
            longest = max(longest, count)
            text, words = _words(utterance, count, timed)
            kind = {4: EnginePartial, 5: EngineEndpoint, 6: EngineFinal}[op]
            pair.engine(kind(text=text, words=words))
            if op != 4:
                utterance += (longest + 1) * _WORD
                longest = 0
        elif op == 7:
            pair.now += (reader.byte() or 0) / 10
            pair.engine(Tick())
        elif op in (8, 9):
            pair.client([TextReceived(data=_update(reader, beta=op == 9))])
        elif op == 10:
            name = ("input_audio_buffer.clear", "input_audio_buffer.commit")[
                (reader.byte() or 0) & 1
            ]
            pair.client([TextReceived(data=json.dumps({"type": name}))])
        elif op == 11:
            pair.client([BinaryReceived(data=reader.take(4), final=(reader.byte() or 0) & 1 == 1)])
        elif op == 12:
            pair.engine(Refused(code=ErrorCode.CONNECTION_LIMIT, detail="full"))
        else:
            pair.engine(EngineFailed(detail="engine failed"))
    items = pair.items()
    pair.finish()
    assert pair.closed
    for joined, completed in items.values():
        assert completed is None or joined == completed, (joined, completed)


def replay(path: str | Path) -> int:
    """Check one file, or every file under a directory; return how many were checked."""
    return _harness.replay(check_one, path)


def _program(*ops: int | bytes) -> bytes:
    return b"".join(bytes([op]) if isinstance(op, int) else op for op in ops)


_Q = b"intent=transcription&model=tiny-test"
# Readable seeds: a query line, then a program (see check_one for the op codes).
SEEDS: dict[str, bytes] = {
    "update_append_items.bin": _Q
    + b"\n"
    + _program(8, 1, 5, 4, 0, 1, 20, 0, 4, 2, 5, 2, 4, 3, 5, 4),
    "append_first.bin": _Q + b"\n" + _program(1, 10, 0, 0, 1, 10, 0, 4, 1, 5, 1),
    "beta.bin": _Q + b"\n" + _program(9, 2, 0, 9, 2, 1, 0, 4, 2, 5, 2),
    "clear_mid_item.bin": _Q + b"\n" + _program(8, 0, 0, 4, 3, 10, 0, 5, 5),
    "commit.bin": _Q + b"\n" + _program(8, 0, 0, 10, 1),
    "manual_update.bin": _Q + b"\n" + _program(8, 1, 2, 0),
    "fragments.bin": _Q
    + b"\n"
    + _program(3, 10, b'{"type":"in', 2, 24, b'put_audio_buffer.clear"}'),
    "bad_json.bin": _Q + b"\n" + _program(2, 4, b"nope"),
    "binary.bin": _Q + b"\n" + _program(8, 0, 0, 11, b"\x01\x02\x03\x04", 1),
    "no_intent.bin": b"model=tiny-test\n" + _program(8, 0, 0, 1, 4, 0),
    "refused.bin": _Q + b"\n" + _program(8, 0, 12),
    "engine_failed.bin": _Q + b"\n" + _program(8, 0, 0, 4, 2, 13),
    "idle.bin": _Q + b"\n" + _program(8, 0, 0, 7, 90, 7, 90),
}


def write_seeds() -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    for name, data in SEEDS.items():
        check_one(data)
        (CORPUS / name).write_bytes(data)


def main(argv: list[str]) -> None:
    if argv[1:] == ["--write-seeds"]:
        write_seeds()
        return
    _harness.main(argv, atheris, check_one)


if __name__ == "__main__":
    main(sys.argv)
