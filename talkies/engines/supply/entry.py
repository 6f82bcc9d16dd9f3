"""A model registry entry: a slug, the executor that runs it, and where its files come from.

The fields that every entry has, and their checks that do not depend on the executor; what an
executor makes of its entry is the executor's (:mod:`talkies.engines.catalogue`), and the
registry (:mod:`.registry`) checks both.
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ...protocol.messages import MODEL_SLUG
from .wheels import WheelFile

__all__ = ["CONVERSIONS", "ModelEntry", "is_https_url"]

# What the files of a ``wheels`` entry may be turned into before they are served.
CONVERSIONS = frozenset({"ct2-whisper"})
_REVISION = re.compile(r"[0-9a-f]{40}")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


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
    # Seconds one decode call may take before its streams fail (None: TALKIES_DECODE_TIMEOUT);
    # a large model on a slow CPU needs more than a small one on the same server.
    decode_timeout: float | None = None
    # Seconds of lag over which the model refuses new streams (None: TALKIES_STREAM_MAX_LAG;
    # 0: never; talkies/engines/runtime/lag.py).
    max_lag: float | None = None
    # Engine knobs that are not part of the common schema (whisper refresh period, ...).
    options: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    description: str = ""
    # Files shipped in PyPI wheels, each pinned by its SHA-256 (built-in entries).
    wheels: tuple[WheelFile, ...] | None = None
    convert: str | None = None  # one of CONVERSIONS, applied to the wheels' files

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
        """Everything wrong with this entry that its executor does not decide (the slug, the
        source of its files, the concurrency), each naming the slug and the field; the
        registry adds the executor's own checks
        (:func:`~talkies.engines.supply.registry.entry_problems`)."""
        out: list[str] = []
        where = f"model {self.slug!r}"
        if MODEL_SLUG.fullmatch(self.slug) is None:
            out.append(f"{where}: slug must be 1-128 of A-Z a-z 0-9 . _ -")
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
        if self.max_concurrency is not None and not (
            type(self.max_concurrency) is int and 1 <= self.max_concurrency <= 1024
        ):
            out.append(f"{where}: max_concurrency must be an integer from 1 to 1024")
        if self.decode_timeout is not None and not (
            type(self.decode_timeout) in (int, float) and 1.0 <= self.decode_timeout <= 3600.0
        ):
            out.append(f"{where}: decode_timeout must be a number of seconds from 1 to 3600")
        if self.max_lag is not None and not (
            type(self.max_lag) in (int, float) and 0.0 <= self.max_lag <= 3600.0
        ):
            out.append(f"{where}: max_lag must be a number of seconds from 0 to 3600")
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
