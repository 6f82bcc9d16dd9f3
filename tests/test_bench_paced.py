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


def test_turns_alternate_abba_and_add_up_to_each_servers_frames() -> None:
    from bench.paced import ClientResult, Target, segments

    def target(streams: int, seconds: float) -> Target:
        fake = [object()] * streams  # segments() only counts a target's streams
        return Target(ClientResult(streams=streams), fake, 0, int(seconds / 0.02) * streams)  # type: ignore[arg-type]

    a, b = target(2, 1.0), target(2, 1.0)
    plan = segments([a, b], 0.5)
    assert [(t is a, n) for t, n in plan] == [(True, 50), (False, 50), (False, 50), (True, 50)]
    assert segments([a], 0.5) == [(a, 100)]
    assert segments([a, b], 0.0) == [(a, 100), (b, 100)]
    c, d = target(3, 1.1), target(3, 1.1)  # a last turn shorter than the others
    plan = segments([c, d], 0.4)
    assert sum(n for t, n in plan if t is c) == c.total == sum(n for t, n in plan if t is d)
    assert [t is c for t, _ in plan] == [True, False, False, True, True, False]
    short = segments([a, b], 0.001)  # under one 20 ms period: a period per turn, not none
    assert len(short) == 100 and {n for _, n in short} == {2}


def test_two_servers_paced_in_turns_answer_every_frame() -> None:
    """The whole path of ``--turn``: both servers at once, one client, a row each."""
    from bench.paced import measure

    # 20 streams: enough CPU in each server's turns (tens of ms) for /proc's 10 ms ticks to
    # count some; 3 streams' few ms could read as none.
    results = measure([20], ("talkies", "bare"), duration=0.4, quiet_wait=0, turn=0.2)
    assert results["turn"] == 0.2 and results["notes"] == []
    rows = {row["server"]: row for row in results["rows"]}
    assert set(rows) == {"talkies", "bare"}
    for row in rows.values():
        assert row["connected"] == row["stats_received"] == 20
        assert row["answered"] == 1.0
        assert row["server_cores"] > 0
    assert set(results["ratios"]["20"]) == {"us_per_frame", "p99_ms"}
