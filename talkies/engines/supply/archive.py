"""Unpacking a downloaded model archive (zip, or tar: plain, gz, bz2, xz) into one folder.

Every member is checked before anything is written, and the whole archive is refused (an
:class:`ArchiveError`) if any member could land outside the folder or is not a plain file or
folder: absolute names, ``..`` components, device files, FIFOs, encrypted zip members. Links
are never created on disk: a symbolic or hard link whose target is a regular file of the same
archive becomes a copy of that file, and any other link (pointing out of the folder, at a
folder, at another link or at nothing) is refused. Nothing therefore writes through a link.

When every member sits under one top-level folder (``vosk-model-small-en-us-0.15/...``), that
folder is stripped, so the destination is the model's root, as for a Hub snapshot.

Sizes are bounded twice: by the sizes the archive declares, before writing, and by the bytes
actually written, since a zip's declared sizes are not to be trusted.
"""

from __future__ import annotations

import lzma
import re
import stat
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

__all__ = ["MAX_MEMBERS", "MAX_UNPACKED_BYTES", "ArchiveError", "extract"]

# Far above any speech model (Vosk's largest English model unpacks to about 3 GB); a bound
# on what a wrong or hostile pin can make us write.
MAX_UNPACKED_BYTES = 64 << 30
MAX_MEMBERS = 100_000
_CHUNK = 1 << 20
_MAX_LINK_TARGET = 4096
_DRIVE = re.compile(r"[A-Za-z]:")


class ArchiveError(ValueError):
    """The archive is corrupt, truncated, of an unknown format, or has a member that may not
    be unpacked; the message names the member."""


@dataclass(frozen=True, slots=True)
class _Member:
    name: str  # as stored, for messages
    parts: tuple[str, ...]  # the checked relative path, before stripping
    kind: str  # "file", "dir" or "link"
    size: int
    # A link's target as a checked path from the archive root, or None when it escapes.
    target: tuple[str, ...] | None = None
    open: Callable[[], IO[bytes]] | None = None


def _parts(name: str) -> tuple[str, ...]:
    """The components of a member name, refusing what could leave the destination."""
    if "\x00" in name:
        raise ArchiveError(f"member {name!r} has a NUL in its name")
    # Backslashes count as separators here: harmless on POSIX, but a name that means ".." on
    # another system is refused everywhere.
    unified = name.replace("\\", "/")
    if unified.startswith("/") or _DRIVE.match(unified):
        raise ArchiveError(f"member {name!r} has an absolute path")
    parts = tuple(p for p in unified.split("/") if p not in ("", "."))
    if ".." in parts:
        raise ArchiveError(f"member {name!r} has a '..' component")
    return parts


def _link_target(link: tuple[str, ...], target: str, *, symbolic: bool) -> tuple[str, ...] | None:
    """Where a link points, as a path from the archive root; None if outside it."""
    unified = target.replace("\\", "/")
    if not unified or unified.startswith("/") or _DRIVE.match(unified):
        return None
    # A symbolic link is relative to its own folder, a tar hard link to the archive root.
    out = list(link[:-1]) if symbolic else []
    for part in unified.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
        else:
            out.append(part)
    return tuple(out) or None


def _zip_members(archive: zipfile.ZipFile) -> Iterator[_Member]:
    for info in archive.infolist():
        parts = _parts(info.filename)
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if info.flag_bits & 0x1:
            raise ArchiveError(f"member {info.filename!r} is encrypted")
        if info.create_system == 3 and kind not in (0, stat.S_IFREG, stat.S_IFDIR, stat.S_IFLNK):
            raise ArchiveError(f"member {info.filename!r} is a device, FIFO or socket")
        if info.create_system == 3 and kind == stat.S_IFLNK:
            if info.file_size > _MAX_LINK_TARGET:
                raise ArchiveError(f"member {info.filename!r} is a link with a huge target")
            target = archive.read(info).decode("utf-8", "surrogateescape")
            yield _Member(
                info.filename, parts, "link", 0, _link_target(parts, target, symbolic=True)
            )
        elif info.is_dir():
            yield _Member(info.filename, parts, "dir", 0)
        else:
            opener = _zip_opener(archive, info)
            yield _Member(info.filename, parts, "file", info.file_size, open=opener)


def _zip_opener(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Callable[[], IO[bytes]]:
    return lambda: archive.open(info)


def _tar_members(archive: tarfile.TarFile) -> Iterator[_Member]:
    for info in archive.getmembers():
        parts = _parts(info.name)
        if info.isreg():
            yield _Member(info.name, parts, "file", info.size, open=_tar_opener(archive, info))
        elif info.isdir():
            yield _Member(info.name, parts, "dir", 0)
        elif info.issym() or info.islnk():
            target = _link_target(parts, info.linkname, symbolic=info.issym())
            yield _Member(info.name, parts, "link", 0, target)
        else:
            raise ArchiveError(f"member {info.name!r} is a device, FIFO or other special file")


def _tar_opener(archive: tarfile.TarFile, info: tarfile.TarInfo) -> Callable[[], IO[bytes]]:
    def opener() -> IO[bytes]:
        stream = archive.extractfile(info)
        if stream is None:  # only for non-files, which never get here
            raise ArchiveError(f"member {info.name!r} cannot be read")
        return stream

    return opener


@contextmanager
def _members(path: Path) -> Iterator[list[_Member]]:
    """The archive's members, checked, while the archive is open."""
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as zipped:
            yield list(_zip_members(zipped))
    elif tarfile.is_tarfile(path):
        with tarfile.open(path, "r:*") as tarred:
            yield list(_tar_members(tarred))
    else:
        raise ArchiveError("it is neither a zip nor a tar archive (or it is truncated)")


def _strip_top(members: list[_Member]) -> list[_Member]:
    """Drop a single top-level folder that holds everything."""
    tops = {m.parts[0] for m in members if m.parts}
    if len(tops) != 1 or any(len(m.parts) == 1 and m.kind != "dir" for m in members):
        return members
    if not any(len(m.parts) > 1 for m in members):
        return members  # one empty folder: nothing to strip into
    (top,) = tops
    out = []
    for m in members:
        if len(m.parts) <= 1:
            continue  # the top folder's own entry
        target = m.target
        if target is not None:
            # A target outside the top folder is no member: refused by _check.
            target = target[1:] if len(target) > 1 and target[0] == top else None
        out.append(_Member(m.name, m.parts[1:], m.kind, m.size, target, m.open))
    return out


def _check(members: list[_Member], max_bytes: int, max_members: int) -> None:
    if len(members) > max_members:
        raise ArchiveError(f"it has {len(members)} members, more than {max_members}")
    declared = sum(m.size for m in members)
    if declared > max_bytes:
        raise ArchiveError(f"it unpacks to {declared} bytes, more than {max_bytes}")
    files = {m.parts: m for m in members if m.kind == "file"}
    written: set[tuple[str, ...]] = set()
    for m in members:
        if not m.parts:
            if m.kind == "dir":
                continue
            raise ArchiveError(f"member {m.name!r} has no name")
        if m.kind != "dir":
            if m.parts in written:
                raise ArchiveError(f"member {m.name!r} appears twice")
            written.add(m.parts)
        if m.kind == "link" and (m.target is None or m.target not in files):
            raise ArchiveError(
                f"member {m.name!r} is a link that does not point at a file in the archive"
            )
    for m in members:
        for i in range(1, len(m.parts)):
            if m.parts[:i] in written:
                raise ArchiveError(f"member {m.name!r} is inside a file or link")


def _copy(source: IO[bytes], dest: Path, budget: list[int], name: str) -> None:
    with dest.open("xb") as out:  # "x": never follow or replace anything already there
        while chunk := source.read(_CHUNK):
            budget[0] -= len(chunk)
            if budget[0] < 0:
                raise ArchiveError(f"member {name!r} unpacks to more than it declares")
            out.write(chunk)


def extract(
    archive: Path,
    dest: Path,
    *,
    max_bytes: int | None = None,
    max_members: int | None = None,
) -> None:
    """Unpack ``archive`` into ``dest`` (created; it must not exist). On an error ``dest`` may
    hold part of the archive: the caller unpacks into a staging folder it removes."""
    limit = MAX_UNPACKED_BYTES if max_bytes is None else max_bytes
    count = MAX_MEMBERS if max_members is None else max_members
    try:
        with _members(archive) as found:
            members = _strip_top(found)
            _check(members, limit, count)
            dest.mkdir()
            budget = [limit]
            for m in members:
                path = dest.joinpath(*m.parts)
                if m.kind == "dir":
                    path.mkdir(parents=True, exist_ok=True)
                elif m.kind == "file":
                    assert m.open is not None
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with m.open() as source:
                        _copy(source, path, budget, m.name)
            # Links last, as copies: their targets may come later in the archive.
            for m in members:
                if m.kind == "link":
                    assert m.target is not None
                    path = dest.joinpath(*m.parts)
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with dest.joinpath(*m.target).open("rb") as source:
                        _copy(source, path, budget, m.name)
    except ArchiveError:
        raise
    except (
        tarfile.TarError,
        zipfile.BadZipFile,
        EOFError,
        zlib.error,
        lzma.LZMAError,
        RuntimeError,
    ) as exc:
        # Truncated or corrupt data (bz2's errors are OSErrors, below), or an encrypted member
        # that zipfile found only on reading (RuntimeError).
        raise ArchiveError(f"it is corrupt or truncated ({type(exc).__name__}: {exc})") from exc
    except NotImplementedError as exc:
        raise ArchiveError(f"it uses an unsupported format ({exc})") from exc
    except OSError as exc:
        raise ArchiveError(f"it cannot be unpacked ({type(exc).__name__}: {exc})") from exc
