"""Lag, and refusing instead of lagging (issue 24, point 5), end to end on both hosts.

Each host (talkies' own server, the ASGI app under uvicorn) is ``tests/http_server.py``, with
the default ``TALKIES_STREAM_MAX_LAG``. A client streams in real time to
``energy-lagging-test`` (the test double of tests/lag_engine.py: decoding takes 2.5 s per
second of audio; its registry entry's ``max_lag`` is 0.5 s), so its decoder falls further
behind at every round. Once the model's lag passes the bound, a new stream is
refused with ``connection_limit`` (4429) and a detail naming the lag, ``/readyz`` answers 503
``lagging``, and ``/metrics`` has the lag histogram and gauges; the stream itself is served to
its end, its events carrying their lag and its ``stats`` the percentiles. When it has ended,
a new stream is admitted again. A real model (Vosk Korean) streamed in real time stays well
under the default bound.

No timed assertions beyond generous bounds: the test waits for the states it checks.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from .fake_engine import silence, speech
from .http_hosts import HOSTS, ROOT, TOKEN, HttpHost, _free_port
from .lag_engine import LAGGING_SLUG
from .wire import START, drain, ws_connect

log = logging.getLogger(__name__)
MAX_LAG = 0.5  # energy-lagging-test's entry (tests/http_server.py)
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module", params=HOSTS)
def host(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[HttpHost]:
    data = tmp_path_factory.mktemp("lag-data")
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    env |= {
        "PYTHONPATH": str(ROOT),
        "TALKIES_DATA_DIR": str(data),
        "TALKIES_AUTH_TOKEN": TOKEN,
        "TALKIES_STREAM_MAX_CONNECTIONS": "8",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.http_server", request.param, str(port)], cwd=ROOT, env=env
    )
    running = HttpHost(request.param, port, data, proc)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"{request.param} exited with {proc.returncode}"
            try:
                if httpx.get(running.url + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{request.param} did not start"
            time.sleep(0.1)
        yield running
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _open(host: HttpHost, model: str) -> Any:
    ws = ws_connect(host.ws_url, additional_headers=AUTH)
    ws.send(json.dumps({**START, "model": model}))
    return ws


def _ready(ws: Any) -> None:
    ready = json.loads(ws.recv(timeout=60))  # (the first stream loads the model)
    assert ready["type"] == "ready", ready


def _paced(ws: Any, pcm: bytes, stop: threading.Event) -> None:
    """Send ``pcm`` in 20 ms frames at real time, then ``end`` (sooner if ``stop`` is set)."""
    began = time.monotonic()
    for n, i in enumerate(range(0, len(pcm), 640)):
        if stop.is_set():
            break
        ws.send(pcm[i : i + 640])
        time.sleep(max(0.0, began + (n + 1) * 0.02 - time.monotonic()))
    ws.send(json.dumps({"type": "end"}))


def _wait_for(check: Any, what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.05)


def _readyz(host: HttpHost) -> httpx.Response:
    return httpx.get(host.url + "/readyz", timeout=10)


def _metric(text: str, name: str, model: str) -> float | None:
    match = re.search(rf'^{name}\{{model="{re.escape(model)}"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else None


def _buckets(text: str, name: str, model: str) -> dict[str, float]:
    """A histogram's cumulative buckets for ``model``, by their ``le``."""
    out = {}
    for labels, value in re.findall(rf"^{name}_bucket\{{([^}}]*)\}} (\S+)$", text, re.M):
        pairs = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if pairs.get("model") == model:
            out[pairs["le"]] = float(value)
    return out


def test_a_lagging_model_refuses_new_streams_until_it_caught_up(host: HttpHost) -> None:
    assert _readyz(host).status_code == 200
    slow = _open(host, LAGGING_SLUG)
    _ready(slow)
    stop = threading.Event()
    audio = (speech(0.5) + silence(0.1)) * 6  # 3.6 s: decoding it takes 9 s
    sender = threading.Thread(target=_paced, args=(slow, audio, stop), daemon=True)
    sender.start()
    try:
        # The model falls behind: /readyz says so, with the reason.
        answer = _wait_for(
            lambda: (r := _readyz(host)).status_code == 503 and r, "503 from /readyz"
        )
        body = answer.json()
        assert body["status"] == "lagging" and body["model"] == LAGGING_SLUG, body
        # (lagging is a lag over the bound; the body rounds it to the millisecond, so a lag
        # just over 0.5 s reads 0.5)
        assert body["lag"] >= MAX_LAG and body["max_lag"] == MAX_LAG, body
        assert "behind" in body["reason"], body
        # A new stream on it is refused, with the contract's code and a detail naming the lag.
        refused = _open(host, LAGGING_SLUG)
        events, code, reason = drain(refused, timeout=30)
        assert [e["type"] for e in events] == ["error"], events
        assert events[0]["code"] == "connection_limit" and (code, reason) == (
            4429,
            "connection_limit",
        )
        assert "cannot keep its streams real time" in events[0]["detail"], events[0]
        assert re.search(r"\d+\.\d s behind", events[0]["detail"]), events[0]
        metrics = httpx.get(host.url + "/metrics", headers=AUTH, timeout=10).text
        assert _metric(metrics, "talkies_model_lagging", LAGGING_SLUG) == 1.0
        assert (_metric(metrics, "talkies_model_lag_seconds", LAGGING_SLUG) or 0) > MAX_LAG
        assert (_metric(metrics, "talkies_lag_refusals_total", LAGGING_SLUG) or 0) >= 1
        assert _buckets(metrics, "talkies_stream_lag_seconds", LAGGING_SLUG)["+Inf"] > 0
    except BaseException:
        slow.close()  # a failure above must not leave the model pinned for the next test
        raise
    finally:
        stop.set()
        sender.join(timeout=30)
    # The lagging stream itself is served to its end: its events carry their lag, its stats
    # the percentiles.
    events, code, _ = drain(slow, timeout=60)
    assert code == 1000 and [e["type"] for e in events[-2:]] == ["final", "stats"], events
    transcripts = [e for e in events if e["type"] in ("partial", "endpoint", "final")]
    assert transcripts and all(
        isinstance(e["lag"], float) and e["lag"] >= 0 for e in transcripts
    ), transcripts
    assert max(e["lag"] for e in transcripts) > MAX_LAG, transcripts
    lag = events[-1]["lag"]
    assert set(lag) == {"p50", "p90", "p99", "max", "results"}, lag
    assert 0 <= lag["p50"] <= lag["p90"] <= lag["p99"] <= lag["max"] and lag["max"] > MAX_LAG
    assert lag["results"] >= len([e for e in transcripts if e["type"] != "partial"])
    # Caught up (its streams have ended): admitted again, and ready.
    _wait_for(lambda: _readyz(host).status_code == 200, "200 from /readyz")
    again = _open(host, LAGGING_SLUG)
    _ready(again)
    again.send(json.dumps({"type": "cancel"}))
    events, code, _ = drain(again, timeout=30)
    assert code == 1000 and events[-1]["type"] == "stats", events
    metrics = httpx.get(host.url + "/metrics", headers=AUTH, timeout=10).text
    assert _metric(metrics, "talkies_model_lagging", LAGGING_SLUG) == 0.0
    buckets = _buckets(metrics, "talkies_stream_lag_seconds", LAGGING_SLUG)
    assert buckets["0.5"] < buckets["+Inf"], buckets  # rounds that ended over the bound


def _korean(text: str) -> np.ndarray:
    from .test_engine_vosk import espeak_korean

    return espeak_korean(text)


def _stream_in_real_time(host: HttpHost, model: str, pcm: bytes) -> list[dict[str, Any]]:
    ws = _open(host, model)
    _ready(ws)
    began = time.monotonic()
    _paced(ws, pcm, threading.Event())
    events, code, _ = drain(ws, timeout=60)
    took = time.monotonic() - began
    assert code == 1000 and events[-1]["type"] == "stats", events
    for event in events[:-1]:
        # The lag counts audio received: never more than the stream had, nor than its time.
        assert 0 <= event["lag"] <= min(event["audio_seconds"], took), event
    assert events[-2]["type"] == "final" and events[-2]["lag"] == 0, events[-2]  # all answered
    return events


def _decode_seconds(host: HttpHost, model: str) -> float:
    """The time ``model``'s decode rounds took so far (the round-time histogram's sum)."""
    text = httpx.get(host.url + "/metrics", headers=AUTH, timeout=10).text
    return _metric(text, "talkies_decode_round_seconds_sum", model) or 0.0


def test_a_real_model_at_real_time_stays_well_under_the_bound(host: HttpHost) -> None:
    """Vosk Korean (the real model, in its engine process), 6.8 s of espeak-ng speech sent in
    real time, twice (the first stream pays for a cold decoder). A decoder that keeps up
    answers each round with the audio that came while the last one ran: its results are a
    fraction of a second behind, and nothing is refused.

    Vosk decodes this audio at 0.5-0.7 of real time on this 2-core machine when it is quiet;
    when other work leaves it too little CPU to keep up (seen: 20 s of decoding for 6.8 s of
    audio, 5 s behind, at a load average of 12-15), the lag can only be what the decoding took
    and the queue holds: so the bound is the one that applies to the decoding time the server
    reports for the stream."""
    parts = [np.zeros(8000, dtype=np.int16)]
    for phrase in ("안녕하세요 반갑습니다", "저는 학교에 갑니다"):
        parts += [_korean(phrase), np.zeros(16000, dtype=np.int16)]
    pcm = np.concatenate(parts).astype("<i2").tobytes()
    seconds = len(pcm) / 32000
    _stream_in_real_time(host, "vosk-ko", pcm)
    before = _decode_seconds(host, "vosk-ko")
    events = _stream_in_real_time(host, "vosk-ko", pcm)
    decoding = _decode_seconds(host, "vosk-ko") - before
    lag = events[-1]["lag"]
    log.info("vosk-ko: %.1f s of audio, %.2f s decoding, lag %s", seconds, decoding, lag)
    assert lag["results"] > 5, lag
    if decoding < 0.8 * seconds:  # it kept up: well under the default bound (3 s)
        assert lag["p50"] < 0.5 and lag["max"] < 1.5, (lag, decoding, seconds)
        assert _readyz(host).status_code == 200
        metrics = httpx.get(host.url + "/metrics", headers=AUTH, timeout=10).text
        assert _metric(metrics, "talkies_model_lagging", "vosk-ko") == 0.0
    else:  # a machine too busy for real time: behind by no more than it spent decoding,
        # nor than the stream's queue holds (TALKIES_STREAM_MAX_BUFFER_SECONDS, 5 s: beyond
        # it backpressure holds the audio in the client) and one read waiting to be queued
        assert lag["max"] <= min(decoding, 5.0) + 2.5, (lag, decoding, seconds)
