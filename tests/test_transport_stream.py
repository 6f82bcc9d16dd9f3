"""The stream route over real loopback sockets with the websockets client."""

from __future__ import annotations

import json
import threading
import time

import pytest

from .conftest import RunningServer, run_server
from .fake_engine import FakeProvider, silence, speech
from .wire import START, drain, open_stream, ws_connect


def test_happy_path_end(server: RunningServer) -> None:
    ws = open_stream(server.url)
    audio = speech(1.0) + silence(0.5) + speech(0.5)
    for i in range(0, len(audio), 640):
        ws.send(audio[i : i + 640])
    ws.send(json.dumps({"type": "end"}))
    events, code, reason = drain(ws)
    types = [e["type"] for e in events]
    assert types[-2:] == ["final", "stats"]
    assert "endpoint" in types and "partial" in types
    lag = events[-1].pop("lag")  # the lag extension (docs/protocol.md): its results carried one
    assert set(lag) == {"p50", "p90", "p99", "max", "results"} and lag["results"] > 0
    assert events[-1] == {"type": "stats", "audio_seconds": 2.0, "frames": 100, "canceled": False}
    assert [e["revision"] for e in events[:-1]] == list(range(1, len(events)))
    assert (code, reason) == (1000, "")
    server.wait_idle()


def test_cancel(server: RunningServer) -> None:
    ws = open_stream(server.url)
    ws.send(speech(0.1))
    ws.send(speech(0.1))
    ws.send(json.dumps({"type": "cancel"}))
    events, code, _ = drain(ws)
    events[-1].pop("lag", None)  # the lag extension, if a result carried one (docs/protocol.md)
    assert events[-1] == {"type": "stats", "audio_seconds": 0.2, "frames": 2, "canceled": True}
    assert "final" not in [e["type"] for e in events]
    assert code == 1000
    server.wait_idle()


@pytest.mark.parametrize(
    ("model", "code", "close"),
    [
        ("no-such-model", "unknown_model", 4404),
        ("offline-test", "streaming_not_supported", 4409),
        ("unopenable-test", "server_error", 4500),
    ],
)
def test_model_refusals(server: RunningServer, model: str, code: str, close: int) -> None:
    ws = ws_connect(server.url)
    ws.send(json.dumps({**START, "model": model}))
    events, got, reason = drain(ws)
    assert [(e["type"], e["code"]) for e in events] == [("error", code)]
    assert (got, reason) == (close, code)
    server.wait_idle()


def test_decoder_failure_is_4500(server: RunningServer) -> None:
    ws = open_stream(server.url, model="broken-test")
    ws.send(speech(0.1))
    events, code, _ = drain(ws)
    assert events[-1]["code"] == "server_error" and code == 4500
    server.wait_idle()


def test_connection_limit_rejects_without_queueing() -> None:
    with run_server(stream_max_connections=2) as server:
        a, b = open_stream(server.url), open_stream(server.url)
        c = ws_connect(server.url)
        events, code, _ = drain(c)
        assert [e["code"] for e in events] == ["connection_limit"] and code == 4429
        a.close()
        deadline = time.monotonic() + 5
        while server.active() > 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        d = open_stream(server.url)  # a slot is free again
        for ws in (b, d):
            ws.send(json.dumps({"type": "cancel"}))
            drain(ws)
        server.wait_idle()


def test_upgrades_that_never_start_hold_no_slot() -> None:
    # Issue 21, point 2: connections without a start count against no limit, and the start
    # timeout closes them (4408) however long the idle timeout is.
    with run_server(stream_max_connections=2, stream_start_timeout=1.0) as server:
        idle = [ws_connect(server.url) for _ in range(3)]
        started = time.monotonic()
        a, b = open_stream(server.url), open_stream(server.url)  # both slots: still free
        assert server.active() == 2
        for ws in idle:
            events, code, reason = drain(ws, timeout=5)
            assert events == [
                {
                    "type": "error",
                    "code": "idle_timeout",
                    "detail": "no start message within 1 seconds",
                }
            ]
            assert (code, reason) == (4408, "idle_timeout")
        assert 0.9 <= time.monotonic() - started < 3.0
        for ws in (a, b):
            ws.send(json.dumps({"type": "cancel"}))
            assert drain(ws)[1] == 1000
        server.wait_idle()


def test_a_start_is_refused_when_the_slots_filled_after_its_upgrade() -> None:
    with run_server(stream_max_connections=1) as server:
        late = ws_connect(server.url)  # admitted: no started stream holds the slot yet
        first = open_stream(server.url)  # takes it
        assert server.active() == 1
        late.send(json.dumps(START))
        events, code, _ = drain(late)
        assert [e["code"] for e in events] == ["connection_limit"] and code == 4429
        assert server.active() == 1
        first.send(json.dumps({"type": "cancel"}))
        assert drain(first)[1] == 1000
        server.wait_idle()


def test_idle_timeout_closes_4408() -> None:
    with run_server(stream_idle_timeout=1.0) as server:
        ws = open_stream(server.url)
        events, code, _ = drain(ws, timeout=5)
        assert [e["code"] for e in events] == ["idle_timeout"] and code == 4408
        ws2 = ws_connect(server.url)  # also before start
        events, code, _ = drain(ws2, timeout=5)
        assert code == 4408
        server.wait_idle()


def test_auth_rejected_closes_4401_without_error_object() -> None:
    with run_server(auth_token="s3cret-token") as server:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic x"}):
            ws = ws_connect(server.url, additional_headers=headers)
            events, code, _ = drain(ws)
            assert (events, code) == ([], 4401)
        # A token in the query string is never accepted.
        ws = ws_connect(server.url + "?token=s3cret-token")
        assert drain(ws)[1] == 4401
        ws = open_stream(server.url, additional_headers={"Authorization": "Bearer s3cret-token"})
        ws.send(json.dumps({"type": "cancel"}))
        assert drain(ws)[1] == 1000
        server.wait_idle()


def test_pings_and_other_connections_flow_while_the_engine_is_busy() -> None:
    provider = FakeProvider(slow_delay=3.0)
    with run_server(provider=provider) as server:
        busy = open_stream(server.url, model="slow-test")
        busy.send(speech(0.1))
        deadline = time.monotonic() + 5
        while provider.stats.accept_calls == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert provider.stats.accept_calls == 1  # the decoder is now inside a 3 s call
        pong = busy.ping()
        assert pong.wait(timeout=2.5)
        other = open_stream(server.url)
        other.send(speech(0.1))
        other.send(json.dumps({"type": "end"}))
        events, code, _ = drain(other, timeout=2.5)
        assert events[-1]["type"] == "stats" and code == 1000
        # Still inside the first decode call: nothing above waited for it.
        assert provider.stats.accept_calls == 2 and provider.stats.closed == 1
        busy.send(json.dumps({"type": "cancel"}))
        assert drain(busy)[1] == 1000
        server.wait_idle(timeout=10)


def test_second_client_stack_websocket_client() -> None:
    import websocket  # websocket-client: an independent implementation

    with run_server(auth_token="tok") as server:
        ws = websocket.create_connection(server.url, header=["Authorization: Bearer tok"])
        ws.send(json.dumps(START))
        assert json.loads(ws.recv())["type"] == "ready"
        ws.send_binary(speech(0.1))
        ws.send(json.dumps({"type": "end"}))
        events = [json.loads(ws.recv()), json.loads(ws.recv())]
        assert [e["type"] for e in events][-1] == "stats"
        opcode, payload = ws.recv_data(control_frame=True)
        assert opcode == websocket.ABNF.OPCODE_CLOSE
        assert int.from_bytes(payload[:2], "big") == 1000
        ws.close()

        bad = websocket.create_connection(server.url)
        opcode, payload = bad.recv_data(control_frame=True)
        assert (opcode, int.from_bytes(payload[:2], "big")) == (websocket.ABNF.OPCODE_CLOSE, 4401)
        bad.close()
        server.wait_idle()


def test_many_clients_in_parallel(server: RunningServer) -> None:
    results: list[int | None] = []

    def client() -> None:
        ws = open_stream(server.url)
        ws.send(speech(0.1))
        ws.send(json.dumps({"type": "end"}))
        results.append(drain(ws)[1])

    with run_server(stream_max_connections=16) as many:
        server = many
        threads = [threading.Thread(target=client) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [1000] * 16
        many.wait_idle()


def test_activity_keeps_the_stream_alive_past_the_idle_timeout() -> None:
    with run_server(stream_idle_timeout=1.0) as server:
        ws = open_stream(server.url)
        started = time.monotonic()
        while time.monotonic() - started < 2.5:
            ws.send(silence(0.02))
            time.sleep(0.3)
        events, code, _ = drain(ws, timeout=5)  # now silent: times out a second later
        assert [e["code"] for e in events] == ["idle_timeout"] and code == 4408
        assert time.monotonic() - started >= 3.0
        server.wait_idle()
