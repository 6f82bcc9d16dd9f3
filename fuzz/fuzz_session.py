"""Atheris harness: whole ``StreamSession`` lifetimes.

The fuzz bytes decode (``fuzz._oracle.decode_program``) into a program of client messages,
fragments, engine answers in any order, transport facts and ticks with an increasing clock.
A session runs it with every message whole, a replica with every message in fragments; both
are audited after every input (``talkies.protocol.audit.SessionAudit.step``) and must act
identically.

    bash fuzz/run.sh 180                                 # every harness, with the seeds
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_session.py fuzz/crashes/session-crash-...  # replay
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_session.py --explain FILE  # decoded steps, actions
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

# The code under test only: instrumenting the oracle and the auditor as well (as before) made
# every input a third slower for coverage of the checks rather than of the session, and kept
# the harness under the 100,000 inputs run.sh requires in a CI minute.
_instrument = (
    atheris.instrument_imports(include=["talkies"], exclude=["talkies.protocol.audit"])
    if atheris is not None and __name__ == "__main__" and "--explain" not in sys.argv
    else contextlib.nullcontext()
)
with _instrument:
    from fuzz._oracle import FUZZ_LIMITS, SessionReport, check_session_program, decode_program
    from talkies.protocol import StreamSession
    from talkies.protocol.audit import SessionAudit

__all__ = ["check_one", "explain", "replay"]


def check_one(data: bytes) -> SessionReport:
    """Run the session oracle on one input; raises on a finding."""
    return check_session_program(data)


def replay(path: str | Path) -> int:
    """Check one file, or every file under a directory; return how many were checked."""
    return _harness.replay(check_one, path)


def explain(data: bytes) -> list[str]:
    """The decoded program, one line per input with the primary session's actions."""
    lines: list[str] = []
    session, audit = StreamSession(FUZZ_LIMITS, now=0.0), SessionAudit()
    for index, step in enumerate(decode_program(data)):
        lines.append(f"{index:3d} t={step.now:<6g} {step.label}")
        for event in step.whole:
            try:
                actions = audit.step(session, event, step.now)
            except AssertionError as exc:
                lines.append(f"      !! {exc}")
                return lines
            lines.append(f"      {event!r:.100} -> {actions!r:.300}")
        if len(step.split) > 1:
            lines.append(f"      (replica: {len(step.split)} fragments)")
    return lines


def main(argv: list[str]) -> None:
    _harness.main(argv, atheris, check_one, explain=explain)


if __name__ == "__main__":
    main(sys.argv)
