"""Giving freed native memory back to the system.

Native engines (Vosk/Kaldi above all) allocate their per-stream state with ``malloc`` from the
worker thread that creates or feeds it. glibc gives each busy thread an arena of its own and
keeps what is freed there for reuse, so a server whose streams come and go on several threads
at once grows by arenas full of free memory that it never returns: the soak in
``tests/reliability/test_soak.py`` measured +14% resident memory over ten minutes of 3 Vosk
streams at a time, and +3% with glibc told to trim eagerly. :func:`release` asks glibc to hand
every arena's free pages back (``malloc_trim(0)``) after a stream's native state is freed.
Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from collections.abc import Callable

__all__ = ["release"]


_MIN_INTERVAL = 0.25  # seconds: one trim serves every stream closed meanwhile


def _load_trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_trim = _load_trim()


class _Trimmer:
    def __init__(self, trim: Callable[[int], int] | None) -> None:
        self._trim = trim
        self._lock = threading.Lock()
        self._last = -_MIN_INTERVAL

    def __call__(self) -> None:
        if self._trim is None:
            return
        now = time.monotonic()
        with self._lock:
            if now - self._last < _MIN_INTERVAL:
                return
            self._last = now
        self._trim(0)


_trimmer = _Trimmer(_load_trim())


def release() -> None:
    """Return free heap pages to the system (blocking; call it from a worker thread). At most
    once per :data:`_MIN_INTERVAL`: a close that comes sooner is covered by the last trim."""
    _trimmer()
