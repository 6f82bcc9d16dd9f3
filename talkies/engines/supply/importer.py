"""``talkies models import-ct2``: a faster-whisper (CTranslate2) folder becomes a whisper model.

The folder holds ``model.bin`` or, as the PyPI wheels ship it, ``model.bin.part1``,
``model.bin.part2``, ... (joined in numeric order), beside its vocabulary. The converted model
appears under ``<data_dir>/models/<slug>`` only when complete, and its registry entry is
written atomically, so a failed import leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ...protocol.messages import MODEL_SLUG
from .registry import ModelEntry, entry_from_json

__all__ = ["ImportProblem", "import_ct2"]

_PART = re.compile(r"model\.bin\.part(\d+)")
_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.txt", "vocabulary.json")


class ImportProblem(ValueError):
    """The folder or slug cannot be imported; the message says why, in one line."""


def _checkpoint_folder(source: Path, scratch: Path) -> Path:
    """A folder with a whole ``model.bin``: ``source`` itself, or its parts joined in
    ``scratch``."""
    if (source / "model.bin").is_file():
        return source
    parts = sorted(
        (int(m.group(1)), path)
        for path in source.iterdir()
        if (m := _PART.fullmatch(path.name)) is not None and path.is_file()
    )
    if not parts:
        raise ImportProblem(f"{source} holds neither model.bin nor model.bin.part1, .part2, ...")
    numbers = [n for n, _ in parts]
    if numbers != list(range(1, len(parts) + 1)):
        raise ImportProblem(f"{source}: the parts of model.bin are {numbers}, not 1..{len(parts)}")
    scratch.mkdir()
    with (scratch / "model.bin").open("wb") as out:
        for _, path in parts:
            with path.open("rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
    for name in _SIDE_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, scratch / name)
    return scratch


def import_ct2(
    source: Path, slug: str, data_dir: Path, registry_file: Path, *, replace: bool = False
) -> ModelEntry:
    """Convert ``source`` into ``<data_dir>/models/<slug>/model.bin`` (ggml) and add a
    ``whisper`` entry for it to ``registry_file`` (created if missing), atomically.

    Raises :class:`ImportProblem` for a bad slug or folder, a checkpoint that is not a
    CTranslate2 Whisper model, or a data directory that cannot be written; for a built-in
    model's slug (its files would be replaced by the import's); for a source inside the
    target folder (which the import replaces: its own input); and for a slug whose folder
    exists, unless ``replace`` (a model imported again).
    """
    from ..whisper.ct2ggml import Ct2FormatError, convert
    from .builtin import BUILTIN_MODELS

    if MODEL_SLUG.fullmatch(slug) is None:
        raise ImportProblem(f"invalid slug {slug!r}: use 1-128 of A-Z a-z 0-9 . _ -")
    if not source.is_dir():
        raise ImportProblem(f"{source} is not a folder")
    if slug in BUILTIN_MODELS:
        raise ImportProblem(f"{slug} is a built-in model: import under another --slug")
    models = data_dir / "models"
    target = models / slug
    if source.resolve().is_relative_to(target.resolve()):
        raise ImportProblem(
            f"{source} is inside {target}, which the import replaces: copy it elsewhere first "
            "or import under another --slug"
        )
    if target.exists() and not replace:
        raise ImportProblem(f"{target} exists: pass --replace to import {slug} again")
    try:
        models.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=models, prefix=f".{slug}.import."))
    except OSError as exc:
        raise ImportProblem(f"cannot write to {models}: {exc.strerror or exc}") from None
    try:
        checkpoint = _checkpoint_folder(source, staging / "ct2")
        (staging / "model").mkdir()
        convert(checkpoint, staging / "model" / "model.bin")
        if target.exists():
            os.replace(target, staging / "previous")
        os.replace(staging / "model", target)
    except Ct2FormatError as exc:
        raise ImportProblem(f"{source}: not a CTranslate2 Whisper model: {exc}") from None
    except OSError as exc:
        raise ImportProblem(f"cannot import {source}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    raw: dict[str, Any] = {
        "executor": "whisper",
        "path": str(target.resolve()),
        "options": {"model_file": "model.bin"},
        "description": f"imported from {source.resolve()}",
    }
    entry, problems = entry_from_json(slug, raw, registry_file.parent)
    if entry is None or problems:
        raise ImportProblem("; ".join(problems))
    document: dict[str, Any] = {"models": {}}
    if registry_file.is_file():
        try:
            document = json.loads(registry_file.read_text(encoding="utf-8"))
        except ValueError as exc:
            raise ImportProblem(f"{registry_file} is not JSON: {exc}") from None
    document.setdefault("models", {})[slug] = raw
    tmp = registry_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, registry_file)
    return entry
