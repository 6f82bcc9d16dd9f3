"""Starting and stopping an engine process (:mod:`talkies.engines.isolation`).

:func:`spawn` starts ``python -m talkies.engines.isolation.child``, hands it the request on
stdin, copies its stderr to ours as it comes, and waits for its one ready line on stdout;
:func:`stop` closes its stdin (it frees its model and exits) and kills it after a grace.

Each child's socket is in a private folder, ``<temp dir>/talkies-engine-*``, removed when the
child is discarded. A server killed with ``SIGKILL`` cannot remove its folders, so each holds
an exclusive ``flock`` on its folder's ``owner.lock`` for as long as the folder is in use (the
file is locked before it gets that name, so it is never seen unlocked while in use), and
:func:`sweep_folders`, run when a server starts, removes every such folder whose lock it can
take: the kernel let go of it when its server ended. Folders without that file (from a Talkies
before it, or a few microseconds old) are left alone. The lock is held by the server, not the
engine process: with its server gone, a child has no one to serve (it ends at its stdin's end).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base import EngineUnavailable
from ..supply.entry import ModelEntry
from ..supply.validate import entry_json
from .wire import HELLO

__all__ = [
    "CLOSE_WAIT",
    "FOLDER_PREFIX",
    "OWNER_LOCK",
    "Spawned",
    "describe_exit",
    "discard",
    "spawn",
    "stop",
    "sweep_folders",
]

CLOSE_WAIT = 10.0  # seconds a closed child has to free its model before it is killed
FOLDER_PREFIX = "talkies-engine-"
OWNER_LOCK = "owner.lock"

# The owner locks this process holds, by folder (released by discard()).
_owned: dict[Path, int] = {}
_owned_guard = threading.Lock()


def describe_exit(status: int | None) -> str:
    if status is None:
        return "stopped answering"
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


@dataclass(frozen=True, slots=True)
class Spawned:
    """An engine process that said it is ready, and how to reach it."""

    slug: str
    proc: subprocess.Popen[bytes]
    folder: Path  # private (0700), holding the socket
    address: str
    key: bytes  # the connections' authkey


def spawn(
    entry: ModelEntry, root: Path, device: str, extra: dict[str, Any], timeout: float
) -> tuple[Spawned, dict[str, Any]]:
    """Start the child, send it the request, wait for its ready line: the child and what it
    said of the model."""
    folder = _make_folder()
    address = str(folder / "socket")
    key = os.urandom(32)
    request = {
        "slug": entry.slug,
        "entry": entry_json(entry, root),
        "root": str(root),
        "device": device,
        "address": address,
        "key": key.hex(),
        "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
        **extra,
    }
    proc = subprocess.Popen(
        # The slug only names the process for ps and top; the request says what to load.
        [sys.executable, "-m", "talkies.engines.isolation.child", entry.slug],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        close_fds=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    tail, copier = _pass_stderr(proc)
    try:
        with contextlib.suppress(BrokenPipeError):  # it ended at once: the hello says how
            proc.stdin.write(json.dumps(request).encode() + b"\n")
            proc.stdin.flush()
        hello = _read_hello(proc, timeout)
    except EngineUnavailable as exc:
        discard(proc, folder, wait=0.0)
        copier.join(1.0)  # its stderr, to the end, for the message
        last = tail[-1][:300] if tail else "no output"
        raise EngineUnavailable(f"model {entry.slug!r} {exc}: {last}") from None
    except BaseException:
        discard(proc, folder, wait=0.0)
        raise
    if not hello.get("ok"):
        discard(proc, folder, wait=CLOSE_WAIT)
        raise EngineUnavailable(f"model {entry.slug!r} could not be loaded: {hello.get('error')}")
    return Spawned(entry.slug, proc, folder, address, key), hello


def _pass_stderr(proc: subprocess.Popen[bytes]) -> tuple[deque[str], threading.Thread]:
    """Copy the child's stderr (its JSON log lines, a native library's messages) to ours, as
    it comes, in a thread that ends with it; the last lines are kept for the message of a
    failed load."""
    tail: deque[str] = deque(maxlen=5)
    stream = proc.stderr
    assert stream is not None

    def copy() -> None:
        out = sys.stderr
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip()
            if line:
                tail.append(line)
            with contextlib.suppress(Exception):
                out.write(line + "\n")
                out.flush()
        stream.close()

    copier = threading.Thread(target=copy, name="talkies-engine-stderr", daemon=True)
    copier.start()
    return tail, copier


def _read_hello(proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """The child's ready line (other output of a native library is skipped)."""
    result: dict[str, Any] = {}
    stdout = proc.stdout
    assert stdout is not None

    def read() -> None:
        for raw in stdout:
            line = raw.decode("utf-8", "replace")
            if line.startswith(HELLO):
                result.update(json.loads(line[len(HELLO) :]))
                return

    reader = threading.Thread(target=read, name="talkies-engine-hello", daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        raise EngineUnavailable(f"did not load within {timeout:g} s")
    if not result:
        status = proc.wait()
        raise EngineUnavailable(f"failed to load: its engine process {describe_exit(status)}")
    return result


def stop(proc: subprocess.Popen[bytes], *, wait: float) -> None:
    """End a child: close its stdin (it frees its model and exits), kill it after ``wait``."""
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def discard(proc: subprocess.Popen[bytes], folder: Path, *, wait: float) -> None:
    """:func:`_stop` the child and remove its socket folder."""
    stop(proc, wait=wait)
    shutil.rmtree(folder, ignore_errors=True)
    with _owned_guard:
        fd = _owned.pop(folder, None)
    if fd is not None:
        os.close(fd)  # after the folder is gone: a sweep never sees it unowned


def _make_folder() -> Path:
    """A private (0700) socket folder, owned by this process until :func:`discard`."""
    folder = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    new = folder / f".{OWNER_LOCK}.new"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    try:
        fd = os.open(new, flags, 0o600)
    except OSError:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(new, folder / OWNER_LOCK)
    except BaseException:
        os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    with _owned_guard:
        _owned[folder] = fd
    return folder


def sweep_folders(parent: Path | None = None) -> list[Path]:
    """Remove the socket folders in ``parent`` (the temp dir) whose server has ended: this
    user's ``talkies-engine-*`` folders whose owner lock can be taken. The folders removed."""
    parent = Path(tempfile.gettempdir()) if parent is None else parent
    removed: list[Path] = []
    uid = os.geteuid()
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(FOLDER_PREFIX):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
            continue
        try:
            fd = os.open(Path(entry.path, OWNER_LOCK), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue  # no owner lock: not made by this code, or being made
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue  # its server is running
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            os.close(fd)
        removed.append(Path(entry.path))
    return removed
