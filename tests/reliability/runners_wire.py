"""Runners for connection- and frame-level cases: request heads, WebSocket frames, floods."""

from __future__ import annotations

import errno
import gc
import json
import logging
import os
import resource
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

import httpx

from talkies.transport.http import HttpLimits

from ..fake_engine import silence, speech
from ..http_hosts import TOKEN
from ..wire import START, open_stream
from .clients import (
    FrameReader,
    bystanders,
    connect,
    frame,
    http_exchange,
    open_descriptors,
    read_until_ready,
    rss_mb,
    upgrade,
    upgrade_request,
)
from .runners import Facts, Target, runner, server

ROOT = Path(__file__).resolve().parents[2]
AUTH = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"


def _port_and_auth(target: Target) -> tuple[int, bytes, str]:
    """(port, auth header line, a streaming model) of a host process."""
    assert target.host is not None
    return target.host.port, AUTH, "energy-test"


# -- request heads --------------------------------------------------------------------------


def _slowloris(port: int, *, clients: int, seconds: float) -> tuple[list[int], list[float]]:
    """``clients`` connections that start a request head and then send one byte of a header
    every 0.5 s, never ending it. Returns each one's status (0: none) and how long it stayed
    open (capped at ``seconds``)."""
    socks = [connect(port) for _ in range(clients)]
    started = time.monotonic()
    for sock in socks:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        sock.setblocking(False)
    statuses = [0] * clients
    open_for: list[float | None] = [None] * clients
    while time.monotonic() - started < seconds and None in open_for:
        for i, sock in enumerate(socks):
            if open_for[i] is not None:
                continue
            try:
                data = sock.recv(65536)
            except BlockingIOError:
                data = None
            except OSError:
                data = b""
            if data:
                if data.startswith(b"HTTP/1.1 "):
                    statuses[i] = int(data.split(b" ", 2)[1])
                continue
            if data == b"":
                open_for[i] = time.monotonic() - started
                continue
            try:
                sock.send(b"a")
            except OSError:
                open_for[i] = time.monotonic() - started
        time.sleep(0.5)
    for sock in socks:
        sock.close()
    return statuses, [seconds if t is None else t for t in open_for]


@runner("slowloris-head", "in-process", "uvicorn")
def slowloris(target: Target) -> Facts:
    if target.host is None:
        with server(target.tmp) as running:
            assert HttpLimits().head_timeout == 10.0  # the deadline the table speaks of
            with bystanders(running.port) as record:
                statuses, open_for = _slowloris(running.port, clients=20, seconds=14)
        return {
            "status": statuses,
            "closed_s": max(open_for),
            "others_s": record.worst(),
        }
    port, _, model = _port_and_auth(target)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    with bystanders(port, headers, model=model) as record:
        statuses, open_for = _slowloris(port, clients=20, seconds=11)
    assert statuses == [0] * 20, statuses
    return {"open_s": min(open_for), "others_s": record.worst()}


def _head_case(target: Target, request: bytes) -> Facts:
    assert target.host is not None
    status, closed = http_exchange(target.host.port, request)
    return {"status": [status], "closed_s": 99.0 if closed is None else closed}


@runner("huge-header", "standalone", "uvicorn")
def huge_header(target: Target) -> Facts:
    big = b"X-Big: " + b"a" * 1_000_000 + b"\r\n"
    return _head_case(target, b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + big + b"\r\n")


def _many_headers() -> bytes:
    lines = b"".join(b"X-H%d: v\r\n" % i for i in range(10_000))
    return b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + lines + b"\r\n"


@runner("many-headers", "standalone", "uvicorn")
def many_headers(target: Target) -> Facts:
    return _head_case(target, _many_headers())


# -- WebSocket frames -----------------------------------------------------------------------


@dataclass(frozen=True)
class FrameCase:
    state: str  # "awaiting_start" or "streaming"
    frames: Callable[[], bytes]
    timed: bool = False  # the row states how soon the server answered


def _start(model: str) -> bytes:
    return json.dumps({**START, "model": model}).encode()


_TB = 1 << 40
FRAME_CASES: dict[str, FrameCase] = {
    "ws-invalid-utf8": FrameCase("awaiting_start", lambda: frame(1, b"\xff\xfe{}")),
    "ws-invalid-utf8-fragment": FrameCase(
        "awaiting_start",
        lambda: frame(1, b'{"type":', fin=False) + frame(0, b'"\xc3\x28"}'),
    ),
    # A valid two-byte character cut between fragments is decoded: the complaint is the
    # unknown field it names, not the encoding.
    "ws-utf8-split": FrameCase(
        "awaiting_start",
        lambda: frame(1, b'{"\xc3', fin=False) + frame(0, b'\xa9":1,' + _start("tiny-test")[1:]),
    ),
    "ws-invalid-utf8-close-reason": FrameCase(
        "awaiting_start", lambda: frame(8, (1000).to_bytes(2, "big") + b"\xff")
    ),
    "ws-fragmented-control-over-4096": FrameCase(
        "awaiting_start",
        lambda: (
            frame(1, b'{"type":', fin=False)
            + b"".join(frame(0, b" " * 1000, fin=False) for _ in range(5))
        ),
        timed=True,
    ),
    "ws-fragmented-control-one-byte": FrameCase(
        "awaiting_start",
        lambda: frame(1, b"{", fin=False) + frame(0, b" ", fin=False) * 4096,
        timed=True,
    ),
    "ws-fragmented-ping": FrameCase("streaming", lambda: frame(9, b"x", fin=False)),
    "ws-oversized-ping": FrameCase("streaming", lambda: frame(9, b"x" * 126)),
    "ws-continuation-first": FrameCase("awaiting_start", lambda: frame(0, b"{}")),
    "ws-text-inside-text": FrameCase(
        "awaiting_start", lambda: frame(1, b"{", fin=False) + frame(1, b"}")
    ),
    "ws-binary-inside-text": FrameCase(
        "awaiting_start", lambda: frame(1, b"{", fin=False) + frame(2, b"\0\0")
    ),
    "ws-continuation-after-final": FrameCase(
        "streaming", lambda: frame(2, b"\0" * 640) + frame(0, b"\0\0")
    ),
    "ws-unmasked": FrameCase("awaiting_start", lambda: frame(1, _start("tiny-test"), masked=False)),
    "ws-unmasked-ping": FrameCase("streaming", lambda: frame(9, b"x", masked=False)),
    # A header claiming a terabyte, then 8 KiB of it: refused on what arrived.
    "terabyte-frame": FrameCase(
        "streaming", lambda: frame(2, b"\0" * 8192, length=_TB)[: 14 + 8192], timed=True
    ),
    "terabyte-text": FrameCase(
        "awaiting_start", lambda: frame(1, b" " * 8192, length=_TB)[: 14 + 8192], timed=True
    ),
    "frame-length-msb": FrameCase("streaming", lambda: frame(2, b"", length=1 << 63)),
}


def _frame_case(case: FrameCase, port: int, auth: bytes, model: str) -> Facts:
    sock, response, rest = upgrade(port, headers=auth)
    assert response.startswith(b"HTTP/1.1 101"), response
    reader = FrameReader(sock, rest)
    if case.state == "streaming":
        sock.sendall(frame(1, _start(model)))
        read_until_ready(reader)
    started = time.monotonic()
    with suppress(OSError):  # refused before all was sent: the answer is on its way
        sock.sendall(case.frames())
    got = reader.pump(timeout=15)
    seconds = time.monotonic() - started
    sock.close()
    facts: Facts = {"close": [got.outcome()]}
    if case.timed:
        facts["closed_s"] = seconds
    return facts


def _frame_runner(name: str, hosts: tuple[str, ...]) -> None:
    def run(target: Target) -> Facts:
        case = FRAME_CASES[name]
        if target.host is not None:
            return _frame_case(case, *_port_and_auth(target))
        with server(target.tmp) as running:
            facts = _frame_case(case, running.port, b"", "tiny-test")
            running.wait_idle()
        return facts

    runner(name, *hosts)(run)


# Rows on uvicorn show what its own WebSocket layer answers before the app sees a frame.
_ON_UVICORN = {
    "ws-invalid-utf8",
    "ws-fragmented-ping",
    "ws-continuation-first",
    "ws-unmasked",
    "terabyte-frame",
}
for _name in FRAME_CASES:
    _frame_runner(_name, ("in-process", "uvicorn") if _name in _ON_UVICORN else ("in-process",))


@runner("ws-frames-with-head", "in-process")
def frames_with_head(target: Target) -> Facts:
    """The upgrade request, a ping and the start in one write (RFC 6455 says to wait for the
    101; a client in a hurry does not)."""
    with server(target.tmp) as running:
        sock = connect(running.port)
        sock.sendall(upgrade_request() + frame(9, b"early") + frame(1, _start("tiny-test")))
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(4096)
            assert chunk, head
            head += chunk
        response, _, rest = head.partition(b"\r\n\r\n")
        assert response.startswith(b"HTTP/1.1 101"), response
        reader = FrameReader(sock, rest)
        ready = True
        try:
            read_until_ready(reader, timeout=5)
        except (AssertionError, TimeoutError):
            ready = False
        sock.close()
        running.wait_idle()
    return {"pings": (1, reader.got.pongs.count(b"early")), "accepted": ready}


# -- connections that never start -----------------------------------------------------------


def _stream_slots(port: int) -> int:
    """The host's server-wide limit (TALKIES_STREAM_MAX_CONNECTIONS), from /metrics."""
    metrics = httpx.get(
        f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}
    ).text
    for line in metrics.splitlines():
        if line.startswith("talkies_stream_slots "):
            return int(float(line.split()[1]))
    raise AssertionError("no talkies_stream_slots in /metrics")


def _answered(sock: socket.socket) -> bool:
    """Whether the server has sent anything (an error, a close) or closed, without waiting."""
    return bool(select.select([sock], [], [], 0)[0])


@runner("ws-no-start", "both")
def ws_no_start(target: Target) -> Facts:
    """As many upgrades as the server has stream slots, none of them sending a start; then a
    client that starts, while they are all still open (issue 21, point 2)."""
    port, auth, model = _port_and_auth(target)
    idle: list[tuple[socket.socket, FrameReader, float]] = []
    for _ in range(_stream_slots(port)):
        sock, response, rest = upgrade(port, headers=auth)
        assert response.startswith(b"HTTP/1.1 101"), response
        idle.append((sock, FrameReader(sock, rest), time.monotonic()))
    sock, response, rest = upgrade(port, headers=auth)
    assert response.startswith(b"HTTP/1.1 101"), response
    sock.sendall(frame(1, _start(model)))
    reader = FrameReader(sock, rest)
    try:
        read_until_ready(reader, timeout=4)
        served: bool | str = True
    except AssertionError as exc:
        served = str(exc)[:300]
    if served is True and any(_answered(s) for s, _, _ in idle):
        served = "ready came only after an idle connection was answered"
    sock.sendall(frame(1, b'{"type":"cancel"}'))
    reader.pump(timeout=10)
    sock.close()
    outcomes, seconds = [], []
    for idle_sock, idle_reader, upgraded in idle:
        got = idle_reader.pump(timeout=15)
        seconds.append(time.monotonic() - upgraded)
        outcomes.append(got.outcome() if got.close is not None else (0, "open"))
        idle_sock.close()
    return {"close": outcomes, "closed_s": max(seconds), "accepted": served}


def _trickle(
    sock: socket.socket, reader: FrameReader, first: bytes, then: Iterator[bytes]
) -> Facts:
    """Send ``first``, then the next of ``then`` whenever 0.5 s pass with nothing to read,
    until the close frame or EOF (a host's own ping is read and passed over) or 15 s: how the
    connection ended, and when."""
    started = time.monotonic()
    with suppress(OSError):
        sock.sendall(first)
        while time.monotonic() - started < 15 and reader.got.close is None:
            if not select.select([sock], [], [], 0.5)[0]:
                sock.sendall(next(then))
                continue
            chunk = sock.recv(65536)
            if not chunk:
                break
            reader.buf += chunk
            reader.pump(until_close=False)
    seconds = time.monotonic() - started
    got = reader.got if reader.got.close is not None else reader.pump(timeout=5)
    sock.close()
    return {"close": [got.outcome() if got.close is not None else (0, "open")], "closed_s": seconds}


@runner("ws-start-trickle", "both")
def ws_start_trickle(target: Target) -> Facts:
    """A start that never ends: a text frame without FIN, then a one-byte continuation every
    0.5 s (each one moves the idle deadline; the start deadline stays)."""
    port, auth, _ = _port_and_auth(target)
    sock, response, rest = upgrade(port, headers=auth)
    assert response.startswith(b"HTTP/1.1 101"), response
    continuation = frame(0, b" ", fin=False)
    return _trickle(
        sock, FrameReader(sock, rest), frame(1, b'{"type":', fin=False), repeat(continuation)
    )


@runner("ws-frame-trickle", "in-process")
def ws_frame_trickle(target: Target) -> Facts:
    """After ready, the head of a 65,536-byte binary frame, then one byte of it every 0.5 s
    (the idle timeout is 2 s here): bytes of a frame are not activity."""
    with server(target.tmp, stream_idle_timeout=2.0) as running:
        sock, reader = _ready_socket(running.port)
        whole = frame(2, bytes(65536))
        head = 14  # 2 bytes, the 64-bit length, the mask
        one_by_one = (whole[i : i + 1] for i in range(head, len(whole)))
        return _trickle(sock, reader, whole[:head], one_by_one)


# -- pings ----------------------------------------------------------------------------------


def _ready_socket(port: int) -> tuple[socket.socket, FrameReader]:
    sock, response, rest = upgrade(port)
    assert response.startswith(b"HTTP/1.1 101"), response
    sock.sendall(frame(1, _start("tiny-test")))
    reader = FrameReader(sock, rest)
    read_until_ready(reader)
    return sock, reader


def _flood(sock: socket.socket, reader: FrameReader, pings: int) -> list[bytes]:
    """``pings`` pings of 125 bytes with a 20 ms audio frame after every twentieth, as fast as
    the server takes them, while the pongs and events are read. Returns the payloads sent.

    The audio is 0.3 s of speech, 0.3 s of silence, and so on: the fake engine ends an
    utterance at each silence, so nothing on the engine's side grows with the flood."""
    payloads = [i.to_bytes(4, "big") * 31 + b"p" for i in range(pings)]
    voiced, quiet = frame(2, speech(0.02)), frame(2, silence(0.02))
    done = threading.Event()

    def send() -> None:
        batch = bytearray()
        for i, payload in enumerate(payloads):
            batch += frame(9, payload)
            if i % 20 == 19:
                batch += voiced if (i // 20 // 15) % 2 == 0 else quiet
            if len(batch) > 65536:
                sock.sendall(batch)
                batch.clear()
        sock.sendall(batch)
        done.set()

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    first = len(reader.got.pongs)
    sock.settimeout(10)
    while len(reader.got.pongs) - first < pings:
        chunk = sock.recv(262144)
        assert chunk, "the server closed during the flood"
        reader.buf += chunk
        reader.pump(until_close=False, timeout=0)
    sender.join(timeout=30)
    assert done.is_set()
    return payloads


@runner("ping-flood", "in-process")
def ping_flood(target: Target) -> Facts:
    with server(target.tmp) as running:
        sock, reader = _ready_socket(running.port)
        _flood(sock, reader, 2000)  # warm up: allocator pools, buffers, caches
        reader.got.pongs.clear()
        rss = []
        answered = 0
        kinds_so_far: set[str] = set()
        for _ in range(3):
            payloads = _flood(sock, reader, 20_000)
            answered += sum(a == b for a, b in zip(reader.got.pongs, payloads, strict=False))
            kinds_so_far |= {t["type"] for t in reader.got.texts}
            reader.got.pongs.clear()
            reader.got.texts.clear()
            gc.collect()
            rss.append(rss_mb())
        sock.sendall(frame(1, b'{"type":"end"}'))
        got = reader.pump(timeout=10)
        sock.close()
        kinds = [*sorted(kinds_so_far), *(t["type"] for t in got.texts)]
        served = (
            "partial" in kinds
            and "endpoint" in kinds
            and kinds[-2:] == ["final", "stats"]
            and got.close == 1000
        )
        running.wait_idle()
    return {
        "pings": (60_000, answered),
        "stream_served": served or kinds[-5:],
        # What a third flood adds to what the second left (the first settles the allocator's
        # high-water mark): a leak would show here.
        "memory_growth_mb": round(rss[2] - rss[1], 1),
    }


@runner("ping-flood-unread", "in-process")
def ping_flood_unread(target: Target) -> Facts:
    # The send timeout is the stream idle timeout: 2 s here, so the case ends soon.
    with (
        server(target.tmp, stream_idle_timeout=2.0) as running,
        bystanders(running.port) as record,
    ):
        time.sleep(0.5)
        before = running.connections()
        sock, _, _ = upgrade(running.port)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        ping = frame(9, b"p" * 125) * 512
        pushed = 0
        started = time.monotonic()
        sock.settimeout(1.0)
        while time.monotonic() - started < 60:
            try:
                pushed += sock.send(ping)
            except TimeoutError:
                break  # the server stopped reading: TCP pushes back
            except OSError:
                break  # the server already closed
        deadline = time.monotonic() + 20
        while running.connections() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        closed = time.monotonic() - started
        sock.close()
    return {
        "pushed_mb": round(pushed / 1e6, 1),
        "closed_s": closed,
        "others_s": record.worst(),
    }


# -- 10,000 connection attempts ---------------------------------------------------------------

ATTEMPTS = 10_000


def raise_descriptor_limit() -> int:
    """The soft RLIMIT_NOFILE raised as far as the hard one allows (an unlimited hard limit
    is capped at 2^20, Linux's default nr_open)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    new = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if new > soft:
        with suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


@dataclass
class _Attempt:
    sock: socket.socket
    state: str = "connecting"  # connecting, sent, done
    buf: bytearray = field(default_factory=bytearray)
    outcome: tuple[int, str] | None = None


def _parse_refusal(buf: bytearray) -> tuple[int, str] | None:
    """The close code and error code after a 101, once the close frame is in."""
    head, sep, rest = bytes(buf).partition(b"\r\n\r\n")
    if not sep:
        return None
    if not head.startswith(b"HTTP/1.1 101"):
        return (0, head.split(b"\r\n", 1)[0].decode())
    reader = FrameReader(None, rest)  # parsing only
    got = reader.pump(timeout=0)
    return got.outcome() if got.close is not None else None


def _wave(port: int, size: int, *, in_flight: int = 512, timeout: float = 60.0) -> list[tuple]:
    """``size`` upgrades at once (at most ``in_flight`` handshakes unanswered at a time), each
    read until its close frame and kept open until the whole wave is answered."""
    request = upgrade_request()
    selector = selectors.DefaultSelector()
    attempts: list[_Attempt] = []
    answered = 0
    deadline = time.monotonic() + timeout

    def start_one() -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        # An abortive close (RST) leaves no TIME_WAIT behind: 10,000 of them would eat the
        # ephemeral ports a rerun needs.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
        code = sock.connect_ex(("127.0.0.1", port))
        assert code in (0, errno.EINPROGRESS), os.strerror(code)
        attempt = _Attempt(sock)
        attempts.append(attempt)
        selector.register(sock, selectors.EVENT_WRITE, attempt)

    try:
        while answered < size:
            assert time.monotonic() < deadline, f"{answered} of {size} answered in {timeout} s"
            while len(attempts) < size and len(attempts) - answered < in_flight:
                start_one()
            for key, _ in selector.select(timeout=1.0):
                attempt: _Attempt = key.data
                if attempt.state == "connecting":
                    attempt.sock.send(request)
                    attempt.state = "sent"
                    selector.modify(attempt.sock, selectors.EVENT_READ, attempt)
                    continue
                try:
                    chunk = attempt.sock.recv(65536)
                except OSError:
                    chunk = b""
                attempt.buf += chunk
                outcome = _parse_refusal(attempt.buf)
                if outcome is None and not chunk:
                    outcome = (0, "closed without an answer")
                if outcome is not None:
                    attempt.outcome, attempt.state = outcome, "done"
                    selector.unregister(attempt.sock)
                    answered += 1
    finally:
        selector.close()
        for attempt in attempts:
            attempt.sock.close()
    return [a.outcome for a in attempts]


class _AcceptWarnings(logging.Handler):
    """Counts the server's "cannot accept connections" warnings (EMFILE and the like)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("cannot accept connections"):
            self.count += 1


@contextmanager
def _removed(handler: logging.Handler) -> Iterator[None]:
    try:
        yield
    finally:
        logging.getLogger("talkies.transport").removeHandler(handler)


@runner("connection-flood", "in-process")
def connection_flood(target: Target) -> Facts:
    limit = raise_descriptor_limit()
    # Each attempt costs two descriptors here (the client's and the server's, one process);
    # keep some for everything else.
    wave = min(ATTEMPTS, max(256, (limit - open_descriptors() - 512) // 2))
    waves = -(-ATTEMPTS // wave)
    wave = -(-ATTEMPTS // waves)
    outcomes: list[tuple] = []
    exhausted = _AcceptWarnings()
    logging.getLogger("talkies.transport").addHandler(exhausted)
    # Four server-wide slots: the bystander stream and three idle streams hold them all.
    with (
        server(target.tmp, stream_max_connections=4, stream_idle_timeout=120.0) as running,
        _removed(exhausted),
    ):
        with bystanders(running.port) as record:
            time.sleep(0.5)
            held = [open_stream(running.url) for _ in range(3)]
            gc.collect()
            baseline = open_descriptors()
            before = running.connections()
            for _ in range(waves):
                outcomes += _wave(running.port, min(wave, ATTEMPTS - len(outcomes)))
            running.wait_connections(before, timeout=30)
            leaked = open_descriptors() - baseline
            for ws in held:
                ws.close()
        target.tmp.joinpath("flood.txt").write_text(
            f"descriptor limit {limit}; {waves} waves of {wave}\n{record.summary()}\n"
        )
        facts: Facts = {
            "attempts": len(outcomes),
            "close": outcomes,
            "others_s": record.worst(),
            "descriptors_leaked": leaked,
            "out_of_descriptors": exhausted.count,
        }
        running.wait_idle()
    return facts


@runner("fd-exhaustion", "in-process")
def fd_exhaustion(target: Target) -> Facts:
    """A server process limited to 64 descriptors, 200 connections at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "tests.reliability.fd_server", str(port), "64"]
    log_path = target.tmp / "server.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=log_file)
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log_path.read_text(errors="replace")
            try:
                if httpx.get(url).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        socks = []
        for _ in range(200):
            sock = connect(port)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(sock)
        time.sleep(1.0)
        for sock in socks:
            sock.close()
        time.sleep(0.5)
        statuses = [httpx.get(url, timeout=10).status_code for _ in range(5)]
        alive = proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    log = log_path.read_text(errors="replace")
    return {"status": statuses, "survives": (alive and "Too many open files" in log) or log[-2000:]}
