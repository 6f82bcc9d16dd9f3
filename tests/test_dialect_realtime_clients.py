"""The official ``openai`` SDK's realtime client against ``/v1/realtime``, with the real
default model, on both hosts.

The same real English recording (pocketsphinx-testdata's goforward.raw, "go forward ten
meters"), resampled to 24 kHz and followed by silence so that the server's voice detection
ends the turn, through ``client.realtime.connect(extra_query={"intent": "transcription"})``
in server-VAD mode must give the words the native route gives. The hosts are
tests/http_hosts.py's: talkies' own server and uvicorn, each a process serving the built-in
``whisper-base-en`` with a bearer token. The README's snippet is run here too.
"""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr  # type: ignore[import-untyped]

from talkies.engines.supply.builtin import DEFAULT_MODEL

from .http_hosts import TOKEN, HttpHost
from .modelgen_whisper import POCKETSPHINX_DATA, normalize_words
from .test_dialect_deepgram_clients import _native

RECORDING = POCKETSPHINX_DATA / "goforward.raw"  # 16 kHz mono PCM16
EXPECTED = ["go", "forward", "ten", "meters"]
CHUNK = 4800  # 0.1 s of 24 kHz PCM16
ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not RECORDING.exists(), reason="pocketsphinx-testdata missing")


def _at_24k(pcm16k: bytes) -> bytes:
    samples = np.frombuffer(pcm16k, dtype="<i2")
    resampled = soxr.resample(samples, 16000, 24000, quality="HQ")
    return np.asarray(resampled).astype("<i2").tobytes() + bytes(2 * 24000 * 2)  # + 2 s silence


async def _openai_sdk(host: HttpHost, pcm24k: bytes) -> tuple[list[str], list[Any]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=TOKEN, base_url=f"http://127.0.0.1:{host.port}/v1")
    events: list[Any] = []
    completed: list[str] = []
    async with client.realtime.connect(
        model=DEFAULT_MODEL, extra_query={"intent": "transcription"}
    ) as connection:
        await connection.session.update(
            session={
                "type": "transcription",
                "audio": {
                    "input": {
                        "format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": DEFAULT_MODEL, "language": "en"},
                        "turn_detection": {"type": "server_vad"},
                    }
                },
            }
        )
        for i in range(0, len(pcm24k), CHUNK):
            audio = base64.b64encode(pcm24k[i : i + CHUNK]).decode()
            await connection.input_audio_buffer.append(audio=audio)
        async with asyncio.timeout(120):
            async for event in connection:
                events.append(event)
                if event.type == "conversation.item.input_audio_transcription.completed":
                    completed.append(event.transcript)
                    if normalize_words(" ".join(completed))[-1:] == ["meters"]:
                        break
                if event.type == "error":
                    break
    await client.close()
    return completed, events


def test_the_same_words_through_native_and_the_openai_sdk(
    host: HttpHost, record_property: Any
) -> None:
    pcm = RECORDING.read_bytes()
    native = _native(host, pcm)
    completed, events = asyncio.run(_openai_sdk(host, _at_24k(pcm)))
    transcript = " ".join(completed)
    record_property("native", native)
    record_property("openai_sdk", transcript)
    assert normalize_words(native) == EXPECTED, native
    assert normalize_words(transcript) == EXPECTED, (transcript, events)
    assert transcript.strip() == native.strip()
    # Parsed by the SDK's own models, in OpenAI's order; the deltas are append-only.
    kinds = [event.type for event in events]
    assert kinds[:1] == ["session.updated"] or kinds[0] == "session.created"
    assert "input_audio_buffer.speech_started" in kinds
    assert kinds.index("input_audio_buffer.committed") < kinds.index(
        "conversation.item.input_audio_transcription.completed"
    )
    deltas: dict[str, str] = {}
    for event in events:
        if event.type == "conversation.item.input_audio_transcription.delta":
            deltas[event.item_id] = deltas.get(event.item_id, "") + event.delta
        if event.type == "conversation.item.input_audio_transcription.completed":
            assert deltas.get(event.item_id, "") == event.transcript
            assert event.usage.type == "duration"


def test_readme_snippet_runs_against_talkies(host: HttpHost, tmp_path: Path) -> None:
    """The README's OpenAI SDK snippet, as written, with input24k.raw beside it."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### From OpenAI's realtime clients", 1)[1]
    snippet = re.search(r"```python\n(.*?)```", section, re.S)
    assert snippet is not None
    code = snippet.group(1).replace("http://127.0.0.1:8000", f"http://127.0.0.1:{host.port}")
    code = code.replace('"TALKIES_AUTH_TOKEN"', repr(TOKEN))
    (tmp_path / "input24k.raw").write_bytes(_at_24k(RECORDING.read_bytes()))
    (tmp_path / "snippet.py").write_text(code)
    result = subprocess.run(
        [sys.executable, "snippet.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert normalize_words(result.stdout) == EXPECTED, result.stdout
