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

# atheris instruments by top-level package: all of ``talkies`` imported in this block (the
# dialects and the session), nothing imported before it.
_instrument = (
    atheris.instrument_imports(include=["talkies.dialects"])
    if atheris is not None and __name__ == "__main__" and "--write-seeds" not in sys.argv
    else contextlib.nullcontext()
)
with _instrument:
    from fuzz import _dialect
    from fuzz._dialect import Program, program
    from fuzz._realtime import RealtimePair
    from talkies.dialects.realtime import QueryError, RealtimeConfig, parse_realtime_query
    from talkies.protocol import (
        BinaryReceived,
        EngineEndpoint,
        EnginePartial,
        ErrorCode,
        Refused,
        TextReceived,
    )

__all__ = ["SEEDS", "check_one", "replay"]

CORPUS = Path(__file__).resolve().parent / "corpus" / "realtime"
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


def _update(ops: Program, beta: bool) -> bytes:
    settings: dict[str, object] = {}
    for _ in range((ops.byte() or 0) % 4):
        keys = _BETA_KEYS if beta else _KEYS
        key = keys[(ops.byte() or 0) % len(keys)]
        settings[key] = _SETTINGS[(ops.byte() or 0) % len(_SETTINGS)]
    if beta:
        return json.dumps({"type": "transcription_session.update", "session": settings}).encode()
    session = {"type": "transcription", "audio": {"input": settings}}
    return json.dumps({"type": "session.update", "session": session}).encode()


def check_one(data: bytes) -> None:
    """Run the oracle on one input; raises on a finding."""
    query, _, rest = data.partition(b"\n")
    refusal = None
    try:
        model = parse_realtime_query(query, default_model="tiny-test").model
    except QueryError as exc:
        assert exc.code in ErrorCode and exc.detail
        model = "tiny-test"
        refusal = Refused(code=exc.code, detail=exc.detail)
    pair = RealtimePair(RealtimeConfig(model=model), refusal=refusal)
    # 0, 2-7, 12, 13: see Program (odd counts of words untimed); the rest are OpenAI's and
    # the engine's results only Realtime reads: 14 a partial with a stable prefix (its words
    # need not keep it: the translator's fallback is fuzzed too), 15 a cut's answer.
    ops = Program(pair, rest, untimed=True)
    for op in ops.ops(_MAX_OPS, 16):
        if ops.step(op):
            continue
        if op == 1:
            size = (ops.byte() or 0) * 8 + ((ops.byte() or 0) & 1)
            audio = base64.b64encode(b"\x01" * size).decode()
            pair.client(
                [
                    TextReceived(
                        data=json.dumps({"type": "input_audio_buffer.append", "audio": audio})
                    )
                ]
            )
        elif op in (8, 9):
            pair.client([TextReceived(data=_update(ops, beta=op == 9))])
        elif op == 10:
            name = ("input_audio_buffer.clear", "input_audio_buffer.commit")[(ops.byte() or 0) & 1]
            pair.client([TextReceived(data=json.dumps({"type": name}))])
        elif op == 14:
            count = (ops.byte() or 0) % 8
            text, words = ops.words(count, timed=count % 2 == 0)
            stable = len(" ".join(text.split()[: (ops.byte() or 0) % (count + 1)]))
            pair.engine(EnginePartial(text=text, words=words, stable=stable))
        elif op == 15:
            count = (ops.byte() or 0) % 8
            text, words = ops.words(count, timed=count % 2 == 0)
            pair.engine(EngineEndpoint(text=text, words=words, cut=True))
            ops.next_utterance()
        else:
            pair.client([BinaryReceived(data=ops.take(4), final=(ops.byte() or 0) & 1 == 1)])
    items = pair.items()
    pair.finish()
    assert pair.closed
    for joined, completed in items.values():
        assert completed is None or joined == completed, (joined, completed)


def replay(path: str | Path) -> int:
    """Check one file, or every file under a directory; return how many were checked."""
    return _harness.replay(check_one, path)


_Q = b"intent=transcription&model=tiny-test"
# Readable seeds: a query line, then a program (see check_one for the op codes).
SEEDS: dict[str, bytes] = {
    "update_append_items.bin": _Q
    + b"\n"
    + program(8, 1, 5, 4, 0, 1, 20, 0, 4, 2, 5, 2, 4, 3, 5, 4),
    "append_first.bin": _Q + b"\n" + program(1, 10, 0, 0, 1, 10, 0, 4, 1, 5, 1),
    "beta.bin": _Q + b"\n" + program(9, 2, 0, 9, 2, 1, 0, 4, 2, 5, 2),
    "clear_mid_item.bin": _Q + b"\n" + program(8, 0, 0, 4, 3, 10, 0, 5, 5),
    "commit.bin": _Q + b"\n" + program(8, 0, 0, 10, 1),
    "manual_commit_answered.bin": _Q
    + b"\n"
    + program(8, 1, 2, 0, 0, *[1, 255, 0] * 3, 4, 3, 10, 1, 15, 3, *[1, 255, 0] * 3, 10, 1, 15, 0),
    "stable_deltas.bin": _Q + b"\n" + program(8, 0, 0, 14, 2, 1, 14, 4, 3, 14, 4, 2, 5, 4),
    "manual_update.bin": _Q + b"\n" + program(8, 1, 2, 0),
    "fragments.bin": _Q
    + b"\n"
    + program(3, 10, b'{"type":"in', 2, 24, b'put_audio_buffer.clear"}'),
    "bad_json.bin": _Q + b"\n" + program(2, 4, b"nope"),
    "binary.bin": _Q + b"\n" + program(8, 0, 0, 11, b"\x01\x02\x03\x04", 1),
    "no_intent.bin": b"model=tiny-test\n" + program(8, 0, 0, 1, 4, 0),
    "refused.bin": _Q + b"\n" + program(8, 0, 12),
    "engine_failed.bin": _Q + b"\n" + program(8, 0, 0, 4, 2, 13),
    "idle.bin": _Q + b"\n" + program(8, 0, 0, 7, 90, 7, 90),
}


def main(argv: list[str]) -> None:
    _dialect.main(argv, atheris, check_one, SEEDS, CORPUS)


if __name__ == "__main__":
    main(sys.argv)
