"""What the two executed dialect tables (docs/dialects.md) share: reading a table's rows,
and the engine's words a script step names (0.2 s each)."""

from __future__ import annotations

from pathlib import Path

from talkies.protocol import Word

DOC = Path(__file__).resolve().parent.parent / "docs" / "dialects.md"


def table_rows(name: str) -> list[tuple[str, str, str]]:
    """(the event, its script, what the client gets) for each row of ``dialect-table:name``."""
    text = DOC.read_text(encoding="utf-8")
    body = text.split(f"<!-- dialect-table:{name} -->")[1].split("<!-- /dialect-table")[0]
    rows = []
    for line in body.strip().splitlines()[2:]:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, line
        rows.append((cells[0], cells[2].strip("`"), cells[3].strip("`")))
    return rows


def script_words(tokens: list[str]) -> tuple[str, tuple[Word, ...]]:
    """The text and words of a script step's tokens, 0.2 s each from 0."""
    words = tuple(
        Word(word=t, start=round(0.2 * i, 3), end=round(0.2 * (i + 1), 3))
        for i, t in enumerate(tokens)
    )
    return " ".join(tokens), words
