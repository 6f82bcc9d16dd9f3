"""``GET /v1/listen`` (Deepgram's live API) over real sockets, on both hosts.

The standalone server in this process and the ASGI app under uvicorn, both with the energy
test engine (``tiny-test``, ``slow-open-test``; tests/fake_engine.py), driven by a plain
websockets client speaking Deepgram's messages. The real Deepgram SDK and the LiveKit plugin
are in tests/test_dialect_deepgram_clients.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection

from .conftest import run_server
from .dialect_wire import Host, host_fixture
from .dialect_wire import closed as _drain
from .fake_engine import silence, speech
from .wire import ws_connect

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "tok"
AUTH = {"Authorization": f"Token {TOKEN}"}
QUERY = "model=tiny-test&encoding=linear16&sample_rate=16000&channels=1"

host = host_fixture(
    "/v1/listen", QUERY, auth_token=TOKEN, stream_max_connections=2, deepgram_idle_timeout=2.0
)


def _send_audio(ws: ClientConnection, pcm: bytes, frame: int = 640) -> None:
    for i in range(0, len(pcm), frame):
        ws.send(pcm[i : i + frame])


def _finals(messages: list[dict[str, Any]]) -> list[str]:
    return [
        m["channel"]["alternatives"][0]["transcript"]
        for m in messages
        if m["type"] == "Results" and m["is_final"]
    ]


def test_audio_before_anything_then_close_stream(host: Host) -> None:
    """A Deepgram client sends audio at once (no start, no ready), then CloseStream: the
    results, the last Results, Metadata, close 1000."""
    ws = ws_connect(
        host.url(QUERY + "&interim_results=true&vad_events=true"), additional_headers=AUTH
    )
    _send_audio(ws, speech(0.6) + silence(0.4) + speech(0.5))
    ws.send(json.dumps({"type": "CloseStream"}))
    messages, code = _drain(ws)
    assert code == 1000
    kinds = [m["type"] for m in messages]
    assert kinds[0] == "SpeechStarted" and kinds[-1] == "Metadata"
    assert kinds.count("SpeechStarted") == 2
    assert _finals(messages) == ["w1 w2", "w1 w2"]  # the endpoint, then CloseStream's flush
    last = [m for m in messages if m["type"] == "Results"][-1]
    assert last["is_final"] and last["speech_final"] and not last["from_finalize"]
    words = last["channel"]["alternatives"][0]["words"]
    assert [w["punctuated_word"] for w in words] == ["w1", "w2"]
    assert set(words[0]) == {"word", "start", "end", "confidence", "punctuated_word"}
    metadata = messages[-1]
    assert metadata["duration"] == pytest.approx(1.5)
    assert metadata["channels"] == 1 and metadata["request_id"] == last["metadata"]["request_id"]


def test_finalize_answers_from_finalize_and_no_word_twice(host: Host) -> None:
    ws = ws_connect(host.url(QUERY + "&interim_results=true"), additional_headers=AUTH)
    _send_audio(ws, speech(0.5))
    partials: list[dict[str, Any]] = []
    while not partials or partials[-1]["channel"]["alternatives"][0]["transcript"] != "w1 w2":
        partials.append(json.loads(ws.recv(timeout=5)))
    ws.send(json.dumps({"type": "Finalize"}))
    finalized = json.loads(ws.recv(timeout=5))
    assert finalized["from_finalize"] and finalized["is_final"] and not finalized["speech_final"]
    assert finalized["channel"]["alternatives"][0]["transcript"] == "w1 w2"
    _send_audio(ws, speech(0.5) + silence(0.4))
    ws.send(json.dumps({"type": "CloseStream"}))
    messages, code = _drain(ws)
    assert code == 1000
    # A cut: the engine went on with a new utterance (the fake engine counts its words
    # afresh), and the finalized words are not sent final again.
    assert _finals(messages) == ["w1 w2", ""]


@pytest.mark.parametrize("rate", [8000, 48000])
def test_other_sample_rates_are_resampled(host: Host, rate: int) -> None:
    import numpy as np

    # 0.6 s each: resampling rounds the square wave's edges, and the energy engine's words
    # count loud samples, so each utterance keeps a margin over its two words.
    pcm16 = np.frombuffer(speech(0.6) + silence(0.4) + speech(0.6), dtype="<i2")
    pcm = np.interp(
        np.arange(len(pcm16) * rate // 16000) * 16000 / rate, np.arange(len(pcm16)), pcm16
    )
    ws = ws_connect(host.url(QUERY.replace("16000", str(rate))), additional_headers=AUTH)
    _send_audio(ws, pcm.astype("<i2").tobytes(), frame=rate // 50 * 2)
    ws.send(json.dumps({"type": "CloseStream"}))
    messages, code = _drain(ws)
    assert code == 1000
    assert _finals(messages) == ["w1 w2", "w1 w2"]
    assert messages[-1]["duration"] == pytest.approx(1.6, abs=0.01)  # at 16 kHz, all of it


@pytest.mark.parametrize("rate", [16000, 8000])
def test_audio_after_close_stream_is_dropped_and_the_flush_still_answers(
    host: Host, rate: int
) -> None:
    """A client whose frames were still queued as it sent CloseStream: the audio after it is
    past the end, dropped. It used to be refused (invalid_audio, 4400: the transcript of all
    that came before lost) or, resampled (8 kHz, G.711), to break the connection (libsoxr
    takes nothing after its last input)."""
    import numpy as np

    pcm16 = np.frombuffer(speech(0.6) + silence(0.4), dtype="<i2")
    pcm = np.interp(
        np.arange(len(pcm16) * rate // 16000) * 16000 / rate, np.arange(len(pcm16)), pcm16
    ).astype("<i2")
    ws = ws_connect(host.url(QUERY.replace("16000", str(rate))), additional_headers=AUTH)
    _send_audio(ws, pcm.tobytes(), frame=rate // 50 * 2)
    ws.send(json.dumps({"type": "CloseStream"}))
    with suppress(ConnectionClosed):
        _send_audio(ws, pcm.tobytes()[: rate // 5], frame=rate // 50 * 2)
    messages, code = _drain(ws)
    assert code == 1000, messages
    assert "w1 w2" in _finals(messages)
    assert messages[-1]["type"] == "Metadata"
    assert messages[-1]["duration"] == pytest.approx(1.0, abs=0.01)  # not the late audio


def test_keepalive_holds_the_stream_past_the_idle_timeout(host: Host) -> None:
    ws = ws_connect(host.url(), additional_headers=AUTH)
    for _ in range(6):  # 3 s of KeepAlive against a 2 s idle timeout
        ws.send(json.dumps({"type": "KeepAlive"}))
        time.sleep(0.5)
    _send_audio(ws, speech(0.3))
    ws.send(json.dumps({"type": "CloseStream"}))
    messages, code = _drain(ws)
    assert code == 1000 and messages[-1]["type"] == "Metadata"


def test_idle_timeout_is_an_error_and_4408(host: Host) -> None:
    ws = ws_connect(host.url(), additional_headers=AUTH)
    _send_audio(ws, silence(0.1))
    started = time.monotonic()
    messages, code = _drain(ws)
    assert code == 4408 and time.monotonic() - started >= 1.5
    assert [(m["type"], m["variant"]) for m in messages] == [("Error", "idle_timeout")]
    assert set(messages[0]) == {"type", "variant", "code", "description", "message"}


@pytest.mark.parametrize(
    ("query", "variant", "close"),
    [
        ("model=tiny-test&sample_rate=16000", "unsupported_encoding", 4400),
        ("model=tiny-test&encoding=opus", "unsupported_encoding", 4400),
        (QUERY.replace("16000", "96000"), "unsupported_sample_rate", 4400),
        (QUERY.replace("channels=1", "channels=2"), "unsupported_channels", 4400),
        (QUERY + "&diarize=true", "unknown_field", 4400),
        (QUERY + "&keywords=hello:2", "unknown_field", 4400),
        (QUERY + "&interim_results=maybe", "invalid_field", 4400),
        (QUERY + "&model=tiny-test", "duplicate_field", 4400),
        (QUERY.replace("tiny-test", "nova-3"), "unknown_model", 4404),
        (QUERY.replace("tiny-test", "offline-test"), "streaming_not_supported", 4409),
    ],
)
def test_unsupported_query_is_an_error_message(
    host: Host, query: str, variant: str, close: int
) -> None:
    ws = ws_connect(host.url(query), additional_headers=AUTH)
    messages, code = _drain(ws)
    assert [(m["type"], m["variant"]) for m in messages] == [("Error", variant)]
    assert code == close


@pytest.mark.parametrize(
    ("message", "variant"),
    [
        ("not json", "invalid_json"),
        ('{"type":"Configure","features":{}}', "invalid_event"),
        ('{"type":"end"}', "invalid_event"),  # native names mean nothing here
        ('{"no":"type"}', "missing_field"),
        ("x" * 5000, "message_too_large"),
    ],
)
def test_bad_client_messages(host: Host, message: str, variant: str) -> None:
    ws = ws_connect(host.url(), additional_headers=AUTH)
    _send_audio(ws, silence(0.1))
    ws.send(message)
    messages, code = _drain(ws)
    assert [(m["type"], m["variant"]) for m in messages] == [("Error", variant)]
    assert code == 4400
    if variant == "invalid_event":
        assert "not supported on /v1/listen" in messages[0]["description"]


def test_unaligned_audio_is_refused(host: Host) -> None:
    ws = ws_connect(host.url(), additional_headers=AUTH)
    ws.send(b"\x00\x01\x02")
    messages, code = _drain(ws)
    assert [m["variant"] for m in messages] == ["unaligned_audio"] and code == 4400


@pytest.mark.parametrize(
    ("kwargs", "allowed"),
    [
        ({"additional_headers": {"Authorization": f"Token {TOKEN}"}}, True),
        ({"additional_headers": {"Authorization": f"Bearer {TOKEN}"}}, True),
        ({"subprotocols": ["token", TOKEN]}, True),
        ({"additional_headers": {"Authorization": "Token wrong"}}, False),
        ({"additional_headers": {"Authorization": f"Basic {TOKEN}"}}, False),
        ({"subprotocols": ["token", "wrong"]}, False),
        ({}, False),
    ],
)
def test_auth(host: Host, kwargs: dict[str, Any], allowed: bool) -> None:
    ws = ws_connect(host.url(), **kwargs)
    if "subprotocols" in kwargs:
        assert ws.subprotocol == "token"
    if not allowed:  # closed at once, without an error message
        assert _drain(ws) == ([], 4401)
        return
    _send_audio(ws, speech(0.3))
    ws.send(json.dumps({"type": "CloseStream"}))
    messages, code = _drain(ws)
    assert code == 1000 and messages[-1]["type"] == "Metadata"


def test_token_in_the_url_is_not_a_credential(host: Host) -> None:
    ws = ws_connect(host.url(QUERY + f"&token={TOKEN}"))
    assert _drain(ws) == ([], 4401)


def test_server_full_and_slots_come_back(host: Host) -> None:
    a = ws_connect(host.url(), additional_headers=AUTH)
    b = ws_connect(host.url(), additional_headers=AUTH)
    for ws in (a, b):  # started: each holds a server-wide slot once its audio flows
        _send_audio(ws, speech(0.3))
        ws.send(json.dumps({"type": "Finalize"}))
        assert json.loads(ws.recv(timeout=5))["type"] == "Results"
    c = ws_connect(host.url(), additional_headers=AUTH)
    messages, code = _drain(c)
    assert [m["variant"] for m in messages] == ["connection_limit"] and code == 4429
    for ws in (a, b):
        ws.send(json.dumps({"type": "CloseStream"}))
        assert _drain(ws)[1] == 1000
    d = ws_connect(host.url(), additional_headers=AUTH)
    _send_audio(d, speech(0.3))
    d.send(json.dumps({"type": "CloseStream"}))
    assert _drain(d)[1] == 1000


def test_plain_get_is_426(host: Host) -> None:
    response = httpx.get(f"http://{host.base}/v1/listen", headers={"Authorization": "Bearer tok"})
    assert response.status_code == 426


def test_other_paths_are_not_upgraded(host: Host) -> None:
    with pytest.raises((InvalidStatus, ConnectionClosed)):
        ws = ws_connect(f"ws://{host.base}/v1/listen/x?{QUERY}", additional_headers=AUTH)
        ws.recv(timeout=5)


@pytest.mark.parametrize(
    "client", ["from deepgram import AsyncDeepgramClient", "from livekit.plugins import deepgram"]
)
def test_the_readme_deepgram_snippets_work(host: Host, tmp_path: Path, client: str) -> None:
    """The README's SDK and LiveKit examples, run as written, with only the address, token
    and model replaced (the energy test engine here; the real model's run of both clients is
    in tests/test_dialect_deepgram_clients.py)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### From Deepgram's clients")[1].split("\n### ", 1)[0]
    snippets = [block.split("\n```", 1)[0] for block in section.split("```python\n")[1:]]
    [code] = [snippet for snippet in snippets if client in snippet]
    code = code.replace("127.0.0.1:8000", host.base).replace('"TALKIES_AUTH_TOKEN"', '"tok"')
    code = code.replace("whisper-base-en", "tiny-test")
    (tmp_path / "input.raw").write_bytes(speech(0.6) + silence(0.4) + speech(0.5))
    (tmp_path / "snippet.py").write_text(code, encoding="utf-8")
    out = subprocess.run(
        [sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["w1 w2", "w1 w2"]


def test_the_token_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    """Offered as a subprotocol or a header, refused or accepted: no log record holds it, and
    the stream's one log line names the route."""
    secret = "very-secret-listen-token"
    with caplog.at_level("DEBUG"), run_server(auth_token=secret) as running:
        url = f"ws://127.0.0.1:{running.port}/v1/listen?{QUERY}"
        for kwargs in (
            {"subprotocols": ["token", secret]},
            {"additional_headers": {"Authorization": f"Token {secret}"}},
            {"subprotocols": ["token", secret + "x"]},
        ):
            ws = ws_connect(url, **kwargs)
            with suppress(ConnectionClosed):
                _send_audio(ws, speech(0.3))
                ws.send(json.dumps({"type": "CloseStream"}))
            _drain(ws)
        running.wait_idle()
    lines = [r for r in caplog.records if r.getMessage() == "stream closed"]
    assert [getattr(r, "route", None) for r in lines] == ["deepgram"] * 3
    # The server's records (the websockets client here logs its own request at DEBUG).
    for record in [r for r in caplog.records if not r.name.startswith("websockets")]:
        assert secret not in record.getMessage()
        assert secret not in repr(record.__dict__)


def test_a_plain_or_malformed_request_with_a_good_token_is_told_what_is_wrong(host: Host) -> None:
    """Deepgram's ``Token`` scheme is a credential on its route for plain HTTP too: a plain
    GET is 426 and a handshake without a key 400, as with Bearer; a wrong token is 401."""
    url = f"http://{host.base}/v1/listen?{QUERY}"
    handshake = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Version": "13"}
    for scheme in ("Token", "Bearer"):
        good = {"Authorization": f"{scheme} {TOKEN}"}
        assert httpx.get(url, headers=good).status_code == 426
        assert httpx.get(url, headers={**good, **handshake}).status_code == 400
    wrong = {"Authorization": "Token nope"}
    assert httpx.get(url, headers=wrong).status_code == 401
    # uvicorn answers a malformed handshake itself (400) before the app sees the request;
    # the standalone server checks the credential first.
    malformed = 401 if host.name == "standalone" else 400
    assert httpx.get(url, headers={**wrong, **handshake}).status_code == malformed
    # Elsewhere the Token scheme is no credential.
    assert httpx.get(f"http://{host.base}/v1/models", headers=AUTH).status_code == 401
