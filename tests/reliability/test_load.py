"""Load: concurrent real-time streams through real engines, and a deliberately slow engine.

Bounded for CI: a few streams per engine, each paced at real time through the real runtime,
pool and engine (``vosk-ko``: the real Korean Vosk model; ``whisper-base-en``: the real
whisper.cpp base model; ``sherpa-random``: a random-weight LSTM transducer of production
widths that the real sherpa-onnx runs). Asserted: every frame counted in each ``stats``,
every stream gets its ``final`` then ``stats`` and a 1000 close, no error event, no slot left
held, no error in the server's log. How many streams this machine sustains, and at what
latency, is measured by ``bench/load.py`` (docs/load.md), not asserted here.

``TALKIES_LOAD_STREAMS=N`` runs every engine with N streams instead of the bounded counts.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ..fake_engine import silence, speech
from .clients import FrameReader, bystanders, frame, read_until_ready, upgrade
from .load import (
    PacedRun,
    ServerProcess,
    load_data_dir,
    load_env,
    production_sherpa,
    run_paced,
    start_server,
    stop_server,
    stream_audios,
)

log = logging.getLogger(__name__)
# (streams, seconds of audio each): what a 2-core CI machine gets through in ~1 min in all.
BOUNDED = {"vosk-ko": (2, 5.0), "sherpa-random": (3, 5.0), "whisper-base-en": (2, 2.0)}
_OVERRIDE = int(os.environ.get("TALKIES_LOAD_STREAMS", "0") or 0)
SLOW_SECONDS = float(os.environ.get("TALKIES_SLOW_SECONDS", "6"))


@pytest.fixture(scope="module")
def engines_server(
    http_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    sherpa, _ = production_sherpa()
    data = load_data_dir(tmp_path_factory.mktemp("load-data"), http_data, sherpa)
    slots = max(8, _OVERRIDE)
    running = start_server(load_env(data, slots), tmp_path_factory.mktemp("load-logs"))
    try:
        yield running
    finally:
        stop_server(running)


@pytest.mark.parametrize("model", list(BOUNDED))
def test_paced_streams_through_a_real_engine(engines_server: ServerProcess, model: str) -> None:
    streams, seconds = BOUNDED[model]
    if _OVERRIDE:
        streams = _OVERRIDE
    server = engines_server
    # One short stream first: loads the model (another model may have held the server).
    warm = run_paced(server.port, model, stream_audios(model, 1, 1.0))
    assert warm.problems() == []
    assert server.wait_idle() == {}
    run = run_paced(
        server.port, model, stream_audios(model, streams, seconds), on_mid=server.rss_mb
    )
    assert run.problems() == []
    for record in run.records:
        assert record.stats is not None
        assert record.stats["frames"] == len(record.sent) == round(seconds / 0.02)
        assert record.events.count("final") == 1
    assert server.wait_idle() == {}, "slots still held after every stream closed"
    assert server.log_problems() == []
    log.info(
        f"{model}: {streams} streams x {seconds:g} s, {len(run.partial_lags())} partials, "
        f"finals {[round(x, 2) for x in run.final_lags()]} s after the end"
    )


# -- a deliberately slow engine ----------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    running = start_server(
        {}, tmp_path_factory.mktemp("slow-logs"), module="tests.reliability.slow_server", args=()
    )
    try:
        yield running
    finally:
        stop_server(running)


@dataclass
class Pusher:
    """A client that sends audio as fast as TCP takes it, reading what comes back."""

    port: int
    frames_sent: int = 0
    bytes_sent: int = 0
    blocked: int = 0  # times the socket's send buffer was full (TCP pushed back)
    reader: FrameReader | None = None
    errors: list[str] = field(default_factory=list)

    def run(self, stop: threading.Event) -> None:
        sock, response, rest = upgrade(self.port)
        # A small send buffer: what the client has queued when TCP pushes back stays small,
        # so the server decodes it soon after the end (the receiving side is the server's).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32768)
        try:
            assert b" 101 " in response, response
            self.reader = reader = FrameReader(sock, rest)
            start = b'{"type":"start","model":"slow-test","encoding":"pcm_s16le",'
            sock.sendall(frame(1, start + b'"sample_rate":16000,"channels":1}'))
            read_until_ready(reader)
            reading = threading.Thread(target=reader.pump, kwargs={"timeout": 120}, daemon=True)
            reading.start()
            # 0.5 s of "voiced" audio then 0.4 s of silence (the fake engine's endpoint, which
            # ends its utterance: its hypothesis does not grow without bound), 0.1 s a frame.
            cycle = [frame(2, speech(0.1))] * 5 + [frame(2, silence(0.1))] * 4
            while not stop.is_set():
                self._send(sock, cycle[self.frames_sent % len(cycle)])
                self.frames_sent += 1
            self._send(sock, frame(1, b'{"type":"end"}'))
            reading.join(timeout=60)
            if reader.got.close is not None:
                with_close = frame(8, reader.got.close.to_bytes(2, "big"))
                self._send(sock, with_close)
        except Exception as exc:
            self.errors.append(repr(exc))
        finally:
            sock.close()

    def _send(self, sock: socket.socket, data: bytes) -> None:
        view = memoryview(data)
        while view:
            _, writable, _ = select.select([], [sock], [], 0)
            if not writable:
                self.blocked += 1
                _, writable, _ = select.select([], [sock], [], 30)
                assert writable, "the server stopped reading for 30 s"
            sent = sock.send(view)
            view = view[sent:]
            self.bytes_sent += sent


def test_slow_engine_pushes_back_and_others_are_served(slow_server: ServerProcess) -> None:
    """Two clients send audio as fast as they can to an engine that takes 0.5 s per decode
    call: the server's memory stays flat (its per-stream buffer is bounded, so TCP pushes
    back on the clients), a paced stream on the same slow engine gets every ping answered,
    a paced stream on a fast model and a /healthz poller are served, every stream ends
    with final, stats and 1000, and every frame is counted."""
    server = slow_server
    stop = threading.Event()
    pushers = [Pusher(server.port) for _ in range(2)]
    threads = [threading.Thread(target=p.run, args=(stop,), daemon=True) for p in pushers]
    samples: list[float] = []
    pinged: list[PacedRun] = []

    def paced_pinger() -> None:
        audios = [speech(SLOW_SECONDS)]
        pinged.append(run_paced(server.port, "slow-test", audios, ping_every=10))

    pinger = threading.Thread(target=paced_pinger, daemon=True)
    with bystanders(server.port) as others:
        for thread in [*threads, pinger]:
            thread.start()
        started = time.monotonic()
        while time.monotonic() - started < SLOW_SECONDS:
            samples.append(server.rss_mb())
            time.sleep(0.25)
        stop.set()
        for thread in threads:
            thread.join(timeout=90)
        pinger.join(timeout=90)
    assert all(not p.errors for p in pushers), [p.errors for p in pushers]
    for pusher in pushers:
        assert pusher.blocked > 0, "TCP never pushed back: the server buffered everything"
        assert pusher.reader is not None
        got = pusher.reader.got
        assert got.close == 1000 and not [t for t in got.texts if t["type"] == "error"], got
        kinds = [t["type"] for t in got.texts]
        assert kinds[-2:] == ["final", "stats"], kinds[-5:]
        assert got.texts[-1]["frames"] == pusher.frames_sent
    # Flat: the second half within 10% of the first (where buffers, socket queues and the
    # allocator filled up: measured ~82 MB -> ~92 MB in 4 s, then +1 MB in the next 16 s).
    half = len(samples) // 2
    warm, late = max(samples[:half]), max(samples[half:])
    assert late <= warm * 1.10, (warm, samples)
    (paced,) = pinged
    assert paced.problems() == []
    record = paced.records[0]
    assert record.pings > 0 and record.pongs == [
        (k - 1).to_bytes(4, "big") for k in range(10, 10 * record.pings + 1, 10)
    ]
    assert isinstance(others.worst(), float), others.summary()
    assert server.log_problems() == []
    log.info(
        f"slow engine: pushed {[p.bytes_sent // 1000 for p in pushers]} kB, "
        f"blocked {[p.blocked for p in pushers]} times; RSS {warm:.1f} -> "
        f"{late:.1f} MB; {record.pings} pings answered"
    )
