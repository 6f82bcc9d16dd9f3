"""talkies.engines.runtime.memory: free heap pages go back to the system after a stream closes."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from pathlib import Path

import pytest

from talkies.engines.runtime import memory

libc_name = ctypes.util.find_library("c")
pytestmark = pytest.mark.skipif(
    memory._trimmer._trim is None, reason="not glibc: nothing to trim with"
)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_release_returns_what_a_worker_thread_freed() -> None:
    libc = ctypes.CDLL(libc_name)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    kept: list[int] = []
    rss: dict[str, float] = {}

    def stream_state() -> None:
        # What a native decoder does: many small blocks from its worker thread's arena, all
        # freed at close but the last one, which pins the arena's top so that free() alone
        # cannot shrink it.
        blocks = [libc.malloc(1000) for _ in range(150_000)]
        for block in blocks:
            ctypes.memset(block, 1, 1000)
        for block in blocks[:-1]:
            libc.free(block)
        kept.append(blocks[-1])

    worker = threading.Thread(target=stream_state)
    worker.start()
    worker.join()
    rss["freed"] = _rss_mb()
    time.sleep(memory._MIN_INTERVAL)  # past any earlier trim's interval
    memory.release()
    rss["trimmed"] = _rss_mb()
    libc.free(kept[0])
    # ~150 MB were written then freed; free() kept them, malloc_trim gives most back.
    assert rss["freed"] - rss["trimmed"] > 100, rss


def test_release_is_rate_limited() -> None:
    calls: list[int] = []
    trimmer = memory._Trimmer(lambda pad: calls.append(pad) or 1)
    trimmer()
    trimmer()  # within the interval: covered by the first
    assert calls == [0]
    trimmer._last -= memory._MIN_INTERVAL
    trimmer()
    assert calls == [0, 0]


def test_nothing_to_do_without_glibc() -> None:
    memory._Trimmer(None)()  # no trim function: a no-op, no error
