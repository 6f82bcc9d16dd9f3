"""Regenerate the state diagram and transition table in docs/protocol.md from the code.

python tools/gen_protocol_docs.py          # rewrite the generated blocks
python tools/gen_protocol_docs.py --check  # exit 1 if they are stale (used by the tests)
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from talkies.protocol.table import TABLE, Handler, InputKind, State  # noqa: E402

DOC = ROOT / "docs" / "protocol.md"
OPEN = [s for s in State if s is not State.CLOSED]


def _label(kind: InputKind) -> str:
    return kind.value.replace("_", " ")


# Handlers that end a session without an error; every other edge into closed is a failure.
_ENDINGS = {Handler.CANCEL, Handler.FINAL, Handler.AUTH_REJECTED, Handler.PEER_GONE}
_ENDINGS |= {Handler.SHUTDOWN}


def states_block() -> str:
    edges: dict[tuple[State, State], list[str]] = defaultdict(list)
    for state in OPEN:
        for kind in InputKind:
            rule = TABLE[state, kind]
            for target in rule.next:
                if target is state:
                    continue
                if target is not State.CLOSED or rule.handler in _ENDINGS:
                    edges[state, target].append(_label(kind))
    lines = ["```mermaid", "stateDiagram-v2", "    [*] --> awaiting_start"]
    for state in OPEN:
        for target in State:
            kinds = edges.get((state, target), [])
            if target is State.CLOSED:
                kinds = [*kinds, "errors"]
            if kinds:
                lines.append(f"    {state.value} --> {target.value}: {', '.join(kinds)}")
    lines += ["    closed --> [*]", "```"]
    return "\n".join(lines)


def table_block() -> str:
    header = "| input | " + " | ".join(s.value for s in State) + " |"
    lines = [header, "|---" * (len(State) + 1) + "|"]
    for kind in InputKind:
        cells = []
        for state in State:
            rule = TABLE[state, kind]
            if rule.handler is Handler.REJECT:
                assert rule.code is not None
                cells.append(f"✗ `{rule.code.value}`")
            elif rule.handler is Handler.IGNORE:
                cells.append("ignored")
            else:
                targets = "/".join(s.value for s in State if s in rule.next)
                cells.append(f"{rule.handler.value} → {targets}")
        lines.append(f"| {_label(kind)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(text: str) -> str:
    for name, block in (("states", states_block()), ("table", table_block())):
        pattern = re.compile(
            rf"(<!-- BEGIN GENERATED: {name} \(tools/gen_protocol_docs.py\) -->\n)"
            rf".*?(<!-- END GENERATED: {name} -->)",
            re.S,
        )
        text, count = pattern.subn(lambda m, b=block: f"{m[1]}{b}\n{m[2]}", text)
        if count != 1:
            raise SystemExit(f"docs/protocol.md: generated block {name!r} not found")
    return text


def main() -> int:
    current = DOC.read_text(encoding="utf-8")
    fresh = render(current)
    if "--check" in sys.argv[1:]:
        if fresh != current:
            print("docs/protocol.md is stale: run python tools/gen_protocol_docs.py")
            return 1
        return 0
    DOC.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
