"""``talkies models import-ct2``: a faster-whisper (CTranslate2) folder becomes a whisper model."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..protocol.messages import MODEL_SLUG
from .registry import ModelEntry, entry_from_json

__all__ = ["import_ct2"]


def import_ct2(source: Path, slug: str, data_dir: Path, registry_file: Path) -> ModelEntry:
    """Convert ``source`` into ``<data_dir>/models/<slug>/model.bin`` (ggml) and add a
    ``whisper`` entry for it to ``registry_file`` (created if missing), atomically."""
    from .ct2ggml import convert

    if MODEL_SLUG.fullmatch(slug) is None:
        raise ValueError(f"invalid slug {slug!r}: 1-128 of A-Z a-z 0-9 . _ -")
    target_dir = data_dir / "models" / slug
    target_dir.mkdir(parents=True, exist_ok=True)
    convert(source, target_dir / "model.bin")
    raw: dict[str, Any] = {
        "executor": "whisper",
        "path": str(target_dir.resolve()),
        "options": {"model_file": "model.bin"},
        "description": f"imported from {source.resolve()}",
    }
    entry, problems = entry_from_json(slug, raw, registry_file.parent)
    if entry is None or problems:
        raise ValueError("; ".join(problems))
    document: dict[str, Any] = {"models": {}}
    if registry_file.is_file():
        document = json.loads(registry_file.read_text(encoding="utf-8"))
    document.setdefault("models", {})[slug] = raw
    registry_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = registry_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, registry_file)
    return entry
