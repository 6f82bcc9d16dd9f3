"""Staged files: audio kept on the server under ``<data_dir>/files`` for later requests.

The spec's native engines take "uploaded or staged audio": a file staged once with
``PUT /v1/files/{path}`` can be transcribed many times by ``file_path`` (HTTP and MCP)
without being uploaded again.

A path is relative, made of 1-255-byte components of printable characters, at most 1024
bytes in all, with no ``..``, no empty or ``.`` components, no NUL and no backslash; and
once resolved (symlinks followed) it must still lie inside the files folder. Anything else is
a 400, before the file system is touched. A file appears only once completely written
(written beside its target, renamed into place).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
import anyio.to_thread

from .http import Body, HttpError

__all__ = ["FileStore"]

_MAX_PATH_BYTES = 1024
_MAX_COMPONENT_BYTES = 255
_PARTIAL_PREFIX = ".partial-"


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
        await anyio.to_thread.run_sync(lambda: target.parent.mkdir(parents=True, exist_ok=True))
        target = self.resolve(relative)  # the folders just made may not lead out either
        handle, partial = tempfile.mkstemp(dir=target.parent, prefix=_PARTIAL_PREFIX)
        try:
            with os.fdopen(handle, "wb") as out:
                async for chunk in body.chunks():
                    await anyio.to_thread.run_sync(out.write, chunk)
            os.replace(partial, target)
        finally:
            Path(partial).unlink(missing_ok=True)
        return self._describe(relative, target)

    def open(self, raw: str) -> tuple[Path, int]:
        """The file and its size; 404 if there is none."""
        relative = self.relative(raw)
        target = self.resolve(relative)
        if not target.is_file() or target.name.startswith(_PARTIAL_PREFIX):
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
        await anyio.to_thread.run_sync(target.unlink)
        return {"id": self.relative(raw), "object": "file", "deleted": True}

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
                and not path.name.startswith(_PARTIAL_PREFIX)
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


async def file_chunks(path: Path, *, chunk_size: int = 262144) -> AsyncIterator[bytes]:
    """A file's content chunk by chunk, read in worker threads."""
    async with await anyio.open_file(path, "rb") as handle:
        while chunk := await handle.read(chunk_size):
            yield chunk


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
        if part.startswith(_PARTIAL_PREFIX):
            return "reserved name"
    return None
