"""The hostile-input table of docs/reliability.md, read as the tests execute it.

A row is ``| case | host | input | outcome | notes |``. ``case`` names the runner
(tests/reliability/runners*.py), ``host`` where it runs, ``input`` is prose for the reader, and
``outcome`` is a ``;``-separated list of clauses in the notation below, each a fact the runner
must observe. A runner reports the facts it measured as a dict; every clause must find its
fact and hold, and every fact must be stated by a clause, so the cell says exactly what was
checked.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
SECTION = "## Hostile input"
HOSTS = ("in-process", "standalone", "uvicorn", "both", "asgi", "module", "reference", "process")


@dataclass(frozen=True)
class Row:
    case: str
    host: str
    input: str
    outcome: str
    notes: str

    @property
    def id(self) -> str:
        return f"{self.case}[{self.host}]"


@dataclass(frozen=True)
class Clause:
    text: str
    key: str  # the fact it is about
    holds: Callable[[Any], bool]


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def _all_in(allowed: set[Any]) -> Callable[[Any], bool]:
    return lambda seen: bool(seen) and all(item in allowed for item in seen)


# Each pattern is the whole clause. Facts that are lists must be non-empty: a runner that
# observed nothing has not shown anything.
_CLAUSES: list[tuple[str, Callable[[re.Match[str]], tuple[str, Callable[[Any], bool]]]]] = [
    (
        r"status (\d{3}(?:\|\d{3})*)",
        lambda m: ("status", _all_in({int(s) for s in m[1].split("|")})),
    ),
    (
        r"close (\d{4})(?: (\w+))?",
        lambda m: ("close", _all_in({(int(m[1]), m[2] or "—")})),
    ),
    (r"closed ≤ ([\d.]+) s", lambda m: ("closed_s", lambda s: s <= _number(m[1]))),
    (
        r"closed between ([\d.]+) and ([\d.]+) s",
        lambda m: ("closed_s", lambda s: _number(m[1]) <= s <= _number(m[2])),
    ),
    (r"open ≥ ([\d.]+) s", lambda m: ("open_s", lambda s: s >= _number(m[1]))),
    (
        r"others served ≤ ([\d.]+) s",
        lambda m: ("others_s", lambda v: isinstance(v, float) and v <= _number(m[1])),
    ),
    (r"stream served", lambda m: ("stream_served", lambda v: v is True)),
    (r"response cut short", lambda m: ("cut_short", lambda v: v is True)),
    (r"every body whole", lambda m: ("torn", lambda v: v[1] > 0 and v[0] == 0)),
    (r"nothing in use removed", lambda m: ("in_use_removed", lambda v: v[1] > 0 and v[0] == [])),
    (r"survives", lambda m: ("survives", lambda v: v is True)),
    (r"slots freed", lambda m: ("slots_freed", lambda v: v is True)),
    (r"models unloaded", lambda m: ("unloaded", lambda v: v is True)),
    (
        r"(finished in grace|dropped at grace): ([\w-]+(?:, [\w-]+)*)",
        lambda m: (m[1].split()[0], lambda v: v == set(m[2].split(", "))),
    ),
    (
        r"exit (\d+) ≤ ([\d.]+) s",
        lambda m: ("exit", lambda v: v[0] == int(m[1]) and v[1] <= _number(m[2])),
    ),
    (r"accepted", lambda m: ("accepted", lambda v: v is True)),
    (r"nothing left behind", lambda m: ("left_behind", lambda v: v == [])),
    (r"nothing leaked", lambda m: ("leaked", lambda v: v == [])),
    (r"every ping answered", lambda m: ("pings", lambda v: v[0] > 0 and v[0] == v[1])),
    (
        r"memory growth ≤ ([\d.]+) MB",
        lambda m: ("memory_growth_mb", lambda v: v <= _number(m[1])),
    ),
    (r"memory kept ≤ ([\d.]+) MB", lambda m: ("memory_kept_mb", lambda v: v <= _number(m[1]))),
    (r"heap peak ≤ ([\d.]+) MB", lambda m: ("heap_peak_mb", lambda v: v <= _number(m[1]))),
    (r"heap kept ≤ ([\d.]+) MB", lambda m: ("heap_kept_mb", lambda v: v <= _number(m[1]))),
    (r"pushed back ≤ ([\d.]+) MB", lambda m: ("pushed_mb", lambda v: v <= _number(m[1]))),
    (r"attempts ([\d,]+)", lambda m: ("attempts", lambda v: v == _number(m[1]))),
    (r"descriptors released", lambda m: ("descriptors_leaked", lambda v: v == 0)),
    (r"never out of descriptors", lambda m: ("out_of_descriptors", lambda v: v == 0)),
    (r"refused (\w+)", lambda m: ("refused", _all_in({m[1]}))),
    (r"hmac\.compare_digest only", lambda m: ("comparisons", lambda v: v == {"compare_digest"})),
    (
        r"see ((?:[\w/.]+::\w+)(?:, [\w/.]+::\w+)*)",
        lambda m: ("see", lambda v: v == set(m[1].split(", "))),
    ),
]


def parse_outcome(cell: str) -> list[Clause]:
    clauses = []
    for text in (part.strip() for part in cell.split(";")):
        for pattern, build in _CLAUSES:
            match = re.fullmatch(pattern, text)
            if match is not None:
                key, holds = build(match)
                clauses.append(Clause(text, key, holds))
                break
        else:
            raise ValueError(f"unknown outcome clause {text!r}")
    keys = [c.key for c in clauses]
    if len(keys) != len(set(keys)):
        raise ValueError(f"two clauses about the same fact in {cell!r}")
    return clauses


def rows(doc: Path = DOC, heading: str = SECTION) -> list[Row]:
    """The rows of the table under ``heading`` (the hostile-input table, or another one
    written the same way: the Faults table)."""
    text = doc.read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    end = section.find("\n## ", len(heading))
    section = section if end < 0 else section[:end]
    out = []
    for line in section.splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) != 5 or cells[0] in ("case", "---") or set(cells[0]) <= {"-"}:
            continue
        case, host = cells[0].strip("`"), cells[1]
        if host not in HOSTS:
            raise ValueError(f"{case}: unknown host {host!r}")
        out.append(Row(case, host, cells[2], cells[3].replace("\\|", "|"), cells[4]))
    return out


def check(row: Row, facts: dict[str, Any]) -> None:
    """Every clause of the row holds on the facts, and every fact is stated."""
    clauses = parse_outcome(row.outcome)
    stated = {c.key for c in clauses}
    unstated = set(facts) - stated
    assert not unstated, f"{row.id}: observed but not in the table: {unstated} {facts!r:.500}"
    for clause in clauses:
        assert clause.key in facts, f"{row.id}: the runner did not observe {clause.text!r}"
        seen = facts[clause.key]
        assert clause.holds(seen), f"{row.id}: {clause.text!r} does not hold: {seen!r:.800}"
