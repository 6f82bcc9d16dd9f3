"""Client-side helpers for tests over real sockets."""

from __future__ import annotations

import json
import socket
from typing import Any

from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

START = {"type": "start", "model": "tiny-test", "encoding": "pcm_s16le"}
START |= {"sample_rate": 16000, "channels": 1}


def ws_connect(url: str, **kwargs: Any) -> ClientConnection:
    """A websockets sync client used without a with block (the tests close it themselves)."""
    ws = connect(url, open_timeout=5, close_timeout=5, legacy=True, **kwargs)
    assert isinstance(ws, ClientConnection)
    return ws


def open_stream(url: str, model: str = "tiny-test", **kwargs: Any) -> ClientConnection:
    """Connect, send start, and wait for ready."""
    ws = ws_connect(url, **kwargs)
    ws.send(json.dumps({**START, "model": model}))
    ready = json.loads(ws.recv(timeout=5))
    assert ready["type"] == "ready", ready
    return ws


def drain(
    ws: ClientConnection, timeout: float = 10
) -> tuple[list[dict[str, Any]], int | None, str]:
    """Every event until the server closes; then the close code and reason."""
    events: list[dict[str, Any]] = []
    try:
        while True:
            message = ws.recv(timeout=timeout)
            events.append(json.loads(message))
    except ConnectionClosed as closed:
        received = closed.rcvd
        return events, (received.code if received else None), (received.reason if received else "")
    except TimeoutError as exc:
        raise AssertionError(f"no close after {timeout} s; events so far {events}") from exc


def raw_connect(port: int, headers: bytes = b"") -> tuple[socket.socket, bytes]:
    """A bare socket after a WebSocket upgrade; returns it and any bytes after the head."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(
        b"GET /v1/audio/transcriptions/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
        b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        b"Sec-WebSocket-Version: 13\r\n" + headers + b"\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            break
        head += chunk
    response, _, rest = head.partition(b"\r\n\r\n")
    assert response.startswith(b"HTTP/1.1 101"), response
    return sock, rest


def masked(opcode: int, payload: bytes, *, fin: bool = True, length: int | None = None) -> bytes:
    """A client frame; ``length`` may claim more payload than follows."""
    n = len(payload) if length is None else length
    first = (0x80 if fin else 0) | opcode
    if n < 126:
        header = bytes([first, 0x80 | n])
    elif n < 65536:
        header = bytes([first, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        header = bytes([first, 0x80 | 127]) + n.to_bytes(8, "big")
    key = b"\x01\x02\x03\x04"
    return header + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def read_close(sock: socket.socket, initial: bytes = b"") -> tuple[list[str], int | None]:
    """Read server frames until a close frame or EOF: text payloads and the close code."""
    buf = bytearray(initial)
    texts: list[str] = []
    while True:
        while len(buf) >= 2:
            n = buf[1] & 0x7F
            offset = 2
            if n == 126:
                if len(buf) < 4:
                    break
                n, offset = int.from_bytes(buf[2:4], "big"), 4
            elif n == 127:
                if len(buf) < 10:
                    break
                n, offset = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < offset + n:
                break
            opcode, payload = buf[0] & 0x0F, bytes(buf[offset : offset + n])
            del buf[: offset + n]
            if opcode == 1:
                texts.append(payload.decode())
            elif opcode == 8:
                return texts, int.from_bytes(payload[:2], "big") if payload else None
        chunk = sock.recv(65536)
        if not chunk:
            return texts, None
        buf += chunk
