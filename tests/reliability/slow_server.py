"""The standalone server over the fake engine, for the slow-engine load test:
``python -m tests.reliability.slow_server PORT`` (``slow-test``: 0.5 s per decode call, a 5 s
stream buffer; ``tiny-test``: instant; 16 streams server-wide)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import anyio

from talkies.config import Settings
from talkies.transport.server import Server

from ..fake_engine import FakeProvider


def main() -> None:
    port = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as data:
        settings = Settings(
            host="127.0.0.1",
            port=port,
            data_dir=Path(data),
            stream_max_connections=16,
            stream_max_frame_bytes=4096,
        )
        anyio.run(Server(settings, FakeProvider(slow_delay=0.5)).serve)


if __name__ == "__main__":
    main()
