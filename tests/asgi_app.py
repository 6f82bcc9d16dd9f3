"""The ASGI app with the fake engine, for running under uvicorn and hypercorn in tests."""

from __future__ import annotations

import os

from talkies.config import Settings
from talkies.transport.asgi import create_app

from .fake_engine import FakeProvider

app = create_app(
    Settings.from_env(os.environ).with_overrides(stream_max_frame_bytes=4096),
    FakeProvider(),
)
