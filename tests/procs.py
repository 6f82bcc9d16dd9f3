"""Child processes, read from ``/proc``: for tests that check what a process left behind."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Child:
    pid: int
    comm: str  # the kernel's short name (``/proc/PID/comm``), e.g. "ffmpeg"
    args: tuple[str, ...]  # the command line as it reads now (nginx rewrites its own)

    @property
    def title(self) -> str:
        """The command line as one string, as ``ps`` shows it."""
        return " ".join(self.args)


def children(parent: int | None = None) -> list[Child]:
    """The children of ``parent`` (default: this process), running or ended and not yet
    reaped. A process that ends while it is read is left out."""
    parent = os.getpid() if parent is None else parent
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == parent:
            # NUL-separated, and NUL-padded where a process rewrote it (nginx); empty for a
            # zombie.
            args = tuple(arg for arg in cmdline.split("\0") if arg)
            found.append(Child(int(entry.name), comm, args))
    return found
