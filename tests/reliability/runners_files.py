"""Runners for staged files under concurrent and conflicting requests (issue 21, points 5, 7
and 8): a GET racing PUTs of the same path, a PUT under a name that is a file, and the folders
a DELETE or a failed PUT leaves empty."""

from __future__ import annotations

import json
import threading
from contextlib import suppress
from typing import Any

import httpx

from ..http_hosts import TOKEN, UPLOAD_CAP

# As a module: runners_http imports runners, which imports this (attributes read at run time).
from . import runners_http as _http
from .clients import connect, send_in_background
from .runners import Facts, Target, runner

_GETS = 400
# Whole multiples of the body's 256 KiB chunks: a body torn between the two can end exactly at
# the length declared, looking complete (the case), or short of it.
_OLD = b"old-" * 65_536  # 262,144 bytes
_NEW = b"NEW!" * 131_072  # 524,288 bytes


def _request(method: bytes, path: bytes, body: bytes = b"", *headers: bytes) -> bytes:
    head = b"%s /v1/files/%s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" % (method, path)
    head += b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
    head += b"".join(h + b"\r\n" for h in headers)
    if method == b"PUT" and not any(h.lower().startswith(b"transfer-encoding") for h in headers):
        head += b"Content-Length: %d\r\n" % len(body)
    return head + b"\r\n" + body


def _exchange(port: int, request: bytes, timeout: float = 30.0) -> bytes:
    """One raw request; the whole response, read until the server closes the connection."""
    with connect(port, timeout=timeout) as sock:
        sender = send_in_background(sock, request)  # a server may answer before it all came
        data = b""
        with suppress(OSError):
            while chunk := sock.recv(1 << 20):
                data += chunk
        sender.join(timeout)
    return data


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def _shaped(response: bytes) -> int | str:
    """The status of an error response in OpenAI's shape, or what was wrong with it."""
    status = _status(response)
    body = response.partition(b"\r\n\r\n")[2]
    try:
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    except (ValueError, KeyError, TypeError, AssertionError):
        return f"{status} without OpenAI's error shape: {body[:200]!r}"
    return status


@runner("files-get-during-put", "both")
def files_get_during_put(target: Target) -> Facts:
    """GETs of one staged path while two clients PUT it, turn about, at 262,144 and 524,288
    bytes: each GET must be one whole version, of the length it declared."""
    assert target.host is not None
    port = _http._port(target)
    name = f"race-{target.host.name}.wav".encode()
    versions = {_OLD, _NEW}
    assert _status(_exchange(port, _request(b"PUT", name, _OLD))) == 201
    stop = threading.Event()

    def put_in_turn(first: bytes) -> None:
        with httpx.Client(base_url=target.host.url, headers=target.host.headers) as client:
            body = first
            while not stop.is_set():
                client.put(f"/v1/files/{name.decode()}", content=body)
                body = _NEW if body is _OLD else _OLD

    putters = [threading.Thread(target=put_in_turn, args=(v,), daemon=True) for v in versions]
    for thread in putters:
        thread.start()
    statuses, torn = [], 0
    try:
        for _ in range(_GETS):
            response = _exchange(port, _request(b"GET", name))
            statuses.append(_status(response))
            head, _, body = response.partition(b"\r\n\r\n")
            declared = [
                int(line.split(b":", 1)[1])
                for line in head.lower().split(b"\r\n")
                if line.startswith(b"content-length:")
            ]
            if body not in versions or declared != [len(body)]:
                torn += 1
    finally:
        stop.set()
        for thread in putters:
            thread.join(timeout=30)
        _exchange(port, _request(b"DELETE", name))
    return {"status": statuses, "torn": (torn, len(statuses))}


@runner("files-under-a-file", "both")
def files_under_a_file(target: Target) -> Facts:
    """PUTs under a staged file's name, as if it were a folder."""
    assert target.host is not None
    port = _http._port(target)
    name = f"under-{target.host.name}.wav".encode()
    assert _status(_exchange(port, _request(b"PUT", name, b"RIFF"))) == 201
    statuses: list[int | str] = []
    try:
        with _http._changes(*_http._host_dirs(target)) as left:
            for path in (name + b"/b.wav", name + b"/x/b.wav"):
                statuses.append(_shaped(_exchange(port, _request(b"PUT", path, b"RIFFdata"))))
    finally:
        _exchange(port, _request(b"DELETE", name))
    return {"status": statuses, "left_behind": left}


def _chunked_past_the_cap() -> bytes:
    chunk = b"\0" * 65536
    count = UPLOAD_CAP // len(chunk) + 2
    return b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(count)) + b"0\r\n\r\n"


@runner("files-delete-folders", "both")
def files_delete_folders(target: Target) -> Facts:
    """A staged file three folders deep, then its DELETE; a PUT three folders deep refused
    for its size once its folders were made."""
    assert target.host is not None
    port = _http._port(target)
    tag = target.host.name.encode()
    statuses: list[Any] = []
    with _http._changes(*_http._host_dirs(target)) as left:
        deep = b"deep-%s/y/z.wav" % tag
        statuses.append(_status(_exchange(port, _request(b"PUT", deep, b"RIFFdata"))))
        statuses.append(_status(_exchange(port, _request(b"DELETE", deep))))
        big = _request(
            b"PUT", b"big-%s/q/r.wav" % tag, _chunked_past_the_cap(), b"Transfer-Encoding: chunked"
        )
        statuses.append(_status(_exchange(port, big)))
    return {"status": statuses, "left_behind": left}
