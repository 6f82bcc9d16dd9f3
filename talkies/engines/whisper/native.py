"""The few ``_pywhispercpp`` calls talkies makes (the binding ships no type stubs)."""

from __future__ import annotations

import atexit
import importlib
import logging
import threading
from pathlib import Path
from typing import Any

from ..base import EngineUnavailable

__all__ = ["Native"]

log = logging.getLogger("talkies.engines")


class Native:
    """The few ``_pywhispercpp`` calls used here (the binding ships no type stubs)."""

    _log_lock = threading.Lock()
    _capture: list[tuple[int, str]] | None = None
    _hooked = False

    def __init__(self) -> None:
        try:
            self.pw: Any = importlib.import_module("_pywhispercpp")
        except ImportError as exc:
            raise EngineUnavailable(
                "the whisper executor needs pywhispercpp (pip install 'talkies[whisper]')"
            ) from exc
        self._hook_logs()

    def _hook_logs(self) -> None:
        # whisper.cpp writes its log (a few dozen lines per load, a line per language
        # detection) to stderr; route it into logging. The hook is removed at exit: a Python
        # callback invoked while the interpreter finalizes aborts the process.
        with Native._log_lock:
            if Native._hooked:
                return
            self.pw.whisper_log_set(Native._on_log)
            atexit.register(self.pw.whisper_log_set, None)
            Native._hooked = True

    @staticmethod
    def _on_log(level: int, text: str) -> None:
        capture = Native._capture
        if capture is not None:
            capture.append((level, text))
        if level >= 4:
            log.warning("whisper.cpp: %s", text.rstrip())
        else:
            log.debug("whisper.cpp: %s", text.rstrip())

    def init(self, path: Path, *, use_gpu: bool, gpu_device: int) -> Any:
        params = self.pw.whisper_context_default_params()
        params.use_gpu = use_gpu
        params.gpu_device = gpu_device
        # With flash attention and a reduced audio_ctx, the same audio decoded differently
        # depending on what the context had decoded before (stale cross-attention state, it
        # seems; whisper.cpp 1.8.5, CPU). Without it a decode depends on its own audio only,
        # at the same speed.
        params.flash_attn = False
        with Native._log_lock:
            captured: list[tuple[int, str]] = []
            Native._capture = captured
            try:
                ctx = self.pw.whisper_init_from_file_with_params(str(path), params)
            finally:
                Native._capture = None
        errors = [text.strip() for level, text in captured if level >= 4]
        if errors:
            # The binding returns a wrapper around NULL on failure; never use it.
            raise EngineUnavailable(f"whisper.cpp could not load {path.name}: {errors[-1]}")
        return ctx

    def free(self, ctx: Any) -> None:
        self.pw.whisper_free(ctx)
