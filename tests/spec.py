"""The contract as the tests read it: the project's copy of the spec, checked against shared/."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC_PATH = ROOT / "spec" / "streaming.md"
SHARED_SPEC_PATH = ROOT.parent / "shared" / "spec" / "streaming.md"


def spec_text() -> str:
    return SPEC_PATH.read_text(encoding="utf-8")


def spec_error_codes() -> dict[str, int]:
    """``code -> close code`` as the spec's sentence "The code values are ..." states them."""
    text = spec_text()
    lead = "The code values are"
    sentence = text[text.index(lead) + len(lead) :].split("\n", 1)[0]
    codes: dict[str, int] = {}
    # Groups look like "a, b, c (all 4400)" or "x and y (4409)" or "z (4404)".
    for group, close in re.findall(r"([a-z_,\s]+?)\s*\((?:all\s+)?(\d{4})\)", sentence):
        names = re.findall(r"[a-z]+(?:_[a-z]+)*", group.replace(" and ", ", "))
        for name in names:
            codes[name] = int(close)
    return codes


def spec_close_codes() -> dict[int, str]:
    """The close-code table: ``code -> meaning``."""
    text = spec_text()
    return {int(c): m.strip() for c, m in re.findall(r"^(\d{4}) (.+)$", text, flags=re.M)}


def spec_example_client() -> str:
    """The spec's "Minimal Python file client", verbatim."""
    text = spec_text()
    start = text.index("import asyncio\n")
    end = text.index("asyncio.run(main())", start) + len("asyncio.run(main())")
    return text[start:end] + "\n"
