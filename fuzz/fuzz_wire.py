"""Atheris harness: raw client bytes through the server's WebSocket code, without sockets.

The bytes after an HTTP upgrade go through ``WsprotoChannel`` (wsproto's frame parser, the
channel's batching, pings, close handshake), ``StreamDriver`` and ``StreamSession`` exactly as
on a socket, with an in-memory socket and an instant engine (``fuzz._wire``). Oracle: the
server finishes, raising nothing, with everything released; what it wrote parses; the outcome
is accepted, or rejected with a documented close code (docs/reliability.md, "Fuzzing").

    bash fuzz/run.sh 180                                 # every harness, with the seeds
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_wire.py fuzz/crashes/wire-crash-...  # replay
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_wire.py --explain FILE  # what the server sent
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

if __name__ == "__main__":  # run as a script: make ``fuzz`` and ``talkies`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fuzz import _harness

try:
    import atheris  # type: ignore[import-untyped]
except ImportError:  # the harness stays importable (and replayable) without atheris
    atheris = None

# wsproto is instrumented too: its frame parser is half of what this harness is about.
_instrument = (
    atheris.instrument_imports(include=["talkies", "wsproto"], exclude=["talkies.protocol.audit"])
    if atheris is not None and __name__ == "__main__" and "--explain" not in sys.argv
    else contextlib.nullcontext()
)
with _instrument:
    from fuzz._wire import WireReport, check_wire_input, decode_wire_input

__all__ = ["check_one", "explain", "replay"]


def check_one(data: bytes) -> WireReport:
    """Run the wire oracle on one input; raises on a finding."""
    return check_wire_input(data)


def replay(path: str | Path) -> int:
    """Check one file, or every file under a directory; return how many were checked."""
    return _harness.replay(check_one, path)


def explain(data: bytes) -> list[str]:
    """How the input is read, and what the server answered."""
    decoded = decode_wire_input(data)
    lines = [
        f"read size {decoded.read_size}, {len(decoded.chunks)} reads, "
        f"{len(decoded.trailing)} bytes with the upgrade head"
    ]
    try:
        report = check_one(data)
    except AssertionError as exc:
        return [*lines, f"!! {exc}"]
    lines += [f"sent {text!r:.200}" for text in report.texts]
    lines.append(f"close {report.close_code} {report.close_reason!r}; outcome {report.outcome}")
    return lines


def main(argv: list[str]) -> None:
    _harness.main(argv, atheris, check_one, explain=explain)


if __name__ == "__main__":
    main(sys.argv)
