"""Atheris harness: the Deepgram translator (``talkies.dialects.deepgram``) over the session.

The fuzz bytes are a ``/v1/listen`` query (up to the first newline) and a program of client
messages (audio, text whole or in fragments, KeepAlive, Finalize, CloseStream), engine
results with timed words, refusals, failures and ticks, run through :class:`fuzz._listen.
ListenPair` (the translator and the real native session, wired as the app wires them).
Oracle: the query parses or raises ``ListenError``; nothing else raises; every message has
Deepgram's shape (``check_message``), none follows the ``Error`` or ``Metadata`` that ends a
stream or the close; and no word is sent final twice (the final words' start times only
grow).

    FUZZ_HARNESSES=listen bash fuzz/run.sh 60
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_listen.py fuzz/corpus/listen   # replay
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_listen.py --write-seeds       # the seed corpus
"""

from __future__ import annotations

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
    from fuzz._listen import ListenPair
    from talkies.dialects import ListenError, ListenOptions, parse_listen_query
    from talkies.protocol import (
        AudioBatch,
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

CORPUS = Path(__file__).resolve().parent / "corpus" / "listen"
_WORD = 0.2  # seconds per fuzzed word
# Steps per input: enough for every state and a few utterances, few enough that an input
# costs well under a millisecond (run.sh asks for 100,000 of them).
_MAX_OPS = 48


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


def _words(start: float, count: int) -> tuple[str, tuple[Word, ...]]:
    words = tuple(
        Word(word=f"w{i}", start=round(start + i * _WORD, 3), end=round(start + (i + 1) * _WORD, 3))
        for i in range(count)
    )
    return " ".join(w.word for w in words), words


def check_one(data: bytes) -> None:
    """Run the oracle on one input; raises on a finding."""
    query, _, program = data.partition(b"\n")
    try:
        options = parse_listen_query(query, default_model="tiny-test")
    except ListenError as exc:
        assert exc.code in ErrorCode and exc.detail
        options = ListenOptions(model="tiny-test", interim_results=True, vad_events=True)
    pair = ListenPair(options)
    reader = _Reader(program)
    utterance = 0.0  # where the open utterance's words start
    longest = 0
    for _ in range(_MAX_OPS):
        op = reader.byte()
        if op is None:
            break
        op %= 15
        if op == 0:
            pair.engine(EngineOpened())
        elif op == 1:
            size = (reader.byte() or 0) * 2 + (1 if (reader.byte() or 0) & 0x80 else 0)
            pair.client([BinaryReceived(data=b"\x01" * size)])
        elif op in (2, 3):
            length = reader.byte() or 0
            pair.client([TextReceived(data=reader.take(length), final=op == 2)])
        elif op in (4, 5, 6):
            count = (reader.byte() or 0) % 8
            longest = max(longest, count)
            text, words = _words(utterance, count)
            kind = {4: EnginePartial, 5: EngineEndpoint, 6: EngineFinal}[op]
            pair.engine(kind(text=text, words=words))
            if op != 4:
                utterance += (longest + 1) * _WORD
                longest = 0
        elif op == 7:
            pair.now += (reader.byte() or 0) / 10
            pair.engine(Tick())
        elif op in (8, 9, 10):
            name = {8: "Finalize", 9: "KeepAlive", 10: "CloseStream"}[op]
            pair.client([TextReceived(data=json.dumps({"type": name}))])
        elif op == 11:
            count = (reader.byte() or 0) % 4
            pair.client([AudioBatch(frames=tuple(b"\x00\x00" * 160 for _ in range(count)))])
        elif op == 12:
            pair.engine(Refused(code=ErrorCode.CONNECTION_LIMIT, detail="full"))
        elif op == 13:
            pair.engine(EngineFailed(detail="engine failed"))
        else:
            pair.engine(Refused(code=ErrorCode.UNKNOWN_MODEL, detail="unknown"))
    pair.finish()
    assert pair.closed
    starts = [w["start"] for w in pair.finals()]
    assert starts == sorted(starts) and len(set(starts)) == len(starts), starts


def replay(path: str | Path) -> int:
    """Check one file, or every file under a directory; return how many were checked."""
    return _harness.replay(check_one, path)


def _program(*ops: int | bytes) -> bytes:
    return b"".join(bytes([op]) if isinstance(op, int) else op for op in ops)


_Q = b"model=tiny-test&encoding=linear16&interim_results=true&vad_events=true"
# Readable seeds: a query line, then a program (see check_one for the op codes).
SEEDS: dict[str, bytes] = {
    "stream_and_close.bin": _Q + b"\n" + _program(0, 1, 200, 0, 4, 2, 4, 3, 10, 6, 3),
    "finalize_mid_utterance.bin": _Q + b"\n" + _program(0, 4, 2, 8, 4, 4, 5, 4, 10, 6, 0),
    "keepalive_idle.bin": _Q + b"\n" + _program(0, 7, 90, 9, 7, 90, 7, 120),
    "fragments.bin": _Q + b"\n" + _program(0, 3, 5, b'{"typ', 2, 15, b'e":"Finalize"}xx'),
    "bad_json.bin": _Q + b"\n" + _program(0, 2, 4, b"nope"),
    "unknown_type.bin": _Q + b"\n" + _program(0, 2, 14, b'{"type":"end"}'),
    "bad_query.bin": b"model=tiny-test&encoding=opus\n" + _program(0, 1, 4, 0),
    "utterance_end.bin": _Q + b"&utterance_end_ms=1000\n" + _program(0, 4, 3, 5, 3, 4, 1, 5, 2),
    "refused.bin": _Q + b"\n" + _program(12),
    "engine_failed.bin": _Q + b"\n" + _program(0, 1, 10, 0, 13),
    "unaligned.bin": _Q + b"\n" + _program(0, 1, 3, 0x80),
    "batch.bin": _Q + b"\n" + _program(0, 11, 3, 11, 0, 10, 6, 0),
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
