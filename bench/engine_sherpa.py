"""The sherpa-onnx engine: what batching buys, and what the server costs over the bare engine.

    python bench/engine_sherpa.py [--part a|b|all] [--streams 16] [--seconds 8]
                                  [--paced-streams 8] [--paced-seconds 6] [--frame-bytes 8192]

Random-weight models from ``tests/modelgen/sherpa.py`` (the real sherpa-onnx runtime, no
model hub), real speech from Debian ``pocketsphinx-testdata`` (``goforward.raw``, repeated with
1 s pauses), every recognizer with ``num_threads=1``.

(a) Streams sustained at real time per core, batched (the engine runtime's rounds call
    ``decode_many``: one ``decode_streams`` call for all ready streams) vs one decode per
    stream (``batch: false``: the same runtime, each stream's chunks through
    ``decode_stream``), with a production-width LSTM transducer (~90 M parameters, like
    sherpa-onnx's lstm-en). Audio seconds decoded per CPU
    second (process CPU time, all threads), for
    - ``--streams`` streams fed as fast as possible (the batch is always full), and
    - ``--paced-streams`` streams fed at real time in 100 ms frames, each starting at a random
      phase (batches form from whatever is ready together).
    Goal: batched >= 3x one-decode-per-stream (as fast as possible).
(b) The server's cost over the bare engine: ``--seconds-b`` (120) s of audio, the 64-wide
    test model; bare = sherpa-onnx called in-process (accept, decode with endpoint checks,
    finish), server = the real talkies Server in its own process, the audio sent as fast as
    possible in ``--frame-bytes`` frames, timed from connect to ``stats``. 1 stream, and
    4 in a row (bare) vs 4 concurrent connections (server). Best of ``--repeat``.
    Goals: server >= 0.9x bare speed for one stream, >= 1.0x bare-sequential for four.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

GOFORWARD = Path("/usr/share/pocketsphinx/test/data/goforward.raw")
REFERENCE_B = {"bare_one": 0.33, "bare_four_sequential": 1.34}  # seconds, measured earlier
GOAL_A = 3.0
GOAL_B_ONE = 0.9
GOAL_B_FOUR = 1.0
TRANSDUCER = {
    "tokens": "tokens.txt",
    "encoder": "encoder.onnx",
    "decoder": "decoder.onnx",
    "joiner": "joiner.onnx",
}


def speech_audio(seconds: float) -> bytes:
    """``seconds`` of 'go forward ten meters' + 1 s pauses, PCM16LE 16 kHz."""
    if not GOFORWARD.exists():
        sys.exit("needs Debian pocketsphinx-testdata (apt-get install pocketsphinx-testdata)")
    speech = np.fromfile(GOFORWARD, dtype="<i2")
    unit = np.concatenate([speech, np.zeros(16000, dtype=np.int16)])
    n = round(seconds * 16000)
    return np.tile(unit, n // len(unit) + 1)[:n].astype("<i2").tobytes()


def entry(root: Path, *, batch: bool, slug: str = "bench") -> Any:
    from talkies.engines.supply.registry import ModelEntry

    return ModelEntry(
        slug=slug,
        executor="sherpa",
        path=root,
        recognizer_factory="from_transducer",
        sherpa_config=MappingProxyType({**TRANSDUCER, "num_threads": 1}),
        options=MappingProxyType({"batch": batch}),
    )


# -- (a) batching ----------------------------------------------------------------------------------


async def _run_stream(
    model: Any, pcm: bytes, frame: int, pace: float | None, delay: float
) -> tuple[list[str], str, float]:
    """One engine stream: (endpoint texts, final text, seconds from last frame to final)."""
    import anyio

    from talkies.protocol import EngineEndpoint, EngineFailed, EngineFinal
    from talkies.protocol.messages import StartOptions

    await anyio.sleep(delay)
    stream = await model.open_stream(StartOptions(model="bench"), max_buffered_bytes=160000)
    endpoints: list[str] = []
    final = ""
    fed_at = 0.0
    lag = 0.0
    try:
        async with anyio.create_task_group() as tg:

            async def consume() -> None:
                nonlocal final, lag
                async for event in stream.events():
                    if isinstance(event, EngineEndpoint) and event.text:
                        endpoints.append(event.text)
                    elif isinstance(event, EngineFinal):
                        final = event.text
                        lag = time.perf_counter() - fed_at
                    elif isinstance(event, EngineFailed):
                        raise RuntimeError(event.detail)

            tg.start_soon(consume)
            start = time.perf_counter()
            for k, i in enumerate(range(0, len(pcm), frame)):
                if pace is not None:
                    await anyio.sleep(max(0.0, start + k * pace - time.perf_counter()))
                await stream.feed(pcm[i : i + frame])
            fed_at = time.perf_counter()
            await stream.flush()
    finally:
        await stream.aclose()
    return endpoints, final, lag


def run_streams(
    model: Any, audios: Sequence[bytes], *, paced: bool, seed: int = 0
) -> dict[str, Any]:
    import anyio

    frame = 3200 if paced else 8192  # 100 ms at real time, or big frames as fast as possible
    pace = 0.1 if paced else None
    rng = np.random.default_rng(seed)
    delays = [float(rng.uniform(0, 0.32)) if paced else 0.0 for _ in audios]
    results: list[Any] = [None] * len(audios)

    async def main() -> None:
        async def one(i: int) -> None:
            results[i] = await _run_stream(model, audios[i], frame, pace, delays[i])

        async with anyio.create_task_group() as tg:
            for i in range(len(audios)):
                tg.start_soon(one, i)

    cpu, wall = time.process_time(), time.perf_counter()
    anyio.run(main)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    seconds = sum(len(a) for a in audios) / 32000
    return {
        "cpu": cpu,
        "wall": wall,
        "audio": seconds,
        "per_core": seconds / cpu,
        "lag_max": max(r[2] for r in results),
        "transcripts": [(r[0], r[1]) for r in results],
    }


def part_a(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from talkies.engines.sherpa import load
    from tests.modelgen import sherpa as gen

    root = workdir / "production"
    started = time.perf_counter()
    gen.lstm_transducer(root, **gen.PRODUCTION)
    params = gen.parameter_count(root)
    size = sum(p.stat().st_size for p in root.iterdir())
    print(
        f"(a) production-width LSTM transducer: {params / 1e6:.1f} M parameters, "
        f"{size / 1e6:.0f} MB, generated in {time.perf_counter() - started:.1f} s"
    )
    speech = speech_audio(args.seconds)
    rng = np.random.default_rng(1)
    fast_audios = [
        speech[: len(speech) - 2 * int(rng.integers(0, 8000))] for _ in range(args.streams)
    ]
    paced_audio = speech_audio(args.paced_seconds)
    out: dict[str, Any] = {}
    for batch in (True, False):
        name = "batched" if batch else "per-stream"
        model = load(entry(root, batch=batch), root, "cpu")
        try:
            # Warm up (first-run allocations), then measure.
            run_streams(model, [speech[: 32000 * 2]], paced=False)
            fast = run_streams(model, fast_audios, paced=False)
            paced = run_streams(model, [paced_audio] * args.paced_streams, paced=True, seed=3)
            counters = model.counters
            calls = (counters.decode_calls, counters.decoded_chunks) if batch else None
        finally:
            model.close()
        out[name] = {"fast": fast, "paced": paced, "calls": calls}
        print(
            f"    {name:10}  as fast as possible, {args.streams} streams x {args.seconds:.0f} s: "
            f"{fast['per_core']:6.1f} real-time streams per core "
            f"(cpu {fast['cpu']:.1f} s, wall {fast['wall']:.1f} s)"
        )
        print(
            f"    {'':10}  paced, {args.paced_streams} streams x {args.paced_seconds:.0f} s:"
            f"        {paced['per_core']:6.1f} real-time streams per core "
            f"(cpu {paced['cpu']:.1f} s, final {paced['lag_max'] * 1000:.0f} ms after the "
            "last frame at worst)"
        )
        if calls is not None:
            print(
                f"    {'':10}  decode_streams calls {calls[0]}, chunks {calls[1]} "
                f"(mean batch {calls[1] / max(1, calls[0]):.1f})"
            )
    same = out["batched"]["fast"]["transcripts"] == out["per-stream"]["fast"]["transcripts"]
    fast_ratio = out["batched"]["fast"]["per_core"] / out["per-stream"]["fast"]["per_core"]
    paced_ratio = out["batched"]["paced"]["per_core"] / out["per-stream"]["paced"]["per_core"]
    print(f"    transcripts identical in both modes: {same}")
    print(
        f"    ratio batched / per-stream: as fast as possible {fast_ratio:.2f}x, "
        f"paced {paced_ratio:.2f}x (goal >= {GOAL_A:.0f}x) "
        f"{'OK' if fast_ratio >= GOAL_A else 'BELOW GOAL'}"
    )
    return {"fast_ratio": fast_ratio, "paced_ratio": paced_ratio, "same": same}


# -- (b) server overhead ---------------------------------------------------------------------------


def serve(model_dir: Path, batch: bool) -> None:
    """Child process: the real talkies Server with this model, until SIGTERM."""

    from talkies.config import Settings
    from talkies.engines.base import EngineStream, Refusal
    from talkies.engines.sherpa import load
    from talkies.protocol import ErrorCode
    from talkies.protocol.messages import StartOptions
    from talkies.transport.server import Server

    model = load(entry(model_dir, batch=batch), model_dir, "cpu")
    settings = Settings(
        host="127.0.0.1",
        port=0,
        stream_max_connections=64,
        stream_idle_timeout=600,
        stream_max_duration=86400,
    )
    buffered = round(settings.stream_max_buffer_seconds * 32000)

    class Provider:
        async def open_stream(self, options: StartOptions) -> EngineStream:
            if options.model != "bench":
                raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {options.model!r}")
            return await model.open_stream(options, max_buffered_bytes=buffered)

    server = Server(settings, Provider())

    from _serve import serve_until_signal  # bench/ is this script's folder

    serve_until_signal(server)
    model.close()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def server_process(model_dir: Path, batch: bool) -> Iterator[tuple[int, int]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, __file__, "--serve", str(model_dir)]
    if not batch:
        cmd.append("--no-batch")
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, env=env, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("PORT "):
                errors.seek(0)
                raise RuntimeError(f"server did not start: {errors.read().decode()[-2000:]}")
            yield int(line.split()[1]), proc.pid
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def client_stream(port: int, pcm: bytes, frame: int) -> tuple[list[str], str]:
    from websockets.asyncio.client import connect

    url = f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream"
    async with connect(url, max_size=None, max_queue=None, compression=None) as ws:
        start = {"type": "start", "model": "bench", "encoding": "pcm_s16le"}
        await ws.send(json.dumps({**start, "sample_rate": 16000, "channels": 1}))
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready", ready
        endpoints: list[str] = []
        final: list[str] = []

        async def receive() -> None:
            async for message in ws:
                event = json.loads(message)
                if event["type"] == "endpoint" and event["text"]:
                    endpoints.append(event["text"])
                elif event["type"] == "final":
                    final.append(event["text"])
                elif event["type"] == "stats":
                    return
                elif event["type"] == "error":
                    raise RuntimeError(event)

        async def send() -> None:
            for i in range(0, len(pcm), frame):
                await ws.send(pcm[i : i + frame])
            await ws.send(json.dumps({"type": "end"}))

        await asyncio.gather(receive(), send())
    return endpoints, final[0]


def timed_clients(port: int, pcm: bytes, frame: int, n: int) -> tuple[float, list[Any]]:
    async def main() -> list[Any]:
        return list(await asyncio.gather(*(client_stream(port, pcm, frame) for _ in range(n))))

    started = time.perf_counter()
    results = asyncio.run(main())
    return time.perf_counter() - started, results


def part_b(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import sherpa_onnx  # type: ignore[import-untyped, unused-ignore]

    from tests.modelgen import sherpa as gen

    root = workdir / "tiny"
    gen.lstm_transducer(root, **gen.TINY)
    pcm = speech_audio(args.seconds_b)
    recognizer = sherpa_onnx.OnlineRecognizer.from_transducer(
        **{k: str(root / v) for k, v in TRANSDUCER.items()},
        num_threads=1,
        enable_endpoint_detection=True,
    )
    gen.decode_directly(recognizer, pcm[: 32000 * 5])  # warm up
    bare_one = bare_four = bare_cpu_one = bare_cpu_four = float("inf")
    expected: tuple[list[str], str] = ([], "")
    for _ in range(args.repeat):
        started, cpu = time.perf_counter(), time.process_time()
        expected = gen.decode_directly(recognizer, pcm)
        bare_one = min(bare_one, time.perf_counter() - started)
        bare_cpu_one = min(bare_cpu_one, time.process_time() - cpu)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in range(4):
            gen.decode_directly(recognizer, pcm)
        bare_four = min(bare_four, time.perf_counter() - started)
        bare_cpu_four = min(bare_cpu_four, time.process_time() - cpu)
    print(
        f"(b) {args.seconds_b:.0f} s of audio, 64-wide model, {args.frame_bytes}-byte frames "
        f"(reference here earlier: bare {REFERENCE_B['bare_one']} s / "
        f"{REFERENCE_B['bare_four_sequential']} s)"
    )
    print(
        f"    bare sherpa-onnx in-process: 1 stream {bare_one:.3f} s, 4 in a row {bare_four:.3f} s"
    )
    out: dict[str, Any] = {}
    for batch in (True, False) if args.both_modes else (True,):
        name = "batched" if batch else "per-stream"
        with server_process(root, batch) as (port, pid):
            timed_clients(port, pcm[: 32000 * 5], args.frame_bytes, 1)  # warm up
            one = four = cpu_one = cpu_four = float("inf")
            same = True
            for _ in range(args.repeat):
                cpu = cpu_seconds(pid)
                seconds, results = timed_clients(port, pcm, args.frame_bytes, 1)
                cpu_one = min(cpu_one, cpu_seconds(pid) - cpu)
                one = min(one, seconds)
                same &= all(tuple(r) == expected for r in results)
                cpu = cpu_seconds(pid)
                seconds, results = timed_clients(port, pcm, args.frame_bytes, 4)
                cpu_four = min(cpu_four, cpu_seconds(pid) - cpu)
                four = min(four, seconds)
                same &= all(tuple(r) == expected for r in results)
        r_one, r_four = bare_one / one, bare_four / four
        out[name] = {"one": one, "four": four, "r_one": r_one, "r_four": r_four, "same": same}
        print(
            f"    server ({name}): 1 stream {one:.3f} s = {r_one:.2f}x bare "
            f"(goal >= {GOAL_B_ONE}x) {'OK' if r_one >= GOAL_B_ONE else 'BELOW GOAL'}; "
            f"4 concurrent {four:.3f} s = {r_four:.2f}x bare-sequential "
            f"(goal >= {GOAL_B_FOUR}x) {'OK' if r_four >= GOAL_B_FOUR else 'BELOW GOAL'}; "
            f"transcripts equal to bare: {same}"
        )
        print(
            f"    {'':8} server process CPU: 1 stream {cpu_one:.2f} s, 4 concurrent "
            f"{cpu_four:.2f} s (bare: {bare_cpu_one:.2f} s, {bare_cpu_four:.2f} s)"
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["a", "b", "all"], default="all")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=8.0, help="(a) audio per stream")
    parser.add_argument("--paced-streams", type=int, default=8)
    parser.add_argument("--paced-seconds", type=float, default=6.0)
    parser.add_argument("--seconds-b", type=float, default=120.0, help="(b) audio per stream")
    parser.add_argument("--frame-bytes", type=int, default=8192)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--both-modes", action="store_true", help="(b) also without batching")
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--no-batch", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, batch=not args.no_batch)
        return
    import sherpa_onnx  # type: ignore[import-untyped, unused-ignore]

    print(
        f"sherpa-onnx {sherpa_onnx.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}"
    )
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="talkies-bench-sherpa-") as tmp:
        if args.part in ("a", "all"):
            part_a(args, Path(tmp))
        if args.part in ("b", "all"):
            part_b(args, Path(tmp))
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
