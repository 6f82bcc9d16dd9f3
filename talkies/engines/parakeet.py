"""``parakeet_cpp``: NVIDIA Parakeet/Nemotron streaming through the parakeet.cpp runtime.

No build of that runtime is installable on the machines this project is developed and tested
on, and it publishes no stable C API to bind against. The executor therefore checks for the
runtime library and, when it is missing, refuses with a 4500 detail that says exactly what is
missing, instead of pretending to stream.
"""

from __future__ import annotations

import ctypes.util
from pathlib import Path

from .base import EngineUnavailable, LoadedModel
from .builtin import DEFAULT_MODEL
from .registry import ModelEntry

__all__ = ["find_runtime", "load", "require_runtime"]

_LIBRARY_NAMES = ("parakeet", "parakeet_cpp")


def find_runtime(entry: ModelEntry) -> str | None:
    """The runtime library: the entry's ``options.library`` path, else the system's."""
    explicit = entry.options.get("library")
    if isinstance(explicit, str):
        return explicit if Path(explicit).is_file() else None
    for name in _LIBRARY_NAMES:
        found = ctypes.util.find_library(name)
        if found:
            return found
    return None


def require_runtime(entry: ModelEntry) -> str:
    """The runtime's path, or :class:`EngineUnavailable` naming what is missing."""
    library = find_runtime(entry)
    if library is None:
        raise EngineUnavailable(
            f"model {entry.slug!r} needs the parakeet.cpp runtime, which is not installed on "
            "this server (it comes from the PyPI package parakeet-cpp-cuda and needs an NVIDIA "
            "GPU with its driver; see docs/engines.md); "
            f"use {DEFAULT_MODEL!r} here, which works offline"
        )
    return library


def load(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
    library = require_runtime(entry)
    raise EngineUnavailable(
        f"model {entry.slug!r}: found the parakeet.cpp runtime at {library}, but this build "
        "of Talkies has no binding for its API yet"
    )
