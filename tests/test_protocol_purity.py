"""talkies/protocol/ is sans-IO: no I/O, clock, randomness, threads, environment or logging."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "talkies" / "protocol"

# Everything the core may import. Anything else (time, os, socket, logging, threading,
# asyncio, random, io, ...) is a reason to fail review.
ALLOWED = {"__future__", "collections", "collections.abc", "dataclasses", "enum", "json", "math"}
ALLOWED |= {"re", "types", "typing"}
FORBIDDEN_NAMES = {"print", "open", "input", "exec", "eval", "__import__", "breakpoint"}


def _modules() -> list[Path]:
    return sorted(PROTOCOL.glob("*.py"))


def test_protocol_imports_only_pure_modules() -> None:
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # our own modules, relative: fine
                    continue
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name in ALLOWED, f"{path.name} imports {name}"


def test_protocol_calls_no_io_builtins() -> None:
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
                raise AssertionError(f"{path.name}:{node.lineno} uses {node.id}")


def test_importing_the_protocol_pulls_in_no_io_modules() -> None:
    code = (
        "import sys; before = set(sys.modules); import talkies.protocol; "
        "new = set(sys.modules) - before; "
        "bad = {m for m in new if m.split('.')[0] in "
        "{'socket','threading','asyncio','logging','time','random','os','anyio','selectors'}}; "
        "print(sorted(bad))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
