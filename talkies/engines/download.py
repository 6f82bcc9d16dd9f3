"""Model files: a local ``path``, or a pinned Hugging Face snapshot under the data directory."""

from __future__ import annotations

import logging
from pathlib import Path

from .registry import ModelEntry

__all__ = ["DownloadError", "ensure_snapshot", "is_downloaded", "snapshot_path"]

log = logging.getLogger("talkies.engines")

# Written after a complete download: the revision the folder holds.
_MARKER = ".talkies-revision"


class DownloadError(RuntimeError):
    """The model's files could not be had; the message names the slug and the cause."""


def snapshot_path(entry: ModelEntry, data_dir: Path) -> Path:
    """Where the model's files are (or will be, for a repo entry)."""
    if entry.path is not None:
        return entry.path
    return data_dir / "models" / entry.slug


def is_downloaded(entry: ModelEntry, data_dir: Path) -> bool:
    if entry.path is not None:
        return entry.path.is_dir()
    marker = snapshot_path(entry, data_dir) / _MARKER
    try:
        return marker.read_text(encoding="utf-8").strip() == entry.revision
    except OSError:
        return False


def ensure_snapshot(
    entry: ModelEntry,
    data_dir: Path,
    *,
    local_files_only: bool = False,
    progress: bool = False,
) -> Path:
    """The model's directory, downloading the pinned revision first if needed (blocking).

    ``huggingface_hub.snapshot_download`` fetches only ``allow_patterns`` at the immutable
    ``revision`` into ``<data_dir>/models/<slug>``. With ``local_files_only`` (or
    ``HF_HUB_OFFLINE=1``) it only accepts what is already there.
    """
    if entry.path is not None:
        if not entry.path.is_dir():
            raise DownloadError(f"model {entry.slug!r}: {str(entry.path)!r} is not a directory")
        return entry.path
    target = snapshot_path(entry, data_dir)
    if is_downloaded(entry, data_dir):
        return target
    assert entry.repo is not None and entry.revision is not None
    from huggingface_hub import snapshot_download
    from huggingface_hub import utils as hf_utils

    target.mkdir(parents=True, exist_ok=True)
    log.info(
        "downloading model",
        extra={"model": entry.slug, "repo": entry.repo, "revision": entry.revision},
    )
    if progress:
        hf_utils.enable_progress_bars()  # type: ignore[attr-defined]
    else:
        hf_utils.disable_progress_bars()  # type: ignore[attr-defined]
    try:
        path = snapshot_download(
            repo_id=entry.repo,
            revision=entry.revision,
            allow_patterns=list(entry.allow_patterns) if entry.allow_patterns else None,
            local_dir=target,
            local_files_only=local_files_only,
        )
    except Exception as exc:  # network, auth, missing revision, offline mode: all one outcome
        raise DownloadError(
            f"model {entry.slug!r}: could not fetch {entry.repo}@{entry.revision[:12]}: {exc}"
        ) from exc
    (Path(path) / _MARKER).write_text(entry.revision + "\n", encoding="utf-8")
    return Path(path)
