"""POST /v1/audio/speech and GET /v1/audio/voices on both hosts: Qwen3 PCM streamed as it is
decoded (a tiny random Qwen3-TTS on the real qwen-tts), buffered formats through ffmpeg, and
Kokoro's real speech transcribed back by the project's own ASR."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from .http_hosts import TOKEN, HttpHost
from .modelgen_whisper import normalize_words
from .spec import spec_text
from .wire import START, ws_connect

pytestmark = pytest.mark.usefixtures("http_data")

STEP_BYTES = 1920 * 2  # one 12 Hz codec step of s16le at 24 kHz
CHUNK_STEPS = 8  # TALKIES_QWEN3_STREAM_CHUNK_SIZE's default
TINY_STEPS = 40


def _post(host: HttpHost, body: dict[str, Any], **kwargs: Any) -> httpx.Response:
    # json.dumps, not httpx's json= (raw UTF-8, which cannot carry a lone surrogate).
    headers = {"Content-Type": "application/json"}
    with host.client() as client:
        return client.post(
            "/v1/audio/speech", content=json.dumps(body).encode(), headers=headers, **kwargs
        )


def _chunked(host: HttpHost, body: dict[str, Any]) -> tuple[bytes, list[int], list[float], float]:
    """A raw-socket request: the head, each HTTP chunk's size and arrival time, and when the
    request was sent (so chunk framing is seen exactly as the server wrote it)."""
    payload = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", host.port), timeout=60)
    started = time.monotonic()
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    buf = b""

    def need(n: int) -> None:
        nonlocal buf
        while len(buf) < n:
            chunk = sock.recv(65536)
            assert chunk, "connection closed early"
            buf += chunk

    while b"\r\n\r\n" not in buf:
        need(len(buf) + 1)
    head, _, buf = buf.partition(b"\r\n\r\n")
    sizes: list[int] = []
    arrivals: list[float] = []
    while True:
        while b"\r\n" not in buf:
            need(len(buf) + 1)
        line, _, buf = buf.partition(b"\r\n")
        size = int(line.split(b";")[0], 16)
        need(size + 2)
        buf = buf[size + 2 :]
        if size == 0:
            break
        sizes.append(size)
        arrivals.append(time.monotonic() - started)
    sock.close()
    return head, sizes, arrivals, started


def test_qwen3_pcm_streams_chunk_by_chunk(host: HttpHost) -> None:
    body = {
        "model": "qwen3-tiny-random",
        "input": "Hello.",
        "voice": "alloy",
        "response_format": "pcm",
    }
    with host.client() as client:  # load the model first: only synthesis is timed below
        assert client.get("/v1/audio/voices", params={"model": "qwen3-tiny-random"}).is_success
    head, sizes, arrivals, _ = _chunked(host, body)
    lines = head.lower().split(b"\r\n")
    assert lines[0].startswith(b"http/1.1 200 ok")
    assert b"content-type: application/octet-stream" in lines
    assert b"x-sample-rate: 24000" in lines
    assert b"transfer-encoding: chunked" in lines
    assert not [line for line in lines if line.startswith(b"content-length")]
    # Every chunk but the last is exactly CHUNK_STEPS codec steps; all of them, every step.
    assert all(size == CHUNK_STEPS * STEP_BYTES for size in sizes[:-1]), sizes
    assert 0 < sizes[-1] <= CHUNK_STEPS * STEP_BYTES
    assert sum(sizes) == TINY_STEPS * STEP_BYTES
    # Written as generated: the chunks arrive spread out, the first well before the last
    # (a buffered response would bring them all within a millisecond).
    assert arrivals == sorted(arrivals)
    # (About 0.1 s apart here; half of that is the bound, far from a millisecond.)
    assert arrivals[-1] - arrivals[0] > 0.05 * (len(arrivals) - 1), arrivals


def test_first_chunk_reaches_an_httpx_stream_before_generation_ends(host: HttpHost) -> None:
    body = {
        "model": "qwen3-tiny-long",
        "input": "A long one.",
        "voice": "alloy",
        "response_format": "pcm",
    }
    with host.client() as client:  # load the model first: only synthesis is timed below
        assert client.get("/v1/audio/voices", params={"model": "qwen3-tiny-long"}).is_success
        started = time.monotonic()
        with client.stream("POST", "/v1/audio/speech", json=body) as response:
            assert response.status_code == 200
            first = None
            total = 0
            for chunk in response.iter_bytes():
                first = first if first is not None else time.monotonic() - started
                total += len(chunk)
        elapsed = time.monotonic() - started
    assert total == 300 * STEP_BYTES
    assert first is not None and first < elapsed / 10, (first, elapsed)
    host.wait_in_use("qwen3-tiny-long", 0)


def test_the_specs_curl_example(host: HttpHost, tmp_path: Path) -> None:
    text = spec_text()
    start = text.index("curl -s -N http://127.0.0.1:8000/v1/audio/speech")
    command = text[start : text.index("--output speech.raw", start) + len("--output speech.raw")]
    command = command.replace("\\\n", " ").replace("127.0.0.1:8000", f"127.0.0.1:{host.port}")
    command = command.replace('"model":"qwen3-tts-0.6b"', '"model":"qwen3-tiny-random"')
    args = shlex.split(command)
    args[1:1] = ["-H", f"Authorization: Bearer {TOKEN}"]  # the spec's server has no token
    subprocess.run(args, cwd=tmp_path, check=True, timeout=60)
    assert (tmp_path / "speech.raw").stat().st_size == TINY_STEPS * STEP_BYTES
    convert = next(ln for ln in text.splitlines() if ln.startswith("ffmpeg -f s16le -ar 24000"))
    subprocess.run([*shlex.split(convert), "-loglevel", "error"], cwd=tmp_path, check=True)
    probe = subprocess.run(
        ["ffprobe", "-v", "error", "-show_entries", "format=duration", "-of", "csv=p=0",
         str(tmp_path / "speech.wav")],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert float(probe.stdout) == pytest.approx(TINY_STEPS * 1920 / 24000, abs=0.01)


FORMATS = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "mp3": "audio/mpeg",
    "opus": "audio/opus",
    "aac": "audio/aac",
    "pcm": "application/octet-stream",
}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_every_format(host: HttpHost, fmt: str, tmp_path: Path) -> None:
    r = _post(
        host,
        {"model": "kokoro-82m", "input": "Good morning.", "voice": "alloy", "response_format": fmt},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == FORMATS[fmt]
    if fmt == "pcm":  # Kokoro streams pcm, a phoneme batch at a time
        assert "content-length" not in r.headers
    else:
        assert int(r.headers["content-length"]) == len(r.content)
    path = tmp_path / f"out.{fmt}"
    path.write_bytes(r.content)
    raw = ["-f", "s16le", "-ar", "24000", "-ac", "1"] if fmt == "pcm" else []
    decoded = subprocess.run(
        ["ffmpeg", "-loglevel", "error", *raw, "-i", str(path), "-f", "s16le", "-ac", "1", "-"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    assert len(decoded) > 24000  # more than half a second of audio came back


def test_qwen3_buffered_wav_is_the_same_audio(host: HttpHost) -> None:
    body = {"model": "qwen3-tiny-random", "input": "Hello.", "voice": "alloy"}
    streamed = _post(host, {**body, "response_format": "pcm"}).content
    wav = _post(host, {**body, "response_format": "wav"})
    assert wav.headers["content-type"] == "audio/wav"
    assert wav.content[44:] == streamed  # greedy: the same samples behind a WAV header


def test_kokoro_speaks_words_our_asr_understands(host: HttpHost) -> None:
    sentence = "The quick brown fox jumps over the lazy dog."
    wav = _post(
        host, {"model": "kokoro-82m", "input": sentence, "voice": "alloy", "response_format": "wav"}
    )
    assert wav.status_code == 200
    with host.client() as client:
        heard = client.post(
            "/v1/audio/transcriptions",
            data={"model": "whisper-base-en"},
            files={"file": ("kokoro.wav", wav.content, "audio/wav")},
        )
    assert heard.status_code == 200, heard.text
    assert normalize_words(heard.json()["text"]) == normalize_words(sentence)


BAD = [
    ({"input": "x", "voice": "alloy"}, 400, "model"),
    ({"model": "no-such", "input": "x", "voice": "alloy"}, 404, "unknown model"),
    ({"model": "whisper-base-en", "input": "x", "voice": "alloy"}, 400, "not a speech model"),
    ({"model": "kokoro-82m", "input": "", "voice": "alloy"}, 400, "empty"),
    ({"model": "kokoro-82m", "input": "x" * 4097, "voice": "alloy"}, 400, "4096"),
    ({"model": "kokoro-82m", "input": "x", "voice": "nobody"}, 400, "unknown voice"),
    (
        {"model": "kokoro-82m", "input": "x", "voice": "alloy", "response_format": "ogg"},
        400,
        "response_format",
    ),
    ({"model": "kokoro-82m", "input": "x", "voice": "alloy", "speed": 9}, 400, "speed"),
    ({"model": "kokoro-82m", "input": "x", "voice": "alloy", "speed": "fast"}, 400, "speed"),
    ({"model": "qwen3-tiny-random", "input": "x", "voice": "alloy", "speed": 1.5}, 400, "speed"),
    (
        {"model": "kokoro-82m", "input": "x", "voice": "alloy", "colour": "red"},
        400,
        "unknown field",
    ),
    ({"model": "kokoro-82m", "input": 5, "voice": "alloy"}, 400, "string"),
    (
        {"model": "kokoro-82m", "input": "x", "voice": "alloy", "stream_format": "sse"},
        400,
        "stream_format must be 'audio'",
    ),
    (
        {"model": "qwen3-tiny-random", "input": "x", "voice": "alloy", "instructions": "a\ud800"},
        400,
        "instructions is not valid unicode",
    ),
]


@pytest.mark.parametrize(("body", "status", "says"), BAD, ids=[b[2] for b in BAD])
def test_refused_before_any_audio(
    host: HttpHost, body: dict[str, Any], status: int, says: str
) -> None:
    r = _post(host, body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert says.lower() in r.json()["error"]["message"].lower()


def test_openai_sdk_stream_format_audio_is_this_routes_streaming(host: HttpHost) -> None:
    """OpenAI's ``stream_format``: "audio" (its default, the audio as it is made) is what this
    route does, taken as the SDK sends it (it was refused as an unknown field)."""
    import openai

    client = openai.OpenAI(api_key="unused", base_url=host.url + "/v1", max_retries=0)
    with client.with_options(
        default_headers=host.headers
    ).audio.speech.with_streaming_response.create(
        model="qwen3-tiny-random",
        input="Hello there.",
        voice="alloy",
        response_format="pcm",
        stream_format="audio",
    ) as response:
        assert response.status_code == 200
        assert sum(len(chunk) for chunk in response.iter_bytes()) > 0


def test_not_json(host: HttpHost) -> None:
    with host.client() as client:
        r = client.post(
            "/v1/audio/speech", content=b"{nope", headers={"Content-Type": "application/json"}
        )
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]


def test_two_requests_to_one_qwen3_model_are_serialized(host: HttpHost) -> None:
    body = {
        "model": "qwen3-tiny-random",
        "input": "Hello.",
        "voice": "alloy",
        "response_format": "pcm",
    }
    spans: list[tuple[float, float]] = []

    def run() -> None:
        _, _, arrivals, started = _chunked(host, body)
        spans.append((started + arrivals[0], started + arrivals[-1]))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(spans) == 2
    (_, a_last), (b_first, _) = sorted(spans)
    # One generation at a time: the second's first chunk came after the first's last chunk.
    assert b_first >= a_last - 0.05, spans


def test_a_client_leaving_mid_stream_frees_the_model(host: HttpHost) -> None:
    body = json.dumps(
        {"model": "qwen3-tiny-long", "input": "Long.", "voice": "alloy", "response_format": "pcm"}
    ).encode()
    sock = socket.create_connection(("127.0.0.1", host.port), timeout=60)
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    assert sock.recv(65536)  # the head, and the first chunk, are on their way
    host.wait_in_use("qwen3-tiny-long", 1)
    sock.close()
    left = time.monotonic()
    host.wait_in_use("qwen3-tiny-long", 0, timeout=10)
    released = time.monotonic() - left
    # The lock is free too: a whole new (short) synthesis on the same model completes.
    started = time.monotonic()
    r = _post(
        host,
        {"model": "qwen3-tiny-long", "input": "x", "voice": "alloy", "response_format": "wav"},
        timeout=120,
    )
    assert r.status_code == 200
    assert released < 2.0, released
    assert time.monotonic() - started < 120


def test_a_speech_request_for_another_model_while_streams_pin_one_is_409(host: HttpHost) -> None:
    ws = ws_connect(host.ws_url, additional_headers={"Authorization": f"Bearer {TOKEN}"})
    ws.send(json.dumps({**START, "model": "energy-test"}))
    assert json.loads(ws.recv(timeout=30))["type"] == "ready"
    try:
        r = _post(host, {"model": "kokoro-82m", "input": "x", "voice": "alloy"})
        assert r.status_code == 409 and "energy-test" in r.json()["error"]["message"]
    finally:
        ws.send(json.dumps({"type": "cancel"}))
        ws.close()
    host.wait_in_use("energy-test", 0)


def test_voices(host: HttpHost) -> None:
    with host.client() as client:
        kokoro = client.get("/v1/audio/voices", params={"model": "kokoro-82m"}).json()
        assert {"alloy", "echo", "fable", "jf_alpha"} <= set(kokoro["voices"])
        qwen = client.get("/v1/audio/voices", params={"model": "qwen3-tiny-random"}).json()
        assert {"alloy", "vivian", "ryan", "serena"} <= set(qwen["voices"])
        missing = client.get("/v1/audio/voices")
        assert missing.status_code == 400 and "kokoro-82m" in missing.json()["error"]["message"]
        assert (
            client.get("/v1/audio/voices", params={"model": "whisper-base-en"}).status_code == 400
        )
