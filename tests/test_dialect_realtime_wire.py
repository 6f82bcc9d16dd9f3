"""``GET /v1/realtime?intent=transcription`` (OpenAI Realtime) over real sockets, both hosts.

The standalone server in this process and the ASGI app under uvicorn, both with the energy
test engine (``tiny-test``; tests/fake_engine.py: 0.25 s of sound is a word ``wN``, 0.3 s of
silence an endpoint), driven by a plain websockets client speaking OpenAI's events, and the
ephemeral secrets route over httpx. The official ``openai`` SDK on real speech is in
tests/test_dialect_realtime_clients.py.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.sync.client import ClientConnection

from .dialect_wire import Host, host_fixture
from .dialect_wire import closed as _closed
from .fake_engine import silence, speech
from .wire import ws_connect

TOKEN = "tok"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUERY = "intent=transcription&model=tiny-test"

host = host_fixture("/v1/realtime", QUERY, auth_token=TOKEN, stream_max_connections=2)


def _at_24k(pcm16k: bytes) -> bytes:
    """The fake engine's 16 kHz test sound, repeated to 24 kHz (its energy is what counts)."""
    samples = np.frombuffer(pcm16k, dtype="<i2")
    index = np.arange(len(samples) * 3 // 2) * 2 // 3
    return samples[index].astype("<i2").tobytes()


def _append(ws: ClientConnection, pcm24k: bytes, chunk: int = 4800) -> None:
    for i in range(0, len(pcm24k), chunk):
        audio = base64.b64encode(pcm24k[i : i + chunk]).decode()
        ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))


def _recv(ws: ClientConnection, timeout: float = 10) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(ws.recv(timeout=timeout))
    return event


def _until(ws: ClientConnection, kind: str, timeout: float = 10) -> list[dict[str, Any]]:
    """Every event up to and including the first of type ``kind``."""
    events: list[dict[str, Any]] = []
    while True:
        events.append(_recv(ws, timeout))
        if events[-1]["type"] == kind:
            return events


GA_UPDATE = {
    "type": "session.update",
    "session": {
        "type": "transcription",
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "transcription": {"model": "tiny-test", "language": "en"},
                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                "noise_reduction": None,
            }
        },
    },
}


def _items(events: list[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """Each item's (concatenated deltas, completed transcript)."""
    deltas: dict[str, str] = {}
    done: dict[str, tuple[str, str]] = {}
    for event in events:
        if event["type"] == "conversation.item.input_audio_transcription.delta":
            deltas[event["item_id"]] = deltas.get(event["item_id"], "") + event["delta"]
        elif event["type"] == "conversation.item.input_audio_transcription.completed":
            done[event["item_id"]] = (deltas.get(event["item_id"], ""), event["transcript"])
    return done


def test_ga_session_server_vad_items(host: Host) -> None:
    """session.created, session.updated, then one item per engine endpoint, in OpenAI's
    order, with append-only deltas equal to each completed transcript."""
    ws = ws_connect(host.url(), additional_headers=AUTH)
    created = _recv(ws)
    assert created["type"] == "session.created"
    assert created["session"]["type"] == "transcription"
    ws.send(json.dumps(GA_UPDATE))
    updated = _recv(ws)
    assert updated["type"] == "session.updated"
    transcription = updated["session"]["audio"]["input"]["transcription"]
    assert transcription["model"] == "tiny-test"
    _append(ws, _at_24k(speech(0.6) + silence(0.5) + speech(0.3) + silence(0.5)))
    first = _until(ws, "conversation.item.done")
    second = _until(ws, "conversation.item.done")
    ws.close()
    for events in (first, second):
        kinds = [e["type"] for e in events]
        assert kinds == [
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "input_audio_buffer.committed",
            "conversation.item.added",
            "conversation.item.input_audio_transcription.delta",
            "conversation.item.input_audio_transcription.completed",
            "conversation.item.done",
        ], kinds
        item = events[0]["item_id"]
        assert all(e.get("item_id", e.get("item", {}).get("id")) == item for e in events)
        ((joined, completed),) = _items(events).values()
        assert joined == completed
        assert events[-1]["item"]["content"][0]["transcript"] == completed
    assert _items(first)[first[0]["item_id"]][1] == "w1 w2"
    assert _items(second)[second[0]["item_id"]][1] == "w1"
    assert second[2]["previous_item_id"] == first[0]["item_id"]
    assert second[0]["audio_start_ms"] >= 1000
    # Counted in /metrics under the route's own surface, not the native WebSocket's.
    counted = 'talkies_streams_total{code="",outcome="peer_gone",surface="realtime"}'
    deadline = time.monotonic() + 10
    while counted not in (text := httpx.get(f"http://{host.base}/metrics", headers=AUTH).text):
        assert time.monotonic() < deadline, [ln for ln in text.splitlines() if "streams" in ln]
        time.sleep(0.1)
    # So is the latency of the events its items were made of.
    latency = [
        ln
        for ln in text.splitlines()
        if ln.startswith('talkies_event_latency_seconds_count{surface="realtime"}')
    ]
    assert latency and float(latency[0].split()[-1]) >= 1, latency


def test_beta_session_answers_in_beta(host: Host) -> None:
    ws = ws_connect(host.url(), additional_headers=AUTH)
    assert _recv(ws)["type"] == "session.created"
    update = {
        "type": "transcription_session.update",
        "session": {
            "input_audio_format": "pcm16",
            "input_audio_transcription": {"model": "tiny-test"},
            "turn_detection": {"type": "server_vad"},
        },
    }
    ws.send(json.dumps(update))
    updated = _recv(ws)
    assert updated["type"] == "transcription_session.updated"
    assert updated["session"]["input_audio_format"] == "pcm16"
    _append(ws, _at_24k(speech(0.5) + silence(0.5)))
    events = _until(ws, "conversation.item.input_audio_transcription.completed")
    ws.close()
    kinds = [e["type"] for e in events]
    assert "conversation.item.created" in kinds and "conversation.item.added" not in kinds
    assert events[-1]["transcript"] == "w1 w2"


def test_a_client_that_asks_for_the_beta_is_greeted_in_beta(host: Host) -> None:
    """OpenAI's SDKs send ``OpenAI-Beta: realtime=v1`` from their beta clients, browsers the
    ``openai-beta.realtime-v1`` subprotocol; such a session begins
    ``transcription_session.created`` with the beta's session object."""
    beta = {**AUTH, "OpenAI-Beta": "realtime=v1"}
    ws = ws_connect(host.url(), additional_headers=beta)
    created = _recv(ws)
    ws.close()
    assert created["type"] == "transcription_session.created"
    assert created["session"]["input_audio_format"] == "pcm16"
    assert created["session"]["input_audio_transcription"]["model"] == "tiny-test"
    assert "audio" not in created["session"]
    offered = ["realtime", f"openai-insecure-api-key.{TOKEN}", "openai-beta.realtime-v1"]
    ws = ws_connect(host.url(), subprotocols=offered)
    assert ws.subprotocol == "realtime"
    assert _recv(ws)["type"] == "transcription_session.created"
    ws.close()
    ws = ws_connect(host.url(), additional_headers={**AUTH, "OpenAI-Beta": "assistants=v2"})
    assert _recv(ws)["type"] == "session.created"  # another beta is not the Realtime beta
    ws.close()


def test_refused_settings_and_an_empty_commit_are_error_events_not_closes(host: Host) -> None:
    ws = ws_connect(host.url(), additional_headers=AUTH)
    _recv(ws)
    semantic = json.loads(json.dumps(GA_UPDATE))
    semantic["session"]["audio"]["input"]["turn_detection"] = {"type": "semantic_vad"}
    ws.send(json.dumps(semantic))
    error = _recv(ws)
    assert error["type"] == "error"
    assert error["error"]["code"] == "unsupported_turn_detection"
    assert error["error"]["param"] == "session.audio.input.turn_detection.type"
    ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription", "x": 1}}))
    assert _recv(ws)["error"]["code"] == "unknown_parameter"
    ws.send(json.dumps(GA_UPDATE))
    assert _recv(ws)["type"] == "session.updated"
    ws.send(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}))
    error = _recv(ws)
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"  # nothing appended
    assert error["error"]["event_id"] == "c1"
    ws.send("not json")
    assert _recv(ws)["error"]["code"] == "invalid_json"
    ws.send(json.dumps({"type": "input_audio_buffer.clear"}))
    assert _recv(ws)["type"] == "input_audio_buffer.cleared"
    # Still streaming: audio gives an item.
    _append(ws, _at_24k(speech(0.3) + silence(0.5)))
    events = _until(ws, "conversation.item.done")
    ws.close()
    assert events[-1]["item"]["content"][0]["transcript"] == "w1"


def test_unknown_model_is_an_error_event_then_the_native_close(host: Host) -> None:
    ws = ws_connect(host.url("intent=transcription&model=no-such-model"), additional_headers=AUTH)
    assert _recv(ws)["type"] == "session.created"
    _append(ws, _at_24k(speech(0.1)))
    events, code = _closed(ws)
    assert [e["type"] for e in events] == ["error"]
    assert events[0]["error"]["code"] == "unknown_model"
    assert code == 4404


def test_query_and_credentials(host: Host) -> None:
    # No intent, or a token in the URL: an error event and 4400, before anything is read.
    for query in ("model=tiny-test", QUERY + f"&api_key={TOKEN}"):
        ws = ws_connect(host.url(query), additional_headers=AUTH)
        events, code = _closed(ws)
        assert code == 4400
        assert events[0]["type"] == "error"
    # A wrong token, or none: 4401.
    for headers in ({"Authorization": "Bearer nope"}, {}):
        ws = ws_connect(host.url(), additional_headers=headers)
        assert _closed(ws)[1] == 4401
    # The browser's subprotocols: "realtime" is selected.
    ws = ws_connect(
        host.url(),
        subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"],  # type: ignore[list-item]
    )
    assert ws.subprotocol == "realtime"
    assert _recv(ws)["type"] == "session.created"
    ws.close()


def test_ephemeral_secret_single_use(host: Host, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    base = f"http://{host.base}/v1/realtime/client_secrets"
    assert httpx.post(base, json={}).status_code == 401
    body = {
        "expires_after": {"anchor": "created_at", "seconds": 60},
        "session": {
            "type": "transcription",
            "audio": {"input": {"transcription": {"model": "tiny-test"}}},
        },
    }
    reply = httpx.post(base, json=body, headers=AUTH)
    assert reply.status_code == 200, reply.text
    document = reply.json()
    secret = document["value"]
    assert secret.startswith("ek_")
    assert document["session"]["audio"]["input"]["transcription"]["model"] == "tiny-test"
    assert document["expires_at"] > time.time()
    bad = httpx.post(base, json={"expires_after": {"seconds": 5}}, headers=AUTH)
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "expires_after.seconds"
    # A secret is a credential here only, and once.
    assert (
        httpx.get(
            f"http://{host.base}/v1/models", headers={"Authorization": f"Bearer {secret}"}
        ).status_code
        == 401
    )
    protocols = ["realtime", f"openai-insecure-api-key.{secret}"]
    ws = ws_connect(host.url("intent=transcription"), subprotocols=protocols)  # type: ignore[arg-type]
    created = _recv(ws)
    assert created["session"]["audio"]["input"]["transcription"]["model"] == "tiny-test"
    _append(ws, _at_24k(speech(0.3) + silence(0.5)))
    assert _until(ws, "conversation.item.done")[-1]["item"]["content"][0]["transcript"] == "w1"
    ws.close()
    again = ws_connect(host.url(), subprotocols=protocols)  # type: ignore[arg-type]
    assert _closed(again)[1] == 4401
    if host.name == "standalone":  # in this process: its log records are here
        assert any(r.getMessage() == "stream closed" for r in caplog.records)
        # The server's own records (the test's clients log their handshakes at DEBUG).
        ours = [r for r in caplog.records if r.name.startswith("talkies")]
        logged = " ".join(f"{r.getMessage()} {r.__dict__}" for r in ours)
        assert secret not in logged and secret[3:] not in logged


def test_the_openai_sdk_mints_a_secret_and_transcribes_with_it(host: Host) -> None:
    """The official SDK's own request and response models for the secrets route, and its
    sync realtime client with the secret as its key (the energy engine, tiny-test)."""
    from openai import OpenAI

    base_url = f"http://{host.base}/v1"
    minted = OpenAI(api_key=TOKEN, base_url=base_url).realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 60},
        session={
            "type": "transcription",
            "audio": {"input": {"transcription": {"model": "tiny-test"}}},
        },
    )
    assert minted.value.startswith("ek_") and minted.session.type == "transcription"
    assert minted.expires_at > time.time()
    client = OpenAI(api_key=minted.value, base_url=base_url)
    with client.realtime.connect(
        model="tiny-test", extra_query={"intent": "transcription"}
    ) as connection:
        assert connection.recv().type == "session.created"
        pcm = _at_24k(speech(0.5) + silence(0.5))
        for i in range(0, len(pcm), 4800):
            connection.input_audio_buffer.append(audio=base64.b64encode(pcm[i : i + 4800]).decode())
        kinds = []
        while True:
            event = connection.recv()
            kinds.append(event.type)
            if event.type == "conversation.item.input_audio_transcription.completed":
                assert event.transcript == "w1 w2"
                break
    assert kinds[0] == "input_audio_buffer.speech_started"
    assert "conversation.item.added" in kinds
