"""The staged-file store (talkies/app/files.py) on its own: a read served from the one file it
opened, PUTs under a file's name, and the folders a DELETE or a failed PUT leaves empty.

Over HTTP, on both hosts, these are the hostile-input rows ``files-get-during-put``,
``files-under-a-file`` and ``files-delete-folders`` (tests/reliability).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import anyio
import pytest

from talkies.app import files as files_module
from talkies.app.files import FileStore, StagedRead
from talkies.app.http import Body, HttpError, PayloadTooLarge


def _body(chunks: Iterable[bytes], limit: int = 1 << 20) -> Body:
    pending = [*chunks, b""]

    async def receive() -> bytes:
        return pending.pop(0)

    return Body(receive, limit=limit, declared=None)


async def _read_all(staged: StagedRead) -> bytes:
    try:
        return b"".join([chunk async for chunk in staged])
    finally:
        await staged.aclose()


def test_a_read_serves_the_file_it_opened(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "files")

    async def main() -> None:
        await store.put("a.wav", _body([b"old" * 100]))
        staged = await store.read("a.wav")
        await store.put("a.wav", _body([b"NEW!" * 1000]))  # renamed into place meanwhile
        assert staged.size == 300 and await _read_all(staged) == b"old" * 100
        staged = await store.read("a.wav")
        await store.delete("a.wav")
        assert await _read_all(staged) == b"NEW!" * 1000

    anyio.run(main)


def test_a_file_cut_in_place_ends_the_body_with_an_error(tmp_path: Path) -> None:
    """Behind the server's back: the body stops short with an error (the host then cuts the
    response), never a complete-looking one of the length first declared."""
    store = FileStore(tmp_path / "files")

    async def main() -> None:
        await store.put("a.wav", _body([b"x" * 1000]))
        staged = await store.read("a.wav")
        os.truncate(tmp_path / "files" / "a.wav", 10)
        with pytest.raises(OSError, match="990 bytes early"):
            await _read_all(staged)

    anyio.run(main)


@pytest.mark.parametrize("path", ["nope.wav", "dir", ".partial-x"])
def test_a_read_of_no_file_is_404(tmp_path: Path, path: str) -> None:
    store = FileStore(tmp_path / "files")
    (tmp_path / "files" / "dir").mkdir(parents=True)

    async def main() -> None:
        with pytest.raises(HttpError) as caught:
            await store.read(path)
        assert caught.value.status in (400, 404)

    anyio.run(main)


def test_a_fifo_is_not_a_staged_file(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "files")
    store.root.mkdir()
    os.mkfifo(store.root / "pipe.wav")

    async def main() -> None:
        with anyio.fail_after(5), pytest.raises(HttpError) as caught:  # opening never blocks
            await store.read("pipe.wav")
        assert caught.value.status == 404

    anyio.run(main)


@pytest.mark.parametrize("path", ["a.wav/b.wav", "a.wav/x/b.wav"])
def test_a_put_under_a_file_is_409(tmp_path: Path, path: str) -> None:
    store = FileStore(tmp_path / "files")

    async def main() -> None:
        await store.put("a.wav", _body([b"RIFF"]))
        with pytest.raises(HttpError) as caught:
            await store.put(path, _body([b"RIFFdata"]))
        assert caught.value.status == 409 and caught.value.param == "path"
        assert "'a.wav' is a file" in caught.value.message

    anyio.run(main)
    assert sorted(p.name for p in store.root.rglob("*")) == ["a.wav"]


def test_a_delete_removes_the_folders_it_leaves_empty(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "files")

    async def main() -> None:
        await store.put("a/b/c/one.wav", _body([b"1"]))
        await store.put("a/two.wav", _body([b"2"]))
        await store.delete("a/b/c/one.wav")
        assert sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*")) == [
            "a",
            "a/two.wav",
        ]
        await store.delete("a/two.wav")
        assert list(store.root.iterdir()) == []  # the files folder itself stays

    anyio.run(main)


def test_a_delete_through_a_link_leaves_the_link(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "files")
    (store.root / "real").mkdir(parents=True)
    (store.root / "link").symlink_to(store.root / "real", target_is_directory=True)

    async def main() -> None:
        await store.put("link/a.wav", _body([b"1"]))
        await store.delete("link/a.wav")

    anyio.run(main)
    assert (store.root / "link").is_symlink() and (store.root / "real").is_dir()


def test_a_failed_put_leaves_neither_file_nor_folders(tmp_path: Path) -> None:
    store = FileStore(tmp_path / "files")
    store.root.mkdir()

    async def main() -> None:
        with pytest.raises(PayloadTooLarge):
            await store.put("p/q/r.wav", _body([b"x" * 600, b"x" * 600], limit=1000))

    anyio.run(main)
    assert list(store.root.iterdir()) == []


def test_a_put_makes_its_folders_again_when_a_delete_removed_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DELETE of the folder's last file between a PUT's making the folder and its partial
    file: the PUT makes the folder again."""
    store = FileStore(tmp_path / "files")
    real_mkstemp = files_module.tempfile.mkstemp
    calls = []

    def racing_mkstemp(*, dir: Path, prefix: str) -> tuple[int, str]:
        calls.append(dir)
        if len(calls) == 1:
            os.rmdir(dir)  # as remove_empty_folders after a DELETE would
        return real_mkstemp(dir=dir, prefix=prefix)

    monkeypatch.setattr(files_module.tempfile, "mkstemp", racing_mkstemp)

    async def main() -> None:
        await store.put("f/a.wav", _body([b"RIFF"]))

    anyio.run(main)
    assert len(calls) == 2 and (store.root / "f" / "a.wav").read_bytes() == b"RIFF"
