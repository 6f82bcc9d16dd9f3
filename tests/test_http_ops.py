"""Operations on both hosts: /readyz for load balancers, /metrics for Prometheus, and the
browsers' way to send a token on a WebSocket (a subprotocol)."""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from .fake_engine import speech
from .http_hosts import TOKEN, HttpHost
from .wire import START, drain, ws_connect

pytestmark = pytest.mark.usefixtures("http_data")


def _metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    pattern = (
        rf"^{re.escape(name)}(?:\{{{re.escape(wanted)}\}})? (\S+)$"
        if wanted
        else rf"^{re.escape(name)} (\S+)$"
    )
    match = re.search(pattern, text, flags=re.M)
    assert match, (name, labels, [ln for ln in text.splitlines() if name in ln])
    return float(match.group(1))


def test_readiness_and_liveness(host: HttpHost) -> None:
    ready = httpx.get(host.url + "/readyz")  # no token: probes carry none
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    assert httpx.get(host.url + "/healthz").status_code == 200


def test_readiness_ignores_connections_that_have_not_started(host: HttpHost) -> None:
    """A connection takes its server-wide slot only once its start is accepted (issue 21,
    point 2): as many upgrades without a start as there are slots leave the server ready.
    /readyz's 503 when started streams fill it: tests/test_scaleout.py."""
    sockets = [ws_connect(host.ws_url, additional_headers=host.headers) for _ in range(4)]
    try:
        ready = httpx.get(host.url + "/readyz")
        assert ready.status_code == 200, ready.text
        assert httpx.get(host.url + "/healthz").status_code == 200
        ws = ws_connect(host.ws_url, additional_headers=host.headers)  # and one more starts
        ws.send(json.dumps({**START, "model": "energy-test"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
        ws.close()
    finally:
        for sock in sockets:
            sock.close()


def test_metrics(host: HttpHost) -> None:
    assert httpx.get(host.url + "/metrics").status_code == 401  # behind the token
    with host.client() as client:
        before = client.get("/metrics").text
        ws = ws_connect(host.ws_url, additional_headers=host.headers)
        ws.send(json.dumps({**START, "model": "energy-test"}))
        assert json.loads(ws.recv(timeout=30))["type"] == "ready"
        for _ in range(10):
            ws.send(speech(0.1))
        ws.send(json.dumps({"type": "end"}))
        assert drain(ws)[1] == 1000
        host.wait_in_use("energy-test", 0)
        # The stream's counters are written once its connection is gone, just after the close.
        deadline = time.monotonic() + 10
        while 'outcome="end"' not in (r := client.get("/metrics")).text:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    after = r.text
    done = {"surface": "websocket", "outcome": "end", "code": ""}
    had = _metric(before, "talkies_streams_total", **done) if 'outcome="end"' in before else 0
    assert _metric(after, "talkies_streams_total", **done) >= had + 1
    assert _metric(after, "talkies_audio_frames_total", surface="websocket") >= 10
    assert _metric(after, "talkies_audio_seconds_total", surface="websocket") >= 1.0
    assert _metric(after, "talkies_model_slots", model="energy-test") == 1
    assert _metric(after, "talkies_model_slots_in_use", model="energy-test") == 0
    assert _metric(after, "talkies_model_loaded", model="energy-test") == 1
    assert _metric(after, "talkies_stream_slots") == 4
    assert "talkies_event_latency_seconds_bucket" in after
    assert 'talkies_model_load_seconds_count{model="energy-test"}' in after
    assert _metric(after, "talkies_decode_round_seconds_count", model="energy-test") >= 1
    assert TOKEN not in after


def test_a_browser_sends_its_token_as_a_subprotocol(host: HttpHost) -> None:
    protocols = ["talkies", f"talkies.bearer.{TOKEN}"]
    ws = ws_connect(host.ws_url, subprotocols=protocols)  # type: ignore[arg-type]
    assert ws.subprotocol == "talkies"
    ws.send(json.dumps({**START, "model": "energy-test"}))
    assert json.loads(ws.recv(timeout=30))["type"] == "ready"
    ws.send(json.dumps({"type": "cancel"}))
    assert drain(ws)[1] == 1000
    wrong = ws_connect(host.ws_url, subprotocols=["talkies", "talkies.bearer.nope"])  # type: ignore[list-item]
    assert drain(wrong)[:2] == ([], 4401)
    # The header stays the primary way: a wrong header is not rescued by a right subprotocol.
    both = ws_connect(
        host.ws_url,
        subprotocols=protocols,  # type: ignore[arg-type]
        additional_headers={"Authorization": "Bearer nope"},
    )
    assert drain(both)[:2] == ([], 4401)
    host.wait_in_use("energy-test", 0)
