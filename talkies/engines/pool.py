"""The model pool: slots, pinning, loading and unloading (spec: "Backend behaviour and pinning").

- **Slots**: each model has ``max_concurrency`` slots (its entry, else TALKIES_MODEL_CONCURRENCY,
  else TALKIES_MODEL_MAX_CONCURRENCY), shared by WebSocket streams and HTTP requests. A full
  model refuses (``connection_limit``); nothing queues, except behind a stream that was
  already released and is finishing its last decode (:mod:`talkies.engines.runtime.slots`).
- **Pinning**: while any stream is open, its model is pinned: a stream for another model gets
  ``model_busy`` (4409), and unloading it or serving another model over HTTP is a
  :class:`ModelConflict` (HTTP 409). The first stream of a model evicts the other loaded ones.
- **Loading** runs in a thread of its own, once per model however many callers wait for it.
  A caller that leaves stops waiting at once and gives its slot back, while the load goes on
  and is kept for the next stream. The first load of a model is checked in a child process
  (validate.py).
- **Registry changes** are picked up without a restart: a start naming an unknown slug
  re-reads the models files if they changed, and :meth:`ModelPool.refresh` (SIGHUP) does so
  unconditionally.
- Every path releases its slot exactly once (:class:`_PooledStream`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

from ..config import Settings
from ..protocol import ErrorCode
from ..protocol.messages import StartOptions
from . import catalogue
from .base import (
    EngineStream,
    EngineUnavailable,
    ListeningStream,
    LoadedModel,
    Refusal,
    RefusalKind,
    ResultListener,
)
from .loading import AnyModel, Loader, LoadPipeline
from .readiness import probe_sites, readiness
from .runtime.slots import Slot, Slots
from .supply.access import SiteAccess
from .supply.download import is_downloaded, source_of
from .supply.registry import (
    ModelEntry,
    RegistryError,
    build_registry,
    local_registry_path,
    registry_stamp,
)
from .supply.wheels import wheels_installed

__all__ = [
    "AnyModel",
    "Loader",
    "ModelConflict",
    "ModelPool",
    "build_registry",
    "local_registry_path",
]

log = logging.getLogger("talkies.engines")

Registry = Callable[[], Mapping[str, ModelEntry]]


class ModelConflict(Refusal):
    """The request conflicts with the pinned model, or unloads one in use (HTTP 409)."""

    def __init__(self, detail: str, kind: RefusalKind = RefusalKind.MODEL_BUSY) -> None:
        super().__init__(kind, detail)

    def __str__(self) -> str:
        return self.detail


@dataclass(eq=False)
class _Loading:
    """One load in progress; every caller of that model waits for the same one."""

    done: anyio.Event = field(default_factory=anyio.Event)
    error: EngineUnavailable | None = None


@dataclass(eq=False)
class _State:
    entry: ModelEntry
    slots: Slots
    streams: int = 0
    loaded: AnyModel | None = None
    loading: _Loading | None = None
    last_used: float = 0.0
    checked: bool = False  # passed the child-process load check
    last_error: str | None = None  # of the last load, until one succeeds
    lock: anyio.Lock = field(default_factory=anyio.Lock)  # loading vs unloading

    @property
    def in_use(self) -> int:
        """Streams + HTTP requests holding a slot."""
        return self.slots.held


class _PooledStream:
    """An engine stream that gives its slot back exactly once, when closed."""

    def __init__(self, inner: EngineStream, slot: Slot, release: Callable[[], None]) -> None:
        self._inner = inner
        self._slot = slot
        self._release = release
        self._closed = False
        # The inner stream's own methods: no await or call of ours on the per-frame path.
        self.feed, self.flush, self.cut = inner.feed, inner.flush, inner.cut
        self.events = inner.events

    def listen(self, listener: ResultListener) -> None:
        if isinstance(self._inner, ListeningStream):
            self._inner.listen(listener)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._slot.leaving()  # a reconnecting client may wait for this slot, not be refused
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
        loader: Loader = catalogue.load_recognition,
        validate: bool = True,
        local_files_only: bool = False,
        registry: Registry | None = None,
        access: SiteAccess | None = None,
    ) -> None:
        self.settings = settings
        self.access = access or SiteAccess()  # which download sites answer (status rows)
        self._validate = validate
        self._pipeline = LoadPipeline(settings, loader=loader, local_files_only=local_files_only)
        self._registry = registry
        self._registry_stamp = registry_stamp(settings) if registry is not None else None
        self._states = {slug: self._new_state(entry) for slug, entry in models.items()}
        self._pinned: str | None = None
        self._max_buffered = max(2, int(settings.stream_max_buffer_seconds * 32000) // 2 * 2)
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelPool:
        """The pool ``talkies serve`` runs: the configured registry, re-read when it changes.
        Raises RegistryError naming every problem."""
        return cls(build_registry(settings), settings, registry=lambda: build_registry(settings))

    def _new_state(self, entry: ModelEntry) -> _State:
        limit = entry.max_concurrency or self.settings.concurrency_for(entry.slug)
        return _State(entry=entry, slots=Slots(limit))

    @property
    def pinned(self) -> str | None:
        """The model every open stream uses, or None when no stream is open."""
        return self._pinned

    def entry(self, slug: str) -> ModelEntry | None:
        state = self._states.get(slug)
        return state.entry if state else None

    def in_use(self, slug: str) -> int:
        return self._states[slug].in_use

    def servable(self) -> bool:
        """Whether some streaming model could be served now: its files are in place (or
        come from installed wheels) and it is not at its slot limit."""
        data_dir = self.settings.data_dir
        for state in self._states.values():
            entry = state.entry
            if not catalogue.executor_of(entry).streams or state.in_use >= state.slots.limit:
                continue
            if self._pinned not in (None, entry.slug):
                continue
            if is_downloaded(entry, data_dir) or wheels_installed(entry.wheels):
                return True
        return False

    def slugs(self) -> list[str]:
        return list(self._states)

    def peek(self, slug: str) -> AnyModel | None:
        """The model if it is loaded now (no slot taken, nothing loaded)."""
        state = self._states.get(slug)
        return state.loaded if state is not None else None

    def loaded(self) -> list[str]:
        return [slug for slug, s in self._states.items() if s.loaded is not None]

    def probe_sites(self, *, wait: bool = False) -> None:
        """Probe the sites of downloads, for the status rows (``wait``: until they answered)."""
        probe_sites([s.entry for s in self._states.values()], self.access, wait=wait)

    def status(self) -> list[dict[str, Any]]:
        """One row per model for ``talkies models list`` and operators' endpoints; its
        ``readiness`` and ``reason`` say whether it can run here (engines/readiness.py)."""
        data_dir = self.settings.data_dir
        rows = []
        for slug, s in self._states.items():
            executor = catalogue.executor_of(s.entry)
            ready = readiness(
                s.entry, data_dir, self.access, loaded=s.loaded is not None, last_error=s.last_error
            )
            rows.append(
                {
                    "model": slug,
                    "executor": s.entry.executor,
                    "kind": executor.kind,
                    "streaming": executor.streams,
                    "source": source_of(s.entry),
                    "downloaded": is_downloaded(s.entry, data_dir),
                    "loaded": s.loaded is not None,
                    "in_use": s.in_use,
                    "max_concurrency": s.slots.limit,
                    "pinned": self._pinned == slug,
                    "readiness": ready.state,
                    "reason": ready.reason,
                }
            )
        return rows

    # -- the registry ------------------------------------------------------------------------

    def refresh(self, *, force: bool = True) -> list[str]:
        """Re-read the registry (TALKIES_MODELS_FILE and imported models); the slugs added or
        changed. Entries of models that are loaded or in use are kept until they are idle.
        Without ``force``, only when one of the files changed since the last read."""
        if self._registry is None:
            return []
        stamp = registry_stamp(self.settings)
        if not force and stamp == self._registry_stamp:
            return []
        self._registry_stamp = stamp
        try:
            models = self._registry()
        except RegistryError as exc:
            log.error("registry not reloaded", extra={"problems": list(exc.problems)})
            return []
        changed = []
        for slug, entry in models.items():
            state = self._states.get(slug)
            if state is None:
                self._states[slug] = self._new_state(entry)
            elif state.entry == entry or state.loaded is not None or state.in_use:
                continue
            else:
                self._states[slug] = self._new_state(entry)
            changed.append(slug)
        if changed:
            log.info("registry reloaded", extra={"models": changed})
        return changed

    def _state(self, slug: str) -> _State:
        state = self._states.get(slug)
        if state is None and self.refresh(force=False):
            state = self._states.get(slug)
        if state is None:
            raise Refusal(ErrorCode.UNKNOWN_MODEL, f"unknown model {slug!r}")
        return state

    # -- streams -----------------------------------------------------------------------------

    async def _wait_for_pinned_to_leave(self, slug: str) -> None:
        """A stream of another model that was released is finishing: wait for it (bounded),
        the way :meth:`Slots.acquire` waits for a leaving slot."""
        pinned = self._pinned
        if pinned is None or pinned == slug:
            return
        other = self._states[pinned]
        if other.slots.leaving >= other.streams:
            await other.slots.wait_for_leaving()

    async def open_stream(self, options: StartOptions) -> EngineStream:
        slug = options.model
        state = self._state(slug)
        if not catalogue.executor_of(state.entry).streams:
            raise Refusal(
                ErrorCode.STREAMING_NOT_SUPPORTED,
                f"model {slug!r} ({state.entry.executor}) does not support streaming",
            )
        await self._wait_for_pinned_to_leave(slug)
        if self._pinned is not None and self._pinned != slug:
            raise Refusal(
                ErrorCode.MODEL_BUSY,
                f"model {self._pinned!r} is streaming; {slug!r} can start when it is released",
            )
        slot = await state.slots.acquire()
        if slot is None:
            raise Refusal(
                ErrorCode.CONNECTION_LIMIT,
                f"model {slug!r} is at its limit of {state.slots.limit} concurrent requests",
            )
        if self._pinned is not None and self._pinned != slug:  # pinned while we waited
            slot.release()
            raise Refusal(
                ErrorCode.MODEL_BUSY,
                f"model {self._pinned!r} is streaming; {slug!r} can start when it is released",
            )
        state.streams += 1
        self._pinned = slug
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            state.streams -= 1
            state.last_used = anyio.current_time()
            if state.streams == 0 and self._pinned == slug:
                self._pinned = None
            slot.release()

        try:
            # A streaming entry's executor loads a recognition model, never a speech model.
            model = cast(LoadedModel, await self._ensure_loaded(state, evict_others=True))
            inner = await model.open_stream(options, max_buffered_bytes=self._max_buffered)
        except BaseException:
            release()
            raise
        return _PooledStream(inner, slot, release)

    # -- HTTP requests (OpenAI-shaped ASR/TTS) share the same slots --------------------------

    async def acquire(self, slug: str) -> tuple[AnyModel, Callable[[], None]]:
        """A slot on ``slug`` for one HTTP request; call the returned function to release it.

        Raises :class:`ModelConflict` when another model is pinned, and :class:`Refusal` for
        unknown models and full slots.
        """
        # A caller cancelled already (a client that left while its upload was decoded) stops
        # here, before it takes a slot, whatever the path below awaits.
        await anyio.lowlevel.checkpoint()
        state = self._state(slug)
        await self._wait_for_pinned_to_leave(slug)
        if self._pinned is not None and self._pinned != slug:
            raise ModelConflict(f"model {self._pinned!r} is pinned by active streams")
        slot = await state.slots.acquire()
        if slot is None:
            raise Refusal(ErrorCode.CONNECTION_LIMIT, f"model {slug!r} is at its limit")

        def release() -> None:
            if not slot.released:
                state.last_used = anyio.current_time()
                slot.release()

        try:
            model = await self._ensure_loaded(state, evict_others=False)
        except BaseException:
            release()
            raise
        return model, release

    # -- loading and unloading ---------------------------------------------------------------

    async def _ensure_loaded(self, state: _State, *, evict_others: bool) -> AnyModel:
        if state.loaded is not None and not getattr(state.loaded, "alive", True):
            # Its engine process ended (isolation/): the streams on it have failed; load
            # it again for this one.
            dead, state.loaded = state.loaded, None
            log.error(
                "model's engine process ended; loading it again", extra={"model": state.entry.slug}
            )
            self._close_later(dead)
        started = False
        while state.loaded is None:
            loading = state.loading
            if loading is None:
                async with state.lock:  # not while this model is being unloaded
                    if state.loaded is not None or state.loading is not None:
                        continue
                    loading = state.loading = _Loading()
                    self._start_load(state, loading)
                    started = True
            # Waiting is cancellable: a client that leaves frees its slot now; the load goes
            # on in its thread and is kept for the next stream.
            await loading.done.wait()
            if loading.error is not None:
                raise loading.error  # the models already loaded stay loaded
        model = state.loaded
        if started and evict_others:
            # Only now that the replacement has loaded: a model that fails to load (one that
            # cannot run on this machine) must not cost the loaded ones their place.
            for other in self._states.values():
                if other is state or other.loaded is None:
                    continue
                async with other.lock:  # (idle is decided under the lock: it may change)
                    if other.in_use == 0:
                        await self._unload(other)
        return model

    def _start_load(self, state: _State, loading: _Loading) -> None:
        token = anyio.lowlevel.current_token()
        entry = state.entry

        def finish(model: AnyModel | None, error: EngineUnavailable | None) -> None:
            # On the event loop.
            state.loading = None
            if model is not None:
                if self._closed or self._states.get(entry.slug) is not state:
                    self._close_later(model)
                else:
                    state.loaded = model
                    state.checked = True
            state.last_error = str(error) if error is not None else None
            loading.error = error
            loading.done.set()

        def work() -> None:
            model: AnyModel | None = None
            error: EngineUnavailable | None = None
            try:
                model = self._pipeline.load(entry, check=self._validate and not state.checked)
            except EngineUnavailable as exc:
                error = exc
            except BaseException as exc:  # a bug: still a clean 4500, with the cause logged
                log.exception("model load failed", extra={"model": entry.slug})
                error = EngineUnavailable(f"model {entry.slug!r} could not be loaded: {exc}")
            try:
                anyio.from_thread.run_sync(finish, model, error, token=token)
            except Exception:  # the event loop is gone: nobody will use the model
                if model is not None:
                    model.close()

        threading.Thread(target=work, name=f"talkies-load-{entry.slug}", daemon=True).start()

    def _close_later(self, model: AnyModel) -> None:
        threading.Thread(target=model.close, name="talkies-unload", daemon=True).start()

    async def _unload(self, state: _State) -> None:
        model, state.loaded = state.loaded, None
        if model is not None:
            log.info("model unloaded", extra={"model": state.entry.slug})
            await anyio.to_thread.run_sync(model.close)

    async def unload(self, slug: str) -> None:
        """Unload on request; :class:`ModelConflict` while the model is pinned or in use."""
        state = self._state(slug)
        if self._pinned == slug or state.in_use:
            raise ModelConflict(
                f"model {slug!r} is in use by {state.in_use} requests", RefusalKind.MODEL_IN_USE
            )
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
        self._closed = True
        for state in self._states.values():
            async with state.lock:
                await self._unload(state)
