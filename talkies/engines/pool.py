"""The model pool: slots, pinning, loading and unloading (spec: "Backend behaviour and pinning").

- **Slots**: each model has ``max_concurrency`` slots (its entry, else TALKIES_MODEL_CONCURRENCY,
  else TALKIES_MODEL_MAX_CONCURRENCY), shared by WebSocket streams and HTTP requests. A full
  model refuses (``connection_limit``); nothing queues.
- **Pinning**: while any stream is open, its model is pinned: a stream for another model gets
  ``model_busy`` (4409), and unloading it or serving another model over HTTP is a
  :class:`ModelConflict` (HTTP 409). The first stream of a model evicts the other loaded ones.
- **Loading** is single-flight per model and shielded: a client that leaves mid-download does
  not waste it. The first load of a model is checked in a child process (validate.py).
- Every path releases its slot exactly once (:class:`_PooledStream`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread

from ..config import Settings
from ..protocol import ErrorCode
from ..protocol.messages import StartOptions
from .base import EngineEvent, EngineStream, EngineUnavailable, LoadedModel, Refusal
from .download import DownloadError, ensure_snapshot, is_downloaded
from .registry import ModelEntry
from .validate import load_model, validate_in_child

__all__ = ["ModelConflict", "ModelPool"]

log = logging.getLogger("talkies.engines")

Loader = Callable[[ModelEntry, Path, str], LoadedModel]
Validator = Callable[[ModelEntry, Path, str], Any]


class ModelConflict(Exception):
    """The request conflicts with the pinned model (HTTP 409)."""


@dataclass(eq=False)
class _State:
    entry: ModelEntry
    limit: int
    in_use: int = 0  # streams + HTTP requests holding a slot
    streams: int = 0
    loaded: LoadedModel | None = None
    last_used: float = 0.0
    checked: bool = False  # passed the child-process load check
    lock: anyio.Lock = field(default_factory=anyio.Lock)


class _PooledStream:
    """An engine stream that gives its slot back exactly once, when closed."""

    def __init__(self, inner: EngineStream, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release = release
        self._closed = False

    async def feed(self, pcm: bytes) -> None:
        await self._inner.feed(pcm)

    async def flush(self) -> None:
        await self._inner.flush()

    def events(self) -> AsyncIterator[EngineEvent]:
        return self._inner.events()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            await self._inner.aclose()
        finally:
            self._release()


class ModelPool:
    """A :class:`~talkies.engines.base.StreamProvider` over the registry's models."""

    def __init__(
        self,
        models: Mapping[str, ModelEntry],
        settings: Settings,
        *,
        loader: Loader = load_model,
        validate: bool = True,
        local_files_only: bool = False,
    ) -> None:
        self.settings = settings
        self._loader = loader
        self._validate = validate
        self._local_files_only = local_files_only
        self._states = {
            slug: _State(
                entry=entry,
                limit=entry.max_concurrency or settings.concurrency_for(slug),
            )
            for slug, entry in models.items()
        }
        self._pinned: str | None = None
        self._max_buffered = max(2, int(settings.stream_max_buffer_seconds * 32000) // 2 * 2)

    @property
    def pinned(self) -> str | None:
        """The model every open stream uses, or None when no stream is open."""
        return self._pinned

    def entry(self, slug: str) -> ModelEntry | None:
        state = self._states.get(slug)
        return state.entry if state else None

    def in_use(self, slug: str) -> int:
        return self._states[slug].in_use

    def loaded(self) -> list[str]:
        return [slug for slug, s in self._states.items() if s.loaded is not None]

    def status(self) -> list[dict[str, Any]]:
        """One row per model for ``talkies models list`` and operators' endpoints."""
        data_dir = self.settings.data_dir
        return [
            {
                "model": slug,
                "executor": s.entry.executor,
                "streaming": s.entry.streaming,
                "source": f"{s.entry.repo}@{s.entry.revision[:12]}"
                if s.entry.repo and s.entry.revision
                else str(s.entry.path),
                "downloaded": is_downloaded(s.entry, data_dir),
                "loaded": s.loaded is not None,
                "in_use": s.in_use,
                "max_concurrency": s.limit,
                "pinned": self._pinned == slug,
            }
            for slug, s in self._states.items()
        ]

    # -- streams -----------------------------------------------------------------------------

    async def open_stream(self, options: StartOptions) -> EngineStream:
        slug = options.model
        state = self._states.get(slug)
        if state is None:
            raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {slug!r}")
        if not state.entry.streaming:
            raise Refusal(
                ErrorCode.STREAMING_NOT_SUPPORTED,
                f"model {slug!r} ({state.entry.executor}) does not support streaming",
            )
        if self._pinned is not None and self._pinned != slug:
            raise Refusal(
                ErrorCode.MODEL_BUSY,
                f"model {self._pinned!r} is streaming; {slug!r} can start when it is released",
            )
        if state.in_use >= state.limit:
            raise Refusal(
                ErrorCode.CONNECTION_LIMIT,
                f"model {slug!r} is at its limit of {state.limit} concurrent requests",
            )
        # Reserve before the first await: concurrent opens must see the slot taken.
        state.in_use += 1
        state.streams += 1
        self._pinned = slug
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            state.in_use -= 1
            state.streams -= 1
            state.last_used = anyio.current_time()
            if state.streams == 0 and self._pinned == slug:
                self._pinned = None

        try:
            model = await self._ensure_loaded(state, evict_others=True)
            # The load is shielded; a caller cancelled meanwhile must not get a stream.
            await anyio.lowlevel.checkpoint_if_cancelled()
            inner = await model.open_stream(options, max_buffered_bytes=self._max_buffered)
        except BaseException:
            release()
            raise
        return _PooledStream(inner, release)

    # -- HTTP requests (OpenAI-shaped ASR/TTS) share the same slots --------------------------

    async def acquire(self, slug: str) -> tuple[LoadedModel, Callable[[], None]]:
        """A slot on ``slug`` for one HTTP request; call the returned function to release it.

        Raises :class:`ModelConflict` when another model is pinned, and :class:`Refusal` for
        unknown models and full slots.
        """
        state = self._states.get(slug)
        if state is None:
            raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {slug!r}")
        if self._pinned is not None and self._pinned != slug:
            raise ModelConflict(f"model {self._pinned!r} is pinned by active streams")
        if state.in_use >= state.limit:
            raise Refusal(ErrorCode.CONNECTION_LIMIT, f"model {slug!r} is at its limit")
        state.in_use += 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                state.in_use -= 1
                state.last_used = anyio.current_time()

        try:
            model = await self._ensure_loaded(state, evict_others=False)
        except BaseException:
            release()
            raise
        return model, release

    # -- loading and unloading ---------------------------------------------------------------

    async def _ensure_loaded(self, state: _State, *, evict_others: bool) -> LoadedModel:
        async with state.lock:
            if state.loaded is not None:
                return state.loaded
            if evict_others:
                for other in self._states.values():
                    if other is not state and other.loaded is not None and other.in_use == 0:
                        await self._unload(other)
            # Shielded: a download or load that started completes and is kept, even if the
            # client that asked for it is gone.
            with anyio.CancelScope(shield=True):
                model = await self._load(state)
            state.loaded = model
            return model

    async def _load(self, state: _State) -> LoadedModel:
        entry, device = state.entry, self.settings.device
        if entry.executor == "whisper" and "window_seconds" not in entry.options:
            # The rolling window is the server's buffer (TALKIES_STREAM_MAX_BUFFER_SECONDS).
            options = {**entry.options, "window_seconds": self.settings.stream_max_buffer_seconds}
            entry = replace(entry, options=MappingProxyType(options))
        if entry.executor == "parakeet_cpp":
            from .parakeet import require_runtime

            require_runtime(entry)  # before fetching weights it could not run
        try:
            root = await anyio.to_thread.run_sync(
                lambda: ensure_snapshot(
                    entry, self.settings.data_dir, local_files_only=self._local_files_only
                )
            )
        except DownloadError as exc:
            log.error("model download failed", extra={"model": entry.slug, "error": str(exc)})
            raise EngineUnavailable(str(exc)) from exc
        if self._validate and not state.checked:
            await validate_in_child(entry, root, device)
            state.checked = True
        started = anyio.current_time()
        try:
            model = await anyio.to_thread.run_sync(self._loader, entry, root, device)
        except EngineUnavailable:
            raise
        except Exception as exc:
            log.exception("model load failed", extra={"model": entry.slug})
            raise EngineUnavailable(f"model {entry.slug!r} could not be loaded: {exc}") from exc
        log.info(
            "model loaded",
            extra={"model": entry.slug, "seconds": round(anyio.current_time() - started, 3)},
        )
        return model

    async def _unload(self, state: _State) -> None:
        model, state.loaded = state.loaded, None
        if model is not None:
            log.info("model unloaded", extra={"model": state.entry.slug})
            await anyio.to_thread.run_sync(model.close)

    async def unload(self, slug: str) -> None:
        """Unload on request; :class:`ModelConflict` while the model is pinned or in use."""
        state = self._states.get(slug)
        if state is None:
            raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {slug!r}")
        if self._pinned == slug or state.in_use:
            raise ModelConflict(f"model {slug!r} is in use by {state.in_use} requests")
        async with state.lock:
            await self._unload(state)

    async def sweep(self) -> list[str]:
        """Unload models idle for TALKIES_MODEL_TTL; pinned and busy ones are skipped."""
        ttl = self.settings.model_ttl
        if ttl <= 0:
            return []
        now = anyio.current_time()
        unloaded = []
        for slug, state in self._states.items():
            idle = state.in_use == 0 and self._pinned != slug
            if state.loaded is not None and idle and now - state.last_used >= ttl:
                async with state.lock:
                    await self._unload(state)
                unloaded.append(slug)
        return unloaded

    async def run_sweeper(self) -> None:
        """Run :meth:`sweep` periodically; returns at once when the TTL is off."""
        ttl = self.settings.model_ttl
        if ttl <= 0:
            return
        while True:
            await anyio.sleep(min(30.0, max(ttl / 4, 0.05)))
            await self.sweep()

    async def aclose(self) -> None:
        for state in self._states.values():
            async with state.lock:
                await self._unload(state)


def build_registry(settings: Settings) -> dict[str, ModelEntry]:
    """Built-in entries, overridden and extended by TALKIES_MODELS_FILE, filtered by
    TALKIES_ENABLED_MODELS. Raises RegistryError naming every problem."""
    from .builtin import builtin_models
    from .registry import RegistryError, load_models_file

    models = builtin_models(settings.data_dir)
    local = local_registry_path(settings)
    if local.is_file():  # models registered by `talkies models import-ct2`
        models.update(load_models_file(local))
    if settings.models_file is not None:
        models.update(load_models_file(settings.models_file))
    if settings.enabled_models is not None:
        unknown = [s for s in settings.enabled_models if s not in models]
        if unknown:
            raise RegistryError(
                [f"TALKIES_ENABLED_MODELS names unknown models: {', '.join(unknown)}"]
            )
        models = {s: models[s] for s in settings.enabled_models}
    return models


def local_registry_path(settings: Settings) -> Path:
    """Where ``talkies models import-ct2`` records the models it converted."""
    return settings.data_dir / "models.json"
