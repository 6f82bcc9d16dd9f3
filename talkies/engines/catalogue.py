"""The catalogue of executors: what each engine is, declared in the engine's own folder.

An executor is the kind of engine a registry entry names (``whisper``, ``vosk``, ``kokoro``,
...). Each engine folder under ``talkies/engines/`` declares its executors in its package, a
module-level ``EXECUTORS`` tuple of :class:`Executor` records: whether it is speech recognition
or synthesis, whether it streams, whether it transcribes whole files, whether it runs in an
engine process of its own, the checks of the entry fields it takes, how it loads. The
catalogue finds the folders by listing this package (the folders of the engines' shared
concerns, :data:`CONCERNS`, are not engines), so adding an engine is writing one folder, and
every place that asks what an executor can do asks here rather than comparing names.

The spec's offline executors (NeMo models) have no runtime here; the catalogue declares them
itself (:data:`DECLARED_ONLY`), so a registry may name them, a stream on one is refused with
``streaming_not_supported`` and a file transcription answers 400.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

from ..config import Settings
from .base import EngineUnavailable, LoadedModel
from .supply.entry import ModelEntry
from .tts.base import SpeechModel

__all__ = [
    "CONCERNS",
    "DECLARED_ONLY",
    "CatalogueError",
    "Executor",
    "executor_of",
    "executors",
    "find",
    "load_recognition",
    "load_speech",
    "names",
]

RecognitionLoader = Callable[[ModelEntry, Path, str], LoadedModel]
SpeechLoader = Callable[[ModelEntry, Path, str, Path], SpeechModel]
EntryCheck = Callable[[ModelEntry], list[str]]
Prepare = Callable[[ModelEntry, Settings], ModelEntry]
Preflight = Callable[[ModelEntry], object]
MachineCheck = Callable[[], str | None]

# Folders of this package that are not engines.
CONCERNS = frozenset({"isolation", "runtime", "supply", "tts"})


class CatalogueError(RuntimeError):
    """An engine folder declares something the catalogue cannot take (a bug, not input)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Executor:
    """One engine, as the registry, the pool, the isolation and the HTTP routes see it."""

    name: str  # what a registry entry's ``executor`` says
    kind: Literal["asr", "tts"]  # speech recognition, or speech synthesis
    streams: bool = False  # implements the live-ASR protocol (WebSocket streams)
    transcribes_files: bool = False  # its loaded model is a FileTranscriber
    isolated: bool = False  # native code: in an engine process under TALKIES_ENGINE_ISOLATION
    # Blocking loaders (a worker thread): an ASR model's, or a TTS model's with the data
    # folder (custom voices). Neither: the executor has no runtime here.
    load_recognition: RecognitionLoader | None = None
    load_speech: SpeechLoader | None = None
    # The checks of the entry fields only this executor takes (problems naming the slug and
    # the field); without it, those fields (recognizer_factory, sherpa_config) are refused.
    check_entry: EntryCheck | None = None
    # The entry as this server runs it (defaults that come from the settings).
    prepare: Prepare | None = None
    # Before any file is fetched: raises EngineUnavailable when it cannot run on this machine.
    preflight: Preflight | None = None
    # The PyPI distributions its loader imports: looked up by name, never imported, so a
    # listing can say which are missing (with the Talkies extra that installs them, or
    # ``install`` where the extras are not the whole story).
    requires: tuple[str, ...] = ()
    install: str | None = None
    # Why this machine cannot run it, found without loading anything (None: it can).
    machine_problem: MachineCheck | None = None

    def __post_init__(self) -> None:
        if self.kind == "tts" and (self.streams or self.transcribes_files):
            raise CatalogueError(f"executor {self.name!r}: speech synthesis does not stream ASR")
        if self.kind == "tts" and self.load_recognition is not None:
            raise CatalogueError(f"executor {self.name!r}: a TTS executor loads speech models")
        if self.kind == "asr" and self.load_speech is not None:
            raise CatalogueError(f"executor {self.name!r}: an ASR executor loads recognizers")
        if (self.streams or self.transcribes_files) and self.load_recognition is None:
            raise CatalogueError(f"executor {self.name!r}: streams or files need a loader")


# The spec's executors with no runtime here: valid in a registry, never loaded.
DECLARED_ONLY = tuple(
    Executor(name=name, kind="asr")
    for name in (
        "parakeet",
        "canary_multitask",
        "canary_salm",
        "sherpa_offline_ctc",
        "wav2vec2_phoneme",
    )
)


@functools.cache
def executors() -> Mapping[str, Executor]:
    """Every executor, by name: the engine folders' declarations and :data:`DECLARED_ONLY`.

    Imports each engine package once (they import their native libraries only when a model
    loads)."""
    found = {executor.name: executor for executor in DECLARED_ONLY}
    for info in pkgutil.iter_modules([str(Path(__file__).parent)]):
        if not info.ispkg or info.name in CONCERNS:
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        declared = getattr(module, "EXECUTORS", None)
        if not isinstance(declared, tuple) or not all(isinstance(e, Executor) for e in declared):
            raise CatalogueError(f"engine folder {info.name!r} has no EXECUTORS tuple of Executor")
        for executor in declared:
            if executor.name in found:
                raise CatalogueError(f"executor {executor.name!r} is declared twice")
            found[executor.name] = executor
    return MappingProxyType(found)


def names() -> frozenset[str]:
    return frozenset(executors())


def find(name: str) -> Executor | None:
    """The executor called ``name``, or None."""
    return executors().get(name)


def executor_of(entry: ModelEntry) -> Executor:
    """The executor of a registry entry (the registry checked that it exists)."""
    executor = find(entry.executor)
    if executor is None:
        raise EngineUnavailable(f"model {entry.slug!r}: executor {entry.executor!r} is unknown")
    return executor


def load_recognition(entry: ModelEntry, root: Path, device: str) -> LoadedModel:
    """Load an ASR model in this process (blocking: call from a worker thread)."""
    load = executor_of(entry).load_recognition
    if load is None:
        raise EngineUnavailable(f"model {entry.slug!r}: executor {entry.executor!r} cannot stream")
    return load(entry, root, device)


def load_speech(entry: ModelEntry, root: Path, device: str, data_dir: Path) -> SpeechModel:
    """Load a TTS model in this process (blocking: call from a worker thread)."""
    load = executor_of(entry).load_speech
    if load is None:
        raise EngineUnavailable(f"model {entry.slug!r}: executor {entry.executor!r} is not TTS")
    return load(entry, root, device, data_dir)
