"""The two hosts the dialect wire tests (tests/test_dialect_*_wire.py) run against, and what
their clients share.

Each test module's ``host`` fixture (:func:`host_fixture`) runs once against the standalone
server in this process and once against the ASGI app under uvicorn (tests/asgi_app.py), both
with the energy test engine (tests/fake_engine.py) and the same settings: :func:`serve`
starts either and gives its :class:`Host`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import ClientConnection

from .conftest import run_server
from .wire import drain

__all__ = ["HOSTS", "Host", "closed", "free_port", "host_fixture", "serve"]

ROOT = Path(__file__).resolve().parent.parent
HOSTS = ["standalone", "uvicorn"]


@dataclass
class Host:
    name: str
    base: str  # host:port
    path: str  # the dialect's route
    query: str  # its default query

    def url(self, query: str | None = None) -> str:
        return f"ws://{self.base}{self.path}?{self.query if query is None else query}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(name: str, path: str, query: str, **settings: Any) -> Iterator[Host]:
    """Host ``name`` with ``settings`` (run_server's keywords; under uvicorn, the same as
    ``TALKIES_*`` variables)."""
    if name == "standalone":
        with run_server(**settings) as running:
            yield Host(name, f"127.0.0.1:{running.port}", path, query)
        return
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    env |= {"PYTHONPATH": str(ROOT)}
    env |= {f"TALKIES_{key.upper()}": str(value) for key, value in settings.items()}
    command = [sys.executable, "-m", "uvicorn", "tests.asgi_app:app", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(command, cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, "uvicorn exited"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.1)
        yield Host(name, f"127.0.0.1:{port}", path, query)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def host_fixture(path: str, query: str, **settings: Any) -> Any:
    """A module's ``host`` fixture: each of :data:`HOSTS` in turn, serving ``path`` with
    ``settings``; ``query`` is its URLs' default."""

    @pytest.fixture(params=HOSTS, scope="module")
    def host(request: pytest.FixtureRequest) -> Iterator[Host]:
        with serve(request.param, path, query, **settings) as running:
            yield running

    return host


def closed(ws: ClientConnection, timeout: float = 10) -> tuple[list[dict[str, Any]], int | None]:
    """Every message until the server closes, and its close code."""
    messages, code, _ = drain(ws, timeout)
    return messages, code
