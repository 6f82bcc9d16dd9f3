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
    from fuzz._listen import ListenPair
    from talkies.dialects import ListenError, ListenOptions, parse_listen_query
    from talkies.protocol import AudioBatch, BinaryReceived, ErrorCode, Refused, TextReceived

__all__ = ["SEEDS", "check_one", "replay"]

CORPUS = Path(__file__).resolve().parent / "corpus" / "listen"
# Steps per input: enough for every state and a few utterances, few enough that an input
# costs well under a millisecond (run.sh asks for 100,000 of them).
_MAX_OPS = 48


def check_one(data: bytes) -> None:
    """Run the oracle on one input; raises on a finding."""
    query, _, rest = data.partition(b"\n")
    try:
        options = parse_listen_query(query, default_model="tiny-test")
    except ListenError as exc:
        assert exc.code in ErrorCode and exc.detail
        options = ListenOptions(model="tiny-test", interim_results=True, vad_events=True)
    pair = ListenPair(options)
    ops = Program(pair, rest)  # 0, 2-7, 12, 13: see Program; the rest are Deepgram's
    for op in ops.ops(_MAX_OPS, 15):
        if ops.step(op):
            continue
        if op == 1:
            size = (ops.byte() or 0) * 2 + (1 if (ops.byte() or 0) & 0x80 else 0)
            pair.client([BinaryReceived(data=b"\x01" * size)])
        elif op in (8, 9, 10):
            name = {8: "Finalize", 9: "KeepAlive", 10: "CloseStream"}[op]
            pair.client([TextReceived(data=json.dumps({"type": name}))])
        elif op == 11:
            count = (ops.byte() or 0) % 4
            pair.client([AudioBatch(frames=tuple(b"\x00\x00" * 160 for _ in range(count)))])
        else:
            pair.engine(Refused(code=ErrorCode.UNKNOWN_MODEL, detail="unknown"))
    pair.finish()
    assert pair.closed
    starts = [w["start"] for w in pair.finals()]
    assert starts == sorted(starts) and len(set(starts)) == len(starts), starts


def replay(path: str | Path) -> int:
    """Check one file, or every file under a directory; return how many were checked."""
    return _harness.replay(check_one, path)


_Q = b"model=tiny-test&encoding=linear16&interim_results=true&vad_events=true"
# Readable seeds: a query line, then a program (see check_one for the op codes).
SEEDS: dict[str, bytes] = {
    "stream_and_close.bin": _Q + b"\n" + program(0, 1, 200, 0, 4, 2, 4, 3, 10, 6, 3),
    "finalize_mid_utterance.bin": _Q + b"\n" + program(0, 4, 2, 8, 4, 4, 5, 4, 10, 6, 0),
    "keepalive_idle.bin": _Q + b"\n" + program(0, 7, 90, 9, 7, 90, 7, 120),
    "fragments.bin": _Q + b"\n" + program(0, 3, 5, b'{"typ', 2, 15, b'e":"Finalize"}xx'),
    "bad_json.bin": _Q + b"\n" + program(0, 2, 4, b"nope"),
    "unknown_type.bin": _Q + b"\n" + program(0, 2, 14, b'{"type":"end"}'),
    "bad_query.bin": b"model=tiny-test&encoding=opus\n" + program(0, 1, 4, 0),
    "utterance_end.bin": _Q + b"&utterance_end_ms=1000\n" + program(0, 4, 3, 5, 3, 4, 1, 5, 2),
    "refused.bin": _Q + b"\n" + program(12),
    "engine_failed.bin": _Q + b"\n" + program(0, 1, 10, 0, 13),
    "unaligned.bin": _Q + b"\n" + program(0, 1, 3, 0x80),
    "batch.bin": _Q + b"\n" + program(0, 11, 3, 11, 0, 10, 6, 0),
}


def main(argv: list[str]) -> None:
    _dialect.main(argv, atheris, check_one, SEEDS, CORPUS)


if __name__ == "__main__":
    main(sys.argv)
