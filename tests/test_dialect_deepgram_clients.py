"""Deepgram's own clients against ``/v1/listen`` on both hosts, with the real default model.

The same real English recording (pocketsphinx-testdata's goforward.raw, "go forward ten
meters") through the native route (websockets), the official ``deepgram-sdk`` live client
with its base URL pointed at Talkies, and ``livekit-plugins-deepgram``'s STT stream (run
headless: no LiveKit server, an aiohttp session of our own) must give the same words. The
hosts are tests/http_hosts.py's: talkies' own server and uvicorn, each a process serving the
built-in ``whisper-base-en`` with a bearer token.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
import soxr  # type: ignore[import-untyped]

from talkies.app.g711 import DECODERS
from talkies.engines.supply.builtin import DEFAULT_MODEL

from .http_hosts import TOKEN, HttpHost
from .modelgen_whisper import POCKETSPHINX_DATA, normalize_words
from .wire import drain, ws_connect

RECORDING = POCKETSPHINX_DATA / "goforward.raw"  # 16 kHz mono PCM16
EXPECTED = ["go", "forward", "ten", "meters"]
CHUNK = 3200  # 0.1 s

pytestmark = pytest.mark.skipif(not RECORDING.exists(), reason="pocketsphinx-testdata missing")


def _native(host: HttpHost, pcm: bytes) -> str:
    ws = ws_connect(host.ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"})
    start = {"type": "start", "model": DEFAULT_MODEL, "encoding": "pcm_s16le"}
    ws.send(json.dumps(start | {"sample_rate": 16000, "channels": 1}))
    assert json.loads(ws.recv(timeout=120))["type"] == "ready"
    for i in range(0, len(pcm), CHUNK):
        ws.send(pcm[i : i + CHUNK])
    ws.send(json.dumps({"type": "end"}))
    events, code, _ = drain(ws, timeout=60)
    assert code == 1000
    return " ".join(e["text"] for e in events if e["type"] in ("endpoint", "final"))


async def _deepgram_sdk(
    host: HttpHost, pcm: bytes, encoding: str = "linear16", rate: int = 16000
) -> tuple[str, list[Any]]:
    from deepgram import AsyncDeepgramClient
    from deepgram.environment import DeepgramClientEnvironment

    base = f"127.0.0.1:{host.port}"
    environment = DeepgramClientEnvironment(
        base=f"http://{base}", production=f"ws://{base}", agent=f"ws://{base}", agent_rest=""
    )
    client = AsyncDeepgramClient(api_key=TOKEN, environment=environment)
    messages: list[Any] = []
    async with client.listen.v1.connect(
        model=DEFAULT_MODEL,
        encoding=encoding,
        sample_rate=rate,
        channels=1,
        interim_results=True,
        punctuate=True,
    ) as socket:

        async def send() -> None:
            for i in range(0, len(pcm), CHUNK):
                await socket.send_media(pcm[i : i + CHUNK])
            await socket.send_close_stream()

        sender = asyncio.create_task(send())
        async with asyncio.timeout(120):
            async for message in socket:
                messages.append(message)
        await sender
    finals = [
        m.channel.alternatives[0].transcript
        for m in messages
        if getattr(m, "type", None) == "Results" and m.is_final
    ]
    return " ".join(finals), messages


def push_pcm(stream: Any, pcm: bytes, rate: int, chunk: int) -> None:
    """Mono PCM16 into a LiveKit STT stream, in frames of ``chunk`` bytes, then its end."""
    from livekit import rtc

    for i in range(0, len(pcm), chunk):
        data = pcm[i : i + chunk]
        frame = rtc.AudioFrame(
            data=data, sample_rate=rate, num_channels=1, samples_per_channel=len(data) // 2
        )
        stream.push_frame(frame)
    stream.flush()
    stream.end_input()


async def _livekit(host: HttpHost, pcm: bytes) -> str:
    import aiohttp
    from livekit.agents import stt as agents_stt
    from livekit.plugins import deepgram

    async with aiohttp.ClientSession() as session:
        stt = deepgram.STT(
            model=DEFAULT_MODEL,
            language="en",
            api_key=TOKEN,
            base_url=f"http://127.0.0.1:{host.port}/v1/listen",
            http_session=session,
            sample_rate=16000,
        )
        stream = stt.stream()
        push_pcm(stream, pcm, 16000, CHUNK)
        finals: list[str] = []
        async with asyncio.timeout(120):
            async for event in stream:
                if event.type == agents_stt.SpeechEventType.FINAL_TRANSCRIPT:
                    finals.append(event.alternatives[0].text)
        await stream.aclose()
    return " ".join(finals)


def test_the_same_words_through_native_and_deepgram_clients(
    host: HttpHost, record_property: Any
) -> None:
    pcm = RECORDING.read_bytes()
    native = _native(host, pcm)
    sdk, messages = asyncio.run(_deepgram_sdk(host, pcm))
    livekit = asyncio.run(_livekit(host, pcm))
    # Each client's transcript as it got it (pytest --junitxml keeps them).
    record_property("native", native)
    record_property("deepgram_sdk", sdk)
    record_property("livekit", livekit)
    assert normalize_words(native) == EXPECTED, native
    assert normalize_words(sdk) == EXPECTED, sdk
    assert normalize_words(livekit) == EXPECTED, livekit
    kinds = [type(m).__name__ for m in messages]
    # Parsed by the SDK's own models: Results, then Metadata last.
    assert kinds[-1] == "ListenV1Metadata" and "ListenV1Results" in kinds
    last = [m for m in messages if type(m).__name__ == "ListenV1Results"][-1]
    words = last.channel.alternatives[0].words
    assert all(w.start <= w.end for w in words)


def _g711(pcm16k: bytes, encoding: str) -> bytes:
    """The recording as telephone audio: 8 kHz, each sample coded as the G.711 byte whose
    value is nearest (the decoder's table, searched; an encoder of its own would only
    round the same way)."""
    samples = soxr.resample(np.frombuffer(pcm16k, dtype="<i2"), 16000, 8000, quality="HQ")
    table = DECODERS[encoding].astype(np.int32)
    order = np.argsort(table)
    ranked = table[order]
    at = np.clip(np.searchsorted(ranked, samples), 1, len(ranked) - 1)
    nearer = np.where(samples - ranked[at - 1] <= ranked[at] - samples, at - 1, at)
    return order[nearer].astype(np.uint8).tobytes()


@pytest.mark.parametrize("encoding", ["mulaw", "alaw"])
def test_telephone_audio_through_the_deepgram_sdk(
    host: HttpHost, encoding: str, record_property: Any
) -> None:
    """G.711 at 8 kHz (what Twilio's media streams carry) with ``encoding=mulaw`` or
    ``alaw``: decoded and resampled as it arrives, it gives the recording's words."""
    telephone = _g711(RECORDING.read_bytes(), encoding)
    sdk, messages = asyncio.run(_deepgram_sdk(host, telephone, encoding, 8000))
    record_property(f"deepgram_sdk_{encoding}", sdk)
    assert normalize_words(sdk) == EXPECTED, sdk
    assert type(messages[-1]).__name__ == "ListenV1Metadata"
