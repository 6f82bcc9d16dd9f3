"""Atheris harness: the control-message parser (``talkies.protocol.messages``).

Oracle (``fuzz._oracle.check_control_message``): for any bytes, ``parse_envelope`` and then
``parse_start``/``check_control`` return or raise ``ProtocolError`` with a 4400 code; over
4096 bytes is always ``message_too_large``; a valid start re-serialised parses to the same
options; the session answers the same bytes exactly as the parser predicts.

    bash fuzz/run.sh 180                                 # every harness, with the seeds
    PYTHONPATH=. .venv/bin/python fuzz/fuzz_control.py fuzz/crashes/control-crash-...  # replay
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

_instrument = (
    atheris.instrument_imports(include=["talkies", "fuzz"])
    if atheris is not None and __name__ == "__main__" and "--explain" not in sys.argv
    else contextlib.nullcontext()
)
with _instrument:
    from fuzz._oracle import check_control_message

__all__ = ["check_one", "replay"]


def check_one(data: bytes) -> None:
    """Run the control-message oracle on one input; raises on a finding."""
    check_control_message(data)


def replay(path: str | Path) -> int:
    """Check one file, or every file under a directory; return how many were checked."""
    return _harness.replay(check_one, path)


def main(argv: list[str]) -> None:
    _harness.main(argv, atheris, check_one, hooks=("RegEx", "str"))


if __name__ == "__main__":
    main(sys.argv)
