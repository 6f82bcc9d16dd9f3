"""What a killed server leaves behind, removed when a server starts on the same data folder.

A server stopped by ``SIGKILL`` (or the OOM killer, or a power cut) leaves what it was writing:
partial staged files (``files/**/.partial-*``), temporary uploads (``tmp/upload-*``,
``tmp/mcp-*``), and the socket folders of its engine processes (:mod:`talkies.engines.isolation.
spawn`, which sweeps those itself). Nothing else ever removes them.

Two servers may share a data folder (uvicorn workers, replicas on one volume, a rolling
restart), so a server removes only what is provably stale, never what a running server still
writes or reads:

- Every server holds an exclusive ``flock`` on a file of its own, ``run/server-*.lock``, for
  its lifetime. The kernel lets go of it when the process ends, however it ends, so a lock
  that can be taken belongs to a server that has ended (its file is removed). The file is
  locked before it gets its name (made as ``run/.new-*``, renamed), so no server ever sees it
  unlocked while its owner runs.
- A server's files are made after its lock, so their change time (``st_ctime``: set by the
  kernel, never by ``utime``, and never earlier than the file's birth) is no earlier than the
  lock's. A leftover whose change time is earlier than the lock of every running server, this
  one's included, was made before any of them started: no running server can be using it. One
  made later is kept (a running server may own it), until a server starts after all the
  servers that were running then.

Both rest on one clock: file times and the locks' times come from the same system clock, and a
step of that clock backwards past a running server's start could make its new files look older
than it. The cutoff is this server's own start at most, so when it runs alone everything a
killed server left goes at once.
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ..engines.isolation.spawn import sweep_folders
from .files import PARTIAL_PREFIX, remove_empty_folders

__all__ = ["RUN_DIR", "TMP_PREFIXES", "Claim", "Swept", "claim", "start", "sweep"]

log = logging.getLogger("talkies.app")

RUN_DIR = "run"
_LOCK_SUFFIX = ".lock"
_NEW_PREFIX = ".new-"
# A lock file not yet renamed lives for microseconds: one older than this lost its server
# between its creation and its rename.
_NEW_STALE_NS = 60 * 10**9
# The temporary files servers make in tmp/ (app/forms.py: uploads; app/mcp_speech.py: MCP
# audio). Other names there are not a server's and stay.
TMP_PREFIXES = ("upload-", "mcp-")
_OPEN = os.O_CLOEXEC | os.O_NOFOLLOW


@dataclass
class Claim:
    """This server's lock on the data folder, held until :meth:`release`."""

    path: Path | None = None  # None: the data folder could not be written
    fd: int | None = None
    started_ns: int = 0  # the lock's change time: this server's start, on the files' clock

    def release(self) -> None:
        if self.path is not None:
            self.path.unlink(missing_ok=True)
            self.path = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@dataclass
class Swept:
    """What a sweep removed, and what it kept because a running server may own it."""

    removed: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)
    servers: int = 0  # other servers running on the folder


def claim(data_dir: Path) -> Claim:
    """Take this server's lock (``run/server-<pid>-<random>.lock``)."""
    run = data_dir / RUN_DIR
    run.mkdir(parents=True, exist_ok=True)
    name = f"server-{os.getpid()}-{secrets.token_hex(6)}"
    new = run / f"{_NEW_PREFIX}{name}"
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()}\n".encode())
        path = run / f"{name}{_LOCK_SUFFIX}"
        os.rename(new, path)
        return Claim(path, fd, os.fstat(fd).st_ctime_ns)  # after the rename, which sets it
    except BaseException:
        new.unlink(missing_ok=True)
        os.close(fd)
        raise


def _lock_is_free(path: Path) -> tuple[bool, int]:
    """Whether the lock file's server has ended (and then it is removed), and its change
    time; (False, 0) if it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | _OPEN)
    except OSError:
        return False, 0
    try:
        changed = os.fstat(fd).st_ctime_ns
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False, changed
        path.unlink(missing_ok=True)  # under the lock: no server holds it, none will
        return True, changed
    finally:
        os.close(fd)


def sweep(data_dir: Path, mine: Claim) -> Swept:
    """Remove what ended servers left in ``data_dir`` (see the module's notes)."""
    swept = Swept()
    cutoff = mine.started_ns
    run = data_dir / RUN_DIR
    for path in sorted(run.iterdir()):
        if path == mine.path:
            continue
        if path.name.endswith(_LOCK_SUFFIX):
            free, changed = _lock_is_free(path)
            if free:
                swept.removed.append(path)
            elif changed:
                swept.servers += 1
                cutoff = min(cutoff, changed)
        elif (
            path.name.startswith(_NEW_PREFIX)
            and _older(path, mine, _NEW_STALE_NS)
            and _lock_is_free(path)[0]
        ):
            swept.removed.append(path)
    files = data_dir / "files"
    for folder, _dirs, names in os.walk(files):  # links to folders are not followed
        for name in names:
            if name.startswith(PARTIAL_PREFIX):
                path = Path(folder, name)
                if _remove_if_older(path, cutoff, swept):
                    relative = path.relative_to(files).as_posix()
                    remove_empty_folders(files, relative)  # those its PUT made
    tmp = data_dir / "tmp"
    if tmp.is_dir():
        for path in sorted(tmp.iterdir()):
            if path.name.startswith(TMP_PREFIXES):
                _remove_if_older(path, cutoff, swept)
    return swept


def _older(path: Path, mine: Claim, by_ns: int) -> bool:
    try:
        return path.lstat().st_ctime_ns < mine.started_ns - by_ns
    except OSError:
        return False


def _remove_if_older(path: Path, cutoff: int, swept: Swept) -> bool:
    """Remove the regular file ``path`` if it last changed before ``cutoff``."""
    try:
        st = path.lstat()
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode):
        return False
    if st.st_ctime_ns >= cutoff:
        swept.kept.append(path)
        return False
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    swept.removed.append(path)
    return True


def start(data_dir: Path) -> Claim:
    """At a server's start: take its lock, remove what ended servers left in the data folder
    and the socket folders of their engine processes, and log what was removed or kept.
    Never fails the start: a data folder that cannot be written is logged and left alone."""
    engine_folders = sweep_folders()
    try:
        mine = claim(data_dir)
        swept = sweep(data_dir, mine)
    except OSError as exc:
        log.warning(
            "left the data folder as it is: cannot take this server's lock in it",
            extra={"path": str(data_dir / RUN_DIR), "error": str(exc)},
        )
        mine, swept = Claim(), Swept()
    run, tmp = data_dir / RUN_DIR, data_dir / "tmp"
    if swept.removed or engine_folders:
        log.info(
            "removed what stopped servers left",
            extra={
                "partial_files": sum(p.parent not in (run, tmp) for p in swept.removed),
                "temporary_files": sum(p.parent == tmp for p in swept.removed),
                "server_locks": sum(p.parent == run for p in swept.removed),
                "engine_folders": len(engine_folders),
            },
        )
    if swept.kept:
        log.info(
            "kept leftovers another running server may own",
            extra={"files": len(swept.kept), "servers": swept.servers},
        )
    return mine
