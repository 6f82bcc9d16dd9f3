"""The standalone server with few file descriptors: ``python -m tests.reliability.fd_server
PORT LIMIT`` (the fd-exhaustion row of docs/reliability.md)."""

from __future__ import annotations

import logging
import resource
import sys
import tempfile

import anyio

from talkies.config import Settings
from talkies.logs import configure
from talkies.transport.server import Server

from ..fake_engine import FakeProvider


def main() -> None:
    port, limit = int(sys.argv[1]), int(sys.argv[2])
    resource.setrlimit(
        resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    )
    configure("info")
    logging.getLogger("mcp").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as data:
        settings = Settings(host="127.0.0.1", port=port, data_dir=data)
        anyio.run(Server(settings, FakeProvider()).serve)


if __name__ == "__main__":
    main()
