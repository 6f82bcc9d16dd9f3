"""/mcp on both hosts, driven by the official MCP SDK's own client (Streamable HTTP), with real
speech through the real default model and the energy doubles for the pool's limits."""

from __future__ import annotations

import base64
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, TextContent
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from talkies.engines.supply.builtin import DEFAULT_SPEECH_MODEL

from .fake_engine import speech, write_wav
from .http_hosts import TOKEN, HttpHost
from .modelgen_whisper import POCKETSPHINX_DATA, normalize_words

pytestmark = pytest.mark.usefixtures("http_data")

GOFORWARD = ["go", "forward", "ten", "meters"]
T = TypeVar("T")


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    raw = POCKETSPHINX_DATA / "goforward.raw"
    if not raw.is_file():
        pytest.skip("pocketsphinx-testdata is not installed")
    folder = tmp_path_factory.mktemp("mcp-clips")
    # goforward.raw is headerless PCM16 at 16 kHz; ffmpeg needs a container to know that.
    return {
        "goforward": write_wav(folder / "goforward.wav", raw.read_bytes()),
        "holder": write_wav(folder / "holder.wav", speech(1.0)),
        "long": write_wav(folder / "long.wav", speech(4.0)),
    }


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode("ascii")


def _run(main: Callable[[], Awaitable[T]]) -> T:
    return anyio.run(main)


@asynccontextmanager
async def _mcp(host: HttpHost, mode: str = "legacy") -> AsyncIterator[Client]:
    """The SDK client over Streamable HTTP, with the bearer token on every request."""
    http = httpx2.AsyncClient(
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=httpx2.Timeout(30.0, read=300.0),
    )
    async with (
        http,
        Client(streamable_http_client(host.url + "/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


def _text(result: CallToolResult) -> str:
    assert len(result.content) == 1 and isinstance(result.content[0], TextContent)
    return result.content[0].text


def _error(result: CallToolResult) -> dict[str, Any]:
    assert result.is_error, result
    error = result.structured_content["error"]
    assert isinstance(error, dict)
    assert _text(result).startswith(f"Error {error['status']} ")
    return error


def test_sdk_client_transcribes_real_speech(host: HttpHost, clips: dict[str, Path]) -> None:
    name = f"mcp-{host.name}/go forward.wav"
    with host.client() as http:
        assert (
            http.put(f"/v1/files/{name}", content=clips["goforward"].read_bytes()).status_code
            == 201
        )

    async def main() -> tuple[Any, ...]:
        async with _mcp(host) as client:  # the initialize handshake
            assert client.server_info is not None and client.server_info.name == "talkies"
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            staged = await client.call_tool("transcribe", {"file_path": name})
            inline = await client.call_tool(
                "transcribe",
                {"audio_base64": _b64(clips["goforward"]), "word_timestamps": True},
            )
            models = await client.call_tool("list_models", {})
            return tools, staged, inline, models

    tools, staged, inline, models = _run(main)
    assert set(tools) == {"transcribe", "list_models", "speak"}
    schema = tools["transcribe"].input_schema
    assert {"file_path", "audio_base64", "model", "language", "prompt", "word_timestamps"} <= set(
        schema["properties"]
    )
    assert schema["properties"]["model"]["default"] == "whisper-base-en"
    assert tools["transcribe"].output_schema is not None

    for result in (staged, inline):
        assert not result.is_error, result
        assert normalize_words(_text(result)) == GOFORWARD
        doc = result.structured_content
        assert normalize_words(doc["text"]) == GOFORWARD
        assert doc["model"] == "whisper-base-en" and doc["language"] == "english"
        assert doc["duration"] == pytest.approx(2.786, abs=0.01)
        assert doc["segments"] and all(
            0 <= s["start"] < s["end"] <= doc["duration"] + 0.01 for s in doc["segments"]
        )
    assert "words" not in staged.structured_content
    words = inline.structured_content["words"]
    assert normalize_words(" ".join(w["word"] for w in words)) == GOFORWARD
    assert [w["start"] for w in words] == sorted(w["start"] for w in words)

    # list_models: the rows of GET /v1/models, as text and as structured content.
    assert not models.is_error
    assert json.loads(_text(models)) == models.structured_content
    listed = {row["id"]: row for row in models.structured_content["data"]}
    # Readiness may change between the two calls (a site check finishing in the background):
    # the rest of each row must be the same.
    assert _steady(listed) == _steady(host.models())
    assert all({"readiness", "reason"} <= row.keys() for row in listed.values())
    assert listed["whisper-base-en"]["loaded"] is True


def _steady(rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        k: {f: v for f, v in row.items() if f not in ("readiness", "reason")}
        for k, row in rows.items()
    }


def test_discovery_mode_client(host: HttpHost, clips: dict[str, Path]) -> None:
    """The SDK's default mode: server/discover, then the per-request protocol revision."""

    async def main() -> tuple[Any, ...]:
        async with _mcp(host, mode="auto") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            result = await client.call_tool(
                "transcribe", {"audio_base64": _b64(clips["holder"]), "model": "energy-test"}
            )
            return client.protocol_version, names, result

    version, names, result = _run(main)
    assert names == {"transcribe", "list_models", "speak"}
    assert not result.is_error, result
    assert result.structured_content["duration"] == pytest.approx(1.0, abs=0.01)
    assert result.structured_content["model"] == "energy-test"
    assert version in MODERN_PROTOCOL_VERSIONS  # discovery worked: no initialize handshake


def _transcribe_in_background(
    host: HttpHost, path: Path, model: str
) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}

    def run() -> None:
        with host.client() as client, path.open("rb") as f:
            r = client.post(
                "/v1/audio/transcriptions",
                data={"model": model},
                files={"file": (path.name, f, "audio/wav")},
            )
            result["status"] = r.status_code

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_a_full_model_is_a_429_tool_error(host: HttpHost, clips: dict[str, Path]) -> None:
    thread, first = _transcribe_in_background(host, clips["holder"], "energy-slow-test")
    try:
        host.wait_in_use("energy-slow-test", 1)

        async def main() -> tuple[CallToolResult, float]:
            async with _mcp(host) as client:
                started = time.monotonic()
                result = await client.call_tool(
                    "transcribe",
                    {"audio_base64": _b64(clips["holder"]), "model": "energy-slow-test"},
                )
                return result, time.monotonic() - started

        result, took = _run(main)
    finally:
        thread.join(60)
    error = _error(result)
    assert error["status"] == 429 and error["code"] == "model_full"
    assert error["type"] == "rate_limit_error" and "limit" in error["message"]
    assert took < 2.0  # refused at once, not queued
    assert first["status"] == 200
    host.wait_in_use("energy-slow-test", 0)


def test_bad_input_is_a_tool_error(host: HttpHost, clips: dict[str, Path]) -> None:
    text = base64.b64encode(b"this is not audio at all").decode()
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"audio_base64": "not base64!"}, 400, "invalid_base64"),
        ({"audio_base64": "data:audio/wav,RIFF"}, 400, "invalid_base64"),
        ({"audio_base64": text}, 400, "invalid_audio"),
        ({"file_path": "../escape.wav"}, 400, "invalid file path"),
        ({"file_path": "a/../../escape.wav"}, 400, "invalid file path"),
        ({"file_path": "/etc/passwd"}, 400, "invalid file path"),
        ({"file_path": f"mcp-{host.name}/missing.wav"}, 404, "no staged file"),
        ({}, 400, "exactly one"),
        ({"file_path": "a.wav", "audio_base64": text}, 400, "exactly one"),
        ({"audio_base64": text, "model": "no-such-model"}, 404, "model_not_found"),
        ({"audio_base64": text, "model": "canary-test"}, 400, "unsupported_model"),
        ({"audio_base64": text, "language": "not a language"}, 400, "invalid_language"),
        ({"audio_base64": text, "word_timestamps": "sometimes"}, 400, "invalid_arguments"),
        ({"audio_base64": text, "speed": 2}, 400, "invalid_arguments"),
    ]

    async def main() -> tuple[list[CallToolResult], MCPError, CallToolResult]:
        async with _mcp(host) as client:
            results = [await client.call_tool("transcribe", args) for args, _, _ in cases]
            with pytest.raises(MCPError) as unknown:
                await client.call_tool("sing", {"input": "hello"})
            # The server is still well afterwards.
            models = await client.call_tool("list_models", {})
            return results, unknown.value, models

    results, unknown, models = _run(main)
    for (args, status, marker), result in zip(cases, results, strict=True):
        error = _error(result)
        assert error["status"] == status, (args, error)
        assert marker in (error["code"] or "") or marker in error["message"], (args, error)
        assert "Traceback" not in error["message"]
    assert unknown.code == -32602 and "sing" in unknown.message
    assert not models.is_error
    assert not (host.data_dir / "escape.wav").exists()
    assert not list((host.data_dir / "tmp").glob("mcp-*"))  # base64 audio is not left behind


def test_mcp_needs_the_token_and_takes_only_post(host: HttpHost) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.post(
            host.url + "/mcp",
            headers=headers,
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
        )
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    get = httpx.get(host.url + "/mcp", headers=host.headers)
    assert get.status_code == 405 and get.headers["allow"] == "POST"


def test_a_client_leaving_mid_call_frees_the_slot(host: HttpHost, clips: dict[str, Path]) -> None:
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "transcribe",
            "arguments": {"audio_base64": _b64(clips["long"]), "model": "energy-slow-test"},
        },
    }
    body = json.dumps(call).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{host.port}\r\nAuthorization: Bearer {TOKEN}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", host.port), timeout=10)
    sock.sendall(head + body)
    host.wait_in_use("energy-slow-test", 1)
    sock.close()
    started = time.monotonic()
    host.wait_in_use("energy-slow-test", 0, timeout=5)
    # The decode would have taken 20 steps x 0.5 s; it stopped within about one step.
    assert time.monotonic() - started < 3.0


def test_speak_returns_speech_that_transcribes_back(host: HttpHost) -> None:
    """Kokoro's real speech as audio content, heard by the offline Whisper base."""

    async def main() -> tuple[Any, Any]:
        async with _mcp(host) as client:
            spoken = await client.call_tool(
                "speak", {"text": "Please call Stella.", "voice": "echo", "model": "kokoro-82m"}
            )
            audio = next(c for c in spoken.content if c.type == "audio")
            heard = await client.call_tool("transcribe", {"audio_base64": audio.data})
            refused = await client.call_tool("speak", {"text": "x", "voice": "nobody"})
            return spoken, heard, refused

    spoken, heard, refused = _run(main)
    assert not spoken.is_error, spoken
    doc = spoken.structured_content
    assert doc["format"] == "wav" and doc["sample_rate"] == 24000 and doc["seconds"] > 0.5
    audio = next(c for c in spoken.content if c.type == "audio")
    assert audio.mime_type == "audio/wav"
    assert normalize_words(_text(heard)) == ["please", "call", "stella"]
    assert refused.is_error and refused.structured_content["error"]["status"] == 400


def test_speak_defaults_to_the_default_speech_model(host: HttpHost) -> None:
    """Without a model, ``speak`` uses the server's default voice, as ``talkies speak`` and
    Wyoming do: Piper's English voice, heard back by the offline Whisper base."""

    async def main() -> tuple[Any, Any]:
        async with _mcp(host) as client:
            spoken = await client.call_tool("speak", {"text": "Good morning, how are you today?"})
            audio = next(c for c in spoken.content if c.type == "audio")
            heard = await client.call_tool("transcribe", {"audio_base64": audio.data})
            return spoken, heard

    spoken, heard = _run(main)
    assert not spoken.is_error, spoken
    assert spoken.structured_content["model"] == DEFAULT_SPEECH_MODEL == "piper-en-us-joe"
    assert normalize_words(_text(heard)) == ["good", "morning", "how", "are", "you", "today"]
