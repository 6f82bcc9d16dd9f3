"""Soak: a server under a mix of traffic for a while, then back where it started.

60 s by default; ``TALKIES_SOAK_SECONDS=600`` for the long run, ``TALKIES_SOAK_WORKERS`` (3)
for the number of concurrent workers (run this file alone with them: the CLI
tests refuse unknown ``TALKIES_*`` variables in their environment). The server is
``tests/http_server.py``'s standalone host (the real registry and pool, the real Korean Vosk
model, the tiny random Qwen3-TTS), as a process.

Three workers loop over, at random (seeded): a normal stream (final then stats), a cancel, a
disconnect in the middle of a frame, a disconnect before ready, protocol errors (an odd-sized
frame, invalid JSON, an unknown field) and an HTTP transcription, all on ``vosk-ko``. Every
10 s the workers pause, the server's slots drain, and TTS requests run (a streaming model
pins the server: TTS meanwhile would be refused with 409, by design). At the end: every
operation got the answer the contract gives it, no slot is held (``/v1/models``), and the
server's RSS is within 10% of its warm baseline (after every operation once, then one round of
the workers side by side).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ..fake_engine import wav_bytes
from .clients import FrameReader, ServerFrames, frame, read_until_ready, upgrade
from .load import ServerProcess, load_env, speech_pcm, start_server, stop_server

log = logging.getLogger(__name__)
SOAK_SECONDS = float(os.environ.get("TALKIES_SOAK_SECONDS", "60") or 60)
MODEL = "vosk-ko"
TTS_MODEL = "qwen3-tiny-random"
ROUND = 10.0  # seconds of ASR traffic between TTS windows
WORKERS = int(os.environ.get("TALKIES_SOAK_WORKERS", "3") or 3)
START: dict[str, object] = {"type": "start", "model": MODEL, "encoding": "pcm_s16le"}
START |= {"sample_rate": 16000, "channels": 1}


@pytest.fixture(scope="module")
def soak_server(
    http_data: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    running = start_server(load_env(http_data, 8), tmp_path_factory.mktemp("soak-logs"))
    try:
        yield running
    finally:
        stop_server(running)


class Traffic:
    """The operations, each checking the answer it got; failures are collected."""

    def __init__(self, server: ServerProcess, seed: int) -> None:
        self.server = server
        self.rng = random.Random(seed)
        pcm = speech_pcm("ko")
        self.pcm = pcm
        self.counts: Counter[str] = Counter()
        self.failures: list[str] = []
        self.lock = threading.Lock()

    def _audio(self, seconds: float) -> bytes:
        n = round(seconds * 50) * 640
        start = self.rng.randrange(0, len(self.pcm) - n) // 640 * 640
        return self.pcm[start : start + n]

    def _check(self, name: str, ok: bool, detail: object) -> None:
        with self.lock:
            self.counts[name] += 1
            if not ok:
                self.failures.append(f"{name}: {detail}")

    def _started(self) -> tuple[FrameReader, Callable[[bytes], None]]:
        sock, response, rest = upgrade(self.server.port)
        assert b" 101 " in response, response
        reader = FrameReader(sock, rest)
        sock.sendall(frame(1, json.dumps(START).encode()))
        read_until_ready(reader, timeout=60)
        return reader, sock.sendall

    def _frames(self, send: Callable[[bytes], None], audio: bytes, pace: float) -> int:
        n = 0
        for k in range(0, len(audio), 640):
            send(frame(2, audio[k : k + 640]))
            n += 1
            if pace:
                time.sleep(pace)
        return n

    @staticmethod
    def _closed(reader: FrameReader, got: ServerFrames) -> None:
        if got.close is not None and reader.sock is not None:
            reader.sock.sendall(frame(8, got.close.to_bytes(2, "big")))
        if reader.sock is not None:
            reader.sock.close()

    # -- operations --------------------------------------------------------------------

    def normal(self) -> None:
        reader, send = self._started()
        sent = self._frames(send, self._audio(self.rng.uniform(0.5, 1.5)), 0.01)
        send(frame(1, b'{"type":"end"}'))
        got = reader.pump(timeout=120)
        self._closed(reader, got)
        kinds = [t["type"] for t in got.texts]
        stats = got.texts[-1] if got.texts else {}
        ok = (
            got.close == 1000
            and kinds[-2:] == ["final", "stats"]
            and "error" not in kinds
            and stats.get("frames") == sent
            and stats.get("canceled") is False
        )
        self._check("normal", ok, (got.close, kinds[-4:], stats, sent))

    def cancel(self) -> None:
        reader, send = self._started()
        sent = self._frames(send, self._audio(0.5), 0.0)
        send(frame(1, b'{"type":"cancel"}'))
        got = reader.pump(timeout=60)
        self._closed(reader, got)
        stats = got.texts[-1] if got.texts else {}
        ok = (
            got.close == 1000
            and stats.get("type") == "stats"
            and stats.get("canceled") is True
            and stats.get("frames") == sent
            and "final" not in [t["type"] for t in got.texts]
        )
        self._check("cancel", ok, (got.close, got.texts[-2:], sent))

    def disconnect_mid_frame(self) -> None:
        reader, send = self._started()
        self._frames(send, self._audio(0.3), 0.0)
        whole = frame(2, self._audio(0.02))
        send(whole[: self.rng.randrange(3, len(whole) - 1)])
        assert reader.sock is not None
        reader.sock.close()
        self._check("disconnect-mid-frame", True, None)

    def disconnect_before_ready(self) -> None:
        sock, response, _ = upgrade(self.server.port)
        sock.sendall(frame(1, json.dumps(START).encode()))
        sock.close()
        self._check("disconnect-before-ready", b" 101 " in response, response[:80])

    def protocol_error(self) -> None:
        case = self.rng.choice(["unaligned_audio", "invalid_json", "unknown_field"])
        reader, send = self._started()
        self._frames(send, self._audio(0.1), 0.0)
        if case == "unaligned_audio":
            send(frame(2, b"\x01\x02\x03"))
        elif case == "invalid_json":
            send(frame(1, b'{"type": "end"'))
        else:
            send(frame(1, b'{"type":"end","extra":1}'))
        got = reader.pump(timeout=60)
        self._closed(reader, got)
        errors = [t.get("code") for t in got.texts if t.get("type") == "error"]
        self._check(f"error-{case}", got.close == 4400 and errors == [case], (got.close, errors))

    def transcription(self) -> None:
        wav = wav_bytes(self._audio(self.rng.uniform(1.0, 2.0)))
        with self.server.client() as client:
            response = client.post(
                "/v1/audio/transcriptions",
                data={"model": MODEL},
                files={"file": ("speech.wav", wav, "audio/wav")},
            )
        ok = response.status_code == 200 and isinstance(response.json().get("text"), str)
        self._check("transcription", ok, (response.status_code, response.text[:200]))

    def speech(self) -> None:
        body = {"model": TTS_MODEL, "input": "Hello there.", "voice": "alloy"}
        body["response_format"] = self.rng.choice(["pcm", "wav"])
        with self.server.client() as client:
            response = client.post("/v1/audio/speech", json=body)
        ok = response.status_code == 200 and len(response.content) > 0
        self._check(
            f"tts-{body['response_format']}", ok, (response.status_code, response.text[:200])
        )

    def asr_operation(self) -> None:
        weights = {
            self.normal: 4,
            self.cancel: 2,
            self.disconnect_mid_frame: 2,
            self.disconnect_before_ready: 1,
            self.protocol_error: 2,
            self.transcription: 2,
        }
        operation = self.rng.choices(list(weights), list(weights.values()))[0]
        try:
            operation()
        except (OSError, AssertionError, httpx.HTTPError) as exc:
            self._check(operation.__name__, False, repr(exc))


def soak(traffic: Traffic, seconds: float) -> None:
    """Rounds of ASR traffic from the workers, each followed by a TTS window."""
    deadline = time.monotonic() + seconds
    while True:
        round_end = min(deadline, time.monotonic() + ROUND)

        def worker(end: float = round_end) -> None:
            while time.monotonic() < end:
                traffic.asr_operation()

        threads = [threading.Thread(target=worker, daemon=True) for _ in range(WORKERS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        held = traffic.server.wait_idle(timeout=30)
        traffic._check("slots-released", held == {}, held)
        if time.monotonic() >= deadline:
            traffic.speech()
            return
        traffic.speech()
        traffic.speech()


def test_soak(soak_server: ServerProcess) -> None:
    server = soak_server
    traffic = Traffic(server, seed=12)
    # Warm: every operation once, then one short round with the workers side by side.
    for operation in (
        traffic.normal,
        traffic.cancel,
        traffic.disconnect_mid_frame,
        traffic.disconnect_before_ready,
        traffic.protocol_error,
        traffic.transcription,
    ):
        operation()
    soak(traffic, ROUND)  # the workers side by side set the allocators' high-water marks
    assert traffic.failures == []
    assert server.wait_idle() == {}
    time.sleep(1.0)
    baseline = server.rss_mb()

    started = time.monotonic()
    soak(traffic, SOAK_SECONDS)
    took = time.monotonic() - started

    assert traffic.failures == [], traffic.failures[:10]
    assert server.wait_idle() == {}
    models = server.models()
    assert all(int(m.get("in_use", 0)) == 0 for m in models.values()), models
    time.sleep(1.0)
    end = server.rss_mb()
    log.info(
        "soak %.0f s: %s; RSS warm %.1f MB, end %.1f MB (%+.1f%%)",
        took,
        dict(traffic.counts),
        baseline,
        end,
        (end / baseline - 1) * 100,
    )
    assert abs(end - baseline) <= 0.10 * baseline, (baseline, end)
    assert server.log_problems() == []
