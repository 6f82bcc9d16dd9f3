"""Hostile and well-behaved clients over raw sockets, for the reliability table.

Everything here is blocking or thread-based: the server under test runs on its own event loop
(in-process, in the portal thread) or in another process.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed

from ..fake_engine import speech
from ..wire import START, ws_connect

STREAM = b"/v1/audio/transcriptions/stream"
KEY = b"dGhlIHNhbXBsZSBub25jZQ=="


def upgrade_request(target: bytes = STREAM, headers: bytes = b"") -> bytes:
    return (
        b"GET " + target + b" HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: " + KEY + b"\r\n"
        b"Sec-WebSocket-Version: 13\r\n" + headers + b"\r\n"
    )


def connect(port: int, timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def upgrade(
    port: int, *, target: bytes = STREAM, headers: bytes = b""
) -> tuple[socket.socket, bytes, bytes]:
    """A socket after an upgrade request: (socket, response head, bytes after the head)."""
    sock = connect(port)
    sock.sendall(upgrade_request(target, headers))
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    response, _, rest = head.partition(b"\r\n\r\n")
    return sock, response, rest


def frame(
    opcode: int,
    payload: bytes = b"",
    *,
    fin: bool = True,
    masked: bool = True,
    length: int | None = None,
) -> bytes:
    """A client frame; ``length`` may claim more payload than follows."""
    n = len(payload) if length is None else length
    first = (0x80 if fin else 0) | opcode
    bit = 0x80 if masked else 0
    if n < 126:
        head = bytes([first, bit | n])
    elif n < 65536:
        head = bytes([first, bit | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([first, bit | 127]) + n.to_bytes(8, "big")
    if not masked:
        return head + payload
    key = b"\x01\x02\x03\x04"
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


@dataclass
class ServerFrames:
    """What a server sent on a WebSocket, as far as it was read."""

    texts: list[dict[str, Any]] = field(default_factory=list)
    pongs: list[bytes] = field(default_factory=list)
    close: int | None = None
    eof: bool = False

    def outcome(self) -> tuple[int, str]:
        """The close code and the error object's code (``—`` for none)."""
        errors = [t["code"] for t in self.texts if t.get("type") == "error"]
        assert self.close is not None, f"no close frame; got {self.texts}"
        assert len(errors) <= 1, self.texts
        return self.close, errors[0] if errors else "—"


class FrameReader:
    """Reads server frames (unmasked) from a socket, keeping what is left over."""

    def __init__(self, sock: socket.socket | None, initial: bytes = b"") -> None:
        self.sock = sock  # None: parse ``initial`` only
        self.buf = bytearray(initial)
        self.got = ServerFrames()

    def _one(self) -> tuple[int, bytes] | None:
        buf = self.buf
        if len(buf) < 2:
            return None
        n, offset = buf[1] & 0x7F, 2
        if n == 126:
            if len(buf) < 4:
                return None
            n, offset = int.from_bytes(buf[2:4], "big"), 4
        elif n == 127:
            if len(buf) < 10:
                return None
            n, offset = int.from_bytes(buf[2:10], "big"), 10
        if len(buf) < offset + n:
            return None
        opcode, payload = buf[0] & 0x0F, bytes(buf[offset : offset + n])
        del buf[: offset + n]
        return opcode, payload

    def pump(self, until_close: bool = True, timeout: float = 10.0) -> ServerFrames:
        """Read until a close frame (or EOF, or ``timeout``), collecting what came."""
        deadline = time.monotonic() + timeout
        while True:
            while (item := self._one()) is not None:
                opcode, payload = item
                if opcode == 1:
                    self.got.texts.append(json.loads(payload))
                elif opcode == 0xA:
                    self.got.pongs.append(payload)
                elif opcode == 8:
                    self.got.close = struct.unpack("!H", payload[:2])[0] if payload else 1005
                    return self.got
            if not until_close or self.sock is None:
                return self.got
            left = deadline - time.monotonic()
            if left <= 0:
                return self.got
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(262144)
            except TimeoutError:
                return self.got
            except OSError:
                chunk = b""
            if not chunk:
                self.got.eof = True
                return self.got
            self.buf += chunk


def read_until_ready(reader: FrameReader, timeout: float = 10.0) -> None:
    """Read until the ready event (and drop the events so far)."""
    assert reader.sock is not None
    deadline = time.monotonic() + timeout
    while True:
        got = reader.pump(until_close=False)
        if any(t.get("type") == "ready" for t in got.texts):
            got.texts.clear()
            return
        assert got.close is None and not got.eof, f"no ready: {got}"
        assert time.monotonic() < deadline, f"no ready within {timeout} s: {got}"
        reader.sock.settimeout(max(0.01, deadline - time.monotonic()))
        chunk = reader.sock.recv(65536)
        assert chunk, f"closed before ready: {got}"
        reader.buf += chunk


def wait_eof(sock: socket.socket, timeout: float) -> float | None:
    """Seconds until the server closed the connection (reading and dropping data), or None."""
    started = time.monotonic()
    deadline = started + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(65536):
                return time.monotonic() - started
        except TimeoutError:
            return None
        except OSError:
            return time.monotonic() - started
    return None


def send_in_background(sock: socket.socket, data: bytes) -> threading.Thread:
    """Send ``data`` without blocking the caller; a server that closes early ends it."""

    def run() -> None:
        with suppress(OSError):
            sock.sendall(data)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def http_exchange(port: int, request: bytes, timeout: float = 15.0) -> tuple[int, float | None]:
    """Send one raw request (in the background), read the response head and wait for EOF:
    (status, seconds until the server closed the connection)."""
    sock = connect(port)
    started = time.monotonic()
    send_in_background(sock, request)
    head = b""
    sock.settimeout(timeout)
    with suppress(OSError):
        while b"\r\n" not in head:
            chunk = sock.recv(65536)
            if not chunk:
                break
            head += chunk
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/1.1 ") else 0
    left = timeout - (time.monotonic() - started)
    closed = wait_eof(sock, max(left, 0.1))
    sock.close()
    return status, None if closed is None else time.monotonic() - started


def rss_mb() -> float:
    """This process's resident memory."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 1e6


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


# -- the bystanders: is everybody else still served? ----------------------------------------


@dataclass
class Bystanders:
    """A /healthz poller and a live stream paced in real time, beside a hostile case."""

    health_latencies: list[float] = field(default_factory=list)
    health_failures: list[str] = field(default_factory=list)
    partial_lags: list[float] = field(default_factory=list)
    stream_events: list[str] = field(default_factory=list)
    stream_close: int | None = None
    stream_error: str | None = None

    def worst(self) -> float | str:
        """The slowest /healthz answer or partial, in seconds; or what went wrong."""
        ok = (
            not self.health_failures
            and self.health_latencies
            and self.stream_error is None
            and self.stream_close == 1000
            and self.stream_events[-2:] == ["final", "stats"]
            and len(self.partial_lags) >= 2
        )
        if not ok:
            return self.summary()
        return round(max(*self.health_latencies, *self.partial_lags), 3)

    def summary(self) -> str:
        health = max(self.health_latencies, default=None)
        lag = max(self.partial_lags, default=None)
        return (
            f"healthz: {len(self.health_latencies)} ok, max {health}, failures "
            f"{self.health_failures[:3]}; stream: {len(self.partial_lags)} partials, max lag "
            f"{lag}, close {self.stream_close}, error {self.stream_error}, "
            f"last events {self.stream_events[-3:]}"
        )


@contextmanager
def bystanders(
    port: int,
    headers: dict[str, str] | None = None,
    *,
    stream: bool = True,
    model: str = "tiny-test",
) -> Iterator[Bystanders]:
    """Run the bystanders for the duration of the block; their record is complete after it."""
    record = Bystanders()
    stop = threading.Event()
    headers = headers or {}

    def poll_health() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            while not stop.is_set():
                started = time.monotonic()
                try:
                    status = client.get("/healthz").status_code
                except httpx.HTTPError as exc:
                    record.health_failures.append(repr(exc))
                else:
                    if status == 200:
                        record.health_latencies.append(time.monotonic() - started)
                    else:
                        record.health_failures.append(f"status {status}")
                stop.wait(0.2)

    def run_stream() -> None:
        url = f"ws://127.0.0.1:{port}/v1/audio/transcriptions/stream"
        try:
            ws = ws_connect(url, additional_headers=headers)
            ws.send(json.dumps({**START, "model": model}))
            assert json.loads(ws.recv(timeout=10))["type"] == "ready"
        except Exception as exc:
            record.stream_error = f"could not start: {exc!r}"
            return
        sent_at: list[float] = []
        audio = speech(0.02)

        def receive() -> None:
            words = 0
            try:
                while True:
                    event = json.loads(ws.recv(timeout=30))
                    record.stream_events.append(event["type"])
                    if event["type"] == "partial":
                        words += 1
                        # The frame that completed this word (the fake engine: one per 0.25 s).
                        due = sent_at[min(len(sent_at) - 1, -(-words * 4000 // 320) - 1)]
                        record.partial_lags.append(time.monotonic() - due)
            except ConnectionClosed as closed:
                record.stream_close = closed.rcvd.code if closed.rcvd else None
            except Exception as exc:
                record.stream_error = f"receive: {exc!r}"

        reader = threading.Thread(target=receive, daemon=True)
        reader.start()
        started = time.monotonic()
        try:
            while not stop.is_set():
                # Paced in real time from the start, so a late frame is not a late partial.
                target = started + len(sent_at) * 0.02
                time.sleep(max(0.0, target - time.monotonic()))
                sent_at.append(time.monotonic())
                ws.send(audio)
            ws.send(json.dumps({"type": "end"}))
        except Exception as exc:
            record.stream_error = f"send: {exc!r}"
        reader.join(timeout=30)
        ws.close()

    threads = [threading.Thread(target=poll_health, daemon=True)]
    if stream:
        threads.append(threading.Thread(target=run_stream, daemon=True))
    for thread in threads:
        thread.start()
    try:
        yield record
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
