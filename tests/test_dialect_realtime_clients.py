"""The official ``openai`` SDK's realtime client against ``/v1/realtime``, with the real
default model, on both hosts.

The same real English recording (pocketsphinx-testdata's goforward.raw, "go forward ten
meters"), resampled to 24 kHz and followed by silence so that the server's voice detection
ends the turn, through ``client.realtime.connect(extra_query={"intent": "transcription"})``
in server-VAD mode must give the words the native route gives. The hosts are
tests/http_hosts.py's: talkies' own server and uvicorn, each a process serving the built-in
``whisper-base-en`` with a bearer token. ``livekit-plugins-openai``'s realtime STT stream
(``use_realtime=True``, its ``base_url`` at Talkies) must give them too, run headless: no
LiveKit server, its HTTP session bound by ``http_context.open()``. The README's two snippets
(the SDK's and LiveKit's) are run here as written.
"""

from __future__ import annotations

import asyncio
import base64
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr  # type: ignore[import-untyped]

from talkies.engines.supply.builtin import DEFAULT_MODEL

from .http_hosts import TOKEN, HttpHost
from .modelgen_whisper import POCKETSPHINX_DATA, normalize_words
from .test_dialect_deepgram_clients import _native, push_pcm

RECORDING = POCKETSPHINX_DATA / "goforward.raw"  # 16 kHz mono PCM16
EXPECTED = ["go", "forward", "ten", "meters"]
CHUNK = 4800  # 0.1 s of 24 kHz PCM16
ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(not RECORDING.exists(), reason="pocketsphinx-testdata missing")


def _at_24k(pcm16k: bytes) -> bytes:
    samples = np.frombuffer(pcm16k, dtype="<i2")
    resampled = soxr.resample(samples, 16000, 24000, quality="HQ")
    return np.asarray(resampled).astype("<i2").tobytes() + bytes(2 * 24000 * 2)  # + 2 s silence


def _session(turn_detection: dict[str, str] | None) -> dict[str, Any]:
    """A GA transcription session: 24 kHz PCM, the default model in English."""
    inputs = {
        "format": {"type": "audio/pcm", "rate": 24000},
        "transcription": {"model": DEFAULT_MODEL, "language": "en"},
        "turn_detection": turn_detection,
    }
    return {"type": "transcription", "audio": {"input": inputs}}


async def _append_and_collect(connection: Any, pcm24k: bytes) -> tuple[list[str], list[Any]]:
    """The recording appended in 0.1 s appends through an SDK connection (GA or beta), then
    its events until the completed items end with the recording's last word."""
    events: list[Any] = []
    completed: list[str] = []
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
    return completed, events


async def _openai_sdk(host: HttpHost, pcm24k: bytes) -> tuple[list[str], list[Any]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=TOKEN, base_url=f"http://127.0.0.1:{host.port}/v1")
    async with client.realtime.connect(
        model=DEFAULT_MODEL, extra_query={"intent": "transcription"}
    ) as connection:
        await connection.session.update(session=_session({"type": "server_vad"}))
        completed, events = await _append_and_collect(connection, pcm24k)
    await client.close()
    return completed, events


async def _openai_sdk_beta(host: HttpHost, pcm24k: bytes) -> tuple[list[str], list[Any]]:
    """The SDK's beta client (``client.beta.realtime``: ``OpenAI-Beta: realtime=v1``,
    ``transcription_session.update``), as older code still uses it. It always dials
    ``wss://`` from ``base_url``; ``websocket_base_url`` is its way to plain ``ws://``."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(
        api_key=TOKEN,
        base_url=f"http://127.0.0.1:{host.port}/v1",
        websocket_base_url=f"ws://127.0.0.1:{host.port}/v1",
    )
    async with client.beta.realtime.connect(
        model=DEFAULT_MODEL, extra_query={"intent": "transcription"}
    ) as connection:
        await connection.transcription_session.update(
            session={
                "input_audio_format": "pcm16",
                "input_audio_transcription": {"model": DEFAULT_MODEL, "language": "en"},
                "turn_detection": {"type": "server_vad"},
            }
        )
        completed, events = await _append_and_collect(connection, pcm24k)
    await client.close()
    return completed, events


async def _livekit(host: HttpHost, pcm24k: bytes) -> tuple[list[str], list[Any]]:
    """livekit-plugins-openai's realtime STT stream, headless: no LiveKit server, the plugin's
    own aiohttp session bound by ``http_context.open()``; the turns come from the server's
    voice detection (the plugin's default ``server_vad`` turn detection)."""
    from livekit.agents import stt as agents_stt
    from livekit.agents.utils import http_context
    from livekit.plugins import openai as lk_openai

    events: list[Any] = []
    finals: list[str] = []
    async with http_context.open():
        stt = lk_openai.STT(
            model=DEFAULT_MODEL,
            language="en",
            api_key=TOKEN,
            base_url=f"http://127.0.0.1:{host.port}/v1",
            use_realtime=True,
        )
        stream = stt.stream()
        push_pcm(stream, pcm24k, 24000, CHUNK)
        # The plugin keeps the socket open for more audio: stop at the recording's last word.
        async with asyncio.timeout(120):
            async for event in stream:
                events.append(event)
                if event.type == agents_stt.SpeechEventType.FINAL_TRANSCRIPT:
                    finals.append(event.alternatives[0].text)
                    if normalize_words(" ".join(finals))[-1:] == ["meters"]:
                        break
        await stream.aclose()
        await stt.aclose()
    return finals, events


def _as_native(
    host: HttpHost,
    record_property: Any,
    name: str,
    client: Callable[[HttpHost, bytes], Awaitable[tuple[list[str], list[Any]]]],
) -> list[Any]:
    """``client``'s finals for the recording at 24 kHz must be the native route's words; its
    events, for the caller's checks. Both transcripts are recorded (pytest --junitxml)."""
    pcm = RECORDING.read_bytes()
    native = _native(host, pcm)
    finals, events = asyncio.run(client(host, _at_24k(pcm)))
    transcript = " ".join(finals)
    record_property("native", native)
    record_property(name, transcript)
    assert normalize_words(native) == EXPECTED, native
    assert normalize_words(transcript) == EXPECTED, (transcript, events)
    assert transcript.strip() == native.strip()
    return events


def test_the_same_words_through_native_and_the_openai_sdk(
    host: HttpHost, record_property: Any
) -> None:
    events = _as_native(host, record_property, "openai_sdk", _openai_sdk)
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


def test_the_same_words_through_native_and_the_openai_sdk_beta_client(
    host: HttpHost, record_property: Any
) -> None:
    events = _as_native(host, record_property, "openai_sdk_beta", _openai_sdk_beta)
    kinds = [event.type for event in events]
    # Greeted, answered and given its items in the beta dialect, parsed by the SDK's beta models.
    assert kinds[:2] == ["transcription_session.created", "transcription_session.updated"]
    assert "conversation.item.created" in kinds and "conversation.item.added" not in kinds
    assert "session.created" not in kinds


async def _openai_sdk_manual(host: HttpHost, pcm24k: bytes, turns: int) -> list[Any]:
    """Manual commits (``turn_detection: null``): the recording appended and committed
    ``turns`` times on one connection; the events until the last item is done."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=TOKEN, base_url=f"http://127.0.0.1:{host.port}/v1")
    events: list[Any] = []
    async with client.realtime.connect(
        model=DEFAULT_MODEL, extra_query={"intent": "transcription"}
    ) as connection:
        await connection.session.update(session=_session(None))
        for _ in range(turns):
            for i in range(0, len(pcm24k), CHUNK):
                audio = base64.b64encode(pcm24k[i : i + CHUNK]).decode()
                await connection.input_audio_buffer.append(audio=audio)
            await connection.input_audio_buffer.commit()
        done = 0
        async with asyncio.timeout(120):
            async for event in connection:
                events.append(event)
                if event.type == "conversation.item.done":
                    done += 1
                    if done == turns:
                        break
                if event.type == "error":
                    break
    await client.close()
    return events


def test_manual_commits_through_the_openai_sdk_keep_the_stream_and_its_words(
    host: HttpHost, record_property: Any
) -> None:
    """Two turns, each committed by the client on one connection (a cut of the same engine
    stream each): each item is the recording's words, committed at once, its deltas adding up
    to its transcript, and the second item follows the first."""
    pcm = RECORDING.read_bytes()
    samples = np.frombuffer(pcm, dtype="<i2")
    pcm24k = np.asarray(soxr.resample(samples, 16000, 24000, quality="HQ")).astype("<i2")
    events = asyncio.run(_openai_sdk_manual(host, pcm24k.tobytes(), turns=2))
    kinds = [event.type for event in events]
    assert "error" not in kinds, events
    assert "input_audio_buffer.speech_started" not in kinds  # items are the client's commits
    committed = [e for e in events if e.type == "input_audio_buffer.committed"]
    assert len(committed) == 2
    assert committed[1].previous_item_id == committed[0].item_id
    transcripts = {
        e.item_id: e.transcript
        for e in events
        if e.type == "conversation.item.input_audio_transcription.completed"
    }
    record_property("manual_commits", list(transcripts.values()))
    assert list(transcripts) == [c.item_id for c in committed]
    for transcript in transcripts.values():
        assert normalize_words(transcript) == EXPECTED, transcripts
    deltas: dict[str, str] = {}
    for event in events:
        if event.type == "conversation.item.input_audio_transcription.delta":
            deltas[event.item_id] = deltas.get(event.item_id, "") + event.delta
    assert deltas == transcripts


def test_the_same_words_through_native_and_livekit_plugins_openai(
    host: HttpHost, record_property: Any
) -> None:
    from livekit.agents import stt as agents_stt

    events = _as_native(host, record_property, "livekit_openai", _livekit)
    # The server's speech_started and speech_stopped are the plugin's start and end of speech.
    kinds = [event.type for event in events]
    assert kinds[0] == agents_stt.SpeechEventType.START_OF_SPEECH, kinds
    assert agents_stt.SpeechEventType.END_OF_SPEECH in kinds


def _run_readme_snippet(host: HttpHost, tmp_path: Path, client: str) -> str:
    """The section's Python snippet that imports ``client``, run as written with input24k.raw
    beside it (only the address and the token are this test's own); its output."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### From OpenAI's realtime clients", 1)[1].split("\n### ", 1)[0]
    snippets = re.findall(r"```python\n(.*?)```", section, re.S)
    [code] = [snippet for snippet in snippets if client in snippet]
    code = code.replace("http://127.0.0.1:8000", f"http://127.0.0.1:{host.port}")
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
    return result.stdout


def test_readme_snippet_runs_against_talkies(host: HttpHost, tmp_path: Path) -> None:
    """The README's OpenAI SDK snippet."""
    stdout = _run_readme_snippet(host, tmp_path, "from openai import AsyncOpenAI")
    assert normalize_words(stdout) == EXPECTED, stdout


def test_readme_livekit_snippet_runs_against_talkies(host: HttpHost, tmp_path: Path) -> None:
    """The README's livekit-plugins-openai snippet, headless."""
    stdout = _run_readme_snippet(host, tmp_path, "from livekit.plugins import openai")
    assert normalize_words(stdout) == EXPECTED, stdout
