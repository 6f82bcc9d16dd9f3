"""What every harness does around its oracle: replay saved inputs, explain one, and hand the
oracle to atheris. Each ``fuzz_<name>.py`` keeps only its instrumented imports, its oracle
(``check_one``) and, where it has one, its ``explain``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["main", "replay"]


def replay(check: Callable[[bytes], object], path: str | Path) -> int:
    """Check one file, or every file under a directory; return how many were checked. A
    finding is raised with a note naming its input."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    for file in files:
        try:
            check(file.read_bytes())
        except Exception as exc:
            exc.add_note(f"input: {file}")
            raise
    return len(files)


def main(
    argv: list[str],
    atheris: Any,
    check: Callable[[bytes], object],
    *,
    explain: Callable[[bytes], Iterable[str]] | None = None,
    hooks: Iterable[str] = (),
) -> None:
    """``--explain FILE`` prints what the harness makes of one input (where it can say);
    anything else is libFuzzer's command line. ``atheris`` is the harness's module, or None
    when it is not installed."""
    if explain is not None and len(argv) == 3 and argv[1] == "--explain":
        for line in explain(Path(argv[2]).read_bytes()):
            print(line)
        return
    if atheris is None:
        sys.exit("atheris is not installed; `pip install atheris` (Linux, Python < 3.13)")
    for hook in hooks:
        atheris.enabled_hooks.add(hook)
    atheris.Setup(argv, check)
    atheris.Fuzz()
