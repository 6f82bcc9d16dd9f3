"""The spec's "Minimal Python file client", extracted from the spec, against the real server."""

from __future__ import annotations

import ast
import subprocess
import sys
import time
from pathlib import Path

from .conftest import run_server
from .fake_engine import silence, speech
from .spec import spec_example_client


def test_spec_example_client_completes_promptly(tmp_path: Path) -> None:
    source = spec_example_client()
    assert source.count("ws://127.0.0.1:8000/") == 1
    audio = speech(0.8) + silence(0.4) + speech(0.4)
    (tmp_path / "input.raw").write_bytes(audio)
    with run_server() as server:
        # The one substitution: the port this test's server got (8000 may be taken).
        client = source.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")
        (tmp_path / "client.py").write_text(client)
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "client.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=30,
        )
        elapsed = time.monotonic() - started
        server.wait_idle()
    assert result.returncode == 0, result.stderr
    events = [ast.literal_eval(line) for line in result.stdout.splitlines()]
    assert events[0]["type"] == "ready" and events[0]["model"] == "nemotron-3.5-asr-0.6b"
    assert [e["type"] for e in events[-2:]] == ["final", "stats"]
    frames = len(audio) // 640
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
