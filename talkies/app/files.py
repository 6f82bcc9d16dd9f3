"""Staged files: audio kept on the server under ``<data_dir>/files`` for later requests.

The spec's native engines take "uploaded or staged audio": a file staged once with
``PUT /v1/files/{path}`` can be transcribed many times by ``file_path`` (HTTP and MCP)
without being uploaded again.

A path is relative, made of 1-255-byte components of printable characters, at most 1024
bytes in all, with no ``..``, no empty or ``.`` components, no NUL and no backslash; and
once resolved (symlinks followed) it must still lie inside the files folder. Anything else is
a 400, before the file system is touched. A file appears only once completely written
(written beside its target, renamed into place).

A GET serves the file it opened, from that one descriptor: a PUT that renames a new file into
place meanwhile, or a DELETE, leaves the response whole (the old file, its own length). A
DELETE, and a PUT that fails, remove the folders they leave empty; a PUT under a name that is
a file (``a.wav/b.wav`` when ``a.wav`` is one) is a 409. Partial files a killed server left are
removed when the next one starts (:mod:`.leftovers`).
"""

from __future__ import annotations

import errno
import io
import os
import stat
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
import anyio.to_thread

from .http import Body, HttpError

__all__ = ["PARTIAL_PREFIX", "FileStore", "StagedRead", "remove_empty_folders"]

_MAX_PATH_BYTES = 1024
_MAX_COMPONENT_BYTES = 255
PARTIAL_PREFIX = ".partial-"
_CHUNK = 262144
# How often a PUT makes its folders again when a DELETE removed them (empty) in between.
_FOLDER_TRIES = 8


class FileStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    # -- paths -------------------------------------------------------------------------------

    def relative(self, raw: str, *, decoded: bool = False) -> str:
        """The normalized relative path of ``raw`` (percent-decoded unless ``decoded``)."""
        try:
            text = raw if decoded else unquote(raw, errors="strict")
        except UnicodeDecodeError:
            raise HttpError(400, "invalid file path: not UTF-8", param="path") from None
        problem = _path_problem(text)
        if problem:
            raise HttpError(400, f"invalid file path: {problem}", param="path")
        return text

    def resolve(self, relative: str) -> Path:
        """The file's absolute path, after checking that symlinks do not lead out."""
        root = self.root.resolve()
        target = (root / relative).resolve()
        if target != root and root not in target.parents:
            raise HttpError(400, "invalid file path: it leads outside the files folder")
        return target

    # -- operations --------------------------------------------------------------------------

    async def put(self, raw: str, body: Body) -> dict[str, Any]:
        relative = self.relative(raw)
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.resolve(relative)
        if target.is_dir():
            raise HttpError(409, f"{relative!r} is a folder", param="path")
        self._refuse_file_in_path(relative)
        with anyio.CancelScope(shield=True):  # a cancel lands below, where the file is removed
            handle, partial = await anyio.to_thread.run_sync(self._create_partial, relative)
        try:
            with os.fdopen(handle, "wb") as out:
                async for chunk in body.chunks():
                    await anyio.to_thread.run_sync(out.write, chunk)
            try:
                os.replace(partial, target)
            except IsADirectoryError:  # a folder was made there meanwhile
                raise HttpError(409, f"{relative!r} is a folder", param="path") from None
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            remove_empty_folders(self.root, relative)  # those made for it, if empty now
            raise
        return self._describe(relative, target)

    def _create_partial(self, relative: str) -> tuple[int, str]:
        """The folders of ``relative`` and an open partial file in the last one. A DELETE may
        remove a folder this just made (it was empty): then it is made again."""
        for _ in range(_FOLDER_TRIES):
            target = self.resolve(relative)  # the folders made here may not lead out either
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                target = self.resolve(relative)
                return tempfile.mkstemp(dir=target.parent, prefix=PARTIAL_PREFIX)
            except (FileNotFoundError, FileExistsError, NotADirectoryError):
                # A file where a folder goes is a 409; one removed since, a try again.
                self._refuse_file_in_path(relative)
        raise HttpError(409, f"the folders of {relative!r} keep being removed", param="path")

    def _refuse_file_in_path(self, relative: str) -> None:
        """409 if a folder ``relative`` needs is a file (``a.wav/b.wav`` with ``a.wav`` one)."""
        parts = relative.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            folder = "/".join(parts[:depth])
            path = self.root / folder
            if path.exists() and not path.is_dir():
                raise HttpError(
                    409,
                    f"{folder!r} is a file, so {relative!r} cannot be staged under it",
                    param="path",
                )

    async def read(self, raw: str) -> StagedRead:
        """The staged file, opened once: its length and content are those of the file that
        was there when it was opened, whatever is put or deleted at its path meanwhile."""
        relative = self.relative(raw)
        target = self.resolve(relative)
        return await anyio.to_thread.run_sync(_open_staged, target, relative)

    def open(self, raw: str) -> tuple[Path, int]:
        """The file and its size; 404 if there is none."""
        relative = self.relative(raw)
        target = self.resolve(relative)
        if not target.is_file() or target.name.startswith(PARTIAL_PREFIX):
            raise HttpError(404, f"no staged file {relative!r}", code="file_not_found")
        return target, target.stat().st_size

    def path_for_request(self, raw: str) -> Path:
        """A staged file named in a request field (already decoded): 400 or 404 if not."""
        relative = self.relative(raw, decoded=True)
        target = self.resolve(relative)
        if not target.is_file():
            raise HttpError(404, f"no staged file {relative!r}", param="file_path")
        return target

    async def delete(self, raw: str) -> dict[str, Any]:
        target, _ = self.open(raw)
        relative = self.relative(raw)

        def remove() -> None:
            target.unlink()
            remove_empty_folders(self.root, relative)

        try:
            await anyio.to_thread.run_sync(remove)
        except FileNotFoundError:  # deleted meanwhile
            raise HttpError(404, f"no staged file {relative!r}", code="file_not_found") from None
        return {"id": relative, "object": "file", "deleted": True}

    async def listing(self) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(self._listing)

    def _listing(self) -> list[dict[str, Any]]:
        if not self.root.is_dir():
            return []
        rows = []
        root = self.root.resolve()
        for path in sorted(self.root.rglob("*")):
            # A link to a file outside the folder is not a staged file (open() refuses it):
            # listing it would tell its name, size and time to any client.
            if (
                path.is_file()
                and not path.name.startswith(PARTIAL_PREFIX)
                and root in path.resolve().parents
            ):
                relative = path.relative_to(self.root).as_posix()
                rows.append(self._describe(relative, path))
        return rows

    @staticmethod
    def _describe(relative: str, path: Path) -> dict[str, Any]:
        st = path.stat()
        return {
            "id": relative,
            "object": "file",
            "bytes": st.st_size,
            "created_at": int(st.st_mtime),
            "filename": path.name,
        }


class StagedRead:
    """An open staged file as a response body: chunks of exactly :attr:`size` bytes, read from
    the one descriptor opened (never the path again), closed by :meth:`aclose` (every host
    calls it, however the response ends). A file that is shorter than it was when opened
    (changed in place, behind the server's back) ends the body early with an error, so the
    host cuts the response short rather than send a complete-looking one."""

    def __init__(self, handle: io.FileIO, size: int, *, chunk_size: int = _CHUNK) -> None:
        self._handle = handle
        self.size = size
        self._left = size
        self._chunk_size = chunk_size

    def __aiter__(self) -> StagedRead:
        return self

    async def __anext__(self) -> bytes:
        if self._left <= 0:
            raise StopAsyncIteration
        chunk = await anyio.to_thread.run_sync(self._handle.read, min(self._chunk_size, self._left))
        if not chunk:
            raise OSError(errno.EIO, f"the file ended {self._left} bytes early")
        self._left -= len(chunk)
        return chunk

    async def aclose(self) -> None:
        self._handle.close()


def _open_staged(target: Path, relative: str) -> StagedRead:
    missing = HttpError(404, f"no staged file {relative!r}", code="file_not_found")
    if target.name.startswith(PARTIAL_PREFIX):
        raise missing
    # O_NOFOLLOW: the path is already resolved, so a link here now was swapped in since;
    # O_NONBLOCK: opening a FIFO someone made there must not block (regular files ignore it).
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(target, flags)
    except OSError:
        raise missing from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise missing
        handle = io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise
    return StagedRead(handle, st.st_size)


def remove_empty_folders(root: Path, relative: str) -> None:
    """Remove the folders of the staged path ``relative`` that are now empty, deepest first,
    up to (not including) ``root``. Along the path as named: a link is never followed (its
    ``rmdir`` fails), and a folder that holds anything stays, with those above it."""
    parts = relative.split("/")[:-1]
    for depth in range(len(parts), 0, -1):
        try:
            os.rmdir(root / "/".join(parts[:depth]))
        except OSError:
            return


def _path_problem(text: str) -> str | None:
    if not text:
        return "empty"
    if "\0" in text:
        return "contains NUL"
    if "\\" in text:
        return "contains a backslash"
    if text.startswith("/"):
        return "absolute"
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        return "contains control characters"
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) > _MAX_PATH_BYTES:
        return f"longer than {_MAX_PATH_BYTES} bytes"
    for part in text.split("/"):
        if part in ("", ".", ".."):
            return f"has a {part!r} component" if part else "has an empty component"
        if len(part.encode("utf-8", "surrogatepass")) > _MAX_COMPONENT_BYTES:
            return f"a component is longer than {_MAX_COMPONENT_BYTES} bytes"
        if part.startswith(PARTIAL_PREFIX):
            return "reserved name"
    return None
