"""Generated documentation stays in step with the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_protocol_doc_tables_are_current() -> None:
    result = subprocess.run(
        [sys.executable, "tools/gen_protocol_docs.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def _setup_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[
        readme.index("## Set up") : readme.index("\n## ", readme.index("## Set up") + 1)
    ]
    blocks = section.split("```sh\n")[1:]
    return [b.split("\n```", 1)[0].strip() for b in blocks]


def test_readme_has_exactly_two_setup_commands() -> None:
    commands = _setup_commands()
    assert len(commands) == 2
    assert all("\n" not in c for c in commands)


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert _setup_commands()[1] in ci
