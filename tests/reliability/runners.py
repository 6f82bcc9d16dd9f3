"""The registry of runners: one function per ``case`` of the hostile-input table.

A runner gets a :class:`Target` (the row, the host process when the row runs on one, a scratch
folder) and returns the facts it observed (tests/reliability/table.py checks them against the
row's outcome). Runners live in runners_wire.py (WebSocket and connection-level cases) and
runners_http.py (HTTP bodies, paths, tokens); importing this module registers them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..conftest import RunningServer, run_server
from ..fake_engine import FakeProvider
from ..http_hosts import HttpHost
from .table import Row

Facts = dict[str, Any]
Runner = Callable[["Target"], Facts]
RUNNERS: dict[str, Runner] = {}
# Where each runner may run: a row naming another host is a mistake in the table.
RUNNER_HOSTS: dict[str, set[str]] = {}


@dataclass
class Target:
    row: Row
    tmp: Path
    host: HttpHost | None = None  # for rows on "standalone", "uvicorn" or "both"

    @property
    def host_name(self) -> str:
        return self.host.name if self.host is not None else self.row.host


def runner(case: str, *hosts: str) -> Callable[[Runner], Runner]:
    def register(fn: Runner) -> Runner:
        assert case not in RUNNERS, f"two runners for {case}"
        RUNNERS[case] = fn
        RUNNER_HOSTS[case] = set(hosts)
        return fn

    return register


@contextmanager
def server(tmp: Path, **settings: Any) -> Iterator[RunningServer]:
    """The standalone server in-process, with the fake engine and a scratch data folder;
    streams may run for two minutes (the test default is 10 s)."""
    settings = {"stream_max_duration": 120.0, "data_dir": tmp / "data", **settings}
    options = settings.pop("options", None)
    with run_server(provider=FakeProvider(), options=options, **settings) as running:
        yield running


# Register every runner.
from . import runners_files, runners_http, runners_memory, runners_wire  # noqa: E402, F401
