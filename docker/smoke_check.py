"""The client side of docker/smoke.sh (and tests/test_scaleout.py): real speech against a
running Talkies server, as a user sends it.

    python docker/smoke_check.py stream BASE       the spec's "Minimal Python file client",
                                                   verbatim but for its URL and model, on a
                                                   real recording; checks the final words
    python docker/smoke_check.py transcribe BASE   POST the recording as a WAV file to
                                                   /v1/audio/transcriptions; checks the words
    python docker/smoke_check.py hold BASE         open a stream, say "ready", then wait for
                                                   the server to close it; exit 0 on 1001

BASE is the server's http://host:port. The recording is Debian pocketsphinx-testdata's
goforward.raw, already in the stream format (s16le, 16 kHz, mono), saying "go forward ten
meters"; --audio and --expect change them, --model the model (default whisper-base-en).
The client needs the `websockets` package, as the spec says.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "spec" / "streaming.md"
RECORDING = Path("/usr/share/pocketsphinx/test/data/goforward.raw")
SPEC_MODEL = "nemotron-3.5-asr-0.6b"
SPEC_URL = "ws://127.0.0.1:8000/"
_SPOKEN = {"10": "ten", "metres": "meters"}


def words(text: str) -> list[str]:
    text = re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " "))
    return [_SPOKEN.get(w, w) for w in text.split()]


def spec_client(base: str, model: str) -> str:
    """The spec's example client, verbatim but for its URL and model."""
    text = SPEC.read_text(encoding="utf-8")
    start = text.index("import asyncio\n")
    end = text.index("asyncio.run(main())", start) + len("asyncio.run(main())")
    source = text[start:end] + "\n"
    assert source.count(SPEC_URL) == 1 and source.count(f'"{SPEC_MODEL}"') == 1
    ws = base.replace("http://", "ws://", 1).rstrip("/") + "/"
    return source.replace(SPEC_URL, ws).replace(f'"{SPEC_MODEL}"', f'"{model}"')


def stream(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="talkies-smoke-") as tmp:
        folder = Path(tmp)
        shutil.copyfile(args.audio, folder / "input.raw")
        (folder / "client.py").write_text(spec_client(args.base, args.model), encoding="utf-8")
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "client.py"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=args.timeout,
            check=False,
        )
        elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.stderr.write(f"the spec's client failed ({result.returncode}):\n{result.stderr}")
        return 1
    events = [ast.literal_eval(line) for line in result.stdout.splitlines() if line.strip()]
    kinds = [e.get("type") for e in events]
    final = next((e for e in events if e.get("type") == "final"), None)
    ok = (
        kinds[:1] == ["ready"]
        and events[0].get("model") == args.model
        and kinds[-1:] == ["stats"]
        and not events[-1].get("canceled")
        and final is not None
        and words(final["text"]) == words(args.expect)
    )
    partials = kinds.count("partial")
    text = final["text"] if final else None
    sys.stdout.write(
        f"stream: {len(events)} events ({partials} partial), final {text!r}, {elapsed:.1f} s\n"
    )
    if not ok:
        sys.stderr.write(f"unexpected events (wanted the words {args.expect!r}):\n")
        sys.stderr.write("".join(f"  {e}\n" for e in events))
        return 1
    return 0


def _wav(pcm: bytes) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(pcm)
    return out.getvalue()


def transcribe(args: argparse.Namespace) -> int:
    boundary = uuid.uuid4().hex
    parts = [
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="model"\r\n\r\n{args.model}\r\n'
        ).encode(),
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; '
            'filename="goforward.wav"\r\nContent-Type: audio/wav\r\n\r\n'
        ).encode()
        + _wav(args.audio.read_bytes())
        + b"\r\n",
        f"--{boundary}--\r\n".encode(),
    ]
    request = urllib.request.Request(
        args.base.rstrip("/") + "/v1/audio/transcriptions",
        data=b"".join(parts),
        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        method="POST",
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            body = json.load(response)
    except urllib.error.HTTPError as exc:
        sys.stderr.write(f"transcribe: HTTP {exc.code}: {exc.read().decode(errors='replace')}\n")
        return 1
    elapsed = time.monotonic() - started
    sys.stdout.write(f"transcribe: {body.get('text')!r}, {elapsed:.1f} s\n")
    if words(body.get("text", "")) != words(args.expect):
        sys.stderr.write(f"unexpected transcription (wanted {args.expect!r}): {body}\n")
        return 1
    return 0


async def _hold(args: argparse.Namespace) -> int:
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    url = args.base.replace("http://", "ws://", 1).rstrip("/")
    url += "/v1/audio/transcriptions/stream"
    async with connect(url) as socket:
        start = {
            "type": "start",
            "model": args.model,
            "encoding": "pcm_s16le",
            "sample_rate": 16000,
            "channels": 1,
        }
        await socket.send(json.dumps(start))
        ready = json.loads(await socket.recv())
        if ready.get("type") != "ready":
            sys.stderr.write(f"hold: expected ready, got {ready}\n")
            return 1
        await socket.send(args.audio.read_bytes()[: 32000 // 2])  # half a second of speech
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        try:
            while True:  # the stream stays open: no "end" is sent
                await socket.recv()
        except ConnectionClosed:
            pass
        code = socket.close_code
    sys.stdout.write(f"closed {code}\n")
    return 0 if code == 1001 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("mode", choices=["stream", "transcribe", "hold"])
    parser.add_argument("base", help="the server, http://host:port")
    parser.add_argument("--model", default="whisper-base-en")
    parser.add_argument("--audio", type=Path, default=RECORDING)
    parser.add_argument("--expect", default="go forward ten meters")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    if not args.audio.is_file():
        sys.stderr.write(
            f"{args.audio} is missing (Debian: apt-get install pocketsphinx-testdata)\n"
        )
        return 2
    if args.mode == "stream":
        return stream(args)
    if args.mode == "transcribe":
        return transcribe(args)
    return asyncio.run(asyncio.wait_for(_hold(args), args.timeout))


if __name__ == "__main__":
    raise SystemExit(main())
