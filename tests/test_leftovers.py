"""What a killed server leaves behind, and which of it the next server may remove
(talkies/app/leftovers.py, the engine socket folders of talkies/engines/isolation/spawn.py).

The whole story, with real ``talkies serve`` processes killed with SIGKILL, is the Faults
table's rows ``sigkill-leftovers`` and ``second-server`` (tests/reliability); these are its
rules one by one, in this process. Locks taken through another open file stand for another
server (``flock`` locks belong to open files, so they conflict within one process too).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from talkies.app import leftovers
from talkies.engines.isolation import spawn

TICK = 0.05  # longer than the file system's clock granularity, so change times differ


def _dead(data: Path) -> Path:
    """The lock of a server that was killed: its file stays, nothing holds it."""
    claim = leftovers.claim(data)
    assert claim.fd is not None and claim.path is not None
    os.close(claim.fd)
    return claim.path


def _touch(path: Path, data: bytes = b"x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_alone_every_leftover_goes_and_the_folders_made_for_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    dead = _dead(data)
    partial = _touch(data / "files" / "a" / "b" / ".partial-x1")
    kept_sibling = _touch(data / "files" / "keep" / "song.wav")
    partial_beside = _touch(data / "files" / "keep" / ".partial-x2")
    upload = _touch(data / "tmp" / "upload-x3")
    mcp = _touch(data / "tmp" / "mcp-x4")
    other = _touch(data / "tmp" / "notes.txt")
    staged = _touch(data / "files" / "c.wav")
    time.sleep(TICK)
    mine = leftovers.claim(data)
    try:
        swept = leftovers.sweep(data, mine)
    finally:
        mine.release()
    assert set(swept.removed) == {dead, partial, partial_beside, upload, mcp}
    assert swept.kept == [] and swept.servers == 0
    assert not (data / "files" / "a").exists()  # the folders the killed PUT made
    assert kept_sibling.exists() and other.exists() and staged.exists()
    assert list((data / "run").iterdir()) == []  # released: its own lock is gone too


def test_a_running_server_keeps_what_it_may_own(tmp_path: Path) -> None:
    data = tmp_path / "data"
    older = _touch(data / "files" / ".partial-old")
    older_upload = _touch(data / "tmp" / "upload-old")
    time.sleep(TICK)
    running = leftovers.claim(data)  # another server, running
    time.sleep(TICK)
    newer = _touch(data / "files" / "d" / ".partial-new")
    newer_upload = _touch(data / "tmp" / "upload-new")
    time.sleep(TICK)
    mine = leftovers.claim(data)
    try:
        swept = leftovers.sweep(data, mine)
        assert set(swept.removed) == {older, older_upload}
        assert set(swept.kept) == {newer, newer_upload} and swept.servers == 1
        assert running.path is not None and running.path.exists()
        # Once the other server has ended, a server that starts after it removes them.
        running.release()
        time.sleep(TICK)
        third = leftovers.claim(data)
        try:
            swept = leftovers.sweep(data, third)
        finally:
            third.release()
        assert set(swept.removed) == {newer, newer_upload}
    finally:
        mine.release()
    assert not (data / "files" / "d").exists()


def test_a_file_that_keeps_changing_is_never_stale(tmp_path: Path) -> None:
    """A running server's upload made before another server's start, but written since: its
    change time moved past that start, so it stays."""
    data = tmp_path / "data"
    running = leftovers.claim(data)
    time.sleep(TICK)
    upload = _touch(data / "tmp" / "upload-live")
    mine = leftovers.claim(data)
    try:
        time.sleep(TICK)
        with upload.open("ab") as out:
            out.write(b"more")
        swept = leftovers.sweep(data, mine)
    finally:
        mine.release()
        running.release()
    assert upload.exists() and swept.kept == [upload]


def test_a_lock_before_its_rename_is_left_alone_while_young(tmp_path: Path) -> None:
    data = tmp_path / "data"
    young = _touch(data / "run" / ".new-server-1-abc")
    mine = leftovers.claim(data)
    try:
        swept = leftovers.sweep(data, mine)
    finally:
        mine.release()
    assert young.exists() and swept.removed == []


def test_a_lock_in_another_process_holds_until_it_ends(tmp_path: Path) -> None:
    """Through a real process: its lock holds while it runs and is let go when it is killed."""
    data = tmp_path / "data"
    (data / "run").mkdir(parents=True)
    code = (
        "import sys, time; from pathlib import Path; from talkies.app import leftovers\n"
        "c = leftovers.claim(Path(sys.argv[1])); print(c.path, flush=True); time.sleep(60)"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(data)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        theirs = Path(child.stdout.readline().strip())
        time.sleep(TICK)
        mine = leftovers.claim(data)
        assert leftovers.sweep(data, mine).servers == 1 and theirs.exists()
        child.kill()
        child.wait()
        assert theirs in leftovers.sweep(data, mine).removed
        mine.release()
    finally:
        child.kill()
        child.wait()


def test_a_data_folder_that_cannot_be_written_does_not_stop_the_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = _touch(tmp_path / "data")  # a file where the folder should be
    claim = leftovers.start(data)
    assert claim.path is None
    assert "cannot take this server's lock" in caplog.text
    claim.release()


# -- engine socket folders --------------------------------------------------------------------


def test_an_engine_folder_is_locked_while_in_use_and_removed_with_its_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spawn.tempfile, "tempdir", str(tmp_path))
    folder = spawn._make_folder()
    assert folder.parent == tmp_path and (folder.stat().st_mode & 0o777) == 0o700
    assert [p.name for p in folder.iterdir()] == [spawn.OWNER_LOCK]
    assert spawn.sweep_folders(tmp_path) == []  # in use: kept
    fd = os.open(folder / spawn.OWNER_LOCK, os.O_RDONLY)
    with pytest.raises(BlockingIOError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(fd)
    proc = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE)
    spawn.discard(proc, folder, wait=5)
    assert not folder.exists() and folder not in spawn._owned


def test_the_sweep_removes_only_folders_whose_owner_has_ended(tmp_path: Path) -> None:
    ended = tmp_path / f"{spawn.FOLDER_PREFIX}ended"
    running = tmp_path / f"{spawn.FOLDER_PREFIX}running"
    unlocked = tmp_path / f"{spawn.FOLDER_PREFIX}old-version"
    other = tmp_path / "talkies-something-else"
    for folder in (ended, running, unlocked, other):
        folder.mkdir()
        (folder / "socket").write_bytes(b"")
    for folder in (ended, running, other):
        (folder / spawn.OWNER_LOCK).write_bytes(b"")
    held = os.open(running / spawn.OWNER_LOCK, os.O_RDONLY)
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        assert spawn.sweep_folders(tmp_path) == [ended]
    finally:
        os.close(held)
    assert running.exists() and unlocked.exists() and other.exists()
    assert spawn.sweep_folders(tmp_path) == [running]  # its owner has let go now
