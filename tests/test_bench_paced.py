"""bench/paced.py's core layout: the load client on a core of its own (no benchmark is run)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.paced import core_layout, pin  # noqa: E402


def test_the_client_gets_the_last_core_and_the_server_the_others() -> None:
    cores = sorted(os.sched_getaffinity(0))
    layout = core_layout()
    if len(cores) < 2:
        assert layout is None
        return
    assert layout is not None
    server, client = layout
    assert client == cores[-1:] and server == cores[:-1]
    assert core_layout(shared=True) is None


def test_pin_moves_every_thread_of_a_process() -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: nothing to pin to")
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); "
    code += "print('up', flush=True); time.sleep(30)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        pin(proc.pid, cores[:1])
        tasks = list(Path(f"/proc/{proc.pid}/task").iterdir())
        assert len(tasks) == 2
        for task in tasks:
            assert os.sched_getaffinity(int(task.name)) == set(cores[:1])
    finally:
        proc.kill()
        proc.wait()
