"""The runners of the Faults table of docs/reliability.md: one function per ``case``.

A runner gets a :class:`FaultTarget` (the row, a scratch folder, the ``process`` host when the
row runs on the shared one) and returns the facts it observed, which tests/reliability/table.py
checks against the row's outcome.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from ..fake_engine import speech, wav_bytes
from ..wire import START, drain, open_stream, ws_connect
from .clients import FrameReader, bystanders, connect, frame, read_until_ready, upgrade
from .fault_server import POISON
from .runners_http import _changes
from .table import Row

ROOT = Path(__file__).resolve().parents[2]
GRACE = 4.0
# The sigterm row's: its short speech must finish in it even on a loaded 2-core machine (32
# steps of the tiny Qwen3-TTS took over 4 s there), its endless one never can.
SIGTERM_GRACE = 8.0
WORD = speech(0.25)  # one word of the energy recognizer

Facts = dict[str, Any]


@dataclass
class FaultHost:
    """``talkies serve`` over the fault doubles, as a process (reliability/fault_server.py)."""

    port: int
    data_dir: Path
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/audio/transcriptions/stream"

    def models(self) -> dict[str, dict[str, Any]]:
        rows = httpx.get(self.url + "/v1/models", timeout=10).json()["data"]
        return {row["id"]: row for row in rows}

    def active_streams(self) -> float:
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("talkies_active_streams "):
                return float(line.split()[1])
        raise AssertionError("no talkies_active_streams in /metrics")

    def wait_in_use(self, slug: str, expected: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while (now := self.models()[slug]["in_use"]) != expected:
            assert time.monotonic() < deadline, f"{slug}: in_use {now}, expected {expected}"
            time.sleep(0.02)


@dataclass
class FaultTarget:
    row: Row
    tmp: Path
    host: FaultHost | None = None

    @property
    def process(self) -> FaultHost:
        assert self.host is not None, f"{self.row.id}: no host process"
        return self.host


Runner = Callable[[FaultTarget], Facts]
FAULT_RUNNERS: dict[str, Runner] = {}
FAULT_RUNNER_HOSTS: dict[str, str] = {}


def runner(case: str, host: str) -> Callable[[Runner], Runner]:
    def register(fn: Runner) -> Runner:
        assert case not in FAULT_RUNNERS, f"two runners for {case}"
        FAULT_RUNNERS[case] = fn
        FAULT_RUNNER_HOSTS[case] = host
        return fn

    return register


# -- the host process ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def fault_host(data_dir: Path, log: Path, *, grace: float = GRACE) -> Iterator[FaultHost]:
    """Start ``talkies serve`` over the fault doubles; kill it after the block if it still
    runs (a row that signals it waits for its exit itself)."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    env |= {
        "PYTHONPATH": str(ROOT),
        "TALKIES_DATA_DIR": str(data_dir),
    }
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.reliability.fault_server",
                "--port",
                str(port),
                "--grace",
                f"{grace:g}",
            ],
            cwd=ROOT,
            env=env,
            stderr=err,
        )
    host = FaultHost(port, data_dir, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"the fault host exited with {proc.returncode}"
            with suppress(httpx.HTTPError):
                if httpx.get(host.url + "/healthz").status_code == 200:
                    break
            assert time.monotonic() < deadline, "the fault host did not start"
            time.sleep(0.1)
        yield host
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- facts common to the rows -------------------------------------------------------------------


def slots_freed(host: FaultHost, timeout: float = 10.0) -> bool | str:
    """Every model slot and server-wide stream slot given back, nothing pinned (or what was
    still held after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        models = host.models()
        held = {slug: row["in_use"] for slug, row in models.items() if row["in_use"]}
        pinned = [slug for slug, row in models.items() if row["pinned"]]
        streams = host.active_streams()
        if not held and not pinned and streams == 0:
            return True
        if time.monotonic() > deadline:
            return f"in use {held}, pinned {pinned}, active streams {streams}"
        time.sleep(0.05)


def next_stream(url: str) -> bool | str:
    """A stream on ``energy-test`` served from ready to its final and 1000."""
    ws = open_stream(url, model="energy-test")
    for _ in range(4):
        ws.send(speech(0.125))
    ws.send(json.dumps({"type": "end"}))
    events, code, _ = drain(ws)
    kinds = [e["type"] for e in events]
    if code == 1000 and kinds == ["partial", "partial", "final", "stats"]:
        return True
    return f"next stream: {kinds} {code}"


def survives(host: FaultHost) -> bool | str:
    if host.proc.poll() is not None:
        return f"exited with {host.proc.returncode}"
    status = httpx.get(host.url + "/healthz", timeout=10).status_code
    if status != 200:
        return f"/healthz {status}"
    return next_stream(host.ws_url)


def descriptors(host: FaultHost) -> int:
    return len(os.listdir(f"/proc/{host.proc.pid}/fd"))


def descriptors_leaked(host: FaultHost, before: int, timeout: float = 3.0) -> int:
    """How many more descriptors the host holds than ``before`` (given ``timeout`` s to let
    go of the sockets it is closing)."""
    deadline = time.monotonic() + timeout
    while (now := descriptors(host)) > before and time.monotonic() < deadline:
        time.sleep(0.05)
    return max(0, now - before)


def _after_fault(host: FaultHost, facts: Facts, fds: int | None = None) -> Facts:
    facts["slots_freed"] = slots_freed(host)
    if fds is not None:
        facts["descriptors_leaked"] = descriptors_leaked(host, fds)
    facts["survives"] = survives(host)
    return facts


def _outcome(events: list[dict[str, Any]], code: int | None) -> tuple[int | None, str]:
    errors = [e["code"] for e in events if e["type"] == "error"]
    return code, errors[-1] if errors else "—"


# -- engine faults ------------------------------------------------------------------------------


def _poisoned_stream(host: FaultHost, model: str) -> tuple[list[dict[str, Any]], int | None, float]:
    """A word (its partial awaited), then a frame holding the poison: what came after it, the
    close code, and the seconds from the poison to the close."""
    ws = open_stream(host.ws_url, model=model)
    ws.send(WORD)
    first = json.loads(ws.recv(timeout=10))
    assert first["type"] == "partial", first
    sent = time.monotonic()
    ws.send(WORD + POISON)
    events, code, _ = drain(ws, timeout=20)
    return events, code, round(time.monotonic() - sent, 3)


@runner("engine-raises", "process")
def engine_raises(target: FaultTarget) -> Facts:
    host = target.process
    fds = descriptors(host)
    events, code, seconds = _poisoned_stream(host, "raise-test")
    return _after_fault(host, {"close": [_outcome(events, code)], "closed_s": seconds}, fds)


@runner("engine-hangs", "process")
def engine_hangs(target: FaultTarget) -> Facts:
    host = target.process
    fds = descriptors(host)
    with bystanders(host.port, model="hang-test") as others:
        time.sleep(0.5)
        events, code, seconds = _poisoned_stream(host, "hang-test")
        time.sleep(1.0)
    detail = events[-1].get("detail") if events else None
    assert detail == "the speech engine did not answer within 1 s", events
    facts = {"close": [_outcome(events, code)], "closed_s": seconds, "others_s": others.worst()}
    return _after_fault(host, facts, fds)


# -- native models that end their process -------------------------------------------------------


def _load_check_refused(target: FaultTarget, entry: Any, expect: dict[str, str]) -> Facts:
    """Under each TALKIES_ENGINE_ISOLATION (``expect``: the detail each gives), two starts:
    both refused the same way by a server still serving, nothing held or loaded."""
    from talkies.config import Settings
    from talkies.engines.pool import ModelPool

    from ..conftest import run_server

    outcomes = []
    healthy = freed = True
    for isolation, detail in expect.items():
        data = target.tmp / f"data-{isolation}"
        settings = Settings(data_dir=data, engine_isolation=isolation)
        pool = ModelPool({entry.slug: entry}, settings, validate=True)
        with run_server(provider=pool) as server:
            for _ in range(2):  # the second: the same answer, from a server still serving
                ws = ws_connect(server.url)
                ws.send(json.dumps({**START, "model": entry.slug}))
                events, code, _ = drain(ws, timeout=60)
                assert detail in (events[-1].get("detail") or ""), events
                outcomes.append(_outcome(events, code))
            healthy &= httpx.get(f"http://127.0.0.1:{server.port}/healthz").status_code == 200
            server.wait_idle()
            freed &= pool.in_use(entry.slug) == 0 and pool.pinned is None and pool.loaded() == []
    same = len(set(outcomes)) == 1
    return {"close": outcomes[:2], "survives": healthy and same and freed}


@runner("native-exit-on-load", "in-process")
def native_exit_on_load(target: FaultTarget) -> Facts:
    import onnx

    from talkies.engines.supply.registry import ModelEntry

    from ..modelgen.sherpa import lstm_transducer

    broken = target.tmp / "broken"
    broken.mkdir()
    config = lstm_transducer(broken)
    encoder = onnx.load(broken / "encoder.onnx")
    del encoder.metadata_props[:]  # sherpa-onnx ends its process on this (SIGSEGV or 255)
    onnx.save(encoder, broken / "encoder.onnx")
    entry = ModelEntry(
        slug="broken",
        executor="sherpa",
        path=broken,
        recognizer_factory="from_transducer",
        sherpa_config=config,
    )
    return _load_check_refused(
        target,
        entry,
        {
            "process": "model 'broken' failed to load: its engine process ",
            "thread": "model 'broken' failed its load check (exit status ",
        },
    )


@runner("native-abort-on-load", "in-process")
def native_abort_on_load(target: FaultTarget) -> Facts:
    from talkies.engines.supply import validate
    from talkies.engines.supply.registry import ModelEntry

    child = target.tmp / "aborting-child"
    child.write_text(
        "#!/bin/sh\n# a load check child that dies as a native abort() would\nkill -ABRT $$\n"
    )
    child.chmod(child.stat().st_mode | stat.S_IXUSR)
    entry = ModelEntry(slug="abort-test", executor="vosk", path=target.tmp)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(f"{validate.__name__}.sys.executable", str(child))
        return _load_check_refused(
            target,
            entry,
            {
                "process": "model 'abort-test' failed to load: its engine process was killed by "
                "SIGABRT",
                "thread": "model 'abort-test' failed its load check (exit status -6)",
            },
        )


def _vosk_stream(host: FaultHost, pcm: bytes) -> bool | str:
    """A stream on the real Korean Vosk model: ready, ``pcm``, end, and a final with words."""
    ws = ws_connect(host.ws_url)
    ws.send(json.dumps({**START, "model": "vosk-ko"}))
    ready = json.loads(ws.recv(timeout=60))  # the first one loads the model
    if ready["type"] != "ready":
        return f"vosk-ko: {ready}"
    for i in range(0, len(pcm), 3200):
        ws.send(pcm[i : i + 3200])
        time.sleep(0.1)  # real time: each decode call holds what one frame brings
    ws.send(json.dumps({"type": "end"}))
    events, code, _ = drain(ws, timeout=30)
    finals = [e["text"] for e in events if e["type"] == "final"]
    if code == 1000 and finals and finals[0].strip():
        return True
    return f"vosk-ko: {events[-3:]} {code}"


@runner("engine-crashes", "process")
def engine_crashes(target: FaultTarget) -> Facts:
    from .load import engine_pids, speech_pcm, wait_ended

    host = target.process
    korean = speech_pcm("ko")[: 32000 * 3]
    loaded = _vosk_stream(host, korean)  # loads vosk-ko in its engine process
    assert loaded is True, loaded
    fds = descriptors(host)
    (engine,) = engine_pids(host.proc.pid)
    ws = open_stream(host.ws_url, model="vosk-ko")
    ws.send(korean[:3200])
    os.kill(engine, signal.SIGSEGV)  # as a native library's fault would end it
    wait_ended(engine)  # (it may answer a call or two while the signal lands)
    sent = time.monotonic()
    with suppress(ConnectionClosed):
        ws.send(korean[3200:6400])  # its next decode call finds the process gone
    events, code, _ = drain(ws, timeout=20)
    facts = _after_fault(
        host,
        {"close": [_outcome(events, code)], "closed_s": round(time.monotonic() - sent, 3)},
        fds,
    )
    again = _vosk_stream(host, korean)  # a fresh engine process, real words again
    if facts["survives"] is True and again is not True:
        facts["survives"] = f"after the crash: {again}"
    return facts


# -- clients that leave -------------------------------------------------------------------------


def _start(model: str) -> bytes:
    return frame(0x1, json.dumps({**START, "model": model}).encode())


def _ready(host: FaultHost, model: str = "energy-test") -> socket.socket:
    sock, response, rest = upgrade(host.port)
    assert response.startswith(b"HTTP/1.1 101"), response
    sock.sendall(_start(model))
    read_until_ready(FrameReader(sock, rest))
    return sock


def _left(host: FaultHost, leave: Callable[[], None]) -> Facts:
    fds = descriptors(host)
    leave()
    return _after_fault(host, {}, fds)


@runner("leave-during-upgrade", "process")
def leave_during_upgrade(target: FaultTarget) -> Facts:
    host = target.process

    def leave() -> None:
        with connect(host.port) as sock:
            sock.sendall(b"GET /v1/audio/transcriptions/stream HTTP/1.1\r\nHost: x\r\nUpgr")
            time.sleep(0.2)

    return _left(host, leave)


@runner("leave-after-upgrade", "process")
def leave_after_upgrade(target: FaultTarget) -> Facts:
    host = target.process

    def leave() -> None:
        sock, response, _ = upgrade(host.port)
        assert response.startswith(b"HTTP/1.1 101"), response
        sock.close()

    return _left(host, leave)


@runner("leave-before-ready", "process")
def leave_before_ready(target: FaultTarget) -> Facts:
    host = target.process

    def leave() -> None:
        sock, response, _ = upgrade(host.port)
        assert response.startswith(b"HTTP/1.1 101"), response
        sock.sendall(_start("slow-test"))
        host.wait_in_use("slow-test", 1)  # the server is opening the stream
        sock.close()

    return _left(host, leave)


@runner("leave-mid-audio", "process")
def leave_mid_audio(target: FaultTarget) -> Facts:
    host = target.process

    def leave() -> None:
        sock = _ready(host)
        for _ in range(20):
            sock.sendall(frame(0x2, speech(0.02)))
        sock.close()

    return _left(host, leave)


@runner("leave-mid-frame", "process")
def leave_mid_frame(target: FaultTarget) -> Facts:
    host = target.process

    def leave() -> None:
        sock = _ready(host)
        whole = frame(0x2, speech(0.1))
        sock.sendall(whole[: len(whole) // 2])
        time.sleep(0.2)
        sock.close()

    return _left(host, leave)


@runner("leave-after-end", "process")
def leave_after_end(target: FaultTarget) -> Facts:
    host = target.process

    def leave() -> None:
        sock = _ready(host, "slow-test")
        sock.sendall(frame(0x2, speech(0.3)) + frame(0x1, b'{"type":"end"}'))
        time.sleep(0.3)  # the flush takes 1 s
        sock.close()

    return _left(host, leave)


def _upload_parts(pcm: bytes) -> tuple[bytes, bytes]:
    """A transcription upload on ``energy-test``: (request head, multipart body)."""
    body = (
        b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nenergy-test\r\n'
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\n" + wav_bytes(pcm) + b"\r\n--B--\r\n"
    )
    head = (
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: multipart/form-data; boundary=B\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    return head, body


@runner("leave-mid-upload", "process")
def leave_mid_upload(target: FaultTarget) -> Facts:
    host = target.process
    head, body = _upload_parts(speech(2.0))  # 64 KB
    (host.data_dir / "tmp").mkdir(exist_ok=True)
    fds = descriptors(host)
    with _changes(host.data_dir) as left:
        with connect(host.port) as sock:
            sock.sendall(head + body[: len(body) // 2])
            time.sleep(0.3)
        facts = _after_fault(host, {}, fds)
    facts["left_behind"] = left
    return facts


def _speech_request(model: str) -> bytes:
    body = json.dumps(
        {"model": model, "input": "Hello there.", "voice": "alloy", "response_format": "pcm"}
    ).encode()
    return (
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )


@runner("leave-mid-speech", "process")
def leave_mid_speech(target: FaultTarget) -> Facts:
    host = target.process

    def leave() -> None:
        with connect(host.port, timeout=120) as sock:
            sock.sendall(_speech_request("qwen3-tiny-long"))
            first = sock.recv(65536)
            assert first.startswith(b"HTTP/1.1 200"), first[:200]
            host.wait_in_use("qwen3-tiny-long", 1)

    # Once to load the model (its files and threads are the model's, not a leak), then the
    # measured time.
    leave()
    host.wait_in_use("qwen3-tiny-long", 0)
    return _left(host, leave)


def _first_chunk(sock: socket.socket) -> bytes:
    """A streamed PCM response's head and at least one byte of its body."""
    data = b""
    while b"\r\n\r\n" not in data or data.endswith(b"\r\n\r\n"):
        chunk = sock.recv(65536)
        assert chunk, data[:200]
        data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    return data


@runner("speech-engine-crashes", "process")
def speech_engine_crashes(target: FaultTarget) -> Facts:
    from .load import engine_pids, wait_ended

    host = target.process
    slug = "qwen3-tiny-long"
    loaded = httpx.get(host.url + "/v1/audio/voices", params={"model": slug}, timeout=120)
    assert loaded.status_code == 200, loaded.text  # loads the model in its engine process
    fds = descriptors(host)
    (engine,) = engine_pids(host.proc.pid, slug)
    with connect(host.port, timeout=60) as sock:
        sock.sendall(_speech_request(slug))
        response = _first_chunk(sock)
        sent = time.monotonic()
        os.kill(engine, signal.SIGSEGV)  # as a native fault in torch would end it
        with suppress(OSError):
            while chunk := sock.recv(262144):
                response += chunk
        closed = time.monotonic() - sent
    wait_ended(engine)
    facts = {
        "status": [int(response.split(b" ", 2)[1])],
        "cut_short": not _complete(response),
        "closed_s": round(closed, 3),
    }
    facts = _after_fault(host, facts, fds)
    # The next request on the model: a fresh engine process that streams audio again.
    with connect(host.port, timeout=120) as sock:
        sock.sendall(_speech_request(slug))
        _first_chunk(sock)
    host.wait_in_use(slug, 0)
    again = engine_pids(host.proc.pid, slug)
    if facts["survives"] is True and (len(again) != 1 or again[0] == engine):
        facts["survives"] = f"after the crash: engine processes {again}"
    return facts


# -- SIGTERM ------------------------------------------------------------------------------------


def _read_all(sock: socket.socket, into: dict[str, bytes], name: str) -> threading.Thread:
    def run() -> None:
        data = b""
        with suppress(OSError):
            while chunk := sock.recv(262144):
                data += chunk
        into[name] = data

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _complete(response: bytes) -> bool:
    """An HTTP response read to its end: a chunked body with its last chunk, or a body of
    its Content-Length."""
    head, sep, body = response.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.1 200"):
        return False
    lines = head.lower().split(b"\r\n")
    if b"transfer-encoding: chunked" in lines:
        return body.endswith(b"\r\n0\r\n\r\n")
    for line in lines:
        if line.startswith(b"content-length:"):
            return len(body) == int(line.split(b":")[1])
    return False


QWEN3_MODEL: list[Path] = []  # the tiny Qwen3-TTS folder, made once by test_faults.py


def qwen3_data(tmp: Path) -> Path:
    """A data folder for a fault host: the tiny Qwen3-TTS linked in."""
    data = tmp / "data"
    data.mkdir()
    (data / "qwen3-tiny").symlink_to(QWEN3_MODEL[0], target_is_directory=True)
    return data


@runner("sigterm", "process")
def sigterm(target: FaultTarget) -> Facts:
    data = qwen3_data(target.tmp)
    with fault_host(data, target.tmp / "sigterm.log", grace=SIGTERM_GRACE) as host:
        # Both speech models loaded first (a load takes seconds): the requests below then
        # stream at once.
        for model in ("qwen3-tiny-short", "qwen3-tiny-endless"):
            with connect(host.port, timeout=120) as warm:
                warm.sendall(_speech_request(model))
                assert warm.recv(65536).startswith(b"HTTP/1.1 200")
            host.wait_in_use(model, 0)
        socks: dict[str, socket.socket] = {}
        socks["long-speech"] = connect(host.port, timeout=60)
        socks["long-speech"].sendall(_speech_request("qwen3-tiny-endless"))
        socks["speech"] = connect(host.port, timeout=60)
        socks["speech"].sendall(_speech_request("qwen3-tiny-short"))
        host.wait_in_use("qwen3-tiny-endless", 1)
        host.wait_in_use("qwen3-tiny-short", 1)
        ws = open_stream(host.ws_url, model="energy-test")
        ws.send(WORD)
        assert json.loads(ws.recv(timeout=10))["type"] == "partial"
        head, body = _upload_parts(speech(1.0))
        half = len(body) // 2
        for name in ("upload", "stalled-upload"):
            socks[name] = connect(host.port, timeout=60)
            socks[name].sendall(head + body[:half])
        time.sleep(0.2)  # the server has the heads
        # A precondition, not a fact: the short speech is still streaming at the signal.
        assert host.models()["qwen3-tiny-short"]["in_use"] == 1, "the speech ended too soon"
        responses: dict[str, bytes] = {}
        readers = [_read_all(sock, responses, name) for name, sock in socks.items()]
        signalled = time.monotonic()
        host.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        socks["upload"].sendall(body[half:])
        events, code, _ = drain(ws, timeout=SIGTERM_GRACE + 10)
        closed = time.monotonic() - signalled
        status = host.proc.wait(timeout=30)
        exited = time.monotonic() - signalled
        for reader in readers:
            reader.join(timeout=10)
        for sock in socks.values():
            sock.close()
    lines = (target.tmp / "sigterm.log").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    after = [r for r in records if r["msg"] == "shutting down"]
    unloaded = {
        r["model"] for r in records[records.index(after[0]) :] if r["msg"] == "model unloaded"
    }
    finished = {name for name, data in responses.items() if _complete(data)}
    dropped = {name for name, data in responses.items() if not _complete(data)}
    return {
        "close": [_outcome([e for e in events if e["type"] == "error"], code)],
        "closed_s": round(closed, 3),
        "finished": finished,
        "dropped": dropped,
        "exit": (status, round(exited, 3)),
        "unloaded": unloaded == {"energy-test", "qwen3-tiny-short", "qwen3-tiny-endless"}
        or unloaded,
    }


def _silence_flac(path: Path, seconds: int) -> bytes:
    """``seconds`` of silence as FLAC (an hour is a few MB): audio that is long to decode
    and small to send."""
    lavfi = ["-f", "lavfi", "-t", str(seconds), "-i", "anullsrc=r=16000:cl=mono"]
    subprocess.run(
        ["ffmpeg", "-nostdin", "-loglevel", "error", *lavfi, "-c:a", "flac", str(path)],
        check=True,
    )
    return path.read_bytes()


@runner("sigterm-transcribing", "process")
def sigterm_transcribing(target: FaultTarget) -> Facts:
    """Issue 21, point 1: a file transcription still decoding on a real engine process when
    SIGTERM comes is cut at the grace, and the server still exits in time."""
    data = target.tmp / "data"
    data.mkdir()
    flac = _silence_flac(target.tmp / "long.flac", 1800)
    body = (
        b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nvosk-ko\r\n'
        b'--B\r\nContent-Disposition: form-data; name="file"; filename="long.flac"\r\n'
        b"Content-Type: audio/flac\r\n\r\n" + flac + b"\r\n--B--\r\n"
    )
    head = (
        b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: multipart/form-data; boundary=B\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    with fault_host(data, target.tmp / "sigterm.log") as host:
        responses: dict[str, bytes] = {}
        sock = connect(host.port, timeout=120)
        sock.sendall(head + body)
        reader = _read_all(sock, responses, "transcription")
        host.wait_in_use("vosk-ko", 1, timeout=120)  # decoded, loaded, and on the engine
        time.sleep(1.0)  # well into its 30 minutes
        assert "transcription" not in responses, "the transcription ended before the signal"
        signalled = time.monotonic()
        host.proc.send_signal(signal.SIGTERM)
        status = host.proc.wait(timeout=60)
        exited = time.monotonic() - signalled
        reader.join(timeout=10)
        sock.close()
    return {
        "dropped": {name for name, got in responses.items() if not _complete(got)},
        "exit": (status, round(exited, 3)),
    }
