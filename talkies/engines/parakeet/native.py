"""The parakeet.cpp runtime of ``parakeet-cpp-cuda``: its CUDA libraries, the driver, the
module, and the C entry points bound with ctypes (see the package docstring)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib
import importlib.metadata
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from ..base import (
    EngineUnavailable,
)
from ..supply.builtin import DEFAULT_MODEL
from ..supply.entry import ModelEntry

log = logging.getLogger("talkies.engines")

# 80 ms: one encoder frame of a FastConformer (10 ms hop, 8x subsampling).
FEED_SAMPLES = 1280
FEED_BYTES = 2 * FEED_SAMPLES
PACKAGE = "parakeet-cpp-cuda"
# The streaming JSON documents carry "events" from ABI 5 on.
_MIN_ABI = 5
# Every call into libparakeet (one process-global ggml backend: see the package docstring).
NATIVE_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class _Library:
    soname: str
    what: str
    distribution: str  # the PyPI wheel that ships it
    folder: str  # where in that wheel


# In load order: each one's dependencies first.
_CUDA_LIBRARIES = (
    _Library(
        "libcudart.so.12",
        "the CUDA 12 runtime",
        "nvidia-cuda-runtime-cu12",
        "nvidia/cuda_runtime/lib",
    ),
    _Library("libcublasLt.so.12", "cuBLASLt", "nvidia-cublas-cu12", "nvidia/cublas/lib"),
    _Library("libcublas.so.12", "cuBLAS", "nvidia-cublas-cu12", "nvidia/cublas/lib"),
    _Library("libnccl.so.2", "NCCL", "nvidia-nccl-cu12", "nvidia/nccl/lib"),
)
_DRIVER = "libcuda.so.1"
_INSTALL = "pip install 'talkies[parakeet]'"


# -- the runtime ------------------------------------------------------------------------------


class RuntimeMissing(Exception):
    """The parakeet.cpp runtime cannot be loaded here; the message says what is missing."""


@dataclass(frozen=True, slots=True)
class LoadedRuntime:
    """The ``parakeet`` module and the C functions streams use."""

    module: ModuleType
    version: str
    abi: int
    begin: Any  # parakeet_capi_stream_begin_lang(ctx, lang) -> stream | NULL
    feed: Any  # parakeet_capi_stream_feed_json(stream, float*, n) -> char* | NULL
    finalize: Any  # parakeet_capi_stream_finalize_json(stream) -> char* | NULL
    free_stream: Any  # parakeet_capi_stream_free(stream)
    free_string: Any  # parakeet_capi_free_string(char*)
    last_error: Any  # parakeet_capi_last_error(ctx) -> const char*

    def take(self, pointer: int | None) -> str | None:
        """The malloc'd string at ``pointer``, freed; None for NULL."""
        if not pointer:
            return None
        value = ctypes.cast(pointer, ctypes.c_char_p).value
        self.free_string(pointer)
        return value.decode("utf-8", "replace") if value is not None else ""

    def error(self, ctx: int) -> str:
        message = self.last_error(ctx)
        return message.decode("utf-8", "replace") if message else "unknown error"


def _load_cuda_library(library: _Library) -> None:
    """Load ``library``, from its wheel if installed, else from the loader's path. Once loaded,
    it is what the loader gives ``libggml-cuda.so`` for that name (libraries are matched by
    soname), so no global symbol scope is needed."""
    try:
        wheel = importlib.metadata.distribution(library.distribution)
    except importlib.metadata.PackageNotFoundError:
        wheel = None
    if wheel is not None:
        path = Path(str(wheel.locate_file(f"{library.folder}/{library.soname}")))
        if path.is_file():
            try:
                ctypes.CDLL(str(path))
                return
            except OSError as exc:
                raise RuntimeMissing(
                    f"{library.soname} ({library.what}) failed to load: {exc}"
                ) from exc
    try:
        ctypes.CDLL(library.soname)
    except OSError:
        raise RuntimeMissing(
            f"{library.soname} ({library.what}) is missing: {PACKAGE} needs it from the PyPI "
            f"package {library.distribution} ({_INSTALL})"
        ) from None


def _bind(lib: Any, name: str, restype: Any, *argtypes: Any) -> Any:
    # lib[name] makes a new function object: the module's own bindings are left alone.
    function = lib[name]
    function.restype, function.argtypes = restype, list(argtypes)
    return function


def _load_runtime() -> LoadedRuntime:
    try:
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeMissing(f"the PyPI package {PACKAGE} is not installed ({_INSTALL})") from None
    for library in _CUDA_LIBRARIES:
        _load_cuda_library(library)
    try:
        ctypes.CDLL(_DRIVER)
    except OSError:
        raise RuntimeMissing(
            f"{_DRIVER} (the NVIDIA driver) is missing: {PACKAGE} needs an NVIDIA GPU and its "
            "driver, even to decode on the CPU"
        ) from None
    try:
        module = importlib.import_module("parakeet")
    except OSError as exc:
        # The package's message lists each library it tried, one per line.
        detail = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
        raise RuntimeMissing(f"{PACKAGE} {version} could not load its library: {detail}") from exc
    except ImportError as exc:
        raise RuntimeMissing(f"{PACKAGE} {version} is broken: {exc}") from exc
    abi = int(module.abi_version())
    lib = getattr(getattr(module, "_ffi", None), "lib", None)
    if abi < _MIN_ABI or lib is None or not hasattr(lib, "parakeet_capi_stream_feed_json"):
        raise RuntimeMissing(
            f"{PACKAGE} {version} (libparakeet ABI {abi}) lacks the streaming JSON API "
            f"(ABI {_MIN_ABI} or later; {PACKAGE}==0.2.2 has it)"
        )
    void_p, char_p, float_p = ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_float)
    return LoadedRuntime(
        module=module,
        version=version,
        abi=abi,
        begin=_bind(lib, "parakeet_capi_stream_begin_lang", void_p, void_p, char_p),
        feed=_bind(lib, "parakeet_capi_stream_feed_json", void_p, void_p, float_p, ctypes.c_int),
        finalize=_bind(lib, "parakeet_capi_stream_finalize_json", void_p, void_p),
        free_stream=_bind(lib, "parakeet_capi_stream_free", None, void_p),
        free_string=_bind(lib, "parakeet_capi_free_string", None, void_p),
        last_error=_bind(lib, "parakeet_capi_last_error", char_p, void_p),
    )


class _Once:
    """The outcome of the one attempt to load the runtime: the runtime or why not. A failure
    is kept: the libraries already loaded stay loaded, and a second attempt would only repeat
    it."""

    lock = threading.Lock()
    loaded: LoadedRuntime | None = None
    missing: str | None = None


def runtime() -> LoadedRuntime:
    """The loaded runtime, loading it on first use; :class:`RuntimeMissing` if it cannot be."""
    with _Once.lock:
        if _Once.loaded is None:
            if _Once.missing is not None:
                raise RuntimeMissing(_Once.missing)
            try:
                _Once.loaded = _load_runtime()
            except RuntimeMissing as exc:
                _Once.missing = str(exc)
                raise
        return _Once.loaded


@functools.cache
def _driver_found() -> bool:
    """Whether the loader could find the NVIDIA driver's library, without loading it:
    ``LD_LIBRARY_PATH``, then the loader's cache and the paths ctypes searches."""
    folders = [f for f in os.environ.get("LD_LIBRARY_PATH", "").split(":") if f]
    if any((Path(folder) / _DRIVER).exists() for folder in folders):
        return True
    return ctypes.util.find_library("cuda") is not None


def machine_problem() -> str | None:
    """Why the runtime cannot run on this machine, found without loading it (a listing of
    the models asks): what the one attempt to load it found, else whether the driver is there
    at all. None: it may run (what is missing from the packages is the catalogue's to say)."""
    if _Once.loaded is not None:
        return None
    if _Once.missing is not None:
        return _Once.missing
    if not _driver_found():
        return (
            f"needs an NVIDIA GPU and its driver ({_DRIVER} is not on this machine), even to "
            "decode on the CPU"
        )
    return None


def require_loaded(entry: ModelEntry) -> LoadedRuntime:
    """The loaded runtime, or :class:`EngineUnavailable` naming what is missing and the model
    that works here instead."""
    try:
        return runtime()
    except RuntimeMissing as exc:
        raise EngineUnavailable(
            f"model {entry.slug!r} cannot load the parakeet.cpp runtime: {exc}. "
            f"Use {DEFAULT_MODEL!r} here, which works offline"
        ) from None


def require_runtime(entry: ModelEntry) -> str:
    """The runtime's version, or :class:`EngineUnavailable` naming what is missing (the pool
    asks before it fetches a model's files)."""
    loaded = require_loaded(entry)
    return f"{PACKAGE} {loaded.version} (libparakeet ABI {loaded.abi})"
