"""Atheris harness: raw HTTP request bytes through the standalone server, without sockets.

One input is what a client sends on one connection: it goes through h11, the host's head and
framing checks, the body reader and every route of the app layer, with an in-memory socket
and instant models (``fuzz._http``). Oracle: never a 5xx, never a traceback, never a hang;
every request read whole is answered, every 4xx is OpenAI's error object
(docs/reliability.md, "Fuzzing").

    bash fuzz/run.sh 180                                 # every harness, with the seeds
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_http.py fuzz/crashes/http-crash-...  # replay
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_http.py --explain FILE  # what the server sent
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

# h11 is instrumented too: its parser is half of what this harness is about.
_instrument = (
    atheris.instrument_imports(include=["talkies", "h11"], exclude=["talkies.protocol.audit"])
    if atheris is not None and __name__ == "__main__" and "--explain" not in sys.argv
    else contextlib.nullcontext()
)
with _instrument:
    from fuzz._http import HttpReport, check_http_input, decode_http_input

__all__ = ["check_one", "explain", "replay"]


def check_one(data: bytes) -> HttpReport:
    """Run the HTTP oracle on one input; raises on a finding."""
    return check_http_input(data)


def replay(path: str | Path) -> int:
    """Check one file, or every file under a directory; return how many were checked."""
    return _harness.replay(check_one, path)


def explain(data: bytes) -> list[str]:
    """How the input is read, and what the server answered."""
    decoded = decode_http_input(data)
    lines = [f"{len(decoded.chunks)} reads, {len(decoded.data)} bytes"]
    try:
        report = check_one(data)
    except AssertionError as exc:
        return [*lines, f"!! {exc}"]
    for index, sent in enumerate(report.requests):
        answer = report.responses[index] if index < len(report.responses) else None
        status = f"{answer.status} {answer.body[:160]!r}" if answer is not None else "-"
        lines.append(f"{sent.method!r} {sent.target[:80]!r} -> {status}")
    return lines


def main(argv: list[str]) -> None:
    _harness.main(argv, atheris, check_one, explain=explain)


if __name__ == "__main__":
    main(sys.argv)
