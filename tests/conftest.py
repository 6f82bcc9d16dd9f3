"""Shared fixtures: a real server on a loopback port, driven from the test's own thread."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from talkies.config import Settings
from talkies.transport.server import Server, ServerOptions

from .fake_engine import FakeProvider

TEST_SETTINGS = {
    "host": "127.0.0.1",
    "port": 0,
    "stream_max_frame_bytes": 4096,
    "stream_max_duration": 10.0,
    "stream_idle_timeout": 30.0,
}


@dataclass
class RunningServer:
    server: Server
    provider: Any
    portal: BlockingPortal

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/audio/transcriptions/stream"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def active(self) -> int:
        return self.portal.call(lambda: self.server.active_streams)

    def connections(self) -> int:
        """Open TCP connections, HTTP or WebSocket, as the server counts them."""
        return self.portal.call(lambda: self.server.connections)

    def wait_connections(self, expected: int = 0, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self.connections() != expected:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.connections()} connections, expected {expected}")
            time.sleep(0.01)

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Wait until no stream holds a slot and every engine stream was closed."""
        deadline = time.monotonic() + timeout
        stats = getattr(self.provider, "stats", None)  # the fake engine counts its streams
        while time.monotonic() < deadline:
            if self.active() == 0 and (stats is None or stats.opened == stats.closed):
                return
            time.sleep(0.01)
        raise AssertionError(f"slots still held: active={self.active()}, engine stats={stats}")


@contextmanager
def run_server(
    provider: Any = None,
    options: ServerOptions | None = None,
    ssl_context: Any = None,
    **settings: Any,
) -> Iterator[RunningServer]:
    provider = provider if provider is not None else FakeProvider()
    server = Server(
        Settings(**{**TEST_SETTINGS, **settings}),
        provider,
        options=options,
        ssl_context=ssl_context,
    )
    with start_blocking_portal() as portal:
        future, _ = portal.start_task(server.serve)
        try:
            yield RunningServer(server, provider, portal)
        finally:
            portal.call(server.shutdown, 0.5)
            future.result(timeout=10)


@pytest.fixture
def server() -> Iterator[RunningServer]:
    with run_server() as running:
        yield running


@pytest.fixture
def server_factory() -> Callable[..., Any]:
    return run_server


# The two HTTP hosts (talkies' own server, uvicorn) for the shared tests/test_http_*.py.
from .http_hosts import host, http_data  # noqa: E402, F401
