"""Bulk-ingest load generator over raw sockets: frames/s a WebSocket server can take in.

    python bench/loadgen.py --port 8000 [--connections 4] [--frames 200000] [--repeat 3] [--json]

Each connection does the HTTP upgrade by hand, sends ``start`` and waits for ``ready`` (unless
``--bare``), then, once every connection is ready, sends its share of the frames: pre-built,
pre-masked 640-byte binary frames joined ``--chunk`` at a time into one ``sendall``. Then it
sends ``end`` and reads until the ``stats`` event. A run's rate is all frames / (time from the
first connection's first frame to the last connection's ``stats``). A Python WebSocket client
would top out far below the servers under test; this one costs one ``sendall`` per chunk.

The helpers here (handshake, masking, a server-frame reader) are shared with ``paced.py``.
Only ever connects to 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

STREAM_PATH = "/v1/audio/transcriptions/stream"
MASK_KEY = b"\x37\xfa\x21\x3d"
OP_TEXT = 0x1
OP_BINARY = 0x2
OP_CLOSE = 0x8
OP_PING = 0x9
OP_PONG = 0xA
START = {
    "type": "start",
    "model": "null",
    "encoding": "pcm_s16le",
    "sample_rate": 16000,
    "channels": 1,
}
END = {"type": "end"}


# -- client frames (masked, as RFC 6455 requires from a client) -------------------------------


def mask(payload: bytes, key: bytes = MASK_KEY) -> bytes:
    n = len(payload)
    if n == 0:
        return b""
    stream = (key * (n // 4 + 1))[:n]
    masked = int.from_bytes(payload, "little") ^ int.from_bytes(stream, "little")
    return masked.to_bytes(n, "little")


def frame_header(opcode: int, length: int, key: bytes = MASK_KEY) -> bytes:
    first = 0x80 | opcode
    if length < 126:
        header = struct.pack("!BB", first, 0x80 | length)
    elif length < 65536:
        header = struct.pack("!BBH", first, 0x80 | 126, length)
    else:
        header = struct.pack("!BBQ", first, 0x80 | 127, length)
    return header + key


def client_frame(opcode: int, payload: bytes, key: bytes = MASK_KEY) -> bytes:
    return frame_header(opcode, len(payload), key) + mask(payload, key)


def text_frame(obj: object) -> bytes:
    return client_frame(OP_TEXT, json.dumps(obj, separators=(",", ":")).encode())


def close_frame(code: int = 1000) -> bytes:
    return client_frame(OP_CLOSE, struct.pack("!H", code))


def pcm_payload(frame_bytes: int) -> bytes:
    """A deterministic, non-silent payload (content does not matter to any peer here)."""
    pattern = bytes(range(256))
    return (pattern * (frame_bytes // 256 + 1))[:frame_bytes]


# -- the upgrade -------------------------------------------------------------------------------


def upgrade_request(host: str, port: int, path: str = STREAM_PATH) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


def split_response(buffer: bytes) -> tuple[bytes, bytes] | None:
    """(response head, bytes after it) once the head is complete, else None."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    head, rest = buffer[: end + 4], buffer[end + 4 :]
    status = head.split(b"\r\n", 1)[0]
    if b" 101 " not in status + b" ":
        raise ConnectionError(f"upgrade refused: {status.decode(errors='replace')}")
    return head, rest


# -- server frames (unmasked) --------------------------------------------------------------------


class FrameReader:
    """Incremental parser of the server's frames; yields (opcode, payload) of whole frames.

    Fragmented messages are not reassembled: none of the servers here fragments small messages.
    """

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> Iterator[tuple[int, bytes]]:
        buf = self._buf
        pos = 0
        n = len(buf)
        while n - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length = b1 & 0x7F
            offset = pos + 2
            if length == 126:
                if n - offset < 2:
                    break
                (length,) = struct.unpack_from("!H", buf, offset)
                offset += 2
            elif length == 127:
                if n - offset < 8:
                    break
                (length,) = struct.unpack_from("!Q", buf, offset)
                offset += 8
            if b1 & 0x80:
                raise ConnectionError("server sent a masked frame")
            if n - offset < length:
                break
            yield b0 & 0x0F, bytes(buf[offset : offset + length])
            pos = offset + length
        del buf[:pos]


# -- one blocking connection ---------------------------------------------------------------------


class Conn:
    """A blocking raw WebSocket client connection."""

    def __init__(self, host: str, port: int, path: str = STREAM_PATH, timeout: float = 60.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = FrameReader()
        self.sock.sendall(upgrade_request(host, port, path))
        buffer = b""
        while (parts := split_response(buffer)) is None:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed during the upgrade")
            buffer += data
        self.reader.feed(parts[1])
        self._pending: list[tuple[int, bytes]] = []

    def next_frame(self) -> tuple[int, bytes]:
        while not self._pending:
            self._pending.extend(self.reader.frames())
            if self._pending:
                break
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("server closed the connection")
            self.reader.feed(data)
        return self._pending.pop(0)

    def next_json(self) -> dict[str, object]:
        """The next text message as JSON; answers pings; raises on a close frame."""
        while True:
            opcode, payload = self.next_frame()
            if opcode == OP_TEXT:
                message: dict[str, object] = json.loads(payload)
                return message
            if opcode == OP_PING:
                self.sock.sendall(client_frame(OP_PONG, payload))
            elif opcode == OP_CLOSE:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                raise ConnectionError(f"server closed with {code}: {payload[2:]!r}")

    def wait_for(self, kind: str) -> dict[str, object]:
        while True:
            message = self.next_json()
            if message.get("type") == kind:
                return message
            if message.get("type") == "error":
                raise ConnectionError(f"server error: {message}")

    def close(self) -> None:
        """Answer the server's close frame (or start the handshake), then close TCP."""
        try:
            self.sock.settimeout(5.0)
            while True:
                opcode, _ = self.next_frame()
                if opcode == OP_CLOSE:
                    self.sock.sendall(close_frame(1000))
                    break
        except (OSError, ConnectionError):
            pass
        finally:
            self.sock.close()


# -- the bulk ingest run -------------------------------------------------------------------------


@dataclass
class ConnResult:
    first_frame: float = 0.0
    stats_at: float = 0.0
    frames_sent: int = 0
    frames_counted: int = -1
    error: str | None = None


def _drive(
    conn: Conn,
    *,
    frames: int,
    chunk: bytes,
    chunk_frames: int,
    single: bytes,
    barrier: threading.Barrier,
    bare: bool,
    result: ConnResult,
) -> None:
    try:
        if not bare:
            conn.sock.sendall(text_frame(START))
            conn.wait_for("ready")
        barrier.wait()
        result.first_frame = time.perf_counter()
        full, rest = divmod(frames, chunk_frames)
        sendall = conn.sock.sendall
        for _ in range(full):
            sendall(chunk)
        if rest:
            sendall(single * rest)
        result.frames_sent = frames
        conn.sock.sendall(text_frame(END))
        stats = conn.wait_for("stats")
        result.stats_at = time.perf_counter()
        counted = stats.get("frames")
        result.frames_counted = counted if isinstance(counted, int) else -1
        conn.close()
    except (OSError, ConnectionError, threading.BrokenBarrierError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        barrier.abort()
        conn.sock.close()


def run_once(
    host: str,
    port: int,
    *,
    connections: int = 4,
    frames: int = 200_000,
    frame_bytes: int = 640,
    chunk_frames: int = 256,
    bare: bool = False,
    path: str = STREAM_PATH,
) -> float:
    """Aggregate frames/s over ``connections`` concurrent connections sharing ``frames``."""
    single = client_frame(OP_BINARY, pcm_payload(frame_bytes))
    chunk = single * chunk_frames
    n = connections
    shares = [frames // n + (1 if i < frames % n else 0) for i in range(n)]
    conns = [Conn(host, port, path) for _ in range(n)]
    barrier = threading.Barrier(n)
    results = [ConnResult() for _ in range(n)]
    threads = [
        threading.Thread(
            target=_drive,
            args=(c,),
            kwargs={
                "frames": share,
                "chunk": chunk,
                "chunk_frames": chunk_frames,
                "single": single,
                "barrier": barrier,
                "bare": bare,
                "result": r,
            },
            daemon=True,
        )
        for c, share, r in zip(conns, shares, results, strict=True)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r.error for r in results if r.error]
    if errors:
        raise RuntimeError("; ".join(errors))
    for share, r in zip(shares, results, strict=True):
        if r.frames_counted != share:
            raise RuntimeError(f"server counted {r.frames_counted} frames of {share} sent")
    elapsed = max(r.stats_at for r in results) - min(r.first_frame for r in results)
    return frames / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default=STREAM_PATH)
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--frames", type=int, default=200_000, help="total, over all connections")
    parser.add_argument("--frame-bytes", type=int, default=640)
    parser.add_argument("--chunk", type=int, default=256, help="frames per sendall")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bare", action="store_true", help="skip start/ready")
    parser.add_argument("--json", action="store_true", help="print one JSON line of rates")
    args = parser.parse_args()
    rates = [
        run_once(
            args.host,
            args.port,
            connections=args.connections,
            frames=args.frames,
            frame_bytes=args.frame_bytes,
            chunk_frames=args.chunk,
            bare=args.bare,
            path=args.path,
        )
        for _ in range(args.repeat)
    ]
    if args.json:
        print(json.dumps({"rates": rates}))
    else:
        for i, rate in enumerate(rates, 1):
            print(f"run {i}: {rate:,.0f} frames/s")
        print(f"best: {max(rates):,.0f} frames/s")


if __name__ == "__main__":
    main()
