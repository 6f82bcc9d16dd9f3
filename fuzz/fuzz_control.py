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
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for file in files:
        try:
            check_one(file.read_bytes())
        except Exception as exc:
            exc.add_note(f"input: {file}")
            raise
    return len(files)


def main(argv: list[str]) -> None:
    if atheris is None:
        sys.exit("atheris is not installed; `pip install atheris` (Linux, Python < 3.13)")
    atheris.enabled_hooks.add("RegEx")
    atheris.enabled_hooks.add("str")
    atheris.Setup(argv, check_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
