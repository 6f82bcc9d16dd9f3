"""Load and soak helpers: paced real-time streams through real engines, server processes, RSS.

Used by tests/reliability/test_load.py, tests/reliability/test_soak.py and bench/load.py.

- :func:`speech_pcm`: real speech to stream (espeak-ng Korean for ``vosk-ko``, the Debian
  pocketsphinx test recordings for English), 16 kHz PCM16LE mono;
- :func:`production_sherpa`: a random-weight sherpa-onnx LSTM transducer with production
  widths (:data:`tests.modelgen.sherpa.PRODUCTION`), generated once and cached on disk;
- :class:`ServerProcess`: ``tests/http_server.py`` (the real registry and pool) as a process
  with the settings a load run needs, its RSS, ``/v1/models`` and ``/metrics``;
- :func:`run_paced`: N WebSocket streams on raw sockets (one asyncio loop), each paced at one
  frame per 20 ms of real time, then ``end``; what every stream got back.

Latency of a partial: receipt time minus the client's send time of the frame that completed
the audio the server had accepted when it emitted the partial (its ``audio_seconds``). The
engine may not have decoded all of that audio yet (it is decoded in rounds), so this is low by
at most one decode round: the bench adds the p99 decode-round time from ``/metrics``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.loadgen import (
    OP_BINARY,
    OP_CLOSE,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    FrameReader,
    client_frame,
    close_frame,
    split_response,
    text_frame,
    upgrade_request,
)

from .. import procs

ROOT = Path(__file__).resolve().parents[2]
PERIOD = 0.020  # seconds of audio per frame
FRAME_BYTES = 640  # 20 ms of 16 kHz PCM16
POCKETSPHINX = Path("/usr/share/pocketsphinx/test/data/librivox")
KOREAN = ("안녕하세요 반갑습니다", "저는 학교에 갑니다", "감사합니다", "오늘 날씨가 좋습니다")
ENGLISH = ("hello and welcome", "the quick brown fox jumps over the lazy dog", "thank you")
# Which audio each engine gets.
AUDIO = {"vosk-ko": "ko", "whisper-base-en": "en", "sherpa-random": "en", "energy-test": "en"}


def cache_dir() -> Path:
    """Where generated test models are kept between runs (``XDG_CACHE_HOME`` or ~/.cache)."""
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".cache"
    return root / "talkies-tests"


# -- audio -------------------------------------------------------------------------------------


def _espeak(text: str, voice: str) -> np.ndarray:
    fd, name = tempfile.mkstemp(suffix=".wav")
    os.close(fd)
    path = Path(name)
    try:
        subprocess.run(
            ["espeak-ng", "-v", voice, "-w", str(path), text], check=True, capture_output=True
        )
        with wave.open(str(path)) as w:
            rate = w.getframerate()
            data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    finally:
        path.unlink(missing_ok=True)
    n = round(len(data) * 16000 / rate)
    resampled = np.interp(np.arange(n) * rate / 16000, np.arange(len(data)), data)
    pcm: np.ndarray = np.clip(np.round(resampled), -32768, 32767).astype(np.int16)
    return pcm


_AUDIO_CACHE: dict[str, bytes] = {}


def speech_pcm(language: str) -> bytes:
    """About 10-20 s of speech with pauses (``ko`` or ``en``), PCM16LE mono 16 kHz."""
    if language in _AUDIO_CACHE:
        return _AUDIO_CACHE[language]
    gap = np.zeros(12000, dtype=np.int16)  # 0.75 s: engines endpoint in it
    parts: list[np.ndarray] = [gap]
    recordings = sorted(POCKETSPHINX.glob("*.wav")) if language == "en" else []
    if recordings:
        for path in recordings[:3]:
            with wave.open(str(path)) as w:
                parts += [np.frombuffer(w.readframes(w.getnframes()), dtype="<i2"), gap]
    else:
        if shutil.which("espeak-ng") is None:
            raise RuntimeError("needs espeak-ng (tools/install-test-deps.sh installs it)")
        for phrase in KOREAN if language == "ko" else ENGLISH:
            parts += [_espeak(phrase, language), gap]
    pcm = np.concatenate(parts).astype("<i2").tobytes()
    _AUDIO_CACHE[language] = pcm
    return pcm


def looped(pcm: bytes, seconds: float, offset: float = 0.0) -> bytes:
    """``seconds`` of ``pcm`` repeated, starting ``offset`` seconds in (whole frames)."""
    frames = max(1, round(seconds / PERIOD))
    start = (round(offset / PERIOD) * FRAME_BYTES) % len(pcm)
    need = frames * FRAME_BYTES
    reps = (start + need) // len(pcm) + 1
    return (pcm * reps)[start : start + need]


# -- the production-width sherpa model ---------------------------------------------------------


def production_sherpa(root: Path | None = None) -> tuple[Path, dict[str, str]]:
    """The :data:`PRODUCTION`-width random LSTM transducer (~88 M parameters, ~350 MB),
    generated on first use (~15 s) under ``root`` (default :func:`cache_dir`), keyed by the
    widths and the generator's source, checked in a child process before it is used."""
    from ..modelgen import sherpa as gen

    source = Path(gen.__file__).read_bytes()
    key = hashlib.sha256(source + json.dumps(gen.PRODUCTION, sort_keys=True).encode())
    directory = (root or cache_dir()) / f"sherpa-production-{key.hexdigest()[:12]}"
    marker = directory / "sherpa_config.json"
    if marker.is_file():
        return directory, json.loads(marker.read_text())
    staging = directory.with_name(directory.name + f".tmp{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    config = gen.lstm_transducer(staging, **gen.PRODUCTION, seed=7)
    gen.probe("from_transducer", staging, config)
    (staging / "sherpa_config.json").write_text(json.dumps(config))
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)
    return directory, config


def load_data_dir(target: Path, base: Path, sherpa: Path) -> Path:
    """A data dir like ``base`` (the HTTP hosts' one: whisper, qwen3) whose ``sherpa-random``
    is the production-width model at ``sherpa`` (links, nothing copied)."""
    target.mkdir(parents=True, exist_ok=True)
    for entry in base.iterdir():
        link = target / entry.name
        if entry.name != "sherpa-random" and not link.exists():
            link.symlink_to(entry.resolve())
    link = target / "sherpa-random"
    if not link.exists():
        link.symlink_to(sherpa.resolve())
    return target


# -- the server process ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def engine_pids(pid: int, model: str | None = None) -> list[int]:
    """The engine processes (``python -m talkies.engines.isolation.proxy <model>``) the server
    ``pid`` runs: all of them, or those of ``model``."""
    return [
        child.pid
        for child in procs.children(pid)
        if "talkies.engines.isolation.child" in child.args
        and (model is None or model in child.args)
    ]


def wait_ended(pid: int, timeout: float = 10.0) -> None:
    """Until the process ``pid`` has ended (gone, or a zombie for its parent to reap)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return
        except OSError:
            return
        assert time.monotonic() < deadline, f"process {pid} did not end"
        time.sleep(0.01)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


@dataclass
class ServerProcess:
    """``python -m MODULE ARGS... PORT`` with ``env`` on top of a TALKIES_-free environment."""

    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_mb(self) -> float:
        """The server's resident memory with its engine processes' (each native model runs
        in a child of its own: talkies/engines/isolation/)."""
        total = rss_kib(self.pid)
        for pid in engine_pids(self.pid):
            with suppress(OSError, RuntimeError):  # (one that ended meanwhile)
                total += rss_kib(pid)
        return total / 1024

    def client(self, timeout: float = 120) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout)

    def models(self) -> dict[str, dict[str, Any]]:
        with self.client() as client:
            return {m["id"]: m for m in client.get("/v1/models").json()["data"]}

    def in_use(self) -> dict[str, int]:
        """Slots held, per model that holds any."""
        return {k: int(v.get("in_use", 0)) for k, v in self.models().items() if v.get("in_use")}

    def wait_idle(self, timeout: float = 30) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while (held := self.in_use()) and time.monotonic() < deadline:
            time.sleep(0.05)
        return held

    def metrics(self) -> str:
        with self.client() as client:
            return client.get("/metrics").text

    def log_problems(self) -> list[str]:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return [
            line
            for line in text.splitlines()
            if any(k in line for k in ("ERROR", "Traceback", "CRITICAL"))
        ]


def start_server(
    env: dict[str, str],
    logdir: Path,
    module: str = "tests.http_server",
    args: Sequence[str] = ("standalone",),
    timeout: float = 90,
) -> ServerProcess:
    port = free_port()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    clean |= {"PYTHONPATH": str(ROOT)} | env
    log = logdir / f"server-{port}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args, str(port)],
            cwd=ROOT,
            env=clean,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running = ServerProcess(port, proc, log)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(running.url + "/healthz", timeout=2).status_code == 200:
                return running
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            stop_server(running)
            raise RuntimeError("server did not start")
        time.sleep(0.1)


def stop_server(running: ServerProcess) -> None:
    running.proc.terminate()
    try:
        running.proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        running.proc.kill()
        running.proc.wait()


def load_env(data_dir: Path, slots: int) -> dict[str, str]:
    """Settings for a load run: ``slots`` streams per model and server-wide."""
    return {
        "TALKIES_DATA_DIR": str(data_dir),
        "TALKIES_MODEL_MAX_CONCURRENCY": str(slots),
        "TALKIES_STREAM_MAX_CONNECTIONS": str(slots),
        "TALKIES_STREAM_IDLE_TIMEOUT": "120",
    }


def round_seconds(metrics_text: str, model: str) -> dict[float, float]:
    """The decode-round histogram's cumulative bucket counts for ``model``."""
    out: dict[float, float] = {}
    prefix = "talkies_decode_round_seconds_bucket{"
    for line in metrics_text.splitlines():
        if line.startswith(prefix) and f'model="{model}"' in line:
            labels, value = line[len(prefix) :].rsplit("} ", 1)
            le = labels.split('le="', 1)[1].split('"', 1)[0]
            out[math.inf if le == "+Inf" else float(le)] = float(value)
    return out


def round_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The q-quantile of decode-round times between two histogram snapshots (linear within
    a bucket; the top bucket's lower edge when it falls past the last finite edge)."""
    edges = sorted(after)
    counts = [after[e] - before.get(e, 0.0) for e in edges]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return 0.0
    rank = q * total
    lower, below = 0.0, 0.0
    for edge, cum in zip(edges, counts, strict=True):
        if cum >= rank:
            if math.isinf(edge):
                return lower
            inside = cum - below
            return lower + (edge - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = edge, cum
    return lower


# -- the paced client --------------------------------------------------------------------------


@dataclass
class StreamRecord:
    """What one stream sent and got."""

    sent: list[float] = field(default_factory=list)  # send time of each frame
    events: list[str] = field(default_factory=list)  # event types in order
    partial_lags: list[float] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    stats: dict[str, Any] | None = None
    final_at: float | None = None
    end_at: float | None = None
    close: int | None = None  # the server's close code
    eof: bool = False  # TCP closed
    connect_error: str | None = None
    pings: int = 0
    pongs: list[bytes] = field(default_factory=list)
    max_write_buffer: int = 0

    @property
    def final_lag(self) -> float | None:
        if self.final_at is None or self.end_at is None:
            return None
        return self.final_at - self.end_at

    def problems(self) -> list[str]:
        """What went wrong with a stream that was meant to end normally."""
        out: list[str] = []
        if self.connect_error:
            return [f"connect: {self.connect_error}"]
        if self.errors:
            out.append(f"error events {self.errors}")
        if self.stats is None:
            out.append(f"no stats (close {self.close}, eof {self.eof}, last {self.events[-3:]})")
        elif self.stats.get("frames") != len(self.sent):
            out.append(f"stats counted {self.stats.get('frames')} frames of {len(self.sent)}")
        elif self.stats.get("canceled") is not False:
            out.append(f"stats {self.stats}")
        if self.events[-2:] != ["final", "stats"]:
            out.append(f"ended with {self.events[-3:]}, not final then stats")
        if self.close != 1000:
            out.append(f"close {self.close} (eof {self.eof})")
        if len(self.pongs) != self.pings:
            out.append(f"{len(self.pongs)} pongs for {self.pings} pings")
        return out


class _Stream(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, port: int, record: StreamRecord) -> None:
        self.record = record
        self.transport: asyncio.Transport | None = None
        self.upgraded: asyncio.Future[None] = loop.create_future()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.done: asyncio.Future[None] = loop.create_future()  # close or EOF
        self._request = upgrade_request("127.0.0.1", port)
        self._head = b""
        self._reader = FrameReader()
        self.gone = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        transport.write(self._request)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.gone and not self.transport.is_closing():
            self.transport.write(data)
            size = self.transport.get_write_buffer_size()
            self.record.max_write_buffer = max(self.record.max_write_buffer, size)

    def ping(self, payload: bytes) -> None:
        self.record.pings += 1
        self.send(client_frame(OP_PING, payload))

    def data_received(self, data: bytes) -> None:
        if not self.upgraded.done():
            self._head += data
            try:
                parts = split_response(self._head)
            except ConnectionError as exc:
                self._end(exc)
                return
            if parts is None:
                return
            self.upgraded.set_result(None)
            data = parts[1]
        self._reader.feed(data)
        for opcode, payload in self._reader.frames():
            if opcode == OP_TEXT:
                self._on_text(json.loads(payload))
            elif opcode == OP_PONG:
                self.record.pongs.append(payload)
            elif opcode == OP_PING:
                self.send(client_frame(OP_PONG, payload))
            elif opcode == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                self.record.close = code
                self.send(close_frame(code if code < 4000 else 1000))
                self.gone = True
                if self.transport is not None:
                    self.transport.close()
                self._end(None)

    def _on_text(self, message: dict[str, Any]) -> None:
        now = time.monotonic()
        kind = str(message.get("type"))
        rec = self.record
        rec.events.append(kind)
        if kind == "ready" and not self.ready.done():
            self.ready.set_result(None)
        elif kind == "partial" and rec.sent:
            samples = round(float(message.get("audio_seconds", 0.0)) * 16000)
            index = min(len(rec.sent), max(1, -(-samples * 2 // FRAME_BYTES))) - 1
            rec.partial_lags.append(now - rec.sent[index])
        elif kind == "final":
            rec.final_at = now
        elif kind == "stats":
            rec.stats = message
        elif kind == "error":
            rec.errors.append(message)
            if not self.ready.done():
                self.ready.set_exception(ConnectionError(f"refused: {message}"))
                self.ready.exception()

    def _end(self, exc: BaseException | None) -> None:
        for future in (self.upgraded, self.ready):
            if not future.done():
                future.set_exception(exc or ConnectionError("closed"))
                future.exception()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.gone = True
        self.record.eof = True
        self._end(exc)


@dataclass
class PacedRun:
    """The records of one :func:`run_paced` and what was sampled on the way."""

    records: list[StreamRecord]
    started: float = 0.0
    mid_rss_mb: float | None = None
    paced_seconds: float = 0.0
    send_lag_p99: float = 0.0

    def problems(self) -> list[str]:
        out = []
        for i, record in enumerate(self.records):
            out += [f"stream {i}: {p}" for p in record.problems()]
        return out

    def partial_lags(self) -> list[float]:
        return sorted(x for r in self.records for x in r.partial_lags)

    def final_lags(self) -> list[float]:
        return sorted(x for r in self.records if (x := r.final_lag) is not None)


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def _open(port: int, model: str, record: StreamRecord, timeout: float) -> _Stream:
    loop = asyncio.get_running_loop()
    _, stream = await loop.create_connection(lambda: _Stream(loop, port, record), "127.0.0.1", port)
    await asyncio.wait_for(stream.upgraded, timeout)
    start = {"type": "start", "model": model, "encoding": "pcm_s16le"}
    stream.send(text_frame(start | {"sample_rate": 16000, "channels": 1}))
    await asyncio.wait_for(stream.ready, timeout)
    return stream


async def run_paced_async(
    port: int,
    model: str,
    audios: Sequence[bytes],
    *,
    ready_timeout: float = 120,
    final_timeout: float = 120,
    ping_every: int = 0,
    on_mid: Callable[[], float] | None = None,
) -> PacedRun:
    """One stream per entry of ``audios``, all paced together at real time (stream i's
    frames offset by i/N of a period), then ``end`` on each; waits for every close."""
    records = [StreamRecord() for _ in audios]
    streams: list[_Stream | None] = []
    for i in range(0, len(audios), 16):
        batch = [
            _open(port, model, records[j], ready_timeout)
            for j in range(i, min(i + 16, len(audios)))
        ]
        for j, outcome in enumerate(await asyncio.gather(*batch, return_exceptions=True)):
            if isinstance(outcome, BaseException):
                records[i + j].connect_error = f"{type(outcome).__name__}: {outcome}"
                streams.append(None)
            else:
                streams.append(outcome)
    run = PacedRun(records)
    frames = [[a[k : k + FRAME_BYTES] for k in range(0, len(a), FRAME_BYTES)] for a in audios]
    total = max((len(f) for f in frames), default=0)
    n = max(1, len(streams))
    slot = PERIOD / n
    lags: list[float] = []
    perf = time.monotonic
    start = perf() + 0.05
    run.started = start
    half = total // 2
    for k in range(total):
        if k == half and on_mid is not None:
            run.mid_rss_mb = on_mid()
        for i, stream in enumerate(streams):
            if stream is None or k >= len(frames[i]):
                continue
            due = start + k * PERIOD + i * slot
            now = perf()
            if due > now:
                await asyncio.sleep(due - now)
            sent_at = perf()
            records[i].sent.append(sent_at)
            stream.send(client_frame(OP_BINARY, frames[i][k]))
            lags.append(sent_at - due)
            if ping_every and k % ping_every == ping_every - 1:
                stream.ping(k.to_bytes(4, "big"))
    run.paced_seconds = perf() - start
    run.send_lag_p99 = percentile(lags, 0.99) if lags else 0.0
    live = [s for s in streams if s is not None]
    for stream in live:
        stream.record.end_at = perf()
        stream.send(text_frame({"type": "end"}))
    if live:
        await asyncio.wait([asyncio.ensure_future(s.done) for s in live], timeout=final_timeout)
    for stream in live:
        if stream.transport is not None:
            stream.transport.close()
    return run


def run_paced(port: int, model: str, audios: Sequence[bytes], **kwargs: Any) -> PacedRun:
    return asyncio.run(run_paced_async(port, model, audios, **kwargs))


def stream_audios(model: str, streams: int, seconds: float) -> list[bytes]:
    """Per stream ``seconds`` of the model's speech, each starting at another offset."""
    pcm = speech_pcm(AUDIO.get(model, "en"))
    length = len(pcm) / 32000
    return [looped(pcm, seconds, offset=i * length / max(streams, 1)) for i in range(streams)]
